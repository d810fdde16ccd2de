"""A CSV's header line: its delimiter and column names, read with the csv module alone (no pandas, no torch).

:func:`datamodules.table_format.read_csv` reads a table's delimiter here (:func:`sniff_delimiter`, Excel's
``sep=;`` line), and the recipes read a table's column names here (:func:`header_names`) to refuse an option that
names no column (``--immutable agee``) in a fraction of a second, before torch is imported or the table is read.
"""

from __future__ import annotations

import csv
import itertools
import re
import unicodedata
from pathlib import Path

from datamodules.suggest import name_hint

DELIMITERS = (",", ";", "\t", "|")
SEP_LINE = re.compile(r'"?sep=(.)"?')
CSV_SUFFIXES = (".csv", ".tsv", ".txt")  # the table files whose names are in a header line (not Parquet)


def sniff_delimiter(header: str) -> str:
    """The delimiter of a CSV from its header line: the candidate (``,``, ``;``, tab, ``|``) it holds most often,
    outside quotes; ``,`` for a one-column file."""
    fields = {sep: len(next(csv.reader([header], delimiter=sep))) for sep in DELIMITERS}
    best = max(DELIMITERS, key=lambda sep: fields[sep])  # ties keep the earlier candidate: ',' first
    return best if fields[best] > 1 else ","


def second_line(path: Path, encoding: str) -> str:
    """The line after Excel's ``sep=;`` line: the header (the file is read no further)."""
    with open(path, encoding=encoding, newline="") as handle:
        lines = list(itertools.islice((line for line in handle if line.strip()), 2))
    return lines[1].rstrip("\r\n") if len(lines) > 1 else ""


def header_line(path: Path, encoding: str) -> str:
    """The first line of ``path`` that is not blank, without its line end."""
    with open(path, encoding=encoding, newline="") as handle:
        for line in handle:
            if line.strip():
                return line.rstrip("\r\n")
    return ""


def column_name(text) -> str:
    """A column's name as every reader of ours names it: without surrounding spaces, and in Unicode's composed form
    (NFC), so that ``Âge`` written by a tool that decomposes accents (NFD, as macOS may) is the ``Âge`` typed."""
    return unicodedata.normalize("NFC", str(text).strip())


def header_names(path) -> list[str] | None:
    """The column names of a CSV file (``.csv``, ``.tsv``, ``.txt``) as :func:`~datamodules.table_format.read_csv`
    names them (spaces around them dropped), from its header line alone; ``None`` where that line cannot tell them
    (a Parquet, missing or empty file, an unreadable line, a name left empty or written twice): the full read decides."""
    path = Path(path)
    if path.suffix.lower() not in CSV_SUFFIXES or not path.is_file():
        return None
    try:
        try:
            encoding, header = "utf-8-sig", header_line(path, "utf-8-sig")
        except UnicodeDecodeError:
            encoding, header = "cp1252", header_line(path, "cp1252")
        hint = SEP_LINE.fullmatch(header.strip())
        sep = hint.group(1) if hint else sniff_delimiter(header)
        if hint:
            header = second_line(path, encoding)
        names = [column_name(name) for name in next(csv.reader([header], delimiter=sep))]
    except (OSError, UnicodeDecodeError, csv.Error, StopIteration):
        return None
    if not names or not all(names) or len(set(names)) != len(names):
        return None
    return names


def target_column_error(target, columns, name: str, frame=None) -> ValueError | None:
    """The one-line error for a ``target`` that names no column of the table ``name`` (``columns``: its names), or
    ``None``: the first check of :func:`~datamodules.table_format.check_target`, which needs the names alone. Given
    the table as read (``frame``), a target that is a value of a text column says so: a class typed for the column
    (``--target repaid``; explain.py's ``--target`` is a class, train.py's the column that holds them)."""
    shown = ", ".join(map(str, columns))
    if not target:
        return ValueError(f"target: required with a table file ({name}); allowed: one of its columns: {shown}")
    if target not in columns:
        hint = name_hint(target, columns) or (_value_hint(target, frame) if frame is not None else "")
        return ValueError(f"target: column {target!r} not found in {name}{hint}; allowed: {shown}")
    return None


def _value_hint(target, frame) -> str:
    """``" ('repaid' is a value of the column 'outcome': ...)"`` for the first text column of ``frame`` that holds
    ``target`` in a cell, else ``""``."""
    for column in frame.columns:
        values = frame[column]
        if values.dtype.kind not in "biufcmM" and (values.astype(str) == str(target)).any():  # text, not numbers
            return (f" ({target!r} is a value of the column {column!r}: --target names the column to predict, "
                    f"--target {column})")
    return ""


def drop_columns_error(dropped, columns, target, name: str) -> ValueError | None:
    """The one-line error for a ``--drop-columns`` list (``dropped``) that names no column of the table ``name``
    (``columns``: its names) or names its ``target``, or ``None``."""
    unknown = [c for c in dropped if c not in columns]
    if unknown:
        return ValueError(f"drop_columns: got {unknown[0]!r}, not a column of {name}; allowed: "
                          f"{', '.join(map(str, columns))}")
    if target is not None and target in dropped:
        return ValueError(f"drop_columns: got {target!r}, the target; allowed: the other columns of {name}")
    return None


def looks_like_names(names: list[str]) -> bool:
    """Whether a header line holds names rather than a first row of data (Adult's ``adult.data``, ``39, State-gov,
    ...``): none of them is a number. Where it may be data, only the full read tells (it refuses such a file)."""
    def number(text: str) -> bool:
        try:
            float(text.replace(",", "."))
        except ValueError:
            return False
        return True

    return not any(number(name) for name in names)
