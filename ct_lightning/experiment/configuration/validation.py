"""The one place where inputs are checked: value rules, one-line errors and the checks before any work.

Every recipe parses its command line with :class:`Parser` and declares its options with a :class:`Rule`
(``type=rule.argtype()``), so a bad value is refused while parsing, in one line that names the option as
typed, the value and what is allowed (``--max-epochs: got -5; allowed: an integer ≥ 1``), with exit code 2.
Problems of the environment (a missing file, an unwritable folder, an unreachable tracking server) are
:class:`EnvironmentProblem` and exit with code 1. No check here imports torch, Lightning or MLflow unless a
value needs it (``--accelerator gpu``, run ids), so argument errors answer in well under two seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """A value that is not allowed (exit code 2). ``option`` names it as the user typed it."""

    def __init__(self, option: str, value: Any, allowed: str, detail: str = ""):
        self.option, self.value, self.allowed, self.detail = option, value, allowed, detail
        super().__init__(f"{option}: got {show(value)}{f' ({detail})' if detail else ''}; allowed: {allowed}")


class EnvironmentProblem(RuntimeError):
    """A problem outside the values given: missing file, unwritable folder, unreachable server (exit code 1)."""


class CliExit(SystemExit):
    """``SystemExit`` with an exit code and the one-line message (``str()``) that was printed."""

    def __init__(self, message: str, code: int):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def show(value: Any) -> str:
    """A value as it appears in messages: numbers as numbers (text that reads as one too), other text quoted."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return repr(kind(value.strip()))
            except ValueError:
                continue
    return repr(value)


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def one_line(text: str) -> str:
    """Collapse ``text`` to a single line."""
    return " ".join(str(text).split())


BATCHES_ALLOWED = "a whole number of batches ≥ 1 or a share of them in (0, 1]"
NO_TRAINING = "or 0 with --from-checkpoint (no training: that model validated and tested as it is)"


def _batch_limit(value: Any) -> int | float:
    """A ``limit_*_batches`` value as Lightning reads it: whole-number text counts batches (an int), other text is
    a share (a float); a number keeps its type. ``ValueError`` for a negative number or a share above 1 that is not
    whole (Lightning would fail on it once the run exists)."""
    if isinstance(value, bool):
        raise ValueError
    if not isinstance(value, (int, float)):
        value = float(str(value).strip())
        value = int(value) if value.is_integer() else value
    if not math.isfinite(value) or value < 0 or (value > 1 and not float(value).is_integer()):
        raise ValueError
    return value


