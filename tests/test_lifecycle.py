"""The lifecycle of a run against a real SQLite MLflow store: outputs per run, failure, kill and resume, MLflow UI."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import mlflow
import numpy as np
import pytest
from preloaded import run_script
import torch
from mlflow.tracking import MlflowClient

from ct_lightning.experiment.runs.lifecycle import ERROR_TAG, RUN_ONLY_KEYS, defining_config
from ct_lightning.experiment.runs.loading import load_checkpoint
from ct_lightning.experiment.configuration.settings import load_config_file
from ct_lightning.experiment.runs.tracking import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
from ct_lightning.experiment.runs.train import train
from recipe_loader import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = {"data": "moons", "max_epochs": 2, "limit_train_batches": 4, "limit_val_batches": 2, "nce": 40,
        "progress": False, "accelerator": "cpu"}
KILL = {**TINY, "max_epochs": 4, "limit_train_batches": 5, "seed": 3}


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def client_of(store) -> MlflowClient:
    return MlflowClient(tracking_uri=store["tracking_uri"])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for the module (creating a SQLite store takes seconds); tests use their own experiments."""
    return {"tracking_uri": f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"}


# ------------------------------------------------------------------------------------------ no data loss
def test_repeat_from_logged_config_leaves_the_first_run_untouched(store, tmp_path):
    exp = {**store, "experiment": "repeat"}
    summary_path = tmp_path / "first.json"
    first = train({**TINY, **exp, "summary_json": str(summary_path)})
    files = [Path(first["checkpoints"]["last"]), Path(first["checkpoints"]["best"]), summary_path]
    before = {str(p): sha256(p) for p in files}
    logged = Path(client_of(store).download_artifacts(first["run_id"], "config.yaml", str(tmp_path)))
    config = load_config_file(logged)
    assert not set(config) & RUN_ONLY_KEYS, "the logged config holds what defines the experiment, not where it wrote"
    assert config == defining_config(first["config"]) and config["max_epochs"] == 2

    recipe = load_recipe("train")
    with pytest.raises(SystemExit, match=r"summary[-_]json: .*first\.json exists"):
        recipe.main(["--config", str(logged), "--summary-json", str(summary_path)])
    with pytest.raises(SystemExit, match=r"checkpoint[-_]dir: .* already holds files"):
        recipe.main(["--config", str(logged), "--checkpoint-dir", str(files[0].parent)])
    second = recipe.main(["--config", str(logged), "--summary-json", str(tmp_path / "second.json")])

    assert second["run_id"] != first["run_id"]
    assert Path(second["checkpoints"]["last"]).parent != files[0].parent, "the repeat has a checkpoint folder of its own"
    assert Path(second["checkpoints"]["last"]).is_file()
    assert {str(p): sha256(p) for p in files} == before, "nothing of the first run changed, byte for byte"
    assert json.loads(summary_path.read_text())["run_id"] == first["run_id"]
    statuses = {r.info.status for r in client_of(store).search_runs(
        [client_of(store).get_experiment_by_name("repeat").experiment_id])}
    assert statuses == {"FINISHED"}, "refused repeats never created a run"


def test_overwrite_allows_replacing_a_named_summary(store, tmp_path):
    summary_path = tmp_path / "s.json"
    summary_path.write_text("{}")
    summary = train({**TINY, **store, "experiment": "overwrite", "max_epochs": 1, "summary_json": str(summary_path),
                     "overwrite": True})
    assert json.loads(summary_path.read_text())["run_id"] == summary["run_id"]


# ----------------------------------------------------------------------------------- orphans and failure
class FailAtEpoch(L.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            raise RuntimeError("simulated failure in epoch 1")


def test_a_run_failing_after_it_started_ends_failed_with_the_error_as_tag(store):
    lines = []
    with pytest.raises(RuntimeError, match="simulated failure"):
        train({**TINY, **store, "experiment": "fails"}, callbacks=[FailAtEpoch()],
              echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    client = client_of(store)
    (run,) = client.search_runs([client.get_experiment_by_name("fails").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags[ERROR_TAG] == "RuntimeError: simulated failure in epoch 1"
    assert run.info.run_id in lines[0] and f"--resume {run.info.run_id}" in lines[0], \
        "the run id and the resume command are printed when training starts"


# ------------------------------------------------------------------------------------- kill and resume
def kill_child(overrides: dict, phase: str, epoch: int, batch: int = 0) -> None:
    """Run training in a subprocess that SIGKILLs itself at (phase, epoch, batch)."""
    done = run_script(ROOT / "tests" / "helpers" / "kill_during_training.py", [json.dumps(overrides), phase, str(epoch),
                                                                                str(batch)], cwd=ROOT)
    assert done.returncode == -9, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def reference(store):
    """An uninterrupted run of the kill-test configuration."""
    return train({**KILL, **store, "experiment": "reference"})


def assert_same_run(reference: dict, resumed: dict, client) -> None:
    a = torch.load(reference["checkpoints"]["last"], weights_only=True)["state_dict"]
    b = torch.load(resumed["checkpoints"]["last"], weights_only=True)["state_dict"]
    assert a.keys() == b.keys()
    for key in a:  # a resumed run repeats the interrupted epoch on the same shapes: bit for bit
        assert torch.equal(a[key], b[key]), f"weights differ in {key}"
    timed = {k for k in reference["metrics"] if k.endswith("seconds")}
    assert {k: v for k, v in reference["metrics"].items() if k not in timed} == \
        {k: v for k, v in resumed["metrics"].items() if k not in timed}
    for key in ("train/loss", "val/acc", "train/cf_converged"):
        histories = [{m.step: m.value for m in sorted(client.get_metric_history(s["run_id"], key),
                                                      key=lambda m: m.timestamp)} for s in (reference, resumed)]
        assert histories[0] == histories[1], key
    best = [torch.load(s["checkpoints"]["best"], weights_only=True) for s in (reference, resumed)]
    assert best[0]["epoch"] == best[1]["epoch"], "the best checkpoint is the same epoch's"
    assert all(torch.equal(best[0]["state_dict"][k], best[1]["state_dict"][k]) for k in best[0]["state_dict"])


def best_state_in(checkpoint: dict) -> dict:
    """The state of the ``val/acc`` ModelCheckpoint that ``checkpoint`` holds."""
    (state,) = [value for key, value in checkpoint["callbacks"].items() if "'monitor': 'val/acc'" in key]
    return state


@pytest.mark.parametrize("epochs", [1, 3])
def test_last_checkpoint_holds_the_best_checkpoints_state_after_its_own_epoch(store, epochs):
    """A resume restores the best checkpoint's score from last.ckpt: it must be the score after last.ckpt's
    epoch (after one epoch: that epoch's), or the resumed run replaces best.ckpt by a worse epoch."""
    summary = train({**TINY, **store, "experiment": f"best-state-{epochs}", "max_epochs": epochs, "seed": 1})
    state = best_state_in(torch.load(summary["checkpoints"]["last"], weights_only=True))
    history = sorted(client_of(store).get_metric_history(summary["run_id"], "val/acc"), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(epochs))
    best_epoch = max(range(epochs), key=lambda e: (history[e].value, -e))  # the first of equal maxima
    assert state["best_model_score"] is not None
    assert float(state["best_model_score"]) == pytest.approx(history[best_epoch].value, abs=1e-6)
    assert state["best_model_path"] == summary["checkpoints"]["best"]
    assert torch.load(summary["checkpoints"]["best"], weights_only=True)["epoch"] == best_epoch


@pytest.mark.parametrize("phase,epoch,batch", [("train", 2, 3), ("val", 1, 0), ("epoch_start", 3, 0),
                                               ("train", 3, 4), ("train", 1, 0), ("epoch_end", 1, 0),
                                               ("step", 2, 2)])
def test_killed_and_resumed_run_is_bit_identical(store, reference, phase, epoch, batch):
    exp = {**store, "experiment": f"kill-{phase}-{epoch}-{batch}"}
    kill_child({**KILL, **exp}, phase, epoch, batch)
    client = client_of(store)
    (killed,) = client.search_runs([client.get_experiment_by_name(exp["experiment"]).experiment_id])
    assert killed.info.status == "RUNNING"
    resumed = train({"resume": "latest", **exp, "progress": False})
    assert resumed["run_id"] == killed.info.run_id and resumed["metrics"]["epochs"] == KILL["max_epochs"]
    assert client.get_run(killed.info.run_id).info.status == "FINISHED"
    assert_same_run(reference, resumed, client)


def test_a_run_that_writes_every_few_seconds_resumes_bit_identical_and_logs_each_epoch_once(store, reference):
    """--checkpoint-seconds: last.ckpt at most every N seconds (here an hour: after the first epoch only, before the
    last). Killed in epoch 2 (of 0..3), the run had sent MLflow nothing past its resume point (epoch 0); resumed, it
    ends bit-identical to a whole run (written at the default cadence), with each epoch's metrics logged once."""
    from ct_lightning.experiment.runs.lifecycle import completed_epochs, last_checkpoint_of

    exp = {**store, "experiment": "kill-cadence"}
    kill_child({**KILL, **exp, "checkpoint_seconds": 3600}, "train", 2, 1)
    client = client_of(store)
    (killed,) = client.search_runs([client.get_experiment_by_name(exp["experiment"]).experiment_id])
    assert completed_epochs(last_checkpoint_of(killed)) == 1, "only epoch 0's checkpoint was written"
    assert {m.step for m in client.get_metric_history(killed.info.run_id, "val/acc")} <= {0}
    resumed = train({"resume": "latest", **exp, "progress": False})
    assert_same_run(reference, resumed, client)
    for key in ("train/loss", "val/acc", "train/cf_converged"):
        steps = sorted(m.step for m in client.get_metric_history(resumed["run_id"], key))
        assert steps == list(range(KILL["max_epochs"])), f"{key}: {steps}"  # each epoch once, none missing


def test_best_checkpoint_is_written_with_the_next_last_checkpoint(store):
    """best.ckpt is gathered when val/acc improves and written with the next last.ckpt: with an hour's cadence, the
    file on disk stays epoch 0's (written with epoch 0's last.ckpt) through epochs 1 and 2 although val/acc improved
    there; after the last epoch it holds the best epoch's state, the one MLflow's history names."""
    seen = []

    class BestOnDisk(L.Callback):  # runs before the checkpoint callbacks at each epoch's end
        def on_train_epoch_end(self, trainer, pl_module):
            path = Path(trainer.checkpoint_callback.dirpath) / "best.ckpt"
            seen.append(torch.load(path, weights_only=True)["epoch"] if path.is_file() else None)

    summary = train({**KILL, **store, "experiment": "best-gathered", "checkpoint_seconds": 3600}, callbacks=[BestOnDisk()])
    history = sorted(client_of(store).get_metric_history(summary["run_id"], "val/acc"), key=lambda m: m.step)
    values = [m.value for m in history]
    assert max(values[1:3]) > values[0], "val/acc must improve in epoch 1 or 2 for this test to mean anything"
    assert seen == [None, 0, 0, 0], seen  # at the end of epochs 0..3, before their checkpoints
    best_epoch = max(range(len(values)), key=lambda e: (values[e], -e))
    assert torch.load(summary["checkpoints"]["best"], weights_only=True)["epoch"] == best_epoch


def signal_child(overrides: dict, name: str, epoch: int, *batches: int, env=None) -> subprocess.CompletedProcess:
    """Run training through a console entry in a subprocess that sends itself SIG``name`` at those batches."""
    return run_script(ROOT / "tests" / "helpers" / "signal_during_training.py",
                      [json.dumps(overrides), name, str(epoch), *map(str, batches)], cwd=ROOT, env=env)


@pytest.mark.parametrize("name,status,batches", [("TERM", 143, (3,)), ("INT", 130, (1,)), ("TERM", 143, (1, 2))],
                         ids=["sigterm", "sigint", "sigterm-twice"])
def test_a_signal_stops_at_a_checkpoint_marks_the_run_killed_and_resumes_bit_identical(store, reference, name,
                                                                                      status, batches):
    """SIGTERM (preemption) or SIGINT (Ctrl-C) in epoch 2 (of 0..3): the epoch finishes and is checkpointed, the
    run ends KILLED with the tag ct.interrupted, the exit status is 128 + the signal; a second signal stops at
    once (the last checkpoint written stays the resume point: epoch 1's, with --checkpoint-seconds 0). --resume then
    ends bit-identical to a whole run."""
    from ct_lightning.experiment.runs.interrupt import INTERRUPTED_TAG
    from ct_lightning.experiment.runs.lifecycle import completed_epochs, last_checkpoint_of

    exp = {**store, "experiment": f"signal-{name}-{len(batches)}"}
    # twice: stopped at once, the run resumes from the last checkpoint written; epoch 1's where every epoch writes one
    cadence = {"checkpoint_seconds": 0} if len(batches) > 1 else {}
    done = signal_child({**KILL, **exp, **cadence}, name, 2, *batches)
    assert done.returncode == status, done.stdout[-2000:] + done.stderr[-3000:]
    client = client_of(store)
    (killed,) = client.search_runs([client.get_experiment_by_name(exp["experiment"]).experiment_id])
    assert killed.info.status == "KILLED" and ERROR_TAG not in killed.data.tags
    assert killed.data.tags[INTERRUPTED_TAG].startswith(f"SIG{name} after ")
    assert f"--resume {killed.info.run_id}" in killed.data.tags[INTERRUPTED_TAG]
    assert f"--resume {killed.info.run_id}" in done.stderr.splitlines()[-1], "the last line says how to resume"
    assert completed_epochs(last_checkpoint_of(killed)) == (3 if len(batches) == 1 else 2)
    resumed = train({"resume": "latest", **exp, "progress": False})
    assert resumed["run_id"] == killed.info.run_id
    finished = client.get_run(killed.info.run_id)
    assert finished.info.status == "FINISHED" and INTERRUPTED_TAG not in finished.data.tags
    assert_same_run(reference, resumed, client)


@pytest.mark.parametrize("in_study", [True, False], ids=["study", "lone-training"])
def test_a_signal_in_the_last_epoch_finishes_the_run_and_stops_the_study(store, in_study):
    """SIGTERM in the last epoch: the training has nothing left to stop, so its run ends FINISHED; a study
    (grid, reproduction) around it must still stop before its next training (exit 143), where a lone
    training simply ends (this helper then says it was not interrupted)."""
    import os

    from ct_lightning.experiment.runs.lifecycle import completed_epochs, last_checkpoint_of

    exp = {**store, "experiment": f"signal-last-epoch-{in_study}"}
    env = {**os.environ, "CT_SIGNAL_IN_STUDY": "1" if in_study else "0"}
    done = signal_child({**KILL, **exp}, "TERM", KILL["max_epochs"] - 1, 1, env=env)
    assert "the study went on" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == (143 if in_study else 1), done.stdout[-2000:] + done.stderr[-3000:]
    if not in_study:
        assert "not interrupted: the training ended" in done.stderr
    client = client_of(store)
    (run,) = client.search_runs([client.get_experiment_by_name(exp["experiment"]).experiment_id])
    assert run.info.status == "FINISHED" and completed_epochs(last_checkpoint_of(run)) == KILL["max_epochs"]


def test_slurm_requeue_signal_checkpoints_the_epoch_and_requeues_the_job(store, tmp_path):
    """Inside a SLURM job, SIGUSR1 (``#SBATCH --signal=USR1@180``) stops like SIGTERM and then runs
    ``scontrol requeue JOB``; here ``scontrol`` is a script on PATH that records its arguments (no SLURM)."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SLURM_ARRAY_JOB_ID", None)
    exp = {**store, "experiment": "slurm-requeue"}
    done = signal_child({**KILL, **exp}, "USR1", 1, 2, env=env)
    assert done.returncode == 128 + 10, done.stdout[-2000:] + done.stderr[-3000:]
    assert calls.read_text().split() == ["requeue", "4242"]
    assert "SLURM: job 4242 requeued" in done.stderr
    client = client_of(store)
    (killed,) = client.search_runs([client.get_experiment_by_name("slurm-requeue").experiment_id])
    assert killed.info.status == "KILLED"


FUSED = {**KILL, "limit_train_batches": None, "epoch_loop": "fused"}  # whole epochs, one Lightning step each


@pytest.fixture(scope="module")
def fused_reference(store):
    """An uninterrupted run of the fused kill-test configuration."""
    return train({**FUSED, **store, "experiment": "fused-reference"})


@pytest.mark.parametrize("phase,epoch,batch", [("step", 2, 5), ("epoch_end", 1, 0), ("val", 2, 0)])
def test_a_fused_run_killed_inside_an_epoch_resumes_bit_identical(store, fused_reference, phase, epoch, batch):
    reference = fused_reference
    exp = {**store, "experiment": f"kill-fused-{phase}-{epoch}-{batch}"}
    kill_child({**FUSED, **exp}, phase, epoch, batch)
    resumed = train({"resume": "latest", **exp, "progress": False})
    assert resumed["metrics"]["epochs"] == FUSED["max_epochs"]
    assert_same_run(reference, resumed, client_of(store))


AMORTISED = {**KILL, "generator": "amortised",
             "generator_options": "initial_epochs=2,refit_every=2,refit_epochs=1,max_fit_samples=300"}


def test_killed_and_resumed_amortised_run_is_bit_identical(store):
    """A learning generator's network, optimiser and fit schedule travel in the checkpoint."""
    reference = train({**AMORTISED, **store, "experiment": "amortised-reference"})
    exp = {**store, "experiment": "kill-amortised"}
    kill_child({**AMORTISED, **exp}, "train", 2, 3)
    resumed = train({"resume": "latest", **exp})
    assert_same_run(reference, resumed, client_of(store))


def test_data_order_and_epoch_seeds_are_pure_functions_of_seed_and_epoch():
    from ct_lightning.callbacks import epoch_seed
    from datamodules.base import EpochSeededSampler

    sampler = EpochSeededSampler(range(50), seed=4)
    sampler.set_epoch(3)
    order = list(sampler)
    assert sorted(order) == list(range(50)) and list(sampler) == order
    again = EpochSeededSampler(range(50), seed=4)
    again.set_epoch(3)
    assert list(again) == order
    again.set_epoch(4)
    assert list(again) != order
    code = ("from ct_lightning.callbacks import epoch_seed; from datamodules.base import EpochSeededSampler as S; "
            "s = S(range(50), 4); s.set_epoch(3); print(epoch_seed(4, 3, 0), list(s))")
    outputs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                              env={**__import__("os").environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)}
    assert outputs == {f"{epoch_seed(4, 3, 0)} {order}\n"}, "the same in every process, whatever PYTHONHASHSEED"


def test_epoch_seed_seeds_python_numpy_and_torch_as_their_own_seed_calls_do():
    import random

    import numpy as np
    import torch

    from ct_lightning.callbacks import epoch_seed
    from ct_lightning.callbacks.epoch_seed import EpochSeed

    class AtEpoch:  # what EpochSeed reads of the trainer
        current_epoch, global_rank = 5, 1

    value = epoch_seed(7, 5, 1)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    torch.manual_seed(0)  # something else in between
    EpochSeed(7).on_train_epoch_start(AtEpoch(), None)
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == expected[:2] and torch.equal(drawn[2], expected[2])


def test_resume_skips_a_run_killed_before_its_first_checkpoint(store, tmp_path):
    exp = {**store, "experiment": "orphans"}
    kill_child({**KILL, **exp}, "train", 2, 1)       # resumable: checkpoints of epochs 0 and 1
    kill_child({**KILL, **exp}, "train", 0, 2)       # newer, killed before any checkpoint
    client = client_of(store)
    orphan, resumable = client.search_runs([client.get_experiment_by_name("orphans").experiment_id],
                                           order_by=["attributes.start_time DESC"])
    assert orphan.info.status == "RUNNING" and not (Path(orphan.data.tags["ct.checkpoint_dir"]) / "last.ckpt").exists()
    recipe = load_recipe("train")
    with pytest.raises(SystemExit, match=f"resume: run {orphan.info.run_id} has no checkpoint"):
        recipe.main(["--resume", orphan.info.run_id, "--tracking-uri", store["tracking_uri"], "--experiment",
                     "orphans"])
    lines = []
    resumed = train({"resume": "latest", **exp}, echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert resumed["run_id"] == resumable.info.run_id
    assert any(f"skipping run {orphan.info.run_id}" in line and "no checkpoint" in line for line in lines)
    assert any(f"resume: run {resumable.info.run_id}" in line for line in lines), "says which run it picked"
    assert client.get_run(orphan.info.run_id).info.status == "RUNNING", "the orphan is left as it was"


def test_resume_with_max_epochs_extends_or_refuses(store, reference):
    recipe = load_recipe("train")
    common = ["--tracking-uri", store["tracking_uri"], "--experiment", "reference"]
    with pytest.raises(SystemExit, match="already trained all 4 epochs; pass --max-epochs N"):
        recipe.main(["--resume", reference["run_id"], *common])
    with pytest.raises(SystemExit, match="max[-_]epochs: 3 with --resume must exceed the 4 epochs"):
        recipe.main(["--resume", reference["run_id"], "--max-epochs", "3", *common])
    with pytest.raises(SystemExit, match="--lr cannot change when resuming"):
        recipe.main(["--resume", reference["run_id"], "--lr", "0.1", "--max-epochs", "6", *common])
    # Extending in place changes the reference run, so extend a copy: a new run trained to 4 epochs.
    base = train({**KILL, **store, "experiment": "extend"})
    extended = train({"resume": base["run_id"], "max_epochs": 5, **store, "experiment": "extend"})
    assert extended["run_id"] == base["run_id"] and extended["metrics"]["epochs"] == 5
    client = client_of(store)
    assert client.get_run(base["run_id"]).data.tags["ct.max_epochs_extended_to"] == "5"
    steps = {m.step for m in client.get_metric_history(base["run_id"], "train/loss")}
    assert steps == {0, 1, 2, 3, 4}


# ---------------------------------------------------------------------------------------------- MLflow UI
def test_mlflow_ui_names_tags_model_datasets_and_epoch_steps(store, tmp_path):
    import random

    exp = {**store, "experiment": "ui"}
    runs = []
    for seed in (0, 0, 1):
        random.seed(0)  # seeding Python's random fixed MLflow's name generator: names must still differ
        runs.append(train({**TINY, **exp, "seed": seed, "objective": "vanilla" if seed else "full"}))
    names = [r["run_name"] for r in runs]
    assert len(set(names)) == 3, names
    assert names[0].startswith("moons-full-ecco-s0-") and names[2].startswith("moons-vanilla-s1-")
    named = train({**TINY, **exp, "max_epochs": 1, "run_name": "my-run", "immutable": ["x1"]})
    assert named["run_name"] == "my-run"
    # the constraints in one tag, alike for runs with and without them (the params differ in their columns)
    constraints = {r["run_id"]: client_of(store).get_run(r["run_id"]).data.tags.get("ct.constraints")
                   for r in (runs[0], named)}
    assert constraints == {runs[0]["run_id"]: "every feature mutable; within the data domain",
                           named["run_id"]: "immutable: x1; within the data domain"}

    client = client_of(store)
    experiment = client.get_experiment_by_name("ui")
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    run = client.get_run(runs[0]["run_id"])
    tags = run.data.tags
    assert (tags["data"], tags["objective"], tags["generator"]) == ("moons", "full", "ecco")
    assert tags["ct_lightning.version"] and tags["mlflow.runName"] == names[0]

    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"moons-train", "moons-test"}
    train_set = inputs["moons-train"]
    assert {t.key: t.value for t in train_set.tags}["mlflow.data.context"] == "train"
    schema = json.loads(train_set.dataset.schema)["mlflow_colspec"]
    assert [c["name"] for c in schema] == ["x1", "x2", "label"]
    # The schema taken from a few rows is MLflow's own inference over the whole split.
    import mlflow.data
    import pandas as pd

    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.settings import resolve_config

    moons = build_datamodule(resolve_config({"data": "moons"}))
    frame = pd.DataFrame(moons.x_train.numpy(), columns=["x1", "x2"]).assign(label=moons.y_train.numpy())
    assert schema == mlflow.data.from_pandas(frame, targets="label").schema.to_dict()
    assert train_set.dataset.digest and train_set.dataset.source

    history = client.get_metric_history(runs[0]["run_id"], "train/loss")
    assert sorted(m.step for m in history) == [0, 1], "per-epoch metrics are logged against the epoch"
    artifacts = {a.path for a in client.list_artifacts(runs[0]["run_id"], "plots")}
    assert artifacts == {"plots/decision_boundary.png", "plots/mature_counterfactuals.png"}

    mlflow.set_tracking_uri(store["tracking_uri"])
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{runs[0]['run_id']}/model")
    x = np.random.default_rng(0).normal(size=(7, 2)).astype(np.float32)
    checkpoint = load_checkpoint(runs[0]["checkpoints"]["last"])
    with torch.no_grad():
        expected = checkpoint(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.asarray(pyfunc.predict(x)), expected)

    # fine-tuning from the logged model and from the registry
    version = mlflow.register_model(f"runs:/{runs[0]['run_id']}/model", "ct-moons")
    for uri in (f"runs:/{runs[0]['run_id']}/model", f"models:/ct-moons/{version.version}"):
        first = FirstWeights()
        tuned = train({**TINY, **exp, "max_epochs": 1, "from_checkpoint": uri}, callbacks=[first])
        assert tuned["config"]["hidden_sizes"] == [32]
        for key, value in checkpoint.model.state_dict().items():
            assert torch.equal(first.state[key], value), (uri, key)
    with pytest.raises(ValueError, match="from_checkpoint: cannot load MLflow model runs:/nope/model"):
        train({**TINY, **exp, "from_checkpoint": "runs:/nope/model"})


def test_the_constraints_tag_says_a_tables_steps_and_largest_changes_as_its_start_up_lines_do(store, tmp_path):
    """A data spec's ``step``, ``max_change`` and bounds read from other columns hold in the training's searches: the
    ``ct.constraints`` tag names them in the words of the start-up lines (an ordinal column's in places of its order),
    beside the mutability."""
    import pandas as pd
    import yaml

    frame = pd.read_csv(ROOT / "tests" / "fixtures" / "loans.csv")
    frame["grade"] = np.array(list("ABCDE"), dtype=object)[np.arange(len(frame)) % 5]
    frame.to_csv(tmp_path / "graded.csv", index=False)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"columns": {
        "income": {"step": 1000, "max_change": 10000}, "age": {"mutability": "none"},
        "years_employed": {"upper": "age - 16"},
        "grade": {"kind": "ordinal", "order": list("ABCDE"), "max_change": 2, "step": 1}}}))
    run = train({**store, "experiment": "steps", "data": str(tmp_path / "graded.csv"), "target": "approved",
                 "data_spec": str(tmp_path / "spec.yaml"), "max_epochs": 1, "limit_train_batches": 2, "nce": 16,
                 "progress": False})
    assert client_of(store).get_run(run["run_id"]).data.tags["ct.constraints"] == (
        "immutable: age; income in steps of 1000, changing by at most 10000; years_employed at most age − 16; grade in "
        "steps of 1 place, changing by at most 2 places; within the data domain")


class FirstWeights(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}


def test_one_ensure_experiment_creates_once_and_tags(tmp_path):
    from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    artifacts = prepare_store(uri)
    client = MlflowClient(tracking_uri=uri)
    made_elsewhere = client.create_experiment("plain")  # e.g. by another tool: no kind tag yet
    assert ensure_experiment(client, "plain") == made_elsewhere
    created = ensure_experiment(client, "new", artifacts)
    assert ensure_experiment(client, "new", artifacts) == created
    assert prepare_store(uri, "third") == artifacts
    for name in ("plain", "new", "third"):
        assert client.get_experiment_by_name(name).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert client.get_experiment(created).artifact_location == artifacts


def test_atomic_writes_leave_a_whole_file_or_the_old_one(tmp_path):
    from ct_lightning.experiment.runs.atomic_files import atomic_file, write_text_atomic

    target = tmp_path / "out" / "table.md"
    write_text_atomic(target, "first")
    assert target.read_text() == "first" and target.stat().st_mode & 0o777 == 0o644
    with pytest.raises(RuntimeError), atomic_file(target) as temporary:
        temporary.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "first" and [p.name for p in target.parent.iterdir()] == ["table.md"]
