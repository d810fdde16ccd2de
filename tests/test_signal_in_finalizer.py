"""A signal in a training's set-up that lands in a finalizer (SQLAlchemy's weakref callbacks during garbage
collection): Python cannot raise there; the stop is recorded and no lost traceback is printed."""

import gc
import signal
import sys

from ct_lightning.experiment.runs.interrupt import TrainingInterrupted
from ct_lightning.experiment.runs.stop_on_signal import StopOnSignal


class RaisesWhenCollected:
    def __init__(self, error):
        self.error = error

    def __del__(self):
        raise self.error


def test_a_stop_lost_in_a_finalizer_is_not_reported_other_lost_errors_are(monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))
    stopper = StopOnSignal(echo=lambda *a, **k: None)
    stopper.install()
    try:
        RaisesWhenCollected(TrainingInterrupted(signal.SIGTERM, None))
        RaisesWhenCollected(RuntimeError("a real problem"))
        gc.collect()
    finally:
        stopper.restore()
    assert [type(error) for error in reported] == [RuntimeError], "the stop is recorded by the handler, not shown"
    RaisesWhenCollected(TrainingInterrupted(signal.SIGTERM, None))
    gc.collect()
    assert [type(error) for error in reported] == [RuntimeError, TrainingInterrupted], "restore() gives the hook back"
