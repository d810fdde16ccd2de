"""Anatomy of a ``train()`` epoch beyond its optimisation steps (issue 25 §4): what each per-epoch cost takes.

Run: ``PYTHONPATH=. .venv/bin/python bench/epoch_anatomy.py [--data circles,adult] [--objective vanilla]
[--epochs 40] [--out bench/epoch_anatomy.json]``. One ``train()`` run per data set (one torch thread, SQLite store in
a temporary folder) with a callback that wraps, once training starts, each callback's epoch hooks, the module's
epoch hooks, ``Trainer.save_checkpoint`` and the logger, and that marks Lightning's epoch events. Per epoch: the
median of each wrapped call and its total per epoch, and the medians of the segments between the events (the
optimisation steps are ``batch_start->batch_end``; the rest is what the plain loop does not pay, apart from its
validation forward). Not a unit test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCH_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_validation_epoch_end", "on_validation_end")
LOGGER_CONNECTOR = ("update_train_epoch_metrics", "log_eval_end_metrics", "update_eval_epoch_metrics")


def _anatomy_callback(calls: dict, events: list):
    import lightning as L

    from bench.epoch_bench import _wrap

    def _timed(owner, name: str, label: str, store: dict) -> None:  # each call's (start, seconds) under label
        _wrap(owner, name, store.setdefault(label, []))

    class Anatomy(L.Callback):
        """Wraps the epoch's costs once training starts and marks Lightning's epoch events."""

        def on_train_start(self, trainer, pl_module):
            for callback in trainer.callbacks:
                if callback is self:
                    continue
                for hook in EPOCH_HOOKS:
                    if any(hook in klass.__dict__ for klass in type(callback).__mro__[:-2]):
                        name = type(callback).__name__ + (f"({callback.filename})" if getattr(callback, "filename",
                                                                                              None) else "")
                        _timed(callback, hook, f"{name}.{hook}", calls)
            for hook in EPOCH_HOOKS[:3]:
                _timed(pl_module, hook, f"module.{hook}", calls)
            for method in LOGGER_CONNECTOR:
                _timed(trainer._logger_connector, method, f"logger_connector.{method}", calls)
            for logger in trainer.loggers:
                _timed(logger, "log_metrics", f"{type(logger).__name__}.log_metrics", calls)
            _timed(trainer, "save_checkpoint", "Trainer.save_checkpoint", calls)

        def _mark(self, name):
            events.append((name, time.perf_counter()))

        def on_train_epoch_start(self, trainer, pl_module):
            self._mark("epoch_start")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._mark("batch_start")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._mark("batch_end")

        def on_validation_start(self, trainer, pl_module):
            self._mark("val_start")

        def on_validation_end(self, trainer, pl_module):
            self._mark("val_end")

        def on_train_end(self, trainer, pl_module):
            self._mark("epoch_start")

    return Anatomy()


def anatomy(data: str, objective: str, epochs: int) -> dict:
    """Per-epoch costs of one ``train()`` run on ``data``."""
    import logging

    import torch

    from ct_lightning.experiment.runs.train import train

    torch.set_num_threads(1)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    calls, events = {}, []
    with tempfile.TemporaryDirectory(prefix="ct-bench-anatomy-") as folder:
        train({"data": data, "objective": objective, "max_epochs": epochs, "seed": 0, "progress": False,
               "tracking_uri": f"sqlite:///{Path(folder) / 'mlflow.db'}", "experiment": "anatomy"},
              callbacks=[_anatomy_callback(calls, events)])
    segments = {}
    for (a, started), (b, ended) in zip(events, events[1:]):
        segments.setdefault(f"{a}->{b}", []).append(ended - started)
    return {"data": data, "objective": objective, "epochs": epochs,
            "calls_ms": {label: {"calls": len(values), "median": round(statistics.median(values) * 1e3, 3),
                                 "per_epoch": round(sum(values) / epochs * 1e3, 3)}
                         for label, values in sorted(((label, [seconds for _, seconds in timed])
                                                      for label, timed in calls.items()), key=lambda kv: -sum(kv[1]))},
            "segments_ms": {name: round(statistics.median(values) * 1e3, 3) for name, values in segments.items()
                            if len(values) > 1}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="circles,adult")
    parser.add_argument("--objective", default="vanilla", choices=("vanilla", "full"))
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "bench" / "epoch_anatomy.json"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.common import append_result, machine_fields, setup_environment

    setup_environment()
    load = os.getloadavg()
    runs = [anatomy(name, args.objective, args.epochs) for name in args.data.split(",")]
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    append_result(args.out, {"commit": commit, **machine_fields(load), "runs": runs})


if __name__ == "__main__":
    main()
