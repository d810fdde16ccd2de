"""Sweeps: search spaces, the shared executor, and a tiny sweep end to end on Ray Tune into a real MLflow store."""

from __future__ import annotations

import importlib.util
import os

import pytest
from mlflow.tracking import MlflowClient

from ct_lightning.experiment.studies.executor import LocalExecutor, RayTuneExecutor
from ct_lightning.experiment.studies.sweep import SWEEP_KEY_TAG, combinations, parse_space, run_sweep

HAS_RAY = importlib.util.find_spec("ray") is not None
TINY = {"data": "circles", "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "max_steps": 3,
        "accelerator": "cpu", "experiment": "sweep-test"}


def test_parse_space_reads_values_with_the_settings_types():
    space = parse_space(["lambda_div=0.01,0.1", "nce=100,1000", "generator=ecco,revise", "hidden_sizes=32;64,64",
                         "protect=true,false"])
    assert space == {"lambda_div": [0.01, 0.1], "nce": [100, 1000], "generator": ["ecco", "revise"],
                     "hidden_sizes": [[32], [64, 64]], "protect": [True, False]}
    with pytest.raises(ValueError, match="param: unknown setting 'lambda_bogus'"):
        parse_space(["lambda_bogus=1"])
    with pytest.raises(ValueError, match="nce='x' cannot be read"):
        parse_space(["nce=x"])


def test_grid_and_random_combinations():
    space = {"a": [1, 2, 3], "b": ["x", "y"]}
    grid = combinations(space, "grid")
    assert len(grid) == 6 and {tuple(c.values()) for c in grid} == {(a, b) for a in (1, 2, 3) for b in "xy"}
    drawn = combinations(space, "random", num_samples=4, seed=1)
    assert len(drawn) == 4 and len({tuple(c.values()) for c in drawn}) == 4
    assert drawn == combinations(space, "random", num_samples=4, seed=1)  # reproducible, so resumable
    with pytest.raises(ValueError, match="search: 'bayes' is not allowed; allowed: grid, random"):
        combinations(space, "bayes")


def square_or_fail(x: int) -> dict:
    """Module level, so spawned workers can import it."""
    if x == 2:
        raise ValueError("two is not allowed")
    return {"square": x * x}


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_executor_reports_a_failure_and_goes_on(jobs):
    seen = []
    outcomes = LocalExecutor(jobs).run(square_or_fail, [1, 2, 3], ["one", "two", "three"], seen.append)
    assert sorted((o.index, o.label, o.result, o.error) for o in seen) == [
        (0, "one", {"square": 1}, None), (1, "two", None, "ValueError: two is not allowed"),
        (2, "three", {"square": 9}, None)]
    assert len(outcomes) == 3


def test_local_executor_fail_fast_raises_inline():
    with pytest.raises(ValueError, match="two is not allowed"):
        LocalExecutor(1, fail_fast=True).run(square_or_fail, [1, 2, 3], ["a", "b", "c"])


def check_sweep(uri: str, summary: dict, n_trials: int) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("sweep-test")
    parents = client.search_runs([experiment.experiment_id], f"tags.`{SWEEP_KEY_TAG}` != ''")
    assert [p.info.run_id for p in parents] == [summary["parent_run_id"]]
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{summary['parent_run_id']}'")
    assert len(children) == n_trials and all(c.info.status == "FINISHED" for c in children)
    for child in children:  # parameters and metrics per trial: what the MLflow UI's parallel coordinates show
        assert {"lambda_div", "nce"} <= set(child.data.params) and "val/acc" in child.data.metrics
    assert summary["best"] is not None and summary["best"]["objective"] == max(
        c.data.metrics["val/acc"] for c in children)
    tied = [t["trial"] for t in summary["trials"] if t["objective"] == summary["best"]["objective"]]
    assert summary["best"]["trial"] == min(tied), "ties go to the first trial, whatever order trials finished in"
    # Trials are not registered; the sweep registers its best trial's predictor once (also when it is resumed).
    versions = client.search_model_versions("name = 'ct-circles-ct'")
    assert [v.run_id for v in versions] == [summary["best"]["run_id"]]
    assert summary["registered"] == f"ct-circles-ct/{versions[0].version}"
    return children


