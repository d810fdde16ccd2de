"""A tracking server that goes away during training, for longer than MLflow's retry budget (issue 26 §2).

A real ``mlflow server`` process is stopped at the start of a given epoch by a test callback (and, in the
first test, started again on the same port and database two epochs later). The training must go on, and
in the end the server must hold every epoch's metrics once, with the run's artifacts, either directly
(server back before the end) or after the printed upload command (server back only after the end).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from preloaded import run_script

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 6
PER_EPOCH = ("train/loss", "train/clf", "val/acc", "val/loss")


class MlflowServer:
    """``mlflow server`` on a fixed port, SQLite backend and artifact root in a folder: stoppable and restartable."""

    def __init__(self, folder: Path):
        self.folder, self.port, self.process = folder, _free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"
        self.executable = Path(sys.executable).parent / "mlflow"

    def start(self, wait: float = 120.0) -> None:
        """Start the server and wait until it answers ``/health``."""
        import urllib.request

        self.process = subprocess.Popen(
            [str(self.executable), "server", "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}",
             "--artifacts-destination", str(self.folder / "server-artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + wait
        while time.time() < deadline:
            assert self.process.poll() is None, "mlflow server exited while starting"
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"mlflow server did not answer within {wait} s")

    def stop(self) -> None:
        """Stop the server and its workers (the whole process group) and wait until the port is closed."""
        if self.process is None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                time.sleep(0.2)
            except OSError:
                return


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerOutage(L.Callback):
    """At the start of epoch ``stop_at`` the server is stopped; at the start of ``restart_at`` (if given) it is
    started again, no sooner than ``min_down`` seconds after it stopped (longer than the retry budget the tests
    give MLflow). Each epoch first sends the metrics waiting in the logger, so writes meet the outage."""

    def __init__(self, server: MlflowServer, stop_at: int, restart_at: int | None = None, min_down: float = 8.0):
        self.server, self.stop_at, self.restart_at, self.min_down = server, stop_at, restart_at, min_down
        self.down_seconds = None
        self._stopped = None

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.stop_at:
            self.server.stop()
            self._stopped = time.monotonic()
        if trainer.current_epoch == self.restart_at:
            time.sleep(max(0.0, self.min_down - (time.monotonic() - self._stopped)))
            self.server.start()
            self.down_seconds = time.monotonic() - self._stopped
        trainer.logger.flush()


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A running server; MLflow's retry budget cut to one quick retry, and the outbox asking every 0.2 s."""
    if not (Path(sys.executable).parent / "mlflow").is_file():
        pytest.skip("the mlflow command is not installed beside this Python")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    monkeypatch.setenv("CT_TRACKING_PROBE_SECONDS", "0.2")
    running = MlflowServer(tmp_path)
    running.start()
    yield running
    running.stop()


