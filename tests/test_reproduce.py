"""The resumable reproduction behind ``recipes/compare.py --data``: keys, stored evaluations, kill and resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from preloaded import run_script, start_script

from ct_lightning.experiment.studies.reproduce import (CONFIG_KEY_TAG, load_evaluation, save_evaluation, stable_key,
                                               training_key)

ROOT = Path(__file__).resolve().parents[1]


def test_training_key_ignores_where_a_run_writes_but_not_what_it_trains():
    config = {"data": "moons", "objective": "full", "lambda_reg": 0.25, "tracking_uri": "sqlite:///a.db",
              "run_name": "x", "checkpoint_dir": "/tmp/a", "progress": True}
    moved = {**config, "tracking_uri": "sqlite:///b.db", "run_name": "y", "checkpoint_dir": "/tmp/b",
             "progress": False}
    assert training_key(config) == training_key(moved)
    assert training_key(config) != training_key({**config, "lambda_reg": 0.5})
    assert training_key(config) != training_key({**config, "objective": "vanilla"})
    assert stable_key({"a": 1, "b": 2}) == stable_key({"b": 2, "a": 1})


def test_evaluation_round_trip(tmp_path):
    from ct_lightning.evaluation import EvaluationConfig, evaluate_model

    torch.manual_seed(0)
    x = torch.randn(60, 2)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    config = EvaluationConfig(n_individuals=10, n_runs=2, lambda_energies=(0.5, 5.0), max_steps=5)
    result = evaluate_model(model, x, y, 2, config)
    loaded = load_evaluation(save_evaluation(result, tmp_path / "e.pt"))
    assert loaded.config == result.config
    for key, values in result.samples.items():
        np.testing.assert_array_equal(loaded.samples[key], values)
    for key, values in result.groups.items():
        np.testing.assert_array_equal(loaded.groups[key], values)
    assert torch.equal(loaded.counterfactuals, result.counterfactuals)
    assert loaded.summary() == result.summary()


def _compare_command(store: Path, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "recipes" / "compare.py"), "--data", "circles,moons", "--max-epochs", "2",
            "--n-runs", "1", "--n-individuals", "10", "--lambda-energy", "1", "--n-boot", "10",
            "--tracking-uri", f"sqlite:///{store}", "--out-dir", str(out)]


def _finished_training_keys(store: Path) -> Counter:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("ct-lightning")
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'")
    return Counter(run.data.tags[CONFIG_KEY_TAG] for run in runs if CONFIG_KEY_TAG in run.data.tags)


def test_killed_reproduction_resumes_without_retraining(tmp_path):
    store, out = tmp_path / "mlflow.db", tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Forked from the preloaded interpreter: one job, so every training runs in this one process (no workers).
    command = _compare_command(store, out)
    process = start_script(command[1], command[2:], env=env, cwd=tmp_path)
    done_lines, seen = 0, []
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        seen = process.output().splitlines(keepends=True)
        done_lines = sum("done]" in line and "trained+evaluated" in line for line in seen)
        if done_lines >= 3:
            break
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert done_lines >= 3, "the reproduction did not finish three models before the deadline"
    plan = "".join(seen[:next(i for i, line in enumerate(seen) if "done]" in line)])
    assert "compare plan: 8 models" in plan and "pass --no-actionability to skip it" in plan, \
        "says what it will train and why before it trains"
    assert plan.count(": train and evaluate (no run id given") == 8
    before = _finished_training_keys(store)
    assert 3 <= len(before) < 8 and set(before.values()) == {1}

    second = run_script(command[1], command[2:], env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    after = _finished_training_keys(store)
    assert len(after) == 8 and set(after.values()) == {1}, "a finished training was repeated"
    outcomes = Counter(re.findall(r"done\] \S+ (trained\+evaluated|evaluated|reused) in ", second.stdout))
    assert outcomes["trained+evaluated"] == 8 - len(before)
    assert outcomes["reused"] + outcomes["evaluated"] == len(before)
    assert "compare plan: 8 models" in second.stdout and second.stdout.count("reuse finished run") == len(before)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    parent = json.loads((out / "summary.json").read_text())["parent_run_id"]
    tags = client.get_run(parent).data.tags
    children = json.loads(tags["ct.children"])
    assert len(children) == 8 and tags["ct.child.circles.ct"] == children["circles/ct"]
    assert "compare-runs?runs=" in tags["mlflow.note.content"]
    child = client.get_run(children["circles/ct"]).data.tags
    assert child["mlflow.parentRunId"] == parent and child["role"] == "CT"
    table = (out / "table.md").read_text()
    assert "| circles |" in table and "| moons |" in table


def test_a_terminated_reproduction_stops_at_a_safe_point(tmp_path):
    """SIGTERM while a reproduction evaluates or trains: the task under way is finished and kept (or its training
    stops after its epoch), the parent run ends KILLED with the resume hint, exit 143, no traceback (raising in the
    middle of a store write had left the SQLite store locked for the clean-up in the grid's twin of this code)."""
    from mlflow.tracking import MlflowClient

    store, out = tmp_path / "mlflow.db", tmp_path / "out"
    process = subprocess.Popen(_compare_command(store, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path,
                               start_new_session=True)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if "done]" in line and "trained+evaluated" in line:
            break
    try:
        os.kill(process.pid, signal.SIGTERM)
        rest = process.communicate(timeout=300)[0]
    finally:
        os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    output = "".join(seen) + rest
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("ct-lightning").experiment_id
    (parent,) = [run for run in client.search_runs([experiment]) if "ct.children" in run.data.tags
                 or run.data.tags.get("ct.interrupted")]
    assert parent.info.status == "KILLED" and parent.data.tags["ct.interrupted"].startswith("SIGTERM")
    assert 1 <= len(_finished_training_keys(store)) < 8


def test_workers_die_with_the_reproduction(tmp_path):
    """Killing only the parent of a --jobs 2 reproduction must not leave workers training on."""
    store, out = tmp_path / "mlflow.db", tmp_path / "out"
    command = _compare_command(store, out) + ["--jobs", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path, start_new_session=True)
    for line in process.stdout:
        if line.startswith("started "):
            break
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    assert children, "no worker process was started"
    process.kill()  # the parent only, not its process group
    process.wait()
    deadline = time.monotonic() + 3  # a worker's task takes far longer; only a kill ends it this soon
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [pid for pid in children if Path(f"/proc/{pid}").exists()
                 and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]
    os.killpg(process.pid, signal.SIGKILL) if alive else None
    assert not alive, f"workers {alive} outlived the reproduction"
