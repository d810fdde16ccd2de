"""The burn-in switch: conventional training first, CT afterwards (SPEC §1)."""

from __future__ import annotations

import lightning as L


class BurnIn(L.Callback):
    """Train conventionally for the first ``round(burnin · max_epochs)`` epochs, then switch CT on.

    The switch is derived from the epoch number alone, so a resumed run lands in the right phase.
    """

    def __init__(self, burnin: float = 0.0):
        if not 0.0 <= burnin < 1.0:
            raise ValueError(f"burnin: must lie in [0, 1), got {burnin}")
        self.burnin = burnin

    def first_ct_epoch(self, max_epochs: int) -> int:
        """Index of the first epoch trained with CT."""
        return round(self.burnin * max_epochs)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.ct_active = trainer.current_epoch >= self.first_ct_epoch(trainer.max_epochs)
