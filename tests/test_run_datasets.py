"""The splits a training records in MLflow as dataset inputs: what they point to, and what recording them costs."""

from __future__ import annotations

import tracemalloc

import pandas as pd
import pytest
from mlflow import MlflowClient

from ct_lightning.experiment.runs.run_artifacts import log_datasets
from datamodules.table import TableDataModule


@pytest.fixture
def client(tmp_path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")


def table(rows: int) -> pd.DataFrame:
    """A table of 61 inputs: a category of 60 levels and a number."""
    return pd.DataFrame({"grade": [f"L{i % 60:02d}" for i in range(rows)], "income": [1000 + i % 977 for i in range(rows)],
                         "y": ["yes" if i % 3 else "no" for i in range(rows)]})


def test_recording_the_splits_does_not_copy_them(client):
    """MLflow's dataset input was made from a copy of the training split, and its digest from another: at a 200 000-row
    table's start, 280 MiB more for a moment. The split's own memory serves both now."""
    data = TableDataModule(table(20000), target="y")
    data.setup("fit")
    run_id = client.create_run(client.create_experiment("datasets")).info.run_id
    tracemalloc.start()
    try:
        log_datasets(client, run_id, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    split = data.x_train.numel() * data.x_train.element_size()
    assert peak < 0.5 * split, f"peak {peak / split:.2f} x the training split"
    assert {d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs} == {"table-train", "table-test"}


def test_a_tables_splits_point_to_its_file(client, tmp_path):
    """The dataset inputs of a run on loans.csv named ct-lightning's own datamodules/__init__.py as their source
    (the fallback of the embedded synthetic sets), so the MLflow UI could not tell which file a model learnt from."""
    path = tmp_path / "loans.csv"
    table(300).to_csv(path, index=False)
    data = TableDataModule(path, target="y")
    data.setup("fit")
    run_id = client.create_run(client.create_experiment("datasets")).info.run_id
    log_datasets(client, run_id, data)
    sources = {d.dataset.name: d.dataset.source for d in client.get_run(run_id).inputs.dataset_inputs}
    assert sources == {name: f'{{"uri": "{path.resolve().as_uri()}"}}' for name in ("loans-train", "loans-test")}
