"""Stacked trainings (several CT trainings as one stacked model) against the same trainings run separately.

Real parts throughout: the library's own search and ``train()`` as the reference, a real MLflow SQLite store,
and the grid recipe in a separate process for the signal and the resume. Comparisons use a tolerance: the
batched kernels may round differently on another CPU (on this project's CI machines they agree bit for bit).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from preloaded import run_script, start_script

from ct_lightning.constraints import Constraints
from ct_lightning.generators import make_generator
from ct_lightning.generators.stacked_search import stacked_search
from ct_lightning.models import LeNet, build_mlp
from ct_lightning.training.stacked_model import StackedMLP

ROOT = Path(__file__).resolve().parents[1]


def _models(k: int, n_features: int = 3, hidden=(16, 8)) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [build_mlp(n_features, 3, hidden) for _ in range(k)]


def test_a_stacked_mlp_computes_what_its_members_compute():
    members = _models(4)
    stacked = StackedMLP(members)
    x = torch.randn(4, 50, 3)
    expected = torch.stack([member(x[k]) for k, member in enumerate(members)])
    torch.testing.assert_close(stacked(x), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(stacked.flat(x.flatten(0, 1)), expected.flatten(0, 1), atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        stacked.weights[0][2].add_(1.0)  # only member 2 changes
    fresh = _models(4)
    stacked.write_to(fresh)
    assert torch.equal(fresh[2][0].weight, members[2][0].weight + 1.0)
    assert all(torch.equal(fresh[k][0].weight, members[k][0].weight) for k in (0, 1, 3))


def test_a_stack_takes_equally_shaped_mlps_only():
    with pytest.raises(ValueError, match="one shape"):
        StackedMLP([build_mlp(3, 2, [8]), build_mlp(3, 2, [16])])
    with pytest.raises(ValueError, match="build_mlp"):
        StackedMLP([LeNet(784, 10)])


@pytest.mark.parametrize("generator", ["ecco", "generic"])
def test_a_stacked_search_finds_what_separate_searches_find(generator):
    members = _models(4, hidden=(32,))
    stacked = StackedMLP(members)
    n = 150
    torch.manual_seed(1)
    x = torch.randn(4 * n, 3)
    target = torch.randint(0, 3, (4 * n,))
    generators = [make_generator(generator, 0.001 * (k + 1), [5.0, 0.5, 20.0, 0.1][k], [0.25, 1.0, 0.1, 0.5][k])
                  for k in range(4)]
    taus = [0.4, 0.5, 0.6, 0.45]
    lower, upper = torch.full((3,), -2.5), torch.full((3,), 2.5)
    mutability = torch.tensor([0, 0, 3])  # the third feature may not move
    result = stacked_search(stacked, generators, x, target, taus, 30, 0.3, Constraints(mutability, lower, upper))
    assert 0.1 < result.converged.float().mean() < 1.0  # some rows converge, some use every step
    for k in range(4):
        rows = slice(k * n, (k + 1) * n)
        alone = generators[k].generate(members[k], x[rows], target[rows], taus[k], 30, 0.3, mutability, lower, upper)
        same_path = (alone.steps == result.steps[rows]) & (alone.converged == result.converged[rows])
        assert same_path.float().mean() >= 0.99, k
        torch.testing.assert_close(result.counterfactual[rows][same_path], alone.counterfactual[same_path],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(result.nascent[rows][same_path], alone.nascent[same_path], atol=1e-4, rtol=1e-4)
        assert torch.equal(result.counterfactual[rows][:, 2], x[rows][:, 2])


POINTS = [{"lambda_div": 0.5, "lambda_reg": 0.1, "tau": 0.75, "lambda_energy": 5.0, "search_lr": 0.25},
          {"lambda_div": 0.1, "lambda_reg": 0.5, "tau": 0.9, "lambda_energy": 0.5, "search_lr": 1.0, "lambda_adv": 1.0},
          {"lambda_div": 1.0, "lambda_reg": 0.01, "tau": 0.95, "lambda_energy": 20.0, "search_lr": 0.1,
           "lambda_cost": 0.01}]
COMPARED = ("train/loss", "train/div", "train/ridge", "train/adv", "train/acc", "train/cf_converged", "train/cf_steps",
            "val/loss", "val/acc", "test/acc")


@pytest.mark.parametrize("generator", ["ecco", "revise"])
def test_a_stack_trains_what_separate_trainings_train(tmp_path, generator):
    """ECCo's pools are searched as one; REVISE's one model at a time (its lone search), with the steps stacked."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.runs.stacked_train import STACK_TAG, train_stack
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = {"data": "moons", "max_epochs": 4, "nce": 90, "progress": False, "tracking_uri": uri, "experiment": "stk",
            "generator": generator}
    if generator == "revise":  # a small VAE, trained once and then loaded from the cache by every training
        base["generator_options"] = f"latent_dim=2,vae_epochs=2,cache_dir={tmp_path / 'vae'}"
    else:  # the first epoch trains conventionally (burn-in), the other three with CT
        base["burnin"] = 0.25
    alone = [train({**base, **point}) for point in POINTS]
    stacked = train_stack([{**base, **point} for point in POINTS], [{"role": "stacked"}] * 3)
    client = MlflowClient(tracking_uri=uri)
    for k, (a, b) in enumerate(zip(alone, stacked)):
        run_a, run_b = client.get_run(a["run_id"]), client.get_run(b["run_id"])
        assert run_b.info.status == "FINISHED" and run_b.data.tags[STACK_TAG] == f"{k + 1}/3"
        assert run_b.data.tags["role"] == "stacked"
        assert run_a.data.params == run_b.data.params  # the same settings, logged the same way
        listing = lambda run_id: sorted(f.path for f in client.list_artifacts(run_id, "checkpoints"))  # noqa: E731
        assert listing(a["run_id"]) == listing(b["run_id"]) == ["checkpoints/best.ckpt", "checkpoints/last.ckpt"]
        for which in ("last", "best"):
            weights_a = load_run(a["run_id"], uri, which).module.state_dict()
            weights_b = load_run(b["run_id"], uri, which).module.state_dict()
            assert weights_a.keys() == weights_b.keys()
            for name in weights_a:
                torch.testing.assert_close(weights_b[name], weights_a[name], atol=1e-4, rtol=1e-4)
        with pytest.raises(ValueError, match="trained in a stack .*--from-checkpoint runs:/"):
            train({"resume": b["run_id"], "max_epochs": 8, "tracking_uri": uri, "experiment": "stk"})
        for metric in COMPARED:
            history_a = [m.value for m in sorted(client.get_metric_history(a["run_id"], metric), key=lambda m: m.step)]
            history_b = [m.value for m in sorted(client.get_metric_history(b["run_id"], metric), key=lambda m: m.step)]
            assert len(history_a) == len(history_b) > 0, metric
            torch.testing.assert_close(torch.tensor(history_b), torch.tensor(history_a), atol=1e-4, rtol=1e-3,
                                       msg=lambda text: f"{metric}: {text}")


