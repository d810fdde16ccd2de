"""Checks before a training starts: every value, the output paths, the tracking store and the device.

:func:`preflight_training` runs before any MLflow run, checkpoint folder, data download or training exists;
``recipes/train.py`` calls it right after parsing (before torch is imported) and
:func:`ct_lightning.experiment.runs.train.train` again at its top, for callers from Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from ct_lightning.experiment.configuration.settings import (DEFAULTS, csv_names, is_table_file, load_config_file,
                                                             validate_config)
from ct_lightning.experiment.configuration.store import (anchor_tracking_uri, check_store_exists, check_tracking_reachable,
                                                         default_tracking_uri)
from ct_lightning.experiment.configuration.validation import (check_accelerator, check_checkpoint_file, check_output_file,
                                                check_writable_folder)


class Checked(NamedTuple):
    """``overrides``: what to pass on (tracking URI anchored); ``given``: config file and overrides merged."""

    overrides: dict
    given: dict


def preflight_training(overrides: dict, store: bool = True) -> Checked:
    """Check a training's inputs and environment; raise ``ValueError`` (a value) or ``OSError``/``EnvironmentProblem``.

    Nothing is created: no store, no run, no folder. A local SQLite tracking URI is anchored to an absolute path.
    ``store=False`` leaves out the tracking store's check (a sweep checks its store once, and each trial's rest).
    """
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config: unknown keys {unknown}; allowed: {', '.join(sorted(DEFAULTS))}")
    given = validate_config({k: v for k, v in overrides.items() if v is not None})
    from_file = load_config_file(given["config"]) if given.get("config") and not given.get("resume") else {}
    merged = {**from_file, **given}
    uri = anchor_tracking_uri(merged.get("tracking_uri") or default_tracking_uri())
    if store and merged.get("resume"):
        check_store_exists("tracking_uri", uri, f"the run to resume ({merged['resume']})")
    elif store:
        check_tracking_reachable(uri, "tracking_uri")
    check_output_file("summary_json", merged.get("summary_json"))
    if merged.get("checkpoint_dir"):
        check_writable_folder("checkpoint_dir", merged["checkpoint_dir"])
    if merged.get("data_dir"):
        check_data_dir(merged["data_dir"])
    check_checkpoint_file("from_checkpoint", merged.get("from_checkpoint"))
    check_accelerator("accelerator", merged.get("accelerator"))
    return Checked({**overrides, "tracking_uri": uri}, {**merged, "tracking_uri": uri})


def check_table_names(given: dict) -> bool | None:
    """The column names the options give (``target``, ``immutable``, ``mutability``, ...) against a table file's
    header line (:func:`~ct_lightning.experiment.configuration.table_columns.check_table_header`: a fraction of a
    second, no pandas), so that a misspelt column is refused before any start-up line; whether the line named the
    columns (``None``: no table file, or ``--resume``)."""
    if given.get("resume") or not is_table_file(given.get("data")):
        return None
    from ct_lightning.experiment.configuration.table_columns import check_table_header  # noqa: PLC0415

    return check_table_header(given)


def check_table_columns(given: dict, named: bool | None = None) -> None:
    """The options that name columns of a table file in ``--data`` (merged ``given`` settings; not on ``--resume``):
    ``target`` a column a classifier can be trained on (:func:`datamodules.table_format.check_target`), and the
    features ``immutable`` and ``mutability`` name among its other columns (one-line ``ValueError``). The recipes
    check them before torch is imported: names against the header line first
    (:func:`~ct_lightning.experiment.configuration.table_columns.check_table_header`, a fraction of a second), then
    the target's classes, which needs the table read with pandas (the data module reuses what is read here,
    :func:`~datamodules.table_format.read_table`), then every problem of the table the data module would refuse,
    by the data module's own checks (:func:`check_table_data`), so that a misspelt column, an amount to predict
    (regression), a gap without ``impute`` or a column of dates is refused in a second, not after the imports and
    the data module. With a ``from_checkpoint`` that carries its model's table preprocessing (a checkpoint of this
    project, :func:`~ct_lightning.experiment.configuration.checkpoint_peek.carries_table_preprocessing`; a
    ``runs:/``/``models:/`` model, looked up in its store only when the training starts) the table's problems are the
    data module's to refuse: the model reads it with its own preprocessing (:mod:`datamodules.kept_codec`); other
    weights (a plain ``state_dict``, TorchScript) are trained on the table as a fresh training reads it, so it is
    checked as one."""
    if given.get("resume") or not is_table_file(given.get("data")):
        return
    from ct_lightning.experiment.configuration.table_columns import check_named_features  # noqa: PLC0415

    if named is None:  # not checked yet (check_table_names)
        named = check_table_names(given)  # before pandas is imported
    from datamodules.table_format import check_target, read_table  # noqa: PLC0415 - pandas: for table files only

    frame = read_table(given["data"])
    check_target(frame, given.get("target"), given["data"])
    check_target_order(given.get("data_spec"), frame, given["target"])
    if not named:  # a Parquet file, or a header the line alone could not tell: the names as read
        check_named_features(given, [str(column) for column in frame.columns])
    from ct_lightning.experiment.configuration.checkpoint_peek import carries_table_preprocessing  # noqa: PLC0415

    if not given.get("from_checkpoint") or carries_table_preprocessing(given["from_checkpoint"]) is False:
        check_table_data(given, frame)  # else the model's own preprocessing reads it and checks it so (a column it
                                        # does not read may have gaps), once the checkpoint is read


def check_table_data(given: dict, frame) -> None:
    """The problems of the table ``frame`` (as read from ``given["data"]``) that its data module would refuse, by the
    same functions and with the same one line: the data spec's keys and values
    (:func:`~datamodules.codec.read_spec`), a ``mutability`` that loosens its kind for a column
    (:func:`~ct_lightning.experiment.configuration.table_columns.check_data_kinds`), ``drop_columns``, missing
    values without ``impute``, a class too rare for the splits, constant columns and text columns a training cannot
    read, every one at once (:func:`~datamodules.table_checks.checked_table`,
    :func:`~datamodules.table_checks.raise_problems`); then, with a data spec, what it declares against the columns
    (unknown columns, kinds, bounds, orders, row rules) by fitting the codec on all rows (:meth:`~datamodules.codec.TabularCodec.fit`; the data module fits it again on its training
    rows). Not with ``balance: undersample``: the data module fits its codec on the rows kept, which may hold fewer
    categories than the file; its ``positive`` is then checked against the file's classes
    (:func:`~datamodules.codec.positive_class`)."""
    from datamodules.codec import TabularCodec, ordinal_orders, positive_class, read_spec  # noqa: PLC0415 - no torch
    from datamodules.table_checks import checked_table, raise_problems  # noqa: PLC0415

    from ct_lightning.experiment.configuration.table_columns import check_data_kinds  # noqa: PLC0415

    spec, drop = read_spec(given.get("data_spec")), csv_names(given.get("drop_columns"))
    check_data_kinds(given, {str(column): str(entry.get("mutability", "both"))
                             for column, entry in (spec.get("columns") or {}).items()})
    name = str(Path(given["data"]).resolve())  # as the data module names it (settings.resolve_config)
    checked = checked_table(frame, given["target"], given.get("impute") or "none", name, ordinal_orders(spec), drop,
                            declared=dict(spec.get("columns") or {}))
    raise_problems(checked.problems, name)
    if spec and (given.get("balance") or "none") == "none":
        TabularCodec.fit(checked.frame, given["target"], spec, dropped=drop)
    elif spec:  # the data module fits its codec on the rows kept: positive's check would count those, not the file's
        positive_class(spec.get("positive"), checked.frame[given["target"]])


def check_target_order(spec, frame, target: str) -> None:
    """The data spec's ``target: {order: [...]}`` against the target's classes in ``frame`` (a class it does not
    name, a value that is no class, a target of two classes: one-line ``ValueError``), before torch is imported;
    the codec checks it again when it is fitted (:func:`datamodules.codec.class_order`)."""
    if not spec:
        return
    from datamodules.codec import _plain, class_order, read_spec, target_entry  # noqa: PLC0415

    named, order = target_entry(read_spec(spec))
    if order is None or (named is not None and str(named) != str(target)):
        return  # unordered, or a spec for another column: the codec refuses that in its own words
    classes = sorted(frame[target].dropna().unique(), key=lambda v: (str(type(v)), v))  # as the codec sorts them
    class_order(order, [_plain(c) for c in classes], target)


def check_data_dir(path) -> None:
    """A given raw-data folder must not be a file (a missing folder is the data module's to report or fill)."""
    from ct_lightning.experiment.configuration.validation import InputError

    if Path(path).exists() and not Path(path).is_dir():
        raise InputError("data_dir", str(path), "a folder with the raw data files (this path is a file)")


def check_raw_data(names, data_dir=None) -> None:
    """Every raw file of the named data sets is in place, downloaded first where it has a public source.

    For a study over many trainings (a grid): a missing file then stops it before its first training, with
    the data module's message (the file, the path it was looked for at, where to get it), instead of failing
    every training of that data set one after the other. Synthetic sets and table files have no raw files.
    """
    from datamodules import get_datamodule_class  # noqa: PLC0415
    from datamodules.download import fetch  # noqa: PLC0415
    from datamodules.paths import resolve_data_dir  # noqa: PLC0415

    folder = resolve_data_dir(data_dir)
    for name in names:
        try:
            raw_files = getattr(get_datamodule_class(name), "raw_files", ())
        except (KeyError, ValueError):
            continue  # not a registered data set (a table file): its own checks run at training
        for raw in raw_files:
            fetch(raw, folder)


def threads_for(threads: int | None, model: str | None = None, accelerator: str | None = None) -> int:
    """torch intra-op threads to use: ``threads`` if given (0: torch's default), else 1 for the small MLPs.

    A 32-unit MLP gains nothing from several threads, and they fight other processes on a busy machine
    (issue 14: 16 min 40 s with torch's default against 85 s with one thread). A CNN or a GPU keeps torch's choice.
    """
    if threads is not None:
        return threads
    return 0 if model == "cnn" or accelerator in ("gpu", "cuda", "mps") else 1


def apply_threads(threads: int) -> str:
    """Set torch's intra-op threads (0: leave torch's default); return the start-up line saying so."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
        return f"torch threads: {threads} (--threads N to change; 0 = torch's default)"
    return f"torch threads: {torch.get_num_threads()} (torch's default; --threads N to change)"


def evaluation_device(accelerator: str | None):
    """The torch device an evaluation runs on for a Lightning ``accelerator`` value (``auto``: CUDA if present)."""
    import torch

    if accelerator in ("gpu", "cuda") or (accelerator in (None, "auto") and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("mps") if accelerator == "mps" else torch.device("cpu")
