"""``last.ckpt`` at an epoch's end, at most every few seconds, and the epochs' metrics sent to MLflow with it;
``best.ckpt`` gathered when ``val/acc`` improves and written with the next ``last.ckpt``.

Writing a checkpoint costs about 6 ms (Lightning gathers its state, then the file is pickled, written and synced),
an eighth of an Adult epoch of the paper's MLP. A fast run writes one every ``every_seconds`` instead of every
epoch: always after the first epoch of a fit (so a resume point exists at once), after the last one, and when
training stops early (a signal: :class:`~ct_lightning.experiment.runs.stop_on_signal.StopOnSignal` sets
``should_stop`` before this hook runs). A resumed run still starts from exactly the state an uninterrupted run had
at that epoch's end (bit-identical); a SIGKILL loses at most ``every_seconds`` of training.

The metrics waiting in :class:`~ct_lightning.experiment.runs.run_artifacts.EpochStepMLFlowLogger` are sent right
after each write, and only then: MLflow never holds an epoch that the resume point has not reached, so a resumed
run logs no epoch twice, and every checkpoint holds the epochs not yet sent (``EpochMetricsInCheckpoint``).

``best.ckpt`` is gathered at the end of the epoch that improves ``val/acc`` (Lightning's checkpoint dictionary, its
tensors copied: about 2 ms) and written to disk just before the next ``last.ckpt`` (about 4 ms more), so an epoch
that improves early in training no longer pays a file of its own. ``last.ckpt`` never names a best score that
``best.ckpt`` on disk does not hold; a kill loses a gathered best with the training after the last write, and the
resumed run, bit-identical, gathers it again.
"""

from __future__ import annotations

import time

import torch
from lightning.pytorch.callbacks import ModelCheckpoint


def _copied(value):
    """``value`` (a checkpoint dictionary) with every dict, list and tuple made anew and every tensor cloned, so that
    training on does not change it."""
    # Not lightning_utilities' apply_to_collection: it checks every element for dataclasses and named tuples and
    # took 4.3 ms on an MNIST checkpoint (1 112 elements) against 0.9 ms here (bench/checkpoint_gather.py)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        copy = value.copy()  # keeps an OrderedDict's type
        for key, item in copy.items():
            copy[key] = _copied(item)
        return copy
    if isinstance(value, (list, tuple)):
        items = [_copied(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a named tuple: by fields
    return value


class BestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint(filename="best", monitor="val/acc", mode="max")`` whose file is written with the next
    ``last.ckpt`` (:meth:`write_gathered`, called by :class:`LastCheckpoint`) or at the end of training."""

    def __init__(self, dirpath, monitor: str = "val/acc"):
        super().__init__(dirpath=dirpath, filename="best", monitor=monitor, mode="max", save_top_k=1,
                         enable_version_counter=False)
        self._gathered: tuple[str, dict] | None = None

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        self._gathered = (filepath, _copied(trainer._checkpoint_connector.dump_checkpoint(self.save_weights_only)))
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath

    def write_gathered(self, trainer) -> None:
        """Write the gathered ``best.ckpt``, if any (on every rank, as Lightning's own save)."""
        if self._gathered is None:
            return
        filepath, checkpoint = self._gathered
        self._gathered = None
        trainer.strategy.save_checkpoint(checkpoint, filepath)
        trainer.strategy.barrier("BestCheckpoint.write_gathered")

    def on_train_end(self, trainer, pl_module) -> None:
        self.write_gathered(trainer)


class LastCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint(filename="last", monitor=None)`` written at most every ``every_seconds`` (0: every epoch);
    ``written_epoch`` is the epoch of the last write in this fit (``None`` before the first)."""

    def __init__(self, dirpath, every_seconds: float = 2.0):
        super().__init__(dirpath=dirpath, filename="last", monitor=None, save_top_k=1, enable_version_counter=False,
                         save_on_train_epoch_end=True)
        self.every_seconds = float(every_seconds)
        self.written_epoch: int | None = None
        self._written_at: float | None = None

    def _due(self, trainer) -> bool:
        last_epoch = trainer.max_epochs is not None and trainer.max_epochs >= 0 \
            and trainer.current_epoch + 1 >= trainer.max_epochs
        due = self._written_at is None or trainer.should_stop or last_epoch \
            or time.monotonic() - self._written_at >= self.every_seconds
        return bool(trainer.strategy.broadcast(due))  # rank 0's clock decides: every rank must save, or none

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self._due(trainer):
            return
        for callback in trainer.checkpoint_callbacks:  # first: last.ckpt then names a best.ckpt on disk
            if isinstance(callback, BestCheckpoint):
                callback.write_gathered(trainer)
        super().on_train_epoch_end(trainer, pl_module)
        self._written_at, self.written_epoch = time.monotonic(), trainer.current_epoch
        for logger in trainer.loggers:
            flush = getattr(logger, "flush_with_checkpoints", None)
            if flush is not None:
                flush()
