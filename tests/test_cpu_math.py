"""``cpu_math``: the CPU kernels torch computes with, chosen before torch starts (issue 24)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ct_lightning.experiment.studies.reproduce import training_key
from ct_lightning.experiment.configuration.settings import resolve_config

ROOT = Path(__file__).resolve().parents[1]


def test_portable_math_is_part_of_the_training_key_and_native_keeps_old_keys():
    base = resolve_config({"data": "circles"})
    assert base["cpu_math"] == "native"
    without = {k: v for k, v in base.items() if k != "cpu_math"}
    assert training_key(base) == training_key(without), "stores filled before the setting existed are still found"
    assert training_key({**base, "cpu_math": "portable"}) != training_key(base)


@pytest.mark.slow
def test_portable_training_runs_with_scalar_kernels_and_says_so(tmp_path):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), "--data", "circles", "--max-epochs", "1",
                           "--limit-train-batches", "2", "--cpu-math", "portable", "--no-progress",
                           "--tracking-uri", store], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "CPU math: portable" in done.stdout
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("ct-lightning").experiment_id])
    assert run.data.tags["ct.torch_cpu_capability"] == "DEFAULT" and run.data.tags["ct.mkl_cbwr"] == "COMPATIBLE"
    assert run.data.params["cpu_math"] == "portable"


def test_portable_is_refused_where_torch_already_runs_native_kernels(tmp_path):
    import torch

    from ct_lightning.experiment.configuration.cpu_math import apply_cpu_math, check_cpu_math

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this interpreter already runs torch's scalar kernels")
    with pytest.raises(RuntimeError, match="before torch is imported"):
        check_cpu_math("portable")
    check_cpu_math("native")
    with pytest.raises(ValueError, match="allowed: native, portable"):
        apply_cpu_math("fast")
