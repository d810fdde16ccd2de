"""Stop training at a safe point on SIGTERM, SIGINT or SLURM's requeue signal, instead of dying mid-write.

The first signal lets the current epoch finish: its validation, its logging and its ``last.ckpt`` (written
atomically), then training stops and :class:`~ct_lightning.experiment.runs.interrupt.TrainingInterrupted` is raised,
so a resumed run starts the next epoch from exactly the state an uninterrupted run has there (bit-identical).
A second signal stops at once; the last ``last.ckpt`` written (at most ``--checkpoint-seconds`` old) is then the
resume point. Before the first epoch starts a signal stops at once while the data are read and the model is built;
once the run's set-up writes to the tracking store (:meth:`StopOnSignal.store_in_use`), it stops when training would
start instead: raised in the middle of an SQLite write, the stop could leave that write's lock held, and every later
write of the process (the run's KILLED status, a study's own records) would wait on it. After training (test,
logging) the run is finished first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import lightning as L

from ct_lightning.experiment.runs.interrupt import TrainingInterrupted, signal_name

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def slurm_requeue_signal() -> int | None:
    """SIGUSR1 inside a SLURM job with Lightning's auto-requeue on (the default), else ``None``."""
    if not os.environ.get("SLURM_JOB_ID") or os.environ.get("CT_SLURM_REQUEUE", "1") == "0":
        return None
    return signal.SIGUSR1


class StopOnSignal(L.Callback):
    """Owns SIGTERM and SIGINT (and SIGUSR1 under SLURM) while a training runs; see the module docstring.

    ``install()`` before ``trainer.fit`` and ``restore()`` after; ``signum`` is the signal received, if any.
    Lightning installs its own SIGTERM handler when fit starts (it stops in the middle of an epoch and exits
    with status 0); this callback takes the signals back once the loop starts.
    """

    def __init__(self, echo=print):
        self.echo, self.signum, self.phase = echo, None, "setup"
        self.requeue = slurm_requeue_signal()
        self.signals = SIGNALS + ((self.requeue,) if self.requeue else ())
        self._previous: dict = {}
        self._unraisable = sys.unraisablehook
        self._given_back: dict = {}  # the handlers restore() gave the signals back to
        self._epoch = 0
        self._store_in_use = False

    def install(self) -> None:
        """Take the signals (main thread only: elsewhere Python cannot, and the defaults stay)."""
        if not self._previous:
            self._previous = {s: signal.getsignal(s) for s in self.signals}
            self._unraisable, sys.unraisablehook = sys.unraisablehook, self._ignored
        self._take()

    def _ignored(self, unraisable) -> None:
        """A signal in set-up that lands inside a finalizer or a weakref callback (SQLAlchemy's, during garbage
        collection): Python cannot raise there and would print the lost exception as a traceback. The signal is
        recorded (``signum``), so the run still stops at its next check; other lost exceptions are shown as before."""
        if not isinstance(unraisable.exc_value, TrainingInterrupted):
            self._unraisable(unraisable)

    def _take(self) -> None:
        try:
            for signum in self.signals:
                signal.signal(signum, self._on_signal)
        except ValueError:  # not the main thread
            pass

    def restore(self) -> None:
        """Give the signals back to their previous handlers."""
        try:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        except ValueError:
            pass
        if self._previous:
            sys.unraisablehook = self._unraisable
        self._given_back, self._previous = self._previous, {}

    def pass_on(self) -> None:
        """After a training that finished although a signal came (in its last epoch, or after it): hand the signal
        to the handler the caller had installed, so that a study (``stop_between_trainings``) stops before its
        next training. Python's own handlers (a lone training) are not called: the finished run ends as usual."""
        handler = self._given_back.get(self.signum)
        if self.signum is not None and callable(handler) and handler is not signal.default_int_handler:
            handler(self.signum, None)

    def store_in_use(self) -> None:
        """From now on the set-up writes to the tracking store: a first signal in set-up waits for training's start
        (see the module docstring)."""
        self._store_in_use = True

    def _on_signal(self, signum, frame) -> None:
        name = signal_name(signum)
        if self.signum is not None or (self.phase == "setup" and not self._store_in_use):
            self.signum = self.signum or signum
            self.echo(f"\n{name}: stopping now", file=sys.stderr, flush=True)
            raise TrainingInterrupted(self.signum, self._epoch if self.phase != "setup" else None)
        self.signum = signum
        if self.phase == "setup":
            self.echo(f"\n{name}: stopping once the run's set-up is written, before training starts (send it again "
                      f"to stop now)", file=sys.stderr, flush=True)
        elif self.phase == "loop":
            self.echo(f"\n{name}: stopping after epoch {self._epoch + 1} and its checkpoint; send it again to stop "
                      f"now (the run then resumes from its last checkpoint)", file=sys.stderr, flush=True)
        else:
            self.echo(f"\n{name}: training is done; finishing the run's test and logging first (send it again to "
                      f"stop now)", file=sys.stderr, flush=True)

    # Lightning registers its SIGTERM handler after on_fit_start: take the signals back from it here.
    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self._take()

    def on_train_start(self, trainer, pl_module) -> None:
        self._take()
        if self.signum is not None:  # came during the run's set-up (store_in_use): stop before any epoch
            raise TrainingInterrupted(self.signum, trainer.current_epoch or None)
        self.phase = "loop"

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._epoch = trainer.current_epoch
        written = [c.written_epoch for c in trainer.callbacks if hasattr(c, "written_epoch")]
        if self.signum is not None and (not written or written[0] == trainer.current_epoch - 1):
            # arrived between the last epoch's end and this start, and that epoch's checkpoint is written
            raise TrainingInterrupted(self.signum, trainer.current_epoch)
        # else (last.ckpt is older: LastCheckpoint writes every few seconds) this epoch runs and stops with its own

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.signum is not None:
            trainer.should_stop = True  # the fit loop stops once this epoch's checkpoint is written

    def on_train_end(self, trainer, pl_module) -> None:
        self.phase = "after"
        self._take()

    def stopped(self, trainer) -> TrainingInterrupted | None:
        """The interruption to raise after ``trainer.fit`` returned, if a signal stopped it."""
        if self.signum is None or trainer.current_epoch >= trainer.max_epochs:  # every epoch ran: finish the run
            return None
        return TrainingInterrupted(self.signum, trainer.current_epoch)

    def requeue_job(self) -> str | None:
        """Under SLURM, after its requeue signal: ``scontrol requeue`` this job; a line saying what happened."""
        if self.requeue is None or self.signum != self.requeue:
            return None
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"SLURM: requeueing job {job} failed ({error})"
        return f"SLURM: job {job} requeued" if done.returncode == 0 else \
            f"SLURM: requeueing job {job} failed ({done.stderr.strip()[:200]})"
