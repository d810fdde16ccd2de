"""Seed the global random generators at every epoch start, so that a resumed run replays an epoch exactly."""

from __future__ import annotations

import random

import lightning as L
import numpy as np
import torch


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The seed of one epoch on one process: a pure function of ``(seed, epoch, rank)``."""
    # Only ints: the hash of a str changes with every process (PYTHONHASHSEED), that of an int tuple does not.
    return hash((int(seed), int(epoch), int(rank), 0x5EED)) % (2**32)


class EpochSeed(L.Callback):
    """Reseed Python's ``random``, NumPy and torch (CPU and CUDA) from ``(seed, epoch, rank)`` before each epoch.

    Everything random inside an epoch then depends only on the seed, the epoch and the state
    restored from the checkpoint, not on what ran before in this process: a run killed and
    resumed from an epoch-end checkpoint continues exactly as an uninterrupted one.
    """

    def __init__(self, seed: int):
        self.seed = int(seed)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = epoch_seed(self.seed, trainer.current_epoch, trainer.global_rank)
        random.seed(value)
        np.random.seed(value)
        if torch.accelerator.is_available():
            torch.manual_seed(value)  # also seeds every accelerator device
        else:
            # The same CPU seed without torch.manual_seed's queued seeds for absent accelerators: each one formats
            # the caller's stack (for a lazy-initialisation error message), ~0.5-1 ms per epoch under Lightning.
            torch.default_generator.manual_seed(value)
