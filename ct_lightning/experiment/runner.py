"""The one runner of the recipes: parse, run one workflow, answer a refused input in one line; the start-up lines
and the MLflow store every workflow shares.

A recipe is its command line and one call, ``run_recipe(build_parser(), argv, workflow)``. A workflow (a function
of the parsed arguments, under ``experiment/workflows/``) checks its inputs inside ``with checking():``: a known
error raised there (:data:`KNOWN_ERRORS`: a value, exit code 2; the environment, exit code 1) ends the command
with one line naming the option as typed (:func:`exit_on_error`). Errors outside such a block are not inputs and
keep their traceback. Nothing here imports torch, Lightning or MLflow at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ct_lightning.experiment.configuration.console import progress_hidden
from ct_lightning.experiment.configuration.store import anchor_tracking_uri, store_location
from ct_lightning.experiment.configuration.validation import KNOWN_ERRORS, Parser, exit_on_error
from ct_lightning.experiment.runs.interrupt import TrainingInterrupted

T = TypeVar("T")


class Refused(Exception):
    """A known error raised while a workflow checked its inputs; :func:`run_recipe` prints it in one line."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def checking():
    """Inside the block, a known error (a bad value, a missing file, an unreachable store) refuses the command."""
    try:
        yield
    except KNOWN_ERRORS as error:
        raise Refused(error) from error


def recipe_parser(description: str | None, **kwargs) -> Parser:
    """A recipe's parser: one-line errors (:class:`Parser`), its docstring as the help's description."""
    return Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def run_recipe(parser: argparse.ArgumentParser, argv: list[str] | None,
               workflow: Callable[[argparse.Namespace], T]) -> T:
    """Parse ``argv`` (a local SQLite ``--tracking-uri`` made absolute) and run ``workflow`` on the arguments."""
    args = parser.parse_args(argv)
    # MLflow draws a progress bar for every artifact it downloads; a grid or a reproduction reads hundreds of
    # small results and says its own progress, so the bars are off in recipes unless the user turns them on.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if isinstance(getattr(args, "tracking_uri", None), str):
        args.tracking_uri = anchor_tracking_uri(args.tracking_uri)
    try:
        with progress_hidden(getattr(args, "progress", True) is False):  # --no-progress, in every recipe that has it
            return workflow(args)
    except Refused as refused:
        exit_on_error(refused.error, parser)


def batches(value: Any) -> Any:
    """``--limit-*-batches``: a whole number ≥ 1 counts batches (Lightning's int), else a share (float)."""
    if value is not None and float(value).is_integer() and value >= 1:
        return int(value)
    return value


def trained_batches(value: Any) -> Any:
    """``--limit-train-batches`` of a recipe that trains its models from scratch (compare, consistency): as
    :func:`batches`, and 0 (no training, for a ``--from-checkpoint`` model in train.py) is refused."""
    from ct_lightning.experiment.configuration.validation import BATCHES_ALLOWED, InputError  # noqa: PLC0415

    if value is not None and value == 0:
        raise InputError("--limit-train-batches", value, BATCHES_ALLOWED,
                         "this recipe trains its models from scratch: 0 would leave them untrained")
    return batches(value)


def start(args: argparse.Namespace, store: bool = True, model: str | None = None) -> None:
    """Print the start-up lines: the store (``store``), the CPU arithmetic (recipes with ``--cpu-math``: set before
    torch is imported) and torch's threads (``--threads``, else 1 for the small MLPs, set here)."""
    from ct_lightning.experiment.configuration.cpu_math import apply_cpu_math  # noqa: PLC0415
    from ct_lightning.experiment.configuration.preflight import apply_threads, threads_for  # noqa: PLC0415

    if store:
        print(f"MLflow store: {store_location(args.tracking_uri)}", flush=True)
    if hasattr(args, "cpu_math"):
        print(apply_cpu_math(args.cpu_math or "native"), flush=True)
    print(apply_threads(threads_for(args.threads, model, args.accelerator)), flush=True)


def open_store(tracking_uri: str, experiment: str):
    """The MLflow store, created if missing (under a file lock) with ``experiment``: ``(client, experiment id,
    artifact location)``."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - heavy: only once the inputs are checked

    from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store  # noqa: PLC0415

    artifact_location = prepare_store(tracking_uri, experiment)
    client = MlflowClient(tracking_uri=tracking_uri)
    return client, ensure_experiment(client, experiment, artifact_location), artifact_location


def exit_soon() -> None:
    """Prepare a recipe's process for its exit, which comes next: the objects it holds (millions: torch, Lightning,
    MLflow, SciPy) are moved out of the garbage collector's reach (``gc.freeze``), so that the interpreter's shutdown
    does not walk them all again (2.4 s after a short training, 0.3 s so; ``bench/short_run.py``). What ends a process
    properly still runs: ``atexit`` handlers (log handlers flushed, temporary folders removed), the flush of the
    standard streams, and the release of every object that no reference cycle holds."""
    gc.freeze()


def console_entry(main: Callable[[list[str] | None], Any]) -> Callable[[], int]:
    """A recipe's console-script entry (``ct-train = "recipes.train:cli"``): run ``main`` on the command line and
    return exit code 0. ``main`` returns its summary for callers in Python, which a console script's
    ``sys.exit(cli())`` must not see (it would print it and exit 1); errors still end inside ``main`` with their
    one-line message and exit code 1 or 2. The process ends when ``cli`` returns (call ``main`` from Python)."""

    def cli() -> int:
        from ct_lightning.experiment.configuration.allocator import keep_freed_memory  # noqa: PLC0415

        keep_freed_memory()  # a recipe's process is the user's: searches reuse their pool-sized blocks
        try:
            main(None)
        except TrainingInterrupted as interrupted:  # its message and the resume command are already printed
            return interrupted.exit_code
        finally:
            exit_soon()
        return 0

    cli.__doc__ = (f"Console-script entry: ``{main.__module__}.main`` on the command line; exit code 0 on success, "
                   "128 + the signal's number when a signal stopped it (143 SIGTERM, 130 SIGINT).")
    return cli
