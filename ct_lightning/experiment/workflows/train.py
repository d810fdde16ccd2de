"""``recipes/train.py``: one tracked training (``experiment.train``), its inputs checked first (``preflight``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ct_lightning.experiment.configuration.cpu_math import apply_cpu_math
from ct_lightning.experiment.configuration.preflight import (apply_threads, check_table_columns, check_table_names,
                                                             preflight_training, threads_for)
from ct_lightning.experiment.runner import batches, checking
from ct_lightning.experiment.configuration.store import store_location
from ct_lightning.experiment.runs.atomic_files import write_text_atomic
from ct_lightning.experiment.runs.lifecycle import recipe_command


def run(args: argparse.Namespace) -> dict:
    """Check the given options (a config file merged in), train, and print where to find the run; returns its
    summary. Every input is checked before torch, Lightning or MLflow is imported and before anything is written."""
    overrides = vars(args)
    spec_path = overrides.pop("write_data_spec", None)
    if spec_path is not None:
        with checking():
            return write_data_spec(overrides, spec_path)
    for key in ("limit_train_batches", "limit_val_batches"):
        if key in overrides:
            overrides[key] = batches(overrides[key])
    with checking():
        checked = preflight_training(overrides)
        named = check_table_names(checked.given)  # a misspelt column before the start-up lines
    overrides, given = checked.overrides, checked.given
    print(f"MLflow store: {store_location(overrides['tracking_uri'])}", flush=True)
    print(apply_cpu_math(overrides.get("cpu_math") or "native"), flush=True)  # before torch is imported
    with checking():  # after the first lines: a large table takes seconds to read
        check_table_columns(given, named)
    from ct_lightning.experiment.runs.train import announce, train  # noqa: PLC0415 - heavy: only after the checks

    print(apply_threads(threads_for(given.get("threads"), given.get("model"), given.get("accelerator"))), flush=True)
    with checking():  # e.g. a checkpoint folder that filled up (OSError: one line, exit 1)
        summary = train(overrides)
    if summary.get("run_id") is not None:  # a DDP worker other than rank 0 tracked nothing: rank 0 says where it is
        print(announce(summary))
    return summary


def write_data_spec(overrides: dict, path: str) -> dict:
    """``train.py --write-data-spec PATH``: write the data spec of the ``--data`` table (its kinds, mutability with
    ``--immutable``/``--mutability`` merged in, declared bounds, and each column's values as comments;
    :func:`datamodules.spec_file.spec_text`) to a new file ``PATH``, print what to do next, and train nothing."""
    from ct_lightning.experiment.configuration.settings import (TABLE_FILE, is_table_file, load_config_file,
                                                                resolve_config, table_options)
    from ct_lightning.experiment.configuration.validation import InputError, check_output_file

    given = {k: v for k, v in overrides.items() if v is not None and k != "config"}
    overrides = {**(load_config_file(overrides["config"]) if overrides.get("config") else {}), **given}
    data = overrides.get("data")
    if not data or not is_table_file(data):
        raise InputError("write_data_spec", path, f"only with {TABLE_FILE} in --data and --target",
                         f"--data is {data or 'not given'}")
    if overrides.get("resume"):
        raise InputError("write_data_spec", path, "without --resume (a resumed run keeps its own data spec)")
    if Path(path).exists():
        raise InputError("write_data_spec", path, "a path that does not exist yet (an existing file is never "
                         "overwritten: it may hold your edits)", "the file exists")
    check_output_file("write_data_spec", path)
    impute = overrides.get("impute") or "none"  # a file with gaps is read as --impute median would: said below
    config = resolve_config({**overrides, "impute": "median" if impute == "none" else impute})
    from datamodules.spec_file import spec_text  # noqa: PLC0415 - reads the table: after the checks
    from datamodules.table import TableDataModule  # noqa: PLC0415

    module = TableDataModule(config["data"], **table_options(config))
    gaps = [note.split(":")[0] for note in module.read_notes if note.endswith("(--impute median)")]
    impute = "median" if gaps and impute == "none" else impute
    mutability = _command_line_mutability(config, module.codec)
    write_text_atomic(path, spec_text(module, mutability, source=str(data)))
    print(module.describe().splitlines()[0], *(f"note: {note}" for note in module.read_notes + module.identifier_notes()),
          sep="\n")
    options = ["--data", str(data), "--target", config["target"], "--data-spec", str(path)]
    for name, flag in (("drop_columns", "--drop-columns"), ("impute", "--impute"), ("balance", "--balance")):
        value = impute if name == "impute" else config.get(name)
        if value and value != "none":
            options += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    if gaps and (overrides.get("impute") or "none") == "none":
        print(f"note: {', '.join(gaps)}: missing values; the command below adds --impute median (fills them as "
              "noted; --impute drop leaves those rows out instead)")
    print(f"wrote {path}: the data spec of {len(module.codec.columns)} columns, as training would use it. Check each "
          "column's kind, mutability and bounds (its values are noted beside it), then train with:\n  "
          + recipe_command("train", options), flush=True)
    return {"data_spec": str(Path(path).resolve()), "columns": len(module.codec.columns)}


def _command_line_mutability(config: dict, codec) -> dict[str, str]:
    """``--immutable`` and ``--mutability`` as ``{column: kind}``, checked as training checks them
    (:func:`~ct_lightning.experiment.configuration.data.command_line_mutability`); the spec is written per column,
    so each name must also be a column of the table (not a one-hot column nor an index)."""
    from ct_lightning.constraints import one_hot_groups  # noqa: PLC0415
    from ct_lightning.experiment.configuration.data import command_line_mutability  # noqa: PLC0415 - imports torch
    from ct_lightning.experiment.configuration.validation import InputError  # noqa: PLC0415

    pairs = command_line_mutability(config, codec.feature_names, one_hot_groups(codec))
    columns = [column.name for column in codec.columns]
    for name in pairs:
        if name not in columns:
            option = "immutable" if name in (config.get("immutable") or []) else "mutability"
            raise InputError(option, name, f"columns of the table: {', '.join(columns)}")
    return pairs