def test_trainings_that_differ_in_what_shapes_the_loop_cannot_stack(tmp_path):
    from ct_lightning.experiment.runs.stacked_train import train_stack

    base = {"data": "moons", "max_epochs": 1, "progress": False, "tracking_uri": f"sqlite:///{tmp_path}/m.db"}
    with pytest.raises(ValueError, match="stack: .*differs from training 0 in nce"):
        train_stack([{**base, "nce": 50}, {**base, "nce": 60}])
    with pytest.raises(ValueError, match="stack: .*pool 'step'"):
        train_stack([{**base, "pool": "step"}, {**base, "pool": "step", "tau": 0.9}])
    with pytest.raises(ValueError, match="stack: .*generator 'amortised'"):
        train_stack([{**base, "generator": "amortised"}, {**base, "generator": "amortised", "tau": 0.9}])


def test_grid_jobs_are_stacked_by_what_they_share():
    from ct_lightning.experiment.studies.grids import load_grid, plan, stack_key, work_items
    from ct_lightning.stacked import PER_MODEL

    _, models = plan(load_grid("note5"), ["moons"], "sqlite:///unused.db", "x")
    jobs = list(models.values())
    assert [job for job in work_items(jobs, 1)] == jobs
    items = work_items(jobs, 64)
    stacks = [item for item in items if isinstance(item, list)]
    alone = [item for item in items if not isinstance(item, list)]
    # 45 CT trainings per generator differ only in λ_adv, λ_div, λ_reg: they stack; the one BL trains alone.
    assert sorted(len(stack) for stack in stacks) == [45, 45, 45]
    assert len(alone) == 1
    for stack in stacks:
        shared = {json.dumps({k: v for k, v in job.overrides.items() if k not in PER_MODEL}, sort_keys=True)
                  for job in stack}
        assert len(shared) == 1 and len({stack_key(job) for job in stack}) == 1
    assert all(len(item) <= 10 for item in work_items(jobs, 10) if isinstance(item, list))
    assert sum(len(item) if isinstance(item, list) else 1 for item in work_items(jobs, 10)) == len(jobs)


