"""Train as configured and SIGKILL this process at a given point (for the kill-and-resume tests).

Usage: python tests/helpers/kill_during_training.py OVERRIDES_JSON PHASE EPOCH BATCH
PHASE: ``train`` (before training batch BATCH of epoch EPOCH), ``val`` (before validation batch
BATCH of epoch EPOCH), ``epoch_end`` (right after epoch EPOCH's checkpoint was written, before
Lightning logs the epoch's training metrics), ``epoch_start`` (as epoch EPOCH starts) or ``step`` (before
optimiser step BATCH of epoch EPOCH, also inside a fused epoch).
"""

import json
import os
import signal
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint

from ct_lightning.experiment.runs.train import train


class KillAt(Checkpoint):
    """SIGKILLs the process at one point of the training loop: no clean-up of any kind runs.

    A ``Checkpoint`` subclass only so that Lightning calls its ``on_train_epoch_end`` after the
    ``ModelCheckpoint`` that writes last.ckpt (monitoring callbacks run last, in order).
    """

    def __init__(self, phase: str, epoch: int, batch: int):
        self.phase, self.epoch, self.batch = phase, epoch, batch

    def _kill(self, trainer, phase, batch=0):
        if phase == self.phase and trainer.current_epoch == self.epoch and batch == self.batch \
                and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._kill(trainer, "train", batch_idx)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._kill(trainer, "val", batch_idx)

    def on_train_epoch_start(self, trainer, pl_module):
        self._kill(trainer, "epoch_start")

    def on_train_epoch_end(self, trainer, pl_module):
        self._kill(trainer, "epoch_end")

    def on_train_start(self, trainer, pl_module):
        # ``step``: before optimiser step BATCH of epoch EPOCH, wherever the loop runs it (also inside a fused epoch).
        optimizer = trainer.optimizers[0]
        step, counter = optimizer.step, {"epoch": None, "index": 0}

        def counted_step(*args, **kwargs):
            if counter["epoch"] != trainer.current_epoch:
                counter.update(epoch=trainer.current_epoch, index=0)
            self._kill(trainer, "step", counter["index"])
            counter["index"] += 1
            return step(*args, **kwargs)

        optimizer.step = counted_step


if __name__ == "__main__":
    torch.set_num_threads(1)
    overrides, phase, epoch, batch = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    train(overrides, callbacks=[KillAt(phase, epoch, batch)])
    sys.exit("not killed: the kill point was never reached")
