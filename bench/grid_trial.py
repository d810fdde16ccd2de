"""Anatomy of one grid trial (issue 25): process start, imports, MLflow, data, training, evaluation.

Run: ``PYTHONPATH=. .venv/bin/python bench/grid_trial.py [--max-epochs 10] [--out bench/grid_trial.json]``.
A fresh interpreter runs two trials of the Moons grid in a row (CT at Note 1's defaults, then its BL), as
one worker process of ``recipes/appendix.py`` does; each phase is timed with ``perf_counter``. The
second trial shows what a warm worker saves. Not a unit test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def inner(max_epochs: int, folder: str) -> dict:
    """The timed phases, in this (fresh) process."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    import torch  # noqa: F401
    timings["import_torch"] = time.perf_counter() - t
    t = time.perf_counter()
    import lightning  # noqa: F401
    import mlflow  # noqa: F401

    from ct_lightning.experiment.studies import grids
    from ct_lightning.experiment.runs.train import train  # noqa: F401
    timings["import_lightning_mlflow_ct"] = time.perf_counter() - t

    torch.set_num_threads(1)
    uri = f"sqlite:///{folder}/mlflow.db"
    t = time.perf_counter()
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store
    location = prepare_store(uri)
    ensure_experiment(MlflowClient(tracking_uri=uri), "bench", location)
    timings["mlflow_store_setup"] = time.perf_counter() - t

    grid = grids.Grid("bench", "bench", ["moons"], {"objective": ["full", "vanilla"]}, {"lambda_energy": [5.0]})
    trials = []
    for objective in ("full", "vanilla"):
        overrides = grids.effective_overrides({**grids.NOTE1, "data": "moons", "objective": objective,
                                               "max_epochs": max_epochs})
        job = grids.ModelJob("moons", overrides, grids.grid_protocol(grid, "moons"), uri, "bench")
        row = {"objective": objective}
        t = time.perf_counter()
        from ct_lightning.experiment.studies.reproduce import find_finished_training
        find_finished_training(MlflowClient(tracking_uri=uri), "bench", job.key())
        row["key_and_lookup"] = time.perf_counter() - t
        t = time.perf_counter()
        out = train(job.training_overrides(), tags={"ct.role": "bench"})
        row["train_total"] = time.perf_counter() - t
        row["fit"] = out["metrics"]["fit_seconds"]
        row["train_overhead"] = row["train_total"] - row["fit"]
        t = time.perf_counter()
        from ct_lightning.experiment.configuration.data import build_datamodule
        build_datamodule({"data": "moons", "seed": 0, "batch_size": 30})
        row["build_data"] = time.perf_counter() - t
        t = time.perf_counter()
        grids.evaluate_job(out["run_id"], job)
        row["evaluate"] = time.perf_counter() - t
        trials.append(row)
    return {"timings": timings, "trials": trials}


def main() -> None:
    """Start a fresh interpreter, time it and its phases, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "bench" / "grid_trial.json"))
    parser.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(inner(args.max_epochs, args.inner)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as folder:
        t = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--max-epochs", str(args.max_epochs), "--inner", folder],
                              env=env, capture_output=True, text=True, check=True)
        total = time.perf_counter() - t
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    result = {"max_epochs": args.max_epochs, "data": "moons", "threads": 1, "interpreter_start": interpreter,
              "process_total": total, **inside, "load_average": os.getloadavg(),
              "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
