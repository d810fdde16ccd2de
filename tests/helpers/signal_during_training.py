"""Train as configured and send this process SIGTERM or SIGINT at given points (for the signal tests).

Usage: python tests/helpers/signal_during_training.py OVERRIDES_JSON SIGNAL EPOCH BATCH [BATCH ...]
Sends SIGNAL (TERM or INT) before training batch BATCH of epoch EPOCH, once per BATCH given (two batches:
the second signal, which stops at once). Runs through a recipe's console entry, so the exit status is the
one a shell or a scheduler sees. With ``CT_SIGNAL_IN_STUDY=1`` the training runs inside a study's signal
handling (``stop_between_trainings``), as a grid's or a reproduction's trainings do.
"""

import json
import os
import signal
import sys

import lightning as L
import torch

from ct_lightning.experiment.runs.train import train
from ct_lightning.experiment.runner import console_entry
from ct_lightning.experiment.runs.interrupt import stop_between_trainings


class SignalAt(L.Callback):
    def __init__(self, signum: int, epoch: int, batches: list[int]):
        self.signum, self.epoch, self.batches = signum, epoch, batches

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx in self.batches:
            os.kill(os.getpid(), self.signum)


if __name__ == "__main__":
    torch.set_num_threads(1)
    overrides, name, epoch = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    callback = SignalAt(getattr(signal, f"SIG{name}"), epoch, [int(b) for b in sys.argv[4:]])

    def main(_argv):
        if os.environ.get("CT_SIGNAL_IN_STUDY") == "1":  # as a grid or a reproduction runs its trainings
            with stop_between_trainings():
                train(overrides, callbacks=[callback])
                sys.exit("the study went on to its next training")
        train(overrides, callbacks=[callback])
        sys.exit("not interrupted: the training ended")

    sys.exit(console_entry(main)())
