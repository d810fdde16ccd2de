"""One tracking store, many writers: concurrent trainings into a fresh SQLite store, and a real MLflow server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from preloaded import Started, start_script
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
N_WRITERS = 8
EPOCHS = 2
EXPECTED = {"train/loss", "train/clf", "train/div", "train/cf_count", "val/acc", "val/loss", "fit_seconds"}


def start_trainings(tracking_uri: str, n: int, tmp_path: Path) -> list[Started]:
    """``n`` tiny ``recipes/train.py`` processes, started at once, all tracking to ``tracking_uri``.

    Each is forked from an interpreter that has imported the libraries already (``tests/helpers/preloaded.py``),
    so the ``n`` processes reach the store within a second of each other, closer together than fresh
    interpreters that spend 5-15 s importing do."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    processes = []
    for i in range(n):
        command = ["--data", "circles", "--max-epochs",
                   str(EPOCHS), "--limit-train-batches", "2", "--limit-val-batches", "1", "--nce", "16",
                   "--max-steps", "3", "--accelerator", "cpu", "--no-progress", "--seed", str(i), "--run-name",
                   f"writer-{i}", "--tracking-uri", tracking_uri, "--experiment", "many-writers",
                   "--checkpoint-dir", str(tmp_path / "checkpoints" / str(i))]
        processes.append(start_script(ROOT / "recipes" / "train.py", command, env=env, cwd=tmp_path))
    return processes


def check_runs(tracking_uri: str, processes: list[Started]) -> None:
    """Every process finished, and the store holds one FINISHED run per process with all its metrics."""
    done = [p.wait(timeout=900) for p in processes]
    failed = [(i, d.stdout[-1000:] + d.stderr[-1000:]) for i, d in enumerate(done) if d.returncode != 0]
    assert not failed, f"{len(failed)} of {len(processes)} trainings failed; first: {failed[0]}"
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("many-writers")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    assert sorted(r.info.run_name for r in runs) == sorted(f"writer-{i}" for i in range(len(processes)))
    for run in runs:
        assert run.info.status == "FINISHED"
        assert EXPECTED <= set(run.data.metrics), sorted(EXPECTED - set(run.data.metrics))
        assert len(client.get_metric_history(run.info.run_id, "train/loss")) == EPOCHS


def test_many_writers_start_at_once_into_a_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    assert not (tmp_path / "store").exists()
    check_runs(uri, start_trainings(uri, N_WRITERS, tmp_path))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` with a SQLite database backend and an artifact root, on a free localhost port."""
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    if mlflow is None:
        pytest.skip("the mlflow command is not installed beside this Python")
    port = _free_port()
    server = subprocess.Popen([mlflow, "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                               "--artifacts-destination", str(tmp_path / "server-artifacts"),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            pytest.skip(f"mlflow server could not start: {server.stdout.read()[-500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(1)
    else:
        server.kill()
        pytest.skip("mlflow server did not listen within 120 s")
    yield uri
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def test_trainings_log_to_a_real_mlflow_server(mlflow_server, tmp_path):
    check_runs(mlflow_server, start_trainings(mlflow_server, 3, tmp_path))
    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.search_runs([client.get_experiment_by_name("many-writers").experiment_id], max_results=1)[0]
    # Artifacts go through the server to its artifact root.
    assert "checkpoints/last.ckpt" in {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
