"""``last.ckpt`` at an epoch's end, at most every few seconds, and the epochs' metrics sent to MLflow with it.

Writing a checkpoint costs about 6 ms (Lightning gathers its state, then the file is pickled, written and synced),
an eighth of an Adult epoch of the paper's MLP. A fast run writes one every ``every_seconds`` instead of every
epoch: always after the first epoch of a fit (so a resume point exists at once), after the last one, and when
training stops early (a signal: :class:`~ct_lightning.experiment.runs.stop_on_signal.StopOnSignal` sets
``should_stop`` before this hook runs). A resumed run still starts from exactly the state an uninterrupted run had
at that epoch's end (bit-identical); a SIGKILL loses at most ``every_seconds`` of training.

The metrics waiting in :class:`~ct_lightning.experiment.runs.run_artifacts.EpochStepMLFlowLogger` are sent right
after each write, and only then: MLflow never holds an epoch that the resume point has not reached, so a resumed
run logs no epoch twice, and every checkpoint holds the epochs not yet sent (``EpochMetricsInCheckpoint``).
"""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import ModelCheckpoint


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
        super().on_train_epoch_end(trainer, pl_module)
        self._written_at, self.written_epoch = time.monotonic(), trainer.current_epoch
        for logger in trainer.loggers:
            flush = getattr(logger, "flush_with_checkpoints", None)
            if flush is not None:
                flush()
