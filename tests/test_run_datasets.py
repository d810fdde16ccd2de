"""The splits a training records in MLflow as dataset inputs: what they point to, and what recording them costs."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from ct_lightning.experiment.runs.run_artifacts import log_datasets
from datamodules.table import TableDataModule

ROOT = Path(__file__).resolve().parents[1]


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


WIDE = """
import json, numpy as np
from datamodules.base import TensorDataModule

def status(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) * 1024

class Wide(TensorDataModule):
    name = "wide"
    def load_splits(self):
        x = np.random.default_rng(0).normal(size=(100_000, 100)).astype(np.float32)
        y = np.zeros(len(x), dtype=np.int64)
        return {"x_train": x, "y_train": y, "x_val": x[:10], "y_val": y[:10], "x_test": x[:10], "y_test": y[:10],
                "feature_names": [f"f{i}" for i in range(100)], "n_classes": 2}

data = Wide()
splits = data.load_splits()
data.load_splits = lambda: splits  # the inputs exist before the peak is measured: only setup's own memory counts
open("/proc/self/clear_refs", "w").write("5")  # the peak mark (VmHWM) starts again from here
before = status("VmRSS")
data.setup("fit")
print(json.dumps({"extra": status("VmHWM") - before, "inputs": splits["x_train"].nbytes}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc peak mark")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the infinite income's statistics
def test_checking_the_inputs_for_nan_needs_no_copy_of_them():
    """Setting up a data module checked its inputs with torch.isfinite, which makes a float copy and two masks: a
    200 000-row table's start peaked 238 MiB above its training inputs. numpy's test makes one boolean mask."""
    done = subprocess.run([sys.executable, "-c", WIDE], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["extra"] < 0.5 * measured["inputs"], measured
    frame = table(300).assign(income=[float("inf")] + [1000.0] * 299)
    data = TableDataModule(frame, target="y")
    with pytest.raises(ValueError, match=r"^data table: x_\w+ contains NaN or infinite values after preprocessing$"):
        data.setup("fit")