def test_sweep_with_local_processes_resumes_and_reports_failures(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    base = {**TINY, "tracking_uri": uri}
    space = {"lambda_div": [0.1, 0.3], "nce": [16]}
    summary = run_sweep(base, space, LocalExecutor(1), echo=lambda *a, **k: None)
    assert summary["failures"] == [] and len(summary["trials"]) == 2
    check_sweep(uri, summary, 2)
    again = run_sweep(base, space, LocalExecutor(1), echo=lambda *a, **k: None)
    assert again["parent_run_id"] == summary["parent_run_id"] and all(t["reused"] for t in again["trials"])
    # generator_options are only checked when the generator is built: that trial fails inside training.
    failing = run_sweep({**base, "max_epochs": 1}, {"generator_options": ["bogus_option=1", None]},
                        LocalExecutor(1), echo=lambda *a, **k: None)
    assert [f["params"] for f in failing["failures"]] == [{"generator_options": "bogus_option=1"}]
    assert [t["params"] for t in failing["trials"]] == [{"generator_options": None}]


@pytest.mark.skipif(HAS_RAY, reason="Ray is installed here; the message for a missing Ray is checked without it")
def test_sweep_recipe_names_the_extra_when_ray_is_missing(tmp_path):
    from recipe_loader import load_recipe

    sweep = load_recipe("sweep")
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[sweep\]"'):
        sweep.main(["--param", "nce=10,20", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert not (tmp_path / "mlflow.db").exists()  # the error came before any work


@pytest.mark.skipif(not HAS_RAY, reason='Ray is not installed (pip install -e ".[sweep]"); the Ray Tune sweep '
                    'is tested where the extra is installed, as in CI')
def test_tiny_sweep_on_ray_tune_end_to_end_then_resumed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    space = {"lambda_div": [0.1, 0.5], "nce": [16, 32]}  # 2 x 2 grid
    executor = RayTuneExecutor(cpus=1, max_concurrent=2, storage_path=str(tmp_path / "ray"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    summary = run_sweep({**TINY, "tracking_uri": uri}, space, executor, echo=lambda *a, **k: None)
    assert summary["failures"] == [] and not any(t["reused"] for t in summary["trials"])
    children = check_sweep(uri, summary, 4)
    resumed = run_sweep({**TINY, "tracking_uri": uri}, space, RayTuneExecutor(storage_path=str(tmp_path / "ray")),
                        echo=lambda *a, **k: None)
    assert resumed["parent_run_id"] == summary["parent_run_id"] and all(t["reused"] for t in resumed["trials"])
    assert {t["run_id"] for t in resumed["trials"]} == {c.info.run_id for c in children}
    check_sweep(uri, resumed, 4)


@pytest.mark.slow
def test_sweep_recipe_on_a_table_file_with_a_relative_path(tmp_path):
    """``recipes/sweep.py --data loans.csv --target approved`` (issue 23 §1): trials in worker processes find the
    file although they run elsewhere, and every trial trains on the table."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "tests" / "fixtures" / "loans.csv", tmp_path / "loans.csv")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    done = subprocess.run([sys.executable, str(root / "recipes" / "sweep.py"), "--data", "loans.csv", "--target",
                           "approved", "--immutable", "age", "--executor", "local", "--param", "lambda_div=0.1,0.3",
                           "--max-epochs", "1", "--experiment", "sweep-test", "--tracking-uri", uri,
                           "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root), "MLFLOW_TRACKING_URI": ""})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep-test").experiment_id],
                              "tags.`mlflow.parentRunId` != ''")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    for run in runs:
        assert run.data.params["data"] == str(tmp_path / "loans.csv") and run.data.params["target"] == "approved"
