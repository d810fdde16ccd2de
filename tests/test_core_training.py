"""Real Lightning runs of CTModule, the burn-in callback and recipes/train.py end to end."""

import json
from pathlib import Path

import lightning as L
import pytest
from preloaded import run_script
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from ct_lightning import BurnIn, CTModule, ECCo, random_targets, search_counterfactuals
from ct_lightning.metrics.functional import implausibility
from datamodules import available, get_datamodule

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ["ls", "ol", "circles", "moons"]


def quiet_trainer(**kwargs) -> L.Trainer:
    options = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu")
    return L.Trainer(**{**options, **kwargs})


@pytest.fixture(scope="module")
def synthetic():
    modules = {}
    for name in SYNTHETIC:
        modules[name] = get_datamodule(name)
        modules[name].setup()
    return modules


def test_synthetic_sets_match_spec(synthetic):
    assert set(SYNTHETIC) <= set(available())
    for name, dm in synthetic.items():
        summary = dm.summary()
        assert (summary["n_train"], summary["n_test"], dm.batch_size) == (3600, 600, 30)
        assert summary["n_features"] == 2 and summary["n_classes"] == 2
        assert summary["protected"] == ["x1"] and dm.feature_names == ["x1", "x2"]
        assert abs(summary["class_balance"][0] - 0.5) < 0.05
    again = get_datamodule("circles")
    again.setup()
    assert torch.equal(again.x_train, synthetic["circles"].x_train), "data seed must be fixed"
    with pytest.raises(ValueError, match="unknown data set 'spirals'.*allowed: .*circles"):
        get_datamodule("spirals")


@pytest.mark.parametrize("objective", ["full", "vanilla", "energy", "adversarial"])
def test_each_objective_trains_on_each_synthetic_set(synthetic, objective):
    for name, dm in synthetic.items():
        L.seed_everything(0, verbose=False)
        module = CTModule(n_features=2, n_classes=2, objective=objective, **dm.ct_defaults | {"nce": 120})
        trainer = quiet_trainer(max_epochs=2, limit_train_batches=12, limit_val_batches=2)
        trainer.fit(module, dm)
        metrics = trainer.callback_metrics
        for term in ("loss", "clf", "div", "ridge", "adv"):
            assert torch.isfinite(metrics[f"train/{term}"]), (name, term)
        if objective in ("vanilla", "adversarial"):
            assert metrics["train/div"] == 0 and metrics["train/ridge"] == 0
        if objective in ("vanilla", "energy"):
            assert metrics["train/adv"] == 0
        if objective != "vanilla":
            assert 0 <= metrics["train/cf_converged"] <= 1 and metrics["train/cf_steps"] >= 1
            assert metrics["train/ridge" if objective != "adversarial" else "train/adv"] > 0
        assert "val/acc" in metrics


def test_step_pool_mode_and_pool_split(synthetic):
    dm = synthetic["moons"]
    module = CTModule(n_features=2, n_classes=2, pool="step", nce=60, tau=0.9)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=6, limit_val_batches=1)
    trainer.fit(module, dm)
    assert trainer.callback_metrics["train/cf_steps"] >= 1
    pool, _ = module.generate_pool(10, torch.Generator().manual_seed(0))
    chunks = [pool.chunk(i, 3) for i in range(4)]
    assert [len(c) for c in chunks] == [3, 4, 3, 0]
    assert torch.equal(torch.cat([c.target for c in chunks]), pool.target)


def test_burnin_trains_conventionally_first(synthetic):
    seen = []

    class Record(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            seen.append((pl_module.ct_active, pl_module.pool is not None))

    module = CTModule(n_features=2, n_classes=2, nce=60, tau=0.5)
    trainer = quiet_trainer(max_epochs=4, limit_train_batches=3, limit_val_batches=1,
                            callbacks=[BurnIn(0.5), Record()])
    trainer.fit(module, synthetic["ls"])
    assert seen == [(False, False), (False, False), (True, True), (True, True)]
    with pytest.raises(ValueError, match="burnin"):
        BurnIn(1.0)


def test_wrap_own_model_and_constraints_reach_the_search(synthetic):
    dm = synthetic["ls"]
    own = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
    module = CTModule(model=own, n_classes=2, nce=200, tau=0.5, mutability={"x1": "none"})
    quiet_trainer(max_epochs=1, limit_train_batches=5, limit_val_batches=1).fit(module, dm)
    assert module.model is own
    assert module.mutability.tolist() == [3, 0]
    assert torch.equal(module.lower, dm.domain()[0])
    pool, _ = module.generate_pool(50, torch.Generator().manual_seed(0))
    # protected x⁺ and the counterfactual agree on the immutable feature
    assert torch.equal(pool.x_pos[:, 0], pool.x_neg[:, 0])
    with pytest.raises(ValueError, match="got 'age' \\(unknown feature\\)"):
        bad = CTModule(n_features=2, mutability={"age": "none"})
        quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0).fit(bad, dm)


