"""CTModule under 2-process CPU DDP (gloo): the paper's pool semantics, global metrics, shared generators, checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ct_lightning.module import CTModule

ROOT = Path(__file__).resolve().parents[1]
import ddp_worker  # noqa: E402  (the script the DDP processes run; tests/helpers)


def run_ddp(tmp_path: Path, generator: str) -> list[dict]:
    """Run ``tests/helpers/ddp_worker.py`` (Lightning starts the second rank) and read both ranks' records."""
    out = tmp_path / generator
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "ddp_worker.py"), str(out), generator], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # rank 1 printed rank 0's announcement from a summary without a run (KeyError 'tracking_uri'): the run passed only
    # where rank 0 was done before rank 1 failed, else the launcher killed it (-9)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)], out


def test_rank_slices_partition_the_global_pool():
    for n in range(0, 23):
        for world in range(1, 5):
            parts = [list(range(n))[CTModule.rank_slice(n, world, rank)] for rank in range(world)]
            assert sum(parts, []) == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.fixture(scope="module")
def ecco_run(tmp_path_factory):
    return run_ddp(tmp_path_factory.mktemp("ddp"), "ecco")


def test_pool_is_split_across_ranks(ecco_run):
    ranks, _ = ecco_run
    assert [r["world"] for r in ranks] == [2, 2]
    n_epochs = len(ranks[0]["epochs"])
    for epoch in range(n_epochs):
        first, second = (set(r["epochs"][epoch]["factuals"]) for r in ranks)
        sizes = [len(r["epochs"][epoch]["factuals"]) for r in ranks]
        assert sum(sizes) == ddp_worker.NCE and sorted(sizes) == [30, 31]
        assert not first & second, "ranks drew the same factuals"
        # One global permutation seeded by (seed, epoch), independent of the rank, sliced by rank.
        rng = torch.Generator().manual_seed(hash((ddp_worker.SEED, epoch, 0)) % (2**63))
        expected = torch.randperm(ddp_worker.N_TRAIN, generator=rng)[:ddp_worker.NCE].tolist()
        assert ranks[0]["epochs"][epoch]["factuals"] + ranks[1]["epochs"][epoch]["factuals"] == expected
    # The counted counterfactuals of an epoch, as logged, are the global nce.
    assert all(r["metrics"]["train/cf_count"] == ddp_worker.NCE for r in ranks)


def test_logged_epoch_metrics_are_global(ecco_run):
    ranks, _ = ecco_run
    last = [r["epochs"][-1] for r in ranks]
    global_loss = sum(e["loss_sum"] for e in last) / sum(e["n"] for e in last)
    local_losses = [e["loss_sum"] / e["n"] for e in last]
    assert abs(local_losses[0] - local_losses[1]) > 1e-6  # otherwise the check below could not fail
    for r in ranks:
        assert r["metrics"]["train/loss"] == pytest.approx(global_loss, rel=1e-5)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


def test_ddp_checkpoint_fine_tunes_on_one_process(ecco_run):
    _, out = ecco_run
    module = CTModule.load_from_checkpoint(str(out / "last.ckpt"), weights_only=True)
    before = [p.detach().clone() for p in module.parameters()]
    x, y = ddp_worker.data()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32))
    assert trainer.callback_metrics["train/cf_count"] == ddp_worker.NCE  # the full pool on one process
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


@pytest.mark.parametrize("generator", ["revise", "amortised"])
def test_learned_generators_are_fitted_once_and_shared(tmp_path, generator):
    ranks, _ = run_ddp(tmp_path, generator)
    for epoch in range(len(ranks[0]["epochs"])):
        fingerprints = [r["epochs"][epoch]["generator_fingerprint"] for r in ranks]
        assert fingerprints[0] == fingerprints[1]
        if generator == "amortised":  # fitted on rank 0 only: rank 1 reports rank 0's measured fit time
            seconds = [r["epochs"][epoch]["generator_fit_seconds"] for r in ranks]
            assert seconds[0] > 0 and seconds[0] == seconds[1]
    assert ranks[0]["metrics"]["train/cf_count"] == ddp_worker.NCE


def test_train_recipe_runs_ddp_on_two_processes_into_one_mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), "--data", "moons", "--accelerator",
                           "cpu", "--devices", "2", "--strategy", "ddp", "--max-epochs", "2", "--nce", "40",
                           "--max-steps", "3", "--limit-train-batches", "3", "--limit-val-batches", "2",
                           "--no-progress", "--tracking-uri", uri, "--summary-json", str(tmp_path / "summary.json")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("ct-lightning").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # rank 1 logged nothing of its own
    run = runs[0]
    assert run.data.metrics["train/cf_count"] == 40 and run.data.params["devices"] == "2"
    assert "checkpoints/last.ckpt" in {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert json.loads((tmp_path / "summary.json").read_text())["run_id"] == run.info.run_id
