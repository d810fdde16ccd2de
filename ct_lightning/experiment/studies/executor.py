"""The one way to run many independent jobs (trainings): local processes or Ray Tune trials.

An :class:`Executor` runs ``fn(item)`` for every item and calls ``on_outcome`` in this process as
each one finishes, with an :class:`Outcome` (the result, or the error as text: one failure does not
stop the others). ``fn`` must be a module-level function and the items picklable.

- :class:`LocalExecutor` (default, no extra dependency): ``jobs`` spawned processes, or this
  process when ``jobs`` is 1 (with ``fail_fast`` a failure there raises at once, as a plain loop would);
- :class:`RayTuneExecutor` (``pip install -e ".[sweep]"``): one Ray Tune trial per item, with CPU/GPU
  resources per trial and a maximum of concurrent trials, on a local Ray or a cluster (``address``).

``recipes/compare.py --jobs`` and ``recipes/sweep.py`` both dispatch through here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import torch

from ct_lightning.experiment.configuration.console import quiet_ray, verbose_console

DONE_KEY = "ct_item_done"  # in a Ray trial's report: the item ran to its end (a trial Tune stopped has none)
EXTRA_HINT = 'Ray is not installed; install the sweep extra: pip install -e ".[sweep]"'


@dataclass
class Outcome:
    """What became of one item: its position, label, and result or error text."""

    index: int
    label: str
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Executor(ABC):
    """Runs ``fn`` over items; see the module docstring."""

    @abstractmethod
    def run(self, fn: Callable, items: Sequence, labels: Sequence[str],
            on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """``fn(item)`` for every item; ``on_outcome`` is called here as each finishes; outcomes in finishing order."""


def _die_with_parent() -> None:
    """On Linux, ask the kernel to kill this worker when the process that started it dies.

    Without it, killing a reproduction or sweep leaves its workers training on, and a restarted
    one trains the same models a second time.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


_SIGNALLED: list[int] = []  # in a worker process: the SIGINT/SIGTERM it received outside a training
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_PARENT_STOPPED = None  # in a worker process: the parent's stop signal, shared (0: none), see _stop_signals_shared


def _remember_signal(signum, frame) -> None:
    _SIGNALLED.append(signum)


@contextlib.contextmanager
def _stop_signals_shared(stopped):
    """While workers run: a SIGINT or SIGTERM that this process receives is also written to ``stopped`` (which the
    workers read before each item, :func:`_run_in_worker`), then handled as before. A worker started just after a
    Ctrl-C never received it itself, and would otherwise begin a whole training."""
    previous = {}

    def forward(signum, frame) -> None:
        stopped.value = signum
        previous[signum](signum, frame)

    try:
        for signum in _STOP_SIGNALS:
            if callable(signal.getsignal(signum)):  # SIG_DFL and SIG_IGN keep their meaning: not forwarded
                previous[signum] = signal.getsignal(signum)
                signal.signal(signum, forward)
    except ValueError:  # not the main thread: no handler of ours
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _stop_signals_held():
    """Hold SIGINT and SIGTERM back in this thread while it starts worker processes: a spawned worker keeps the
    mask, so a Ctrl-C while it starts and imports torch waits until :func:`_set_threads` has its handler (it would
    die with a KeyboardInterrupt traceback, break the pool and fail every item). Held here, they are delivered to
    this process's own handlers when the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _set_threads(threads: int, stopped=None) -> None:
    global _PARENT_STOPPED
    _die_with_parent()
    _PARENT_STOPPED = stopped
    if threads > 0:  # 0: torch's default
        torch.set_num_threads(threads)
    # Ctrl-C reaches every worker: an idle one must not die with a KeyboardInterrupt traceback (and break the pool);
    # the signal is kept, and the worker takes no new item (a training takes the signals itself while it runs).
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _remember_signal)
    except ValueError:  # not the main thread (a Ray trial): the defaults stay
        return
    # a worker starts with them held back (_stop_signals_held): one that came while it started is remembered now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _run_in_worker(fn: Callable, item) -> Any:
    """``fn(item)`` in a worker, unless a signal came (to it, or to the parent): then :class:`TrainingInterrupted`
    instead of a new item."""
    signum = _SIGNALLED[0] if _SIGNALLED else _PARENT_STOPPED.value if _PARENT_STOPPED is not None else 0
    if signum:
        from ct_lightning.experiment.runs.interrupt import TrainingInterrupted

        raise TrainingInterrupted(signum)
    return fn(item)


class LocalExecutor(Executor):
    """``jobs`` spawned worker processes with ``threads`` torch threads each; ``jobs=1`` runs inline.

    ``fail_fast``: inline, let the first failure raise instead of reporting it and going on.
    """

    def __init__(self, jobs: int = 1, threads: int = 1, fail_fast: bool = False):
        if jobs < 1:
            raise ValueError(f"jobs: must be at least 1, got {jobs}")
        self.jobs, self.threads, self.fail_fast = jobs, threads, fail_fast

    def run(self, fn, items, labels, on_outcome=None) -> list[Outcome]:
        """Run in order inline, or ``jobs`` at a time; failures are reported and the rest go on (see ``fail_fast``)."""
        outcomes: list[Outcome] = []

        def finished(outcome: Outcome) -> None:
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)

        if self.jobs <= 1:
            for index, (item, label) in enumerate(zip(items, labels)):
                try:
                    result = fn(item)
                except Exception as error:  # noqa: BLE001 - report, let the other items run
                    if self.fail_fast:
                        raise
                    finished(Outcome(index, label, error=f"{type(error).__name__}: {error}"))
                    continue
                finished(Outcome(index, label, result))
            return outcomes
        context = get_context("spawn")
        stopped = context.RawValue("i", 0)
        with ProcessPoolExecutor(max_workers=self.jobs, mp_context=context, initializer=_set_threads,
                                 initargs=(self.threads, stopped)) as pool, _stop_signals_shared(stopped):
            with _stop_signals_held():  # the workers start (in submit) with Ctrl-C held back until they can take it
                pending = {pool.submit(_run_in_worker, fn, item): index for index, item in enumerate(items)}
            try:
                while pending:
                    completed, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in completed:
                        index = pending.pop(future)
                        try:
                            finished(Outcome(index, labels[index], future.result()))
                        except Exception as error:  # noqa: BLE001 - report, let the other items finish
                            finished(Outcome(index, labels[index], error=f"{type(error).__name__}: {error}"))
            except BaseException:  # an interruption (a worker's, or on_outcome's): start nothing new
                for future in pending:
                    future.cancel()
                raise
        return outcomes


def require_ray():
    """``ray`` and ``ray.tune``, or a one-line error naming the extra to install."""
    try:
        import ray
        from ray import tune
    except ImportError:
        raise SystemExit(f"error: {EXTRA_HINT}") from None
    return ray, tune


def _tune_trial(config: dict, fn=None, items=None) -> None:
    """The Ray Tune trainable: run the item of this trial and report its result (numbers and strings)."""
    from ray import tune

    _set_threads(config["threads"])
    result = fn(items[config["index"]]) or {}
    tune.report({**{k: v for k, v in result.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)},
                 DONE_KEY: 1})


def _item_result(reported: dict) -> dict:
    """What an item's ``fn`` returned, from a Tune report (without the done marker)."""
    return {k: v for k, v in reported.items() if k != DONE_KEY}