@pytest.mark.slow  # trains BL and CT to convergence (9 s)
def test_ct_makes_circles_counterfactuals_more_plausible(synthetic):
    """Paper, Table 1: on circles CT's ECCo counterfactuals lie much closer to the target class."""
    dm = synthetic["circles"]
    x = dm.x_test[:200]
    ip = {}
    for objective in ("vanilla", "full"):
        L.seed_everything(0, verbose=False)
        module = CTModule(n_features=2, n_classes=2, objective=objective, tau=0.5, lambda_reg=0.5)
        quiet_trainer(max_epochs=12, limit_val_batches=1).fit(module, dm)
        module.eval()
        with torch.no_grad():
            target = random_targets(module(x).argmax(1), 2, torch.Generator().manual_seed(1))
        result = search_counterfactuals(module.model, x, target, ECCo(lambda_energy=1.0), tau=0.95, max_steps=50)
        with torch.no_grad():
            valid = module(result.counterfactual).argmax(1) == target
        assert valid.float().mean() > 0.9
        ip[objective] = implausibility(result.counterfactual[valid], target[valid], dm.x_test, dm.y_test).mean().item()
    assert ip["full"] < 0.8 * ip["vanilla"], ip


def run_recipe(*args, cwd=ROOT):
    return run_script(ROOT / "recipes" / "train.py", list(args), cwd=cwd, timeout=300)


@pytest.mark.slow
def test_train_recipe_end_to_end(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary_path = tmp_path / "out" / "summary.json"
    done = run_recipe("--data", "moons", "--max-epochs", "2", "--limit-train-batches", "10", "--nce", "100",
                      "--immutable", "x1", "--tracking-uri", uri, "--experiment", "test-ct",
                      "--summary-json", str(summary_path), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert f"MLflow run id: {summary['run_id']}" in done.stdout
    assert "mlflow ui --backend-store-uri" in done.stdout
    config = summary["config"]
    assert config["data"] == "moons" and config["tau"] == 0.9 and config["lambda_reg"] == 0.25
    assert config["immutable"] == ["x1"] and config["max_epochs"] == 2 and config["nce"] == 100
    assert summary["data"] == {**summary["data"], "name": "moons", "n_train": 3600, "n_val": 600, "n_test": 600,
                               "n_features": 2, "n_classes": 2, "protected": ["x1"]}
    for key in ("train/loss", "train/clf", "train/div", "train/ridge", "train/adv", "train/cf_converged",
                "train/cf_steps", "train/cf_nascent", "val/acc", "test/acc"):
        assert summary["metrics"][key] is not None, key

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["run_id"])
    assert run.data.params["objective"] == "full" and run.data.params["data"] == "moons"
    for key in ("train/loss", "train/div", "train/ridge", "train/adv", "train/cf_converged", "val/acc"):
        history = client.get_metric_history(summary["run_id"], key)
        assert len(history) == 2, key  # one value per epoch
    artifacts = {a.path for a in client.list_artifacts(summary["run_id"], "checkpoints")}
    assert "checkpoints/last.ckpt" in artifacts
    restored = CTModule.load_from_checkpoint(summary["checkpoints"]["last"], weights_only=True)
    assert restored.hparams.mutability == {"x1": "none"}


@pytest.mark.slow
def test_train_recipe_bad_input_is_a_clear_error(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = run_recipe("--data", "moons", "--immutable", "age", "--tracking-uri", uri, "--fast-dev-run")
    assert done.returncode != 0 and "got 'age' (unknown feature)" in done.stderr and "x1, x2" in done.stderr
    done = run_recipe("--data", "spirals", "--tracking-uri", uri)
    assert done.returncode == 2 and "--data: got 'spirals'; allowed: adult, california_housing" in done.stderr \
        and "a .csv/.tsv/.txt/.parquet/.xlsx/.xlsm file, or package.module:Class" in done.stderr
    help_text = run_recipe("--help").stdout
    for flag in ("--objective", "--generator", "--max-epochs", "--seed", "--nce", "--burnin", "--immutable",
                 "--lambda-div", "--lambda-reg", "--lambda-adv", "--tau", "--tracking-uri", "--experiment",
                 "--summary-json"):
        assert flag in help_text


def test_plain_dataloaders_without_datamodule(synthetic):
    from torch.utils.data import DataLoader, TensorDataset

    dm = synthetic["moons"]
    train_loader = DataLoader(TensorDataset(dm.x_train, dm.y_train), batch_size=30, shuffle=True)
    val_loader = DataLoader(TensorDataset(dm.x_val, dm.y_val), batch_size=100)
    module = CTModule(n_features=2, n_classes=2, nce=60, tau=0.9, lambda_reg=0.25)
    quiet_trainer(max_epochs=1, limit_train_batches=5, limit_val_batches=1).fit(module, train_loader, val_loader)
    assert len(module.y_train) == 3600 and module.lower is not None
    assert module.trainer.callback_metrics["train/cf_steps"] >= 1
