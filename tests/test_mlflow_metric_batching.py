"""EpochStepMLFlowLogger sends fast epochs' metrics a few epochs at a time (one store transaction per send),
with the same keys, values and steps as one send per epoch; checkpoints carry what it has not sent yet."""

import time

import mlflow
import pytest
import torch

from ct_lightning.experiment.runs.run_artifacts import EpochStepMLFlowLogger, log_missing_epoch_metrics


@pytest.fixture()
def run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("batching")
    return uri, client, client.create_run(experiment).info.run_id


def histories(client, run_id, keys):
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}


def epoch_metrics(epoch: int) -> tuple[dict, dict]:
    """What Lightning hands the logger at the end of an epoch: validation first, then training."""
    return {"val/acc": 0.5 + epoch / 100, "epoch": float(epoch)}, {"train/loss": 1.0 / (epoch + 1), "epoch": float(epoch)}


def test_waiting_epochs_are_sent_together_with_the_same_values_and_steps(run):
    uri, client, run_id = run
    logger = EpochStepMLFlowLogger(tracking_uri=uri, run_id=run_id, flush_seconds=3600)
    for epoch in range(5):
        for metrics in epoch_metrics(epoch):
            logger.log_metrics(metrics)
    assert histories(client, run_id, ["train/loss"]) == {"train/loss": []}, "nothing sent within flush_seconds"
    assert [entry["epoch"] for entry in logger.unsent()] == [0, 1, 2, 3, 4]
    assert logger.unsent()[2]["metrics"] == {"val/acc": 0.52, "epoch": 2.0, "train/loss": 1.0 / 3}
    logger.finalize("success")
    assert logger.unsent() == []
    assert histories(client, run_id, ["val/acc", "train/loss", "epoch"]) == {
        "val/acc": [(e, 0.5 + e / 100) for e in range(5)],
        "train/loss": [(e, 1.0 / (e + 1)) for e in range(5)],
        "epoch": [(e, float(e)) for e in range(5)]}


def test_an_epoch_is_sent_when_the_next_starts_once_flush_seconds_have_passed(run):
    uri, client, run_id = run
    logger = EpochStepMLFlowLogger(tracking_uri=uri, run_id=run_id, flush_seconds=0.2)
    val, train = epoch_metrics(0)
    logger.log_metrics(val)
    logger.log_metrics(train)
    logger.log_metrics(epoch_metrics(1)[0])  # within 0.2 s: epoch 0 still waits
    assert histories(client, run_id, ["train/loss"])["train/loss"] == []
    time.sleep(0.25)
    logger.log_metrics(epoch_metrics(1)[1])  # the same epoch: an epoch is never sent in parts
    assert histories(client, run_id, ["train/loss"])["train/loss"] == []
    logger.log_metrics(epoch_metrics(2)[0])  # a new epoch after 0.2 s: everything before it is sent
    assert histories(client, run_id, ["train/loss", "val/acc"]) == {
        "train/loss": [(0, 1.0), (1, 0.5)], "val/acc": [(0, 0.5), (1, 0.51)]}
    assert [entry["epoch"] for entry in logger.unsent()] == [2]


def test_a_resume_logs_the_unsent_epochs_a_checkpoint_holds_and_nothing_twice(run, tmp_path):
    uri, client, run_id = run
    logger = EpochStepMLFlowLogger(tracking_uri=uri, run_id=run_id, flush_seconds=0)
    for epoch in range(2):  # epochs 0 and 1 reach the store (1 when 2 starts)
        for metrics in epoch_metrics(epoch):
            logger.log_metrics(metrics)
    logger.log_metrics(epoch_metrics(2)[0])
    sent = histories(client, run_id, ["train/loss"])["train/loss"]
    assert sent == [(0, 1.0), (1, 0.5)]
    checkpoint = tmp_path / "last.ckpt"
    unsent = [{"epoch": 1, "metrics": {"train/loss": 0.5}}, {"epoch": 2, "metrics": {"val/acc": 0.52, "epoch": 2.0}},
              {"epoch": 3, "metrics": {"val/acc": 0.53, "epoch": 3.0}}]
    torch.save({"ct_unsent_metrics": unsent,
                "ct_epoch_metrics": {"epoch": 3, "metrics": {"train/loss": 0.25, "val/acc": 0.53}}}, checkpoint)
    assert log_missing_epoch_metrics(client, run_id, checkpoint) == 5  # val/acc and epoch at 2 and 3, train/loss at 3
    assert histories(client, run_id, ["train/loss", "val/acc", "epoch"]) == {
        "train/loss": [(0, 1.0), (1, 0.5), (3, 0.25)],
        "val/acc": [(0, 0.5), (1, 0.51), (2, 0.52), (3, 0.53)],
        "epoch": [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]}
    assert log_missing_epoch_metrics(client, run_id, checkpoint) == 0, "a second resume logs nothing again"


def test_long_parameters_are_logged_whole(run):
    """Lightning's MLFlowLogger cut every value to 250 characters: a table's feature_names param ended
    "..., 'city=Cologne', '" with the remaining categories gone."""
    uri, client, run_id = run
    names = [f"city=Town number {i}" for i in range(40)]
    EpochStepMLFlowLogger(tracking_uri=uri, run_id=run_id).log_hyperparams({"feature_names": names, "seed": 0})
    params = client.get_run(run_id).data.params
    assert params["feature_names"] == str(names) and len(params["feature_names"]) > 250
    assert params["seed"] == "0"