@dataclass(frozen=True)
class Rule:
    """The values one option allows: ``kind`` (int, float, str, bool, ints, floats, batches:
    Lightning's ``limit_*_batches``), bounds and choices.

    ``low``/``high`` bound numbers (open at that end with ``low_open``/``high_open``; floats must be
    finite). ``choices`` is a sequence or a callable returning one (evaluated when needed); ``lower``
    compares choices case-insensitively.
    """

    kind: str = "str"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: Any = None
    lower: bool = False
    nonempty: bool = False

    def options(self) -> list | None:
        """The allowed values, if the rule has a fixed list."""
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)

    def describe(self) -> str:
        """The allowed values in words: ``an integer ≥ 1``, ``a number in [0, 1)``, ``one of a, b``."""
        if self.options() is not None:
            return "one of " + ", ".join(map(str, self.options()))
        if self.kind == "batches":  # low 0 (closed): 0 batches allowed (limit_train_batches, see NO_TRAINING)
            return f"{BATCHES_ALLOWED}, {NO_TRAINING}" if self.low == 0 and not self.low_open else \
                f"{BATCHES_ALLOWED} (0 would validate nothing: no val/acc)"
        noun = {"int": "an integer", "float": "a finite number", "ints": "comma-separated integers",
                "floats": "comma-separated finite numbers", "bool": "true or false",
                "names": "comma-separated names", "inputs": "a JSON file listing the model's inputs"
                }.get(self.kind, "a text")
        if self.nonempty and self.kind == "str":
            noun = "a non-empty text"
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{noun} in {left}{low}, {high}{right}"
        if self.low is not None:
            return f"{noun} {'>' if self.low_open else '≥'} {low}"
        if self.high is not None:
            return f"{noun} {'<' if self.high_open else '≤'} {high}"
        return noun

    def _in_range(self, number: float) -> bool:
        if isinstance(number, float) and not math.isfinite(number):
            return False
        if self.low is not None and (number <= self.low if self.low_open else number < self.low):
            return False
        return not (self.high is not None and (number >= self.high if self.high_open else number > self.high))

    def _one(self, value: Any, kind: str) -> Any:
        """``value`` checked (and converted from text) as one item of ``kind``; ``ValueError`` if not allowed."""
        if kind == "int":
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
                raise ValueError
            value = int(value) if isinstance(value, (int, float)) else int(str(value).strip())
        elif kind == "float":
            if isinstance(value, bool):
                raise ValueError
            # an int stays an int (Lightning reads limit_train_batches=5 as 5 batches, 5.0 as an error)
            value = value if isinstance(value, (int, float)) else float(str(value).strip())
        elif kind == "batches":
            value = _batch_limit(value)
            if value == 0 and not (self.low == 0 and not self.low_open):
                raise ValueError
            return value
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ValueError
        elif kind == "inputs":  # a file's path, or (a configuration, a checkpoint's) the list or object itself
            if not isinstance(value, (str, list, dict)) or isinstance(value, str) and not value.strip():
                raise ValueError
        elif not isinstance(value, str):
            raise ValueError
        if kind in ("int", "float") and not self._in_range(value):
            raise ValueError
        return value

    def check(self, value: Any, option: str) -> Any:
        """``value`` if allowed (text converted to the kind), else :class:`InputError` naming ``option``."""
        if value is None:
            return None
        try:
            if self.kind == "names":
                items = value.split(",") if isinstance(value, str) else value
                if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
                    raise ValueError
                value = [i.strip() for i in items if i.strip()]
            elif self.kind in ("ints", "floats"):
                items = value.split(",") if isinstance(value, str) else value
                if not isinstance(items, (list, tuple)):
                    raise ValueError
                items = [i for i in items if not (isinstance(i, str) and not i.strip())]
                if not items:
                    raise ValueError
                value = [self._one(item, self.kind[:-1]) for item in items]
            else:
                value = self._one(value, self.kind)
        except (TypeError, ValueError, OverflowError):
            raise InputError(option, value, self.describe()) from None
        if self.nonempty and isinstance(value, str) and not value.strip():
            raise InputError(option, value, self.describe())
        allowed = self.options()
        if allowed is not None:
            key = value.lower() if self.lower and isinstance(value, str) else value
            if key not in allowed:
                raise InputError(option, value, self.describe())
            value = key
        return value

    def argtype(self) -> Callable[[str], Any]:
        """An argparse ``type`` that converts and checks (argparse adds the option's name)."""

        def convert(text: str) -> Any:
            try:
                return self.check(text, "")
            except InputError as error:
                raise argparse.ArgumentTypeError(str(error)[2:]) from None

        convert.__name__ = self.kind
        return convert


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: ``error: --option: ...`` and exit code 2.

    ``hints``: for an option this recipe does not take but another does, what to do instead (added to argparse's
    "unrecognized arguments")."""

    hints: dict[str, str] = {}

    def error(self, message: str):  # noqa: D102 - argparse's hook
        message = re.sub(r"^argument ([^:]+): ", lambda m: m.group(1).split("/")[0] + ": ", message)
        if message.startswith("unrecognized arguments"):
            given = {word.split("=")[0] for word in message.split(":", 1)[-1].split()}
            message += "".join(f"; {option}: {hint}" for option, hint in self.hints.items() if option in given)
        fail(f"{one_line(message)} (see {self.prog} --help)", 2)


def fail(message: str, code: int):
    """Print ``error: MESSAGE`` as one line on stderr and exit with ``code``."""
    message = one_line(message)
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise CliExit(message, code)


def option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``dest`` → the option string a user types (``max_epochs`` → ``--max-epochs``)."""
    names = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and action.dest not in names:
            names[action.dest] = longs[0]
    return names


def name_options(message: str, parser: argparse.ArgumentParser | None) -> str:
    """Replace a leading setting name (``from_checkpoint: ...``, ``mutability/immutable ...``) by its option."""
    if parser is None:
        return message
    names = option_names(parser)
    match = re.match(r"^([a-z_]+(?:/[a-z_]+)*)([: ])", message)
    if match and all(part in names for part in match.group(1).split("/")):
        flags = "/".join(names[part] for part in match.group(1).split("/"))
        return flags + message[match.end(1):]
    return message


def exit_on_error(error: BaseException, parser: argparse.ArgumentParser | None = None):
    """Turn a known error into the one-line message and exit code (2: a value, 1: the environment)."""
    code = 2 if isinstance(error, ValueError) else 1
    fail(name_options(str(error), parser), code)


KNOWN_ERRORS = (ValueError, EnvironmentProblem, OSError)


# --- checks of the environment -------------------------------------------------------------------------------

