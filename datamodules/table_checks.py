"""The checks of a user's table that stop a training, with pandas alone (no torch, no Lightning).

:func:`checked_table` runs them in the data module's order: an ordinal column's labels as written, the columns
``--drop-columns`` leaves out, missing values (``--impute``), the target's classes (one too rare for the splits),
constant columns and text columns a training cannot read (:func:`~datamodules.table_format.text_column_problems`).
:class:`~datamodules.table.TableDataModule` calls it on every table, and the recipes before torch is imported
(``ct_lightning.experiment.configuration.preflight.check_table_columns``), so that a file's problems are refused in
a second, with the same one line (:func:`raise_problems`: every problem at once).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import pandas as pd

from datamodules.codec import text_ordinals
from datamodules.table_format import check_target, labels_as_written, text_column_problems
from datamodules.table_header import drop_columns_error

IMPUTE = ("none", "drop", "median")  # missing values: refuse, drop those rows, or fill (median / most frequent)
SPLIT = (0.70, 0.15, 0.15)  # train, validation, test
# the fewest rows of a class that give each split one (stratified_split rounds 15 % of 4 rows up to 1)
MIN_CLASS_ROWS = next(n for n in range(1, 100) if min(round(n * SPLIT[1]), round(n * SPLIT[2])) >= 1)


class CheckedTable(NamedTuple):
    """:func:`checked_table`'s result: ``frame`` (labels as written, columns dropped, gaps handled), ``notes`` (how
    the file was read, rows left out), ``problems`` (each with its fix, for :func:`raise_problems`) and ``attrs``
    (the reader's ``units``, ``decimal_comma``, ... as they were before any column was dropped)."""

    frame: pd.DataFrame
    notes: list[str]
    problems: list[str]
    attrs: dict


def checked_table(frame: pd.DataFrame, target: str | None, impute: str, name: str, orders: Mapping,
                  drop_columns: Sequence[str] = (), strict: bool = True,
                  declared: Mapping | None = None) -> CheckedTable:
    """The table as a training takes it and the problems that stop one (see the module docstring); a one-line
    ``ValueError`` at once for what cannot wait (a target that cannot be trained on, an unknown ``drop_columns``
    name where ``strict``, an ordinal label written two ways). ``orders``: the ordinal columns' orders
    (:func:`~datamodules.codec.ordinal_orders`); ``declared``: the data spec's ``columns`` (their kinds spare a
    column the text checks), ``None`` to leave the text checks out (a trained model's own preprocessing)."""
    frame = labels_as_written(frame, text_ordinals(orders))  # labels such as 10% or $1,000 match their order as written
    attrs = dict(frame.attrs)
    notes = list(attrs.get("notes", ()))  # how the file was read: delimiter, decimal commas
    frame = drop_table_columns(frame, drop_columns, target, name, strict=strict)
    # how a column left out was read ('NA' kept as a category in a free-text column) is no longer news
    notes = [n for n in notes if not any(n.startswith(f"{c}: ") for c in drop_columns)]
    frame, dropped_or_filled, problems = check_table(frame, target, impute, name)
    if declared is not None:
        problems += text_column_problems(frame, target, dict(declared), name)
    return CheckedTable(frame, notes + dropped_or_filled, problems, attrs)


def drop_table_columns(frame: pd.DataFrame, columns: Sequence[str], target: str | None, name: str,
                       strict: bool = True) -> pd.DataFrame:
    """``frame`` without ``columns`` (``--drop-columns``: identifiers, free text, leaked outcomes); ``strict``: a
    column the table lacks, or the target, is a one-line ``ValueError`` (a trained model's list is not strict: a
    file to evaluate may lack an identifier it was trained without)."""
    error = drop_columns_error(columns, list(frame.columns), target, name) if strict else None
    if error is not None:
        raise error
    return frame.drop(columns=[c for c in columns if c in frame.columns])


def check_table(frame: pd.DataFrame, target: str | None, impute: str, name: str
                ) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The table with missing values handled as ``impute`` says, notes on the rows left out or filled, and the
    problems of its feature columns that stop a training (missing values, constant columns; each a message with its
    fix, reported together by :func:`raise_problems`); a one-line ``ValueError`` at once for a target that cannot
    be trained on: none, not a column, one class, too many classes."""
    check_target(frame, target, name)
    if impute not in IMPUTE:
        raise ValueError(f"impute: got {impute!r}; allowed: {', '.join(IMPUTE)}")
    notes = []
    unlabelled = int(frame[target].isna().sum())
    if unlabelled:
        notes.append(f"{unlabelled} row(s) without a value in the target column {target!r} left out")
        frame = frame[frame[target].notna()].reset_index(drop=True)
    missing, problems = frame.columns[frame.isna().any()].tolist(), []
    if missing and impute == "none":
        counts = [f"{column!r} ({int(frame[column].isna().sum())})" for column in missing]
        what = f"column {missing[0]!r} has {int(frame[missing[0]].isna().sum())} missing value(s)" if len(missing) == 1 \
            else f"columns {', '.join(counts)} have missing values"
        problems.append(f"{what} (empty or '?') in {name}; pass --impute drop (drop those rows) or --impute median "
                        "(fill from the training rows)")
    if missing and impute == "drop":
        before = len(frame)
        frame = frame.dropna().reset_index(drop=True)
        notes.append(f"{before - len(frame)} row(s) with a missing value left out (--impute drop)")
    if frame[target].nunique() < 2:  # its other classes were only in rows --impute drop left out
        raise ValueError(f"target: column {target!r} has only one class ({frame[target].iloc[0]!r}) in {name}; "
                         "allowed: a column with at least two classes")
    problems += rare_class_problems(frame[target], target, name)
    constant = [c for c in frame.columns if c != target and frame[c].nunique(dropna=False) <= 1]
    if constant:
        what = f"column {constant[0]!r} is" if len(constant) == 1 else \
            f"columns {', '.join(repr(c) for c in constant)} are"
        problems.append(f"{what} constant in {name} (a constant column cannot explain anything); leave "
                        f"{'it' if len(constant) == 1 else 'them'} out with --drop-columns "
                        f"{shlex.quote(','.join(map(str, constant)))}")
    return frame, notes, problems


def rare_class_problems(labels: pd.Series, target: str, name: str) -> list[str]:
    """A problem (with its fix) for the classes with fewer than :data:`MIN_CLASS_ROWS` rows: a misspelt label
    ('Rejectd' once beside 'Rejected') would train as a class of its own that no validation or test row holds."""
    counts = labels.value_counts()
    rare = counts[counts < MIN_CLASS_ROWS]
    if rare.empty:
        return []
    shown = ", ".join(f"{label!r} ({count} row{'s' if count > 1 else ''})" for label, count in rare.items())
    enough = counts.index[counts >= MIN_CLASS_ROWS]
    fix = (f"a misspelt label? write it as one of the other classes ({', '.join(map(repr, enough[:5]))}), or leave "
           "those rows out" if len(enough) else
           f"no class has {MIN_CLASS_ROWS} rows: the table is too small to train on; give it more rows")
    return [f"target {target!r}: {'class' if len(rare) == 1 else 'classes'} {shown} of {name} "
            f"{'has' if len(rare) == 1 else 'have'} too few rows for the training, validation and test splits "
            f"(allowed: at least {MIN_CLASS_ROWS} rows per class); {fix}"]


def raise_problems(problems: list[str], name: str) -> None:
    """A one-line ``ValueError`` with every problem of a table (each with its fix), so that one run shows them all."""
    if len(problems) == 1:
        raise ValueError(f"data: {problems[0]}")
    if problems:
        raise ValueError(f"data: {len(problems)} problems in {name}, each with its fix: "
                         + " | ".join(f"({i}) {problem}" for i, problem in enumerate(problems, start=1)))
