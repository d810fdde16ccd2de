"""``recipes/sweep.py``: a grid or random search over training options (``experiment.sweep``), on Ray Tune or
local processes, resumable; the parsed training options are the base of every trial."""

from __future__ import annotations

import argparse
import os
import sys

from ct_lightning.experiment.configuration.console import VERBOSE_ENV, quiet_console, verbose_console
from ct_lightning.experiment.configuration.sweep_space import check_sweep_inputs
from ct_lightning.experiment.configuration.store import default_tracking_uri
from ct_lightning.experiment.runner import batches, checking

SWEEP_OPTIONS = ("param", "search", "num_samples", "sweep_seed", "metric", "mode", "executor", "address",
                 "cpus_per_trial", "gpus_per_trial", "max_concurrent", "jobs", "sweep_name", "sweep_json",
                 "storage_path")


def executor_of(sweep: dict, tracking_uri: str):
    """The executor of the sweep options: ``LocalExecutor`` (``--executor local``) or ``RayTuneExecutor``."""
    from ct_lightning.experiment.studies.executor import LocalExecutor, RayTuneExecutor, require_ray  # noqa: PLC0415
    from ct_lightning.experiment.configuration.store import local_store_dir  # noqa: PLC0415

    if sweep["executor"] == "local":
        return LocalExecutor(sweep["jobs"], max(1, int(sweep["cpus_per_trial"])))
    require_ray()
    storage = sweep["storage_path"] or str((local_store_dir(tracking_uri) / "ray").resolve())
    return RayTuneExecutor(sweep["address"], sweep["cpus_per_trial"], sweep["gpus_per_trial"],
                           sweep["max_concurrent"], storage)


def run(args: argparse.Namespace) -> dict:
    """Run or resume the sweep of the parsed options; exit with status 1 when a trial failed. Every input that
    needs no data is checked first, before torch, Lightning or the data are loaded."""
    base = vars(args).copy()
    sweep = {key: base.pop(key) for key in SWEEP_OPTIONS if key in base}
    for key in ("limit_train_batches", "limit_val_batches"):
        if key in base:
            base[key] = batches(base[key])
    with checking():
        base, space, _ = check_sweep_inputs(base, sweep)
    base["tracking_uri"] = base.get("tracking_uri") or default_tracking_uri()  # once, before any trial runs
    if base.get("verbose"):
        os.environ[VERBOSE_ENV] = "1"  # seen by the executor (Ray's console) and the trials' processes
    quiet_console(verbose_console(base.get("verbose")))  # MLflow's store set-up lines, before the store is opened
    from ct_lightning.experiment.studies.sweep import run_sweep  # noqa: PLC0415 - heavy: only after the checks

    with checking():
        executor = executor_of(sweep, base.get("tracking_uri", "sqlite:///mlruns/x"))
        summary = run_sweep(base, space, executor, search=sweep["search"], num_samples=sweep["num_samples"],
                            seed=sweep["sweep_seed"], metric=sweep["metric"], mode=sweep["mode"],
                            name=sweep["sweep_name"], threads=max(1, int(sweep["cpus_per_trial"])),
                            out_json=sweep["sweep_json"])
    if summary["failures"]:
        sys.exit(1)
    return summary
