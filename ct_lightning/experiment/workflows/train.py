"""``recipes/train.py``: one tracked training (``experiment.train``), its inputs checked first (``preflight``)."""

from __future__ import annotations

import argparse

from ct_lightning.experiment.configuration.cpu_math import apply_cpu_math
from ct_lightning.experiment.configuration.preflight import apply_threads, preflight_training, threads_for
from ct_lightning.experiment.runner import batches, checking
from ct_lightning.experiment.configuration.store import store_location


def run(args: argparse.Namespace) -> dict:
    """Check the given options (a config file merged in), train, and print where to find the run; returns its
    summary. Every input is checked before torch, Lightning or MLflow is imported and before anything is written."""
    overrides = vars(args)
    for key in ("limit_train_batches", "limit_val_batches"):
        if key in overrides:
            overrides[key] = batches(overrides[key])
    with checking():
        checked = preflight_training(overrides)
    overrides, given = checked.overrides, checked.given
    print(f"MLflow store: {store_location(overrides['tracking_uri'])}", flush=True)
    print(apply_cpu_math(overrides.get("cpu_math") or "native"), flush=True)  # before torch is imported
    from ct_lightning.experiment.runs.train import announce, train  # noqa: PLC0415 - heavy: only after the checks

    print(apply_threads(threads_for(given.get("threads"), given.get("model"), given.get("accelerator"))), flush=True)
    with checking():  # e.g. a checkpoint folder that filled up (OSError: one line, exit 1)
        summary = train(overrides)
    print(announce(summary))
    return summary