def test_grid_stacks_are_split_to_keep_every_worker_busy():
    from ct_lightning.experiment.studies.grids import load_grid, plan, stack_cost, work_items

    _, models = plan(load_grid("note5"), ["moons", "circles"], "sqlite:///unused.db", "x")
    jobs = list(models.values())
    items = work_items(jobs, 64, workers=2)
    # Per data set: its BL first, then the three stacks of 45, one split in two (four stacks: two per worker).
    for data, part in (("moons", items[:5]), ("circles", items[5:])):
        assert not isinstance(part[0], list) and part[0].overrides["objective"] == "vanilla" and part[0].data == data
        assert sorted(len(stack) for stack in part[1:]) == [22, 23, 45, 45]
        assert all(job.data == data for stack in part[1:] for job in stack)
    flat = [job for item in items for job in (item if isinstance(item, list) else [item])]
    assert sorted(job.label for job in flat) == sorted(job.label for job in jobs)  # each job exactly once
    assert len(work_items(jobs, 64, workers=3)) == 2 * 4  # three stacks per data set fit three workers as they are
    # Five workers: the fullest stack is split each time, until the data set has five.
    moons = [item for item in work_items(jobs, 64, workers=5) if isinstance(item, list) and item[0].data == "moons"]
    assert sorted(len(stack) for stack in moons) == [22, 22, 23, 23, 45]
    # Note 9 on one data set: one stack of 9 is split in two for two workers; the larger part goes first.
    _, models = plan(load_grid("note9"), ["moons"], "sqlite:///unused.db", "x")
    stacks = [item for item in work_items(list(models.values()), 64, workers=2) if isinstance(item, list)]
    assert [len(stack) for stack in stacks] == [5, 4]
    assert stack_cost(stacks[0]) > stack_cost(stacks[1])
    # Note 3's stacks differ in T: the most search steps first.
    _, models = plan(load_grid("note3"), ["moons"], "sqlite:///unused.db", "x")
    stacks = [item for item in work_items(list(models.values()), 64, workers=2) if isinstance(item, list)]
    steps = [stack[0].overrides["max_steps"] for stack in stacks]
    assert steps == sorted(steps, reverse=True) and len(stacks) % 2 == 0


STACKED_GRID = """name: stacked
title: a stacked test grid
data: [moons]
base:
  nce: 20
space:
  lambda_div: [0.1, 0.5, 1.0]
  objective: [full, vanilla]
evaluation:
  lambda_energy: [5.0]
"""


def _grid_command(grid: Path, out: Path, epochs: int) -> list[str]:
    return [str(ROOT / "recipes" / "appendix.py"), "--grid", str(grid), "--max-epochs", str(epochs), "--n-runs", "1",
            "--n-individuals", "6", "--tracking-uri", f"sqlite:///{out}/mlflow.db", "--out-dir", str(out)]


