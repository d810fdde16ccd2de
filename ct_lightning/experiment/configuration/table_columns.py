"""The options that name a table's columns (``--target``, ``--drop-columns``, ``--immutable``, ``--mutability``),
checked against the names in its header line before torch is imported or the table is read (plain Python: no
pandas, no torch).

A training checks these names again once its data module is built (``configuration.data.mutability_spec``); the
check here refuses only what that check would refuse, with the same line (the messages have one home each:
:func:`datamodules.table_header.target_column_error` and ``drop_columns_error``,
:func:`ct_lightning.feature_names.unknown_feature_error`), and leaves to it what the header cannot tell: a one-hot
column (``purpose=car``), an index, a header that may be data.
"""

from __future__ import annotations

from pathlib import Path

from ct_lightning.experiment.configuration.settings import csv_names
from ct_lightning.feature_names import immutable_conflict, loosened_kind, mutability_pairs, unknown_feature_error


def named_features(config: dict) -> list[tuple[str, str, str]]:
    """``(option, feature, kind)`` for each feature that ``mutability`` (``"FEATURE=KIND,..."``) and ``immutable``
    (names: kind ``none``) name, in that order; a one-line ``ValueError`` for a feature given two kinds (in
    ``mutability`` twice, or in both with a kind other than ``none``): which one was meant cannot be told."""
    pairs = mutability_pairs(str(config.get("mutability") or ""))
    immutable = csv_names(config.get("immutable"))
    conflict = immutable_conflict(immutable, pairs)
    if conflict is not None:
        raise conflict
    return [("mutability", name, kind) for name, kind in pairs.items()] + [("immutable", name, "none")
                                                                             for name in immutable]


def check_data_kinds(config: dict, data_kinds: dict[str, str]) -> None:
    """Refuse in one line a ``mutability`` that lets a feature change more than the data spec's kind for it
    (``data_kinds``: ``{column: kind}``; :func:`~ct_lightning.feature_names.loosened_kind`): the data spec states
    facts about the data, and the command line may only add to them."""
    spec = config.get("data_spec")
    source = f"the data spec {Path(spec).name}" if isinstance(spec, (str, Path)) else "the data spec"
    conflict = loosened_kind(data_kinds, mutability_pairs(str(config.get("mutability") or "")), source)
    if conflict is not None:
        raise conflict


def check_named_features(config: dict, columns: list[str]) -> None:
    """Every feature ``immutable`` and ``mutability`` name (:func:`named_features`) is one of the table's ``columns``
    less the target and ``drop_columns``, or may be one once the table is encoded (a one-hot ``column=value``, an
    index); else the one-line ``ValueError`` of a training's own check, naming the option."""
    dropped = set(csv_names(config.get("drop_columns")))
    features = [c for c in columns if c != config.get("target") and c not in dropped]
    for option, name, _ in named_features(config):
        undecided = name.lstrip("-").isdigit() or any(name.startswith(f"{feature}=") for feature in features)
        if name not in features and not undecided:
            raise unknown_feature_error(option, name, features, spec_labels(config.get("data_spec")))


def spec_labels(spec) -> list[tuple[str, str | None, str | None]]:
    """``(column, label, unit)`` of each column of a data spec (a dict or file, :func:`datamodules.codec.read_spec`)
    that gives words, for the hint of a column named by them (``--immutable 'Yearly income'``); read on the way to
    an error only (pandas)."""
    if not spec:
        return []
    from datamodules.codec import read_spec  # noqa: PLC0415 - on the way to an error only

    columns = read_spec(spec).get("columns") or {}
    return [(name, (words or {}).get("label"), (words or {}).get("unit")) for name, words in columns.items()]


def check_table_header(config: dict) -> bool:
    """Check ``target``, ``drop_columns``, ``immutable`` and ``mutability`` against the header line of the table file
    in ``data`` (a one-line ``ValueError``); whether its names were known (a CSV with a header of names: not a Parquet
    file, nor one whose first line may be data), so that the caller checks them against the table as read otherwise."""
    from datamodules.suggest import name_hint  # noqa: PLC0415
    from datamodules.table_header import (drop_columns_error, header_names, looks_like_names,  # noqa: PLC0415
                                          target_column_error)

    names = header_names(config["data"])
    if names is None or not looks_like_names(names):
        return False
    target, frame = config.get("target"), None
    if target and target not in names and not name_hint(target, names):
        from datamodules.table_format import read_table  # noqa: PLC0415 - pandas: on this way to an error only

        frame = read_table(config["data"])  # a class typed for the column, perhaps: which column holds it
    error = target_column_error(target, names, config["data"], frame) or \
        drop_columns_error(csv_names(config.get("drop_columns")), names, config.get("target"), config["data"])
    if error is not None:
        raise error
    check_named_features(config, names)
    return True
