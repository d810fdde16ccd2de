"""One progress line per epoch, for a console that is not a terminal (a SLURM or nohup log, a pipe, a notebook):
Lightning's progress bars redraw themselves with carriage returns, which a log file keeps as one long line."""

from __future__ import annotations

import sys
import time

import lightning as L

SHOWN = ("train/loss", "val/loss", "val/acc")  # what the progress bar shows, in its order


def wants_epoch_lines(progress: bool, stream=None) -> bool:
    """Progress asked for, and ``stream`` (default: stderr, where the bars go) is not a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(progress) and not (callable(isatty) and isatty())


class EpochLines(L.Callback):
    """After each epoch (its validation and every epoch-end hook, so the module's training loss is in):
    ``epoch 3/100: train/loss 0.563, val/loss 0.459, val/acc 0.791 (0.31 s)`` through ``echo`` to stderr. The line
    is written when the next epoch starts or training ends: the module logs its epoch values in its own
    ``on_train_epoch_end``, which Lightning calls after the callbacks' one."""

    def __init__(self, echo=print):
        self.echo = echo
        self._due: tuple[int, float] | None = None  # the epoch whose line is due, and when it started

    def _write_due_line(self, trainer) -> None:
        if self._due is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        (epoch, started), self._due = self._due, None
        metrics = trainer.callback_metrics
        values = ", ".join(f"{name} {float(metrics[name]):.3f}" for name in SHOWN if name in metrics)
        self.echo(f"epoch {epoch + 1}/{trainer.max_epochs}: {values} ({time.perf_counter() - started:.2f} s)",
                  file=sys.stderr, flush=True)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._write_due_line(trainer)
        self._due = (trainer.current_epoch, time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        self._write_due_line(trainer)