class RayTuneExecutor(Executor):
    """One Ray Tune trial per item: ``cpus``/``gpus`` per trial, at most ``max_concurrent`` at once (0: no limit).

    ``address`` joins a running Ray cluster (``"auto"`` or ``ray://host:10001``); ``None`` starts a local Ray.
    ``storage_path``/``name`` say where Tune keeps its experiment folder. Each trial's ``fn`` result is
    returned through the outcome: its numbers and strings, as Tune reported them.
    """

    def __init__(self, address: str | None = None, cpus: float = 1, gpus: float = 0, max_concurrent: int = 0,
                 storage_path: str | None = None, name: str | None = None):
        self.address, self.cpus, self.gpus, self.max_concurrent = address, cpus, gpus, max_concurrent
        self.storage_path = storage_path
        self.name = name or time.strftime("ct-sweep-%Y%m%d-%H%M%S")

    def run(self, fn, items, labels, on_outcome=None) -> list[Outcome]:
        """Run every item as a trial of one Tune experiment; failed trials are reported, the others go on."""
        ray, tune = require_ray()
        if not items:
            return []
        # Trials keep this working directory, so relative paths in the items mean what they mean here.
        os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
        with quiet_ray(verbose_console()):
            return self._run(ray, tune, fn, items, labels, on_outcome)

    def _run(self, ray, tune, fn, items, labels, on_outcome) -> list[Outcome]:
        verbose = verbose_console()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.INFO if verbose else logging.ERROR,
                     runtime_env={"env_vars": {"RAY_CHDIR_TO_TRIAL_DIR": "0",
                                               "PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
        outcomes: list[Outcome] = []
        seen: set[int] = set()

        def finished(outcome: Outcome) -> None:
            if outcome.index in seen:
                return
            seen.add(outcome.index)
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)

        class Report(tune.Callback):
            """Hands each finished or failed trial to ``on_outcome`` as it happens, in this process."""

            def on_trial_complete(self, iteration, trials, trial, **info):
                index = trial.config["index"]
                if DONE_KEY in (trial.last_result or {}):  # else stopped by Tune (Ctrl-C): see after fit
                    finished(Outcome(index, labels[index], _item_result(trial.last_result)))

            def on_trial_error(self, iteration, trials, trial, **info):
                index = trial.config["index"]
                error = getattr(trial, "error_msg", None) or "trial failed"
                finished(Outcome(index, labels[index], error=str(error).strip().splitlines()[-1]))

        trainable = tune.with_resources(tune.with_parameters(_tune_trial, fn=fn, items=list(items)),
                                        {"cpu": self.cpus, "gpu": self.gpus})
        space = {"index": tune.grid_search(list(range(len(items)))), "threads": max(1, int(self.cpus))}
        tuner = tune.Tuner(trainable, param_space=space,
                           tune_config=tune.TuneConfig(max_concurrent_trials=self.max_concurrent or None),
                           run_config=tune.RunConfig(name=self.name, storage_path=self.storage_path,
                                                     verbose=None if verbose else 0,
                                                     failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                                                     callbacks=[Report()]))
        grid = tuner.fit()
        stopped = False
        for result in grid:  # anything the callbacks did not see (e.g. a trial that never started)
            index = (result.config or {}).get("index")
            if index is None:
                continue
            if result.error is not None:
                finished(Outcome(index, labels[index], error="".join(traceback.format_exception_only(result.error))
                                 .strip().splitlines()[-1]))
            elif DONE_KEY in (result.metrics or {}):
                finished(Outcome(index, labels[index], _item_result(result.metrics)))
            else:
                stopped = True
        # A stop before a trial started leaves no result for it at all (an empty grid on a Ctrl-C at start-up)
        stopped = stopped or len(seen) < len(items)
        if stopped:
            # Tune ends fit() early, without an error, only when it was stopped (its handler takes Ctrl-C while fit
            # runs): trials that never reported their end must not read as results.
            from ct_lightning.experiment.runs.interrupt import TrainingInterrupted

            raise TrainingInterrupted(signal.SIGINT)
        return outcomes
