"""A training stopped by a signal: SIGTERM (a scheduler's preemption), SIGINT (Ctrl-C) or SLURM's requeue signal.

Light on purpose (no torch, no Lightning): the recipes' console entries import it to turn the exception into the
shell's exit status for a signal, 128 + its number (143 for SIGTERM, 130 for SIGINT), so that a scheduler never
reads an interrupted training as a success. The callback that stops training at a safe point is
:class:`ct_lightning.experiment.runs.stop_on_signal.StopOnSignal`.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

INTERRUPTED_TAG = "ct.interrupted"  # on a run that a signal stopped (its status is KILLED)


def clear_interrupted(client, run_id: str) -> None:
    """Remove :data:`INTERRUPTED_TAG` from a parent run that a resume has now finished (the UI showed a FINISHED
    compare or sweep as interrupted). Never raises: a store that does not answer now (an outage, whose records wait
    in the outbox) leaves the tag, which is all that is lost."""
    try:
        tags = client.get_run(run_id).data.tags
    except Exception:  # noqa: BLE001 - MLflow and requests raise many types for a store that does not answer
        return
    if INTERRUPTED_TAG in tags:
        client.delete_tag(run_id, INTERRUPTED_TAG)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingInterrupted(BaseException):
    """Training stopped on signal ``signum``; ``checkpoint`` is the last good checkpoint (``None``: none yet).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception`` reports it as a failure;
    not a ``KeyboardInterrupt``, which Lightning turns into ``sys.exit(1)``.
    """

    def __init__(self, signum: int, epochs: int | None = None, checkpoint: str | None = None):
        self.signum, self.epochs, self.checkpoint = signum, epochs, checkpoint
        done = "" if epochs is None else f" after {epochs} complete epoch(s)"
        super().__init__(f"{signal_name(signum)}{done}")

    def __reduce__(self):  # raised in a worker process and read back in the parent: keep the signal number
        return type(self), (self.signum, self.epochs, self.checkpoint)

    @property
    def exit_code(self) -> int:
        """The shell's status for a process ended by this signal: 128 + its number."""
        return 128 + int(self.signum)


class StudyStop:
    """What a study's signal handler has seen; ``check()`` raises :class:`TrainingInterrupted` once a signal came."""

    def __init__(self, defer: bool):
        self.defer, self.signum = defer, None

    def on_signal(self, signum, frame) -> None:
        """The handler: raise at once, or (``defer``) only at the second signal, the first waiting for ``check()``."""
        if not self.defer or self.signum is not None:
            raise TrainingInterrupted(self.signum or signum)
        self.signum = signum
        if frame is not None:  # a real signal; one a finished training passes on has been announced already
            print(f"\n{signal_name(signum)}: stopping once the current item is done and kept; send it again to stop "
                  f"now", file=sys.stderr, flush=True)

    def check(self) -> None:
        """At a safe point (an item kept, no write under way): stop if a signal came."""
        if self.signum is not None:
            raise TrainingInterrupted(self.signum)


@contextmanager
def stop_between_trainings(defer: bool = False) -> Iterator[StudyStop]:
    """A study's signal handling (a grid, a reproduction): SIGTERM or SIGINT raises :class:`TrainingInterrupted`.

    Inside a training, the training's own handler stops it at its epoch's end. Outside one (evaluations,
    tables) the signal raises at once, or with ``defer`` at the study's next ``check()`` (a second signal still
    raises at once): an exception raised in the middle of a store write can leave the SQLite store locked for
    the clean-up that follows. A signal that arrives while a training finishes anyway (in its last epoch) is
    passed on here when the training returns, so the study stops before its next item.
    """
    stop = StudyStop(defer)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for signum in previous:
            signal.signal(signum, stop.on_signal)
    except ValueError:  # not the main thread: the defaults stay
        previous = {}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