def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_folder(option: str, folder: str | os.PathLike) -> None:
    """``folder`` is, or can be made, a writable folder (nothing is created)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(option, str(folder), "a folder (this path is a file)")
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise EnvironmentProblem(f"{option}: cannot create {folder}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise EnvironmentProblem(f"{option}: cannot write to {folder}: {base} is not writable")


def check_output_file(option: str, path: str | os.PathLike | None, overwrite: bool | None = None) -> None:
    """``path`` can be written as a file: not a folder, in a folder that exists or can be made and is writable;
    with ``overwrite`` given (a recipe that has ``--overwrite``), an existing file only when it is true."""
    if not path:
        return
    path = Path(path)
    if path.is_dir() or str(path).endswith(os.sep):
        raise InputError(option, str(path), "a file path (this is a folder)")
    if overwrite is False and path.exists():
        raise InputError(option, str(path), "a new file path, or --overwrite to replace this one", "the file exists")
    if path.exists() and not os.access(path, os.W_OK):
        raise EnvironmentProblem(f"{option}: {path} exists and is not writable")
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise EnvironmentProblem(f"{option}: cannot write {path}: {base} is a file, not a folder")
    check_writable_folder(option, path.parent)


CHECKPOINT_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip format; legacy pickles


def check_checkpoint_file(option: str, path: str | os.PathLike | None) -> None:
    """``path`` is an existing file that looks like a PyTorch checkpoint (zip or pickle), without reading it."""
    if not path or ":/" in str(path):  # URIs (runs:/, models:/) are checked where they are resolved
        return
    path = Path(path)
    if not path.exists():
        from datamodules.suggest import path_hint  # noqa: PLC0415 - plain Python

        raise EnvironmentProblem(f"{option}: no file at {path}{path_hint(path)}")
    if not path.is_file():
        raise InputError(option, str(path), "a checkpoint file (this is a folder)")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if not any(head.startswith(magic) for magic in CHECKPOINT_MAGIC):
        raise InputError(option, str(path), "a PyTorch checkpoint file (.ckpt/.pt written by torch.save)",
                         "not a readable PyTorch checkpoint: neither a zip nor a pickle file")


def check_accelerator(option: str, accelerator: str | None) -> None:
    """A GPU/MPS accelerator is actually available (imports torch only for those values)."""
    if accelerator in (None, "auto", "cpu"):
        return
    import torch  # noqa: PLC0415 - only when a device is asked for

    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise EnvironmentProblem(f"{option}: got {accelerator!r}, but this machine has no CUDA GPU "
                                 f"(torch {torch.__version__}); use --accelerator cpu or auto")
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise EnvironmentProblem(f"{option}: got 'mps', but MPS is not available here; use --accelerator cpu or auto")


def check_run_ids(option: str, run_ids: Sequence[str], tracking_uri: str, checkpoint: str | None = None) -> None:
    """Every run id exists in the store (imports MLflow); with ``checkpoint`` (``last``, ``best``) each run also
    holds that checkpoint (``checkpoints/last.ckpt``), which an evaluation of the run loads."""
    ids = [run_id for run_id in run_ids if run_id]
    if not ids:
        return
    from ct_lightning.experiment.configuration.store import check_store_exists  # noqa: PLC0415

    check_store_exists("--tracking-uri", tracking_uri, f"{option} {ids[0]}")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri=tracking_uri)
    for run_id in ids:
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - MLflow raises several types for an unknown or malformed id
            raise InputError(option, run_id, f"the id of a run in {tracking_uri}", "no such run") from None
        if checkpoint is not None:
            names = [a.path for a in client.list_artifacts(run_id, "checkpoints")]
            if f"checkpoints/{checkpoint}.ckpt" not in names and not (
                    not any(n.endswith(".ckpt") for n in names) and logged_model(client, run_id)):
                found = ", ".join(Path(n).name for n in names) or "none"
                raise InputError(option, run_id, f"the id of a run with a saved model (checkpoints/{checkpoint}.ckpt, or "
                                 "the MLflow model 'model' that a run without checkpoints logged), or an empty entry "
                                 "to train", f"its checkpoints: {found}")


def logged_model(client, run_id: str) -> bool:
    """Whether the run logged its classifier as the MLflow model ``model`` (a run of train.py that logged a model
    as it is, ``--limit-train-batches 0``, has it and no checkpoint: evaluations load it instead)."""
    run = client.get_run(run_id)
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                         filter_string=f"source_run_id = '{run_id}'")
    return any(m.name == "model" for m in models)


def check_model_fits(option: str, value: str, module, datamodule) -> None:
    """A loaded ``CTModule`` takes the data set's features and classes (a checkpoint of another data set does not)."""
    hparams = getattr(module, "hparams", {}) or {}
    n_features, n_classes = hparams.get("n_features"), hparams.get("n_classes")
    name = getattr(datamodule, "name", "the data set")
    if n_features is not None and n_features != datamodule.n_features:
        raise InputError(option, value, f"a model of {datamodule.n_features} features ({name})",
                         f"its model takes {n_features} features: trained on another data set?")
    if n_classes is not None and n_classes != datamodule.n_classes:
        raise InputError(option, value, f"a model of {datamodule.n_classes} classes ({name})",
                         f"its model predicts {n_classes} classes: trained on another data set?")