def test_a_stacked_grid_stops_on_a_signal_and_resumes(tmp_path):
    from mlflow.tracking import MlflowClient

    grid = tmp_path / "stacked.yaml"
    grid.write_text(STACKED_GRID)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    command = _grid_command(grid, tmp_path, 60)
    started = start_script(command[0], command[1:], cwd=tmp_path, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and started.poll() is None and "stack of 3 trainings" not in started.output():
        time.sleep(0.2)
    assert started.poll() is None, started.output()[-3000:]
    time.sleep(1.0)  # inside the stack's epochs
    os.kill(started.pid, signal.SIGTERM)
    done = started.wait(300)
    assert done.returncode == 128 + signal.SIGTERM, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("ct-appendix").experiment_id
    finished = client.search_runs([experiment], "tags.`ct.role` = 'grid-model' and attributes.status = 'FINISHED'")
    assert [r.data.tags["objective"] for r in finished] == ["vanilla"]  # the BL ran first; the stack left nothing
    # One CT point trained alone meanwhile (as a --stack 1 run would): the re-run reuses it and stacks the other two.
    from ct_lightning.experiment.runs.train import train
    from ct_lightning.experiment.studies.grids import _training_tags, load_grid, plan

    _, jobs = plan(load_grid(str(grid)), ["moons"], f"sqlite:///{tmp_path}/mlflow.db", "ct-appendix",
                   extra={"max_epochs": 60}, n_runs=1, n_individuals=6)
    key, job = next((k, j) for k, j in jobs.items() if j.overrides["objective"] == "full")
    train(job.training_overrides(), tags=_training_tags(job, key))
    done = run_script(command[0], command[1:], cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stack of 2 trainings" in done.stdout and "stack: run 2/2 written" in done.stdout
    assert "Downloading artifacts" not in done.stderr  # reused points are read without MLflow's progress bars
    assert done.stdout.count(" evaluated\n") >= 2  # the stack's models are evaluated one by one, each said
    results = json.loads((tmp_path / "stacked.json").read_text())
    assert results["n_models"] == 4 and len(results["models"]) == 4 and not results["failures"]
    assert not results["models"][key]["trained"]  # reused, not trained again
    finished = client.search_runs([experiment], "tags.`ct.role` = 'grid-model' and attributes.status = 'FINISHED'")
    assert sorted(r.data.tags.get("ct.stack", "alone") for r in finished) == ["1/2", "2/2", "alone", "alone"]
    assert len({r.data.tags["ct.config_key"] for r in finished}) == 4
    # Grid models log the classifier only (no serving predictor) and stay out of the Model Registry (hundreds of
    # points per data set).
    assert all({m.name for m in client.search_logged_models([experiment]) if m.source_run_id == r.info.run_id}
               == {"model"} for r in finished)
    assert client.search_registered_models() == []


def test_a_stack_keeps_the_feature_types_of_its_data(tmp_path):
    """Credit has one-hot groups: every search step must end at a valid point in a stack as alone (a stack that
    searched without the types trained other weights: 0.02 apart after one epoch on the full credit set)."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.settings import resolve_config
    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.runs.stacked_train import train_stack
    from ct_lightning.experiment.runs.train import train
    from ct_lightning.constraints import resolve_feature_types

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = {"data": "small_credit:SmallCredit", "max_epochs": 2, "nce": 60, "progress": False,
            "tracking_uri": uri, "experiment": "stk"}
    datamodule = build_datamodule(resolve_config(base))
    types = resolve_feature_types(datamodule, list(datamodule.feature_names), int(datamodule.n_features))
    assert types.groups and types.integers  # the check below would hold without types too
    points = [{"tau": 0.5}, {"tau": 0.9, "lambda_reg": 0.5}]
    alone = [train({**base, **point}) for point in points]
    stacked = train_stack([{**base, **point} for point in points])
    for a, b in zip(alone, stacked):
        weights_a = load_run(a["run_id"], uri, "last").module.state_dict()
        weights_b = load_run(b["run_id"], uri, "last").module.state_dict()
        for name in weights_a:
            torch.testing.assert_close(weights_b[name], weights_a[name], atol=1e-5, rtol=1e-5)
