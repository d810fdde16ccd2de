"""A quiet console: what a user acts on (what runs, progress, the result, how to resume), not library chatter.

Hidden unless ``--verbose``: Lightning's INFO lines (devices, the LitLogger advertisement, model summary
notes) and known library deprecation warnings that the user cannot act on.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable

from datamodules.paths import PROGRESS_ENV, progress_shown  # noqa: F401 - the one switch, read by the data downloads too

VERBOSE_ENV = "CT_VERBOSE"  # "1": a recipe's --verbose, seen by its worker processes too
LIBRARY_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning", "pytorch_lightning", "lightning_fabric",
                   "mlflow.store.db.utils", "alembic")
# Warnings about how MLflow stores a model (pickle caution, input-example validation): nothing a user acts on.
MODEL_LOGGING_LOGGERS = ("mlflow.pytorch", "mlflow.pyfunc", "mlflow.models")
QUIET_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's _pytree on torch >= 2.10
)


@contextlib.contextmanager
def progress_hidden(hidden: bool):
    """Inside the block, under a recipe's ``--no-progress`` (``hidden``), progress displays are off in this process
    and its workers (:data:`PROGRESS_ENV`); restored after it (a recipe called in Python leaves no trace)."""
    before = os.environ.get(PROGRESS_ENV)
    if hidden:
        os.environ[PROGRESS_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PROGRESS_ENV, None)
        else:
            os.environ[PROGRESS_ENV] = before


ONCE_PER_PROCESS = ("data ", "CT settings ")
_SHOWN: set[str] = set()


def child_training_echo(*args, **kwargs) -> None:
    """``echo`` for a training run by a recipe that resumes by re-running itself (compare): without the
    training's own ``train.py --resume`` hints, which the recipe replaces by its own, printed once; a table's
    description and chosen CT settings once per process, not once per model."""
    text = " ".join(map(str, args))
    if text.lstrip().startswith(("MLflow run ", "interrupted (")):
        return
    if text.startswith(ONCE_PER_PROCESS):  # a table's description, the same for each of its models
        if text in _SHOWN:
            return
        _SHOWN.add(text)
    print(*args, **kwargs)


def sweep_trial_echo(shown: Iterable[str], then: Callable[..., None] = print) -> Callable[..., None]:
    """``echo`` for a sweep's trial or a compare's training: the table descriptions in ``shown``, which the sweep or
    compare printed once before its trainings (with ``--jobs``, in each worker process), are left out; the
    training's own lines (its CT settings, its run, its epochs) go to ``then``. A training whose table reads
    otherwise (another seed's split with a note of its own) prints its own description."""
    shown = frozenset(shown)

    def echo(*args, **kwargs) -> None:
        if " ".join(map(str, args)) not in shown:
            then(*args, **kwargs)

    return echo


def quiet_console(verbose: bool = False) -> None:
    """Hide Lightning's INFO lines and the known library warnings for this process (``verbose``: show all).

    Imports Lightning first where it is not imported yet (every caller trains with it): its import sets its own
    logger to INFO, which would undo a level set before. The same for the standalone ``pytorch_lightning`` where it
    is installed, which ``import mlflow.pytorch`` imports (a fine-tuning of ``runs:/``/``models:/`` weights loads them
    with it before training): Lightning's INFO lines then came back."""
    import importlib.util  # noqa: PLC0415

    import lightning.pytorch  # noqa: F401, PLC0415

    if importlib.util.find_spec("pytorch_lightning") is not None:
        import pytorch_lightning  # noqa: F401, PLC0415 - 0.1 s beside lightning.pytorch

    level = logging.INFO if verbose else logging.WARNING
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for name in MODEL_LOGGING_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.ERROR)
    if not verbose:
        for message in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message)


def verbose_console(verbose: bool | None = None) -> bool:
    """Whether the console shows everything: ``verbose`` (a recipe's ``--verbose``), else :data:`VERBOSE_ENV`."""
    return bool(verbose) or os.environ.get(VERBOSE_ENV) == "1"


# Ray's driver-side chatter: the token-authentication note and "Started a local Ray instance" (logger ray), Tune's
# state-file INFO lines (ray.tune), and with its new output engine a configuration table, the results folder and a
# TensorBoard hint on stdout, which RunConfig(verbose=0) leaves on: the legacy engine (RAY_AIR_NEW_OUTPUT=0) is silent.
RAY_LOGGERS = ("ray", "ray.tune", "ray.train", "ray.air")


@contextlib.contextmanager
def quiet_ray(verbose: bool):
    """Inside the block, unless ``verbose``, Ray and Tune print nothing on the driver's console but errors."""
    if verbose:
        yield
        return
    levels = {name: logging.getLogger(name).level for name in RAY_LOGGERS}
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    for name in RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


@contextlib.contextmanager
def quiet_registry(verbose: bool):
    """Inside the block, unless ``verbose``, MLflow's model-registry lines ("Successfully registered model",
    "Created version", printed to stderr, and its warnings) are hidden: the recipe prints its own line."""
    if verbose:
        yield
        return
    registry = logging.getLogger("mlflow.tracking._model_registry")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as hidden:
            yield
    finally:
        registry.setLevel(level)
    errors = [line for line in hidden.getvalue().splitlines() if "error" in line.lower()]
    if errors:  # an error among the hidden lines still shows
        print("\n".join(errors), file=sys.stderr)
