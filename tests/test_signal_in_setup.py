"""A signal while a training's set-up writes to the tracking store stops the run before training, not in the middle
of a store write: raised inside an SQLite transaction, the stop left its lock held, and a grid interrupted there
waited minutes on it for its own closing records (a SIGTERM'd grid that did not exit)."""

import os
import signal
import time

import pytest
from mlflow.tracking import MlflowClient

from ct_lightning.experiment.runs.interrupt import TrainingInterrupted


def test_a_signal_during_the_runs_set_up_in_the_store_stops_before_training(tmp_path, monkeypatch):
    import ct_lightning.experiment.runs.train as train_module

    real_create_run = train_module.create_run

    def create_run_under_a_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, here: inside the set-up's store writes
        return real_create_run(*args, **kwargs)

    monkeypatch.setattr(train_module, "create_run", create_run_under_a_signal)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lines = []
    with pytest.raises(TrainingInterrupted):
        train_module.train({"data": "moons", "max_epochs": 3, "nce": 16, "max_steps": 3, "progress": False,
                            "tracking_uri": uri, "experiment": "setup-signal",
                            "checkpoint_dir": str(tmp_path / "checkpoints")},
                           echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert any("stopping once the run's set-up is written" in line for line in lines), lines
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("setup-signal").experiment_id])
    assert run.info.status == "KILLED" and run.data.params["max_epochs"] == "3"  # its set-up complete, then ended
    assert client.get_metric_history(run.info.run_id, "train/loss") == []  # no epoch trained
    started = time.perf_counter()
    client.set_tag(run.info.run_id, "after", "stop")  # the store is not left locked
    assert time.perf_counter() - started < 5
