"""Fine-tuning from checkpoints, configuration files, the CNN, and resuming a killed run."""

import json
import os
import sys
import signal
import time
from pathlib import Path

import lightning as L
import pytest
from preloaded import run_script, start_script
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from ct_lightning import CTModule
from ct_lightning.experiment.runs.checkpoints import read_checkpoint
from ct_lightning.models import LeNet, build_mlp
from ct_lightning.experiment.configuration.settings import load_config_file, parse_generator_options
from ct_lightning.experiment.runs.train import train
from datamodules import get_datamodule
from recipe_loader import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = {"data": "moons", "max_epochs": 1, "limit_train_batches": 4, "limit_val_batches": 2, "nce": 40,
        "progress": False, "accelerator": "cpu"}




class FirstWeights(L.Callback):
    """Records the model's weights when training starts."""

    def on_train_start(self, trainer, pl_module):
        self.state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}


def assert_started_from(callback: FirstWeights, state: dict):
    assert callback.state.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(callback.state[key], value), key


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for the module: creating a SQLite store takes seconds."""
    return {"tracking_uri": f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db", "experiment": "finetune-tests"}


def test_finetune_from_lightning_checkpoint(store):
    vanilla = train({**TINY, **store, "objective": "vanilla", "hidden_sizes": [16]})
    state, metadata = read_checkpoint(vanilla["checkpoints"]["last"])
    assert metadata["hidden_sizes"] == [16]
    first = FirstWeights()
    tuned = train({**TINY, **store, "objective": "full", "from_checkpoint": vanilla["checkpoints"]["last"]},
                  callbacks=[first])
    assert tuned["config"]["hidden_sizes"] == [16], "architecture comes from the checkpoint's metadata"
    assert_started_from(first, state)
    assert tuned["metrics"]["train/ridge"] > 0


def test_finetune_from_plain_state_dict(store, tmp_path, monkeypatch):
    model = build_mlp(2, 2, [12, 6], "relu")
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    first = FirstWeights()
    summary = train({**TINY, **store, "from_checkpoint": str(tmp_path / "plain.pt")}, callbacks=[first])
    assert summary["config"]["hidden_sizes"] == [12, 6], "hidden sizes inferred from the weight shapes"
    assert_started_from(first, model.state_dict())
    # the run names the file absolutely, also when given relative to the folder it was started in
    monkeypatch.chdir(tmp_path)
    relative = train({**TINY, **store, "from_checkpoint": "plain.pt"})
    assert relative["config"]["from_checkpoint"] == str((tmp_path / "plain.pt").resolve())
    # metadata form: {"state_dict": ..., "activation": ...}
    tanh = build_mlp(2, 2, [8], "tanh")
    torch.save({"state_dict": tanh.state_dict(), "activation": "tanh", "hidden_sizes": [8]}, tmp_path / "meta.pt")
    summary = train({**TINY, **store, "from_checkpoint": str(tmp_path / "meta.pt")})
    assert summary["config"]["activation"] == "tanh" and summary["config"]["hidden_sizes"] == [8]


def test_finetune_from_a_torchscript_file_and_a_pickled_module_is_refused_with_the_fix(store, tmp_path):
    model = build_mlp(2, 2, [12, 6], "relu")
    torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    first = FirstWeights()
    summary = train({**TINY, **store, "from_checkpoint": str(tmp_path / "scripted.pt")}, callbacks=[first])
    assert summary["config"]["hidden_sizes"] == [12, 6], "hidden sizes inferred from the scripted weights"
    assert_started_from(first, model.state_dict())
    torch.save(model, tmp_path / "whole.pt")  # the whole module, pickled: loading it runs code from the file
    with pytest.raises(ValueError) as refused:
        read_checkpoint(tmp_path / "whole.pt")
    message = str(refused.value)
    assert message.startswith(f"from_checkpoint: {tmp_path / 'whole.pt'} holds a pickled "
                              "torch.nn.modules.container.Sequential (torch.save(model))")
    assert "torch.save(model.state_dict(), 'weights.pt')" in message and "\n" not in message
    recipe = load_recipe("train")
    with pytest.raises(SystemExit, match="--from-checkpoint: .*holds a pickled"):
        recipe.main(["--data", "moons", "--from-checkpoint", str(tmp_path / "whole.pt"), "--max-epochs", "1",
                     "--tracking-uri", store["tracking_uri"], "--no-progress"])


def test_finetune_own_model_from_factory(store, tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "from torch import nn\n"
        "def make(n_features, n_classes):\n"
        "    return nn.Sequential(nn.Linear(n_features, 10), nn.Tanh(), nn.Linear(10, n_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_models

    model = my_models.make(2, 2)
    torch.save(model.state_dict(), tmp_path / "own.pt")
    first = FirstWeights()
    summary = train({**TINY, **store, "model": "my_models:make", "from_checkpoint": str(tmp_path / "own.pt")},
                    callbacks=[first])
    assert_started_from(first, model.state_dict())
    restored = CTModule.load_from_checkpoint(summary["checkpoints"]["last"], weights_only=True)
    assert isinstance(restored.model[1], nn.Tanh)


def test_a_model_of_a_class_of_ones_own_loads_from_mlflow_where_its_module_is_not_importable(store, tmp_path,
                                                                                            monkeypatch):
    """``--model mynet:make`` with a class of the user's own: the logged model pickles that class, and loading or
    serving it elsewhere ended in ``ModuleNotFoundError: No module named 'mynet'``. The module's file now travels
    with the logged model (MLflow's code_paths)."""
    import subprocess
    import sys

    code = tmp_path / "code"
    code.mkdir()
    (code / "mynet.py").write_text(
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, n_features, n_classes):\n"
        "        super().__init__()\n"
        "        self.hidden, self.out = nn.Linear(n_features, 8), nn.Linear(8, n_classes)\n"
        "    def forward(self, x):\n"
        "        return self.out(self.hidden(x).relu())\n"
        "def make(n_features, n_classes):\n"
        "    return Net(n_features, n_classes)\n")
    monkeypatch.syspath_prepend(str(code))
    summary = train({**TINY, **store, "model": "mynet:make"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = ("import sys, torch, mlflow.pytorch; mlflow.set_tracking_uri(sys.argv[1]); "
              "m = mlflow.pytorch.load_model(f'runs:/{sys.argv[2]}/model', map_location='cpu'); "
              "print(type(m).__module__, tuple(m(torch.zeros(3, 2)).shape))")
    done = subprocess.run([sys.executable, "-c", script, store["tracking_uri"], summary["run_id"]], cwd=elsewhere,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                               "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0 and done.stdout.split() == ["mynet", "(3,", "2)"], done.stderr[-2000:]


def test_wrong_checkpoint_unknown_model_and_unknown_config_key_are_clear_errors(store, tmp_path):
    torch.save(build_mlp(2, 2, [16]).state_dict(), tmp_path / "w16.pt")
    with pytest.raises(ValueError, match=r"does not fit the model: shape mismatch in 0\.weight: checkpoint \(16, 2\) "
                                         r"vs model \(32, 2\)"):
        train({**TINY, **store, "hidden_sizes": [32], "from_checkpoint": str(tmp_path / "w16.pt")})
    torch.save(build_mlp(3, 2, [32]).state_dict(), tmp_path / "w3.pt")
    with pytest.raises(ValueError, match=r"shape mismatch in 0\.weight"):
        train({**TINY, **store, "from_checkpoint": str(tmp_path / "w3.pt")})
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="not a readable PyTorch checkpoint"):
        train({**TINY, **store, "from_checkpoint": str(tmp_path / "junk.pt")})
    with pytest.raises(ValueError, match="cannot import module 'no_such_package.models'.*; run from the folder that "
                                         "holds no_such_package, or add that folder to PYTHONPATH$"):
        train({**TINY, **store, "model": "no_such_package.models:make"})
    (tmp_path / "bad.yaml").write_text("max_epochs: 2\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown keys \['learning_rate'\] in .*bad\.yaml"):
        load_config_file(tmp_path / "bad.yaml")
    recipe = load_recipe("train")
    with pytest.raises(SystemExit, match="learning_rate"):
        recipe.main(["--config", str(tmp_path / "bad.yaml")])


def test_config_file_below_command_line(store, tmp_path):
    (tmp_path / "run.yaml").write_text(
        "data: moons\nmax-epochs: 1\ntau: 0.6\nlambda_div: 0.3\nnce: 40\nlimit_train_batches: 3\n"
        "limit_val_batches: 1\nprogress: false\naccelerator: cpu\n")
    recipe = load_recipe("train")
    summary = recipe.main(["--config", str(tmp_path / "run.yaml"), "--tau", "0.7", "--tracking-uri",
                           store["tracking_uri"], "--experiment", store["experiment"]])
    config = summary["config"]
    assert config["tau"] == 0.7                      # command line beats the file
    assert config["lambda_div"] == 0.3 and config["max_epochs"] == 1  # the file beats the defaults
    assert config["lambda_reg"] == 0.25             # Table 2 value for moons where neither sets it
    logged = MlflowClient(tracking_uri=store["tracking_uri"]).download_artifacts(
        summary["run_id"], "config.yaml", str(tmp_path))
    assert load_config_file(logged)["tau"] == 0.7, "the logged config can be fed back with --config"


def test_generator_options_forms():
    assert parse_generator_options("variant=gan,refit_every=5,w_l1=0.1") == {"variant": "gan", "refit_every": 5,
                                                                           "w_l1": 0.1}
    assert parse_generator_options('{"latent_dim": 4}') == {"latent_dim": 4}
    assert parse_generator_options(None) is None
    with pytest.raises(ValueError, match="generator_options: expected KEY=VALUE"):
        parse_generator_options("variant")
    with pytest.raises(ValueError, match="generator_options: ecco takes none"):
        CTModule(n_features=2, generator="ecco", generator_options={"latent_dim": 4})


@pytest.mark.parametrize("name", ["ls", "circles", "moons", "ol", "adult", "california_housing", "credit",
                                  "gmsc", "mnist"])
def test_shipped_configs_hold_table2(name):
    config = load_config_file(ROOT / "configs" / f"{name}.yaml")
    from datamodules import get_datamodule_class

    cls = get_datamodule_class(name)
    assert config["data"] == name and config["batch_size"] == cls.default_batch_size
    for key, value in cls.ct_defaults.items():
        assert config[key] == value, key
    assert config["max_epochs"] == 100 and config["lambda_div"] == 0.5 and config["lambda_adv"] == 0.25


def test_cnn_trains_under_ct_on_mnist(fixture_dir, tmp_path):
    mnist = get_datamodule("mnist", batch_size=50, data_dir=fixture_dir, n_train=200, n_test=100,
                           cache_dir=tmp_path, download=False)
    mnist.setup()
    assert LeNet()(mnist.x_train[:3]).shape == (3, 10)
    module = CTModule(n_features=784, n_classes=10, architecture="cnn", nce=60, tau=0.5, lambda_reg=0.01,
                      mutability={name: "none" for name in mnist.protected}, feature_names=mnist.feature_names)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, mnist)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.callback_metrics["train/cf_steps"] >= 1
    pool, _ = module.generate_pool(20, torch.Generator().manual_seed(0))
    protected = module.mutability == 3
    assert protected.sum() == 280
    assert torch.equal(pool.x_neg[:, protected], pool.x_pos[:, protected])


def test_resume_after_killed_process(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["--data", "moons", "--max-epochs", "5", "--pool", "step", "--tracking-uri", uri, "--experiment",
            "resume-test", "--no-progress", "--checkpoint-dir", str(tmp_path / "ckpt")]
    process = start_script(ROOT / "recipes" / "train.py", args, cwd=ROOT)
    last = tmp_path / "ckpt" / "last.ckpt"
    deadline = time.time() + 240
    while not last.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the run must still be going when it is killed: " + process.output()[-2000:]
    time.sleep(0.5)  # well inside the next epoch
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait().returncode == -signal.SIGKILL
    killed_at = torch.load(last, weights_only=False)["epoch"]
    assert killed_at < 4

    summary_path = tmp_path / "resumed.json"
    done = run_script(ROOT / "recipes" / "train.py", ["--resume", "--tracking-uri", uri, "--experiment", "resume-test",
                                                      "--no-progress", "--summary-json", str(summary_path)],
                      cwd=ROOT, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["metrics"]["epochs"] == 5
    assert summary["config"]["max_epochs"] == 5 and summary["config"]["pool"] == "step"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("resume-test").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == summary["run_id"], "resumed in the same MLflow run"
    assert runs[0].info.status == "FINISHED"
    epochs = {m.value for m in client.get_metric_history(summary["run_id"], "epoch")}
    assert epochs == {0.0, 1.0, 2.0, 3.0, 4.0, 5.0}  # five training epochs, then the test phase logs epoch 5
    assert len({m.step for m in client.get_metric_history(summary["run_id"], "val/acc")}) == 5
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["epoch"] == 4
    restored = CTModule.load_from_checkpoint(last, weights_only=True)
    assert restored.hparams.pool == "step"


class RunSettings(L.Callback):
    """Records how the trainer actually runs: its strategy, devices and epoch loop."""

    def on_train_start(self, trainer, pl_module):
        self.seen = {"strategy": type(trainer.strategy).__name__, "devices": trainer.num_devices,
                     "fused": not pl_module.automatic_optimization}


def test_every_option_allowed_with_resume_applies_to_the_resumed_training(tmp_path, store):
    """--resume accepts the options whose settings row says ``on_resume``; each must reach the resumed training
    (before, only five were applied and --epoch-loop, --search-compile, --devices, --strategy, --threads were
    silently dropped)."""
    from ct_lightning.experiment.configuration.settings import RESUME_OPTIONS  # noqa: PLC0415

    uri = {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "resume-options"}
    first = RunSettings()
    done = train({**TINY, **uri, "max_epochs": 1, "limit_train_batches": None}, callbacks=[first])
    changed = {"epoch_loop": "lightning", "search_compile": "off", "threads": 1, "devices": "1",
               "strategy": "single_device", "data_dir": str(tmp_path)}
    assert set(changed) <= RESUME_OPTIONS
    resumed = RunSettings()
    summary = train({**uri, "resume": done["run_id"], "max_epochs": 2, "progress": False, **changed},
                    callbacks=[resumed])
    assert summary["metrics"]["epochs"] == 2
    for key, value in changed.items():
        assert str(summary["config"][key]) == str(value), key
    assert resumed.seen["strategy"] == "SingleDeviceStrategy" and resumed.seen["devices"] == 1
    assert first.seen["fused"] and not resumed.seen["fused"]


def test_a_torchscript_mlp_keeps_its_activation_and_a_state_dict_says_which_it_assumes(store, tmp_path):
    class Functional(nn.Module):  # the activation as a function call in forward, not a module
        def __init__(self):
            super().__init__()
            self.hidden, self.out = nn.Linear(2, 8), nn.Linear(8, 2)

        def forward(self, x):
            return self.out(torch.tanh(self.hidden(x)))

    tanh = build_mlp(2, 2, [8, 8], "tanh")
    torch.jit.save(torch.jit.script(tanh), tmp_path / "tanh.pt")
    assert read_checkpoint(tmp_path / "tanh.pt")[1] == {"activation": "tanh"}
    torch.jit.save(torch.jit.script(Functional()), tmp_path / "functional.pt")
    assert read_checkpoint(tmp_path / "functional.pt")[1] == {"activation": "tanh"}
    torch.jit.save(torch.jit.script(nn.Sequential(nn.Linear(2, 8), nn.SiLU(), nn.Linear(8, 2))), tmp_path / "silu.pt")
    with pytest.raises(ValueError, match=r"uses the activation SiLU; allowed: relu, tanh, sigmoid, gelu"):
        read_checkpoint(tmp_path / "silu.pt")
    lines = []
    first = FirstWeights()
    summary = train({**TINY, **store, "from_checkpoint": str(tmp_path / "tanh.pt")}, callbacks=[first],
                    echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert summary["config"]["activation"] == "tanh" and summary["config"]["hidden_sizes"] == [8, 8]
    assert_started_from(first, tanh.state_dict())
    assert not [line for line in lines if "is assumed" in line]
    # a state_dict (here in the {"model_state_dict": ...} form training scripts save) holds no activation: said
    torch.save({"model_state_dict": tanh.state_dict(), "epoch": 3}, tmp_path / "weights.pt")
    lines.clear()
    summary = train({**TINY, **store, "from_checkpoint": str(tmp_path / "weights.pt")},
                    echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert summary["config"]["activation"] == "relu" and summary["config"]["hidden_sizes"] == [8, 8]
    assert f"fine-tuning {tmp_path / 'weights.pt'}: an MLP with hidden sizes [8, 8] and relu, 114 weights" in lines
    assert [line for line in lines if line.startswith(f"note: {tmp_path / 'weights.pt'} does not say which activation")
            and "relu is assumed; pass --activation" in line]
    lines.clear()
    train({**TINY, **store, "from_checkpoint": str(tmp_path / "weights.pt"), "activation": "tanh"},
          echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert not [line for line in lines if "is assumed" in line]


def test_weights_of_a_model_class_of_ones_own_point_to_model_factory(store, tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.out = nn.Linear(2, 8), nn.Linear(8, 2)

    torch.save(Net().state_dict(), tmp_path / "net.pt")
    lines = []
    with pytest.raises(ValueError, match=r"missing in checkpoint: 0\.weight.*not in model: fc1\.weight.* the layers "
                                         r"have other names.*pass --model package\.module:factory"):
        train({**TINY, **store, "from_checkpoint": str(tmp_path / "net.pt")},
              echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    # refused before the data is read, without first calling it an MLP with a guessed activation and hidden sizes
    assert not [line for line in lines if "which activation its MLP uses" in line or "an MLP with hidden" in line
                or line.startswith("data ")], lines


def test_a_model_class_whose_constructor_takes_arguments_of_its_own_is_refused_in_one_line(store, tmp_path,
                                                                                        monkeypatch):
    """A risk team's ``CreditNet(n_inputs, hidden=(32, 16), dropout=0.2)`` given as ``--model mymodel:CreditNet``
    ended in a traceback (``TypeError: ... missing 1 required positional argument: 'n_inputs'``) after the data was
    read; now one line names the argument and the factory to write."""
    (tmp_path / "mymodel.py").write_text(
        "from torch import nn\n"
        "class CreditNet(nn.Sequential):\n"
        "    def __init__(self, n_inputs, hidden=(8,), dropout=0.2):\n"
        "        super().__init__(nn.Linear(n_inputs, hidden[0]), nn.ReLU(), nn.Dropout(dropout),"
        " nn.Linear(hidden[0], 2))\n"
        "def make(n_features):\n"
        "    return CreditNet(n_features)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^model: got 'mymodel:CreditNet' \(it requires 'n_inputs', which "
                                         r"ct-lightning does not give\); allowed: .*n_features, n_classes.*"
                                         r"def make\(n_features\): return CreditNet\(n_features, \.\.\.\)"):
        train({**TINY, **store, "model": "mymodel:CreditNet"})
    assert train({**TINY, **store, "model": "mymodel:make"})["metrics"]["epochs"] == 1  # the factory it names works


def test_a_model_name_that_is_no_class_of_its_module_is_refused_with_the_modules_classes(store, tmp_path,
                                                                                      monkeypatch):
    """``--model hiring_net:HiringNett`` said only "module 'hiring_net' has no attribute 'HiringNett'" (no allowed
    values), and ``--model hiring_net:torch`` (a module the file imports) ended in a traceback, ``TypeError: 'module'
    object is not callable``; weights of another class than the ``--model`` given were told to "pass --model"."""
    (tmp_path / "hiring_net.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class HiringNet(nn.Sequential):\n"
        "    def __init__(self, n_features, n_classes):\n"
        "        super().__init__(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_classes))\n"
        "def make(n_features):\n"
        "    return nn.Sequential(nn.Linear(n_features, 2))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hiring_net", raising=False)  # another test's hiring_net.py, imported before
    with pytest.raises(ValueError, match=r"^model: got 'hiring_net:HiringNett' \(module 'hiring_net' has no "
                                         r"'HiringNett'; did you mean 'HiringNet'\?\); allowed: a class or function "
                                         r"of hiring_net: HiringNet, make$"):
        train({**TINY, **store, "model": "hiring_net:HiringNett"})
    with pytest.raises(ValueError, match=r"^model: got 'hiring_net:torch' \('torch' is no class or function\); "
                                         r"allowed: a class or function of hiring_net: HiringNet, make$"):
        train({**TINY, **store, "model": "hiring_net:torch"})
    class Other(nn.Module):  # weights saved from another class than the --model given
        def __init__(self):
            super().__init__()
            self.fc1, self.out = nn.Linear(2, 8), nn.Linear(8, 2)

    torch.save(Other().state_dict(), tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"the layers have other names, so the weights come from another model class "
                                         r"than the one built: pass --model package\.module:factory for the class"):
        train({**TINY, **store, "model": "hiring_net:HiringNet", "from_checkpoint": str(tmp_path / "other.pt")})


def test_a_model_file_that_fails_to_import_is_refused_in_one_line_naming_the_file_and_line(store, tmp_path,
                                                                                            monkeypatch):
    """``--model credit_model:CreditNet`` with a syntax error in ``credit_model.py`` (or an exception at its top
    level) ended in a traceback through importlib; one importing a package that is not installed was told to "run
    from the folder that holds credit_model". Now one line names the file, the line and what went wrong."""
    body = ("from torch import nn\nclass CreditNet(nn.Sequential):\n    def __init__(self, n_features, n_classes):\n"
            "        super().__init__(nn.Linear(n_features, n_classes))\n")
    (tmp_path / "syntax_net.py").write_text(body + "    def oops(:\n")
    (tmp_path / "raising_net.py").write_text("LIMIT = 1 / 0\n" + body)
    (tmp_path / "importing_net.py").write_text("import no_such_package_xyz\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^model: got 'syntax_net:CreditNet' \(importing 'syntax_net' failed: "
                                         r"SyntaxError: .* in .*syntax_net\.py, line 5\); allowed: a module that "
                                         r"imports without error: fix the file$"):
        train({**TINY, **store, "model": "syntax_net:CreditNet"})
    with pytest.raises(ValueError, match=r"^model: got 'raising_net:CreditNet' \(importing 'raising_net' failed: "
                                         r"ZeroDivisionError: division by zero in .*raising_net\.py, line 1\)"):
        train({**TINY, **store, "model": "raising_net:CreditNet"})
    with pytest.raises(ValueError, match=r"^model: got 'importing_net:CreditNet' \(module 'importing_net' imports "
                                         r"'no_such_package_xyz', which is not installed\)"):
        train({**TINY, **store, "model": "importing_net:CreditNet"})


def test_a_resumed_run_writes_its_summary_where_the_run_was_asked_to(tmp_path, store):
    """--summary-json is a run-only setting (not in the logged configuration): the run keeps it as a tag, so a
    resumed or extended run writes its summary there (replacing its own earlier one) without being told again."""
    path = tmp_path / "summary.json"
    first = train({**TINY, **store, "summary_json": str(path)})
    assert json.loads(path.read_text())["metrics"]["epochs"] == 1
    train({**store, "resume": first["run_id"], "max_epochs": 2, "progress": False})
    written = json.loads(path.read_text())
    assert written["run_id"] == first["run_id"] and written["metrics"]["epochs"] == 2


def test_weights_of_a_sequential_with_dropout_say_how_to_load_them():
    """A very common model, Linear-ReLU-Dropout-Linear, saves its last layer as 3.weight: the refusal named the
    keys only ("missing in checkpoint: 2.weight | not in model: 3.weight") with no way forward."""
    from ct_lightning.experiment.runs.checkpoints import load_weights

    theirs = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    with pytest.raises(ValueError, match=r"missing in checkpoint: 2\.weight, 2\.bias \| not in model: 3\.weight, "
                                         r"3\.bias \| its layers sit at other places of an nn\.Sequential \(a Dropout "
                                         r"or BatchNorm between the Linear layers\?\): pass --model"):
        load_weights(build_mlp(2, 2, [32]), theirs.state_dict(), "own.pt")


def test_a_pickled_module_of_a_class_of_ones_own_is_refused_naming_the_model_option_too(tmp_path, monkeypatch):
    """An analyst's ``torch.save(model)`` of ``hr_net.HRNet``: the refusal said to save the state_dict, and the next
    try was refused again for layers of another class than the default MLP; it now names ``--model hr_net:HRNet``
    with the state_dict line, so that one round of fixing suffices."""
    (tmp_path / "hr_net_pickled.py").write_text(
        "from torch import nn\n"
        "class HRNet(nn.Module):\n"
        "    def __init__(self, n_inputs=2):\n"
        "        super().__init__()\n"
        "        self.fc1, self.out = nn.Linear(n_inputs, 4), nn.Linear(4, 2)\n"
        "    def forward(self, x):\n"
        "        return self.out(self.fc1(x).relu())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hr_net_pickled", raising=False)
    from hr_net_pickled import HRNet

    torch.save(HRNet(), tmp_path / "hr_model_full.pt")
    with pytest.raises(ValueError, match=r"holds a pickled hr_net_pickled\.HRNet \(torch\.save\(model\)\), .*save its "
                                         r"weights with torch\.save\(model\.state_dict\(\), 'weights\.pt'\) and pass "
                                         r"that file, with --model hr_net_pickled:HRNet \(or a factory of your own"):
        read_checkpoint(tmp_path / "hr_model_full.pt")