def _train(server: MlflowServer, tmp_path: Path, outage: ServerOutage) -> tuple[dict, list[str]]:
    from ct_lightning.experiment.runs.train import announce, train

    lines = []
    summary = train({"data": "moons", "objective": "full", "max_epochs": EPOCHS, "limit_train_batches": 2,
                     "limit_val_batches": 1, "nce": 16, "max_steps": 3, "accelerator": "cpu", "progress": False,
                     "seed": 3, "tracking_uri": server.uri, "experiment": "outage",
                     "checkpoint_dir": str(tmp_path / "checkpoints")},
                    callbacks=[outage], echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    lines.append(announce(summary))
    return summary, lines


def _check_complete(uri: str, run_id: str) -> None:
    """The run is FINISHED with every epoch's metrics once, its artifacts and its models."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in PER_EPOCH:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert sorted(steps) == list(range(EPOCHS)), (key, steps)  # every epoch, none twice
    assert len(client.get_metric_history(run_id, "fit_seconds")) == 1
    assert {"config.json", "config.yaml", "checkpoints", "plots"} <= {a.path for a in client.list_artifacts(run_id)}
    assert "checkpoints/last.ckpt" in {a.path for a in client.list_artifacts(run_id, "checkpoints")}
    assert "plots/mature_counterfactuals.png" in {a.path for a in client.list_artifacts(run_id, "plots")}
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert {"model", "predictor"} <= {m.name for m in models if m.source_run_id == run_id}


@pytest.mark.slow
def test_training_survives_an_outage_that_ends_before_the_run(server, tmp_path):
    from ct_lightning.experiment.runs.outbox import Outbox

    outage = ServerOutage(server, stop_at=2, restart_at=4)
    summary, lines = _train(server, tmp_path, outage)
    assert "tracking" not in summary, summary.get("tracking")
    outbox = Outbox(tmp_path / "checkpoints" / "mlflow-outbox")
    kept = outbox.records()
    assert kept, "no write met the outage: the test did not test it"
    assert outbox.replayed() == len(kept)  # all sent when the server came back
    assert any("unreachable" in line for line in lines) and any("answers again" in line for line in lines)
    assert outage.down_seconds > 2 * 3  # longer than MLflow's retry budget (one retry, 3 s timeout, no backoff)
    _check_complete(server.uri, summary["run_id"])
    assert f"{server.uri}/#/experiments/{summary['experiment_id']}/runs/{summary['run_id']}" in lines[-1]
    assert "mlflow ui --backend-store-uri" not in lines[-1]


@pytest.mark.slow
def test_an_outage_past_the_end_leaves_the_run_for_the_upload_command(server, tmp_path):
    summary, lines = _train(server, tmp_path, ServerOutage(server, stop_at=2))
    pending = summary["tracking"]
    assert pending["status"] == "pending_upload"
    assert any(pending["command"] in line for line in lines)  # the console names the command
    assert "Pending upload" in lines[-1]
    server.start()
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=server.uri).get_run(summary["run_id"]).info.status == "RUNNING"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(pending["command"], shell=True, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the run is FINISHED" in done.stdout
    # the predictor the deferred end registered, named as train.py names it (train.announce)
    from ct_lightning.experiment.runs.served_model import registered_text

    assert f"registered model {registered_text('ct-moons-ct', '1', server.uri)}" in done.stdout.splitlines()
    _check_complete(server.uri, summary["run_id"])
    # The same command again (forked from the preloaded interpreter: the printed command itself ran above).
    module, folder = shlex.split(pending["command"])[2:]
    assert shlex.split(pending["command"])[:2] == [sys.executable, "-m"]
    again = run_script(ROOT / "tests" / "helpers" / "run_module.py", [module, folder], cwd=Path.cwd(), env=env)
    assert again.returncode == 0 and "0 of 0 waiting record(s) sent" in again.stdout, again.stdout + again.stderr
    _check_complete(server.uri, summary["run_id"])  # nothing sent twice


def test_the_end_of_a_run_on_a_server_names_the_servers_own_page():
    from ct_lightning.experiment.runs.train import announce

    text = announce({"run_id": "abc123", "tracking_uri": "http://tracking.example:5005/", "experiment_id": "7"})
    assert "http://tracking.example:5005/#/experiments/7/runs/abc123?workflowType=machine_learning" in text
    assert "mlflow ui" not in text
    local = announce({"run_id": "abc123", "tracking_uri": "sqlite:////tmp/s/mlflow.db", "experiment_id": "7"})
    assert "ui --backend-store-uri sqlite:////tmp/s/mlflow.db" in local
    # what the run reached and where its checkpoints are, first
    done = announce({"run_id": "abc123", "tracking_uri": "sqlite:////tmp/s/mlflow.db", "experiment_id": "7",
                     "metrics": {"test/acc": 0.90651, "val/acc": 0.8916, "epochs": 100},
                     "checkpoints": {"last": "/c/last.ckpt", "best": "/c/best.ckpt"}}).splitlines()
    assert done[:3] == ["result after 100 epoch(s): test accuracy 0.907, validation accuracy 0.892",
                        "checkpoints: last /c/last.ckpt, best /c/best.ckpt", "MLflow run id: abc123"]


def test_replaying_an_outbox_twice_or_after_a_cut_short_replay_sends_each_point_once(tmp_path):
    """Replay against a real local store: a replay whose count was lost (a crash between sending and counting)
    and a second replay send no metric point twice; a line cut short by a crash is skipped."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.outbox import Outbox, replay
    from ct_lightning.experiment.runs.tracking import prepare_store

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    prepare_store(uri, "replay")
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.get_experiment_by_name("replay").experiment_id).info.run_id
    outbox = Outbox(tmp_path / "outbox", {"run_id": run_id, "tracking_uri": uri})
    for epoch in range(3):
        outbox.append({"op": "log_batch", "run_id": run_id, "metrics": [["train/loss", 1.0 / (epoch + 1), 1000 + epoch,
                                                                         epoch]], "params": [["lr", "0.1"]]})
    (tmp_path / "config.json").write_text("{}")
    outbox.append({"op": "log_artifact", "run_id": run_id, "file": outbox.keep(tmp_path / "config.json"),
                   "artifact_path": None})
    outbox.append({"op": "set_terminated", "run_id": run_id, "status": "FINISHED", "end_time": 5000})
    with open(outbox.journal, "a") as handle:
        handle.write('{"op": "log_batch", "run_id"')  # a crash while a line was written
    assert replay(client, outbox) == 5
    outbox.mark_replayed(0)  # as if the counts had been lost: everything is offered again
    assert replay(client, outbox) == 5
    assert replay(client, outbox) == 0
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in history) == [0, 1, 2]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1"
    assert "config.json" in {a.path for a in client.list_artifacts(run_id)}
    outbox.append({"op": "log_batch", "run_id": run_id, "metrics": [["train/loss", 0.1, 1003, 3]]})
    assert outbox.records()[-1]["metrics"][0][3] == 3  # the cut line was closed, the new one reads whole
    assert replay(client, outbox) == 1
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == [0, 1, 2, 3]
