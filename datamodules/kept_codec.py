"""Another table read with a trained model's own preprocessing: next month's file for a model trained on this month's.

``evaluate.py --data november.csv`` and ``train.py --data november.csv --from-checkpoint october/last.ckpt`` encode the
new file with the model's fitted :class:`~datamodules.codec.TabularCodec` (its columns, categories and
standardisation), never with one fitted again on the new rows: a network reads its inputs as it was trained to.
So the new file must hold every column the model reads (in any order) and only categories it knows; a column it does
not read (a new one, or one the model was trained without) is left out with a note. Each check is one line naming
``--data``, the value and what is allowed, before anything is trained or evaluated. Plain pandas: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from datamodules.codec import LABELLED, TabularCodec, category_codes
from datamodules.suggest import name_hint
from datamodules.table_format import as_written
from datamodules.wording import row_number

SHOWN = 5  # rows or values a message names before it counts the rest


def _number(value, codec: TabularCodec, column) -> str:
    """A bound or value of a number column as the training file writes numbers: whole where it is, else to cents."""
    value = float(value)
    text = str(int(value)) if value.is_integer() else str(round(value, 2))
    return as_written(text, codec.decimal_comma, column.thousands)


def model_columns(frame: pd.DataFrame, codec: TabularCodec, name: str, target: str,
                  drop_columns: Sequence[str] = ()) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with the columns the model reads and the target, and a note naming the columns left out that the
    model does not read and the user did not name in ``drop_columns`` (a new column of the month: ``branch``). A
    column the model reads that ``frame`` lacks is a one-line ``ValueError`` naming the file's columns the model does
    not know (a rename, ``employment_years`` for ``years_employed``, most likely); so is a ``drop_columns`` entry the
    model reads."""
    reads = [c.name for c in codec.columns]
    dropped = [c for c in drop_columns if c in reads]
    if dropped:
        raise ValueError(f"drop_columns: got {dropped[0]!r} (a column the model reads: its preprocessing comes with "
                         f"it); allowed: columns it does not read, such as the file's "
                         f"{', '.join(map(str, [c for c in frame.columns if c not in reads and c != target]) or ['none'])}")
    unknown = [c for c in frame.columns if c not in reads and c != target]
    missing = [c for c in reads if c not in frame.columns]
    if missing:
        unknown = [c for c in unknown if c not in codec.dropped]  # an identifier the model was trained without
        hints = [name_hint(c, missing, "{}") for c in unknown]
        close = next(((c, h) for c, h in zip(unknown, hints) if h), None)
        renamed = f"; the file's {close[0]!r}: {close[1]}" if close else \
            f"; the file has columns the model does not know: {', '.join(map(str, unknown[:SHOWN]))}" \
            f"{' and more' if len(unknown) > SHOWN else ''} (one renamed? give it the model's name)" if unknown else ""
        raise ValueError(f"data: got {name!r} (without the model's column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(map(repr, missing))}{renamed}); allowed: a table holding every column the "
                         f"model reads, in any order: {', '.join(reads)}")
    left = [c for c in unknown if c not in codec.dropped and c not in drop_columns]
    notes = [f"{Path(name).name}: columns the model does not read left out: {', '.join(map(str, left))} (the model keeps its "
             "inputs; --drop-columns names such columns to leave them out without this note)"] if left else []
    return frame[[*reads, target] if target in frame.columns else reads], notes


def unseen_category_rows(frame: pd.DataFrame, codec: TabularCodec) -> dict[str, pd.Series]:
    """Per column of categories, the rows of ``frame`` (a boolean Series) holding a category the model was not
    trained on; columns without such rows are left out. Missing values are not counted (``--impute``'s)."""
    found = {}
    for column in codec.columns:
        if column.kind in LABELLED and column.name in frame.columns:
            values = frame[column.name]
            unseen = values.notna() & (category_codes(values, column.categories) < 0)
            if unseen.any():
                found[column.name] = pd.Series(unseen, index=frame.index)
    return found


def refuse_unseen_categories(frame: pd.DataFrame, codec: TabularCodec, name: str, fix: str) -> None:
    """A one-line ``ValueError`` naming the first column whose rows hold a category the model was not trained on: the
    values, how many rows, the first rows (numbered as the file's data rows, from 1) and the model's categories;
    ``fix`` says what to do. The model has no input for such a category: it can neither score nor learn it."""
    found = unseen_category_rows(frame, codec)
    if not found:
        return
    column_name, rows = next(iter(found.items()))
    column = next(c for c in codec.columns if c.name == column_name)
    values = pd.unique(frame.loc[rows, column_name])
    shown = ", ".join(repr(v.item() if isinstance(v, np.generic) else v) for v in values[:SHOWN])
    where = [str(row_number(i)) for i in frame.index[rows.to_numpy()][:SHOWN]]
    more = f"; also in {', '.join(map(repr, list(found)[1:]))}" if len(found) > 1 else ""
    what = "a category" if len(values) == 1 else "categories"
    raise ValueError(f"data: got {column_name}={shown} ({what} the model was not trained on, in {int(rows.sum())} "
                     f"row(s) of {name}: row {', '.join(where)}{', ...' if rows.sum() > SHOWN else ''}{more}); "
                     f"allowed: {', '.join(map(str, column.categories))}; {fix}")


def widen_domain(codec: TabularCodec, frame: pd.DataFrame, name: str) -> list[str]:
    """Widen each number column's inferred domain (its training range, :meth:`~datamodules.codec.ColumnSpec.domain`)
    in place to hold the values of ``frame`` (the new training rows), and say so, one note per column widened; the
    encoding (mean and scale) and declared bounds stay. A model fine-tuned on rows beyond its first month's range then
    explains those rows, where the old domain would refuse them."""
    notes = []
    for column in codec.columns:
        if column.kind not in ("continuous", "integer") or column.name not in frame.columns \
                or column.train_min is None or column.train_max is None:
            continue
        values = pd.to_numeric(frame[column.name], errors="coerce").dropna()
        if values.empty:
            continue
        before = column.domain()
        low, high = float(values.min()), float(values.max())
        column.train_min, column.train_max = min(column.train_min, low), max(column.train_max, high)
        after = column.domain()
        if after != before:
            text = [_number(v, codec, column) for v in (*before, *after)]
            notes.append(f"{column.name}: {Path(name).name}'s training rows reach {text[2] if after[0] < before[0] else text[3]}, "
                         f"outside the model's domain {text[0]} to {text[1]}: the domain widens to {text[2]} to "
                         f"{text[3]} (the encoding stays the model's)")
    return notes


def outside_domain_notes(codec: TabularCodec, frame: pd.DataFrame, name: str) -> list[str]:
    """One note per number column with rows of ``frame`` outside the model's domain: they are scored as they are (the
    model extrapolates), and a counterfactual search starts by moving them into the domain."""
    notes = []
    for column in codec.columns:
        if column.kind not in ("continuous", "integer") or column.name not in frame.columns:
            continue
        low, high = column.domain()
        values = pd.to_numeric(frame[column.name], errors="coerce")
        outside = (values < low) | (values > high)
        if outside.any():
            text = [_number(v, codec, column) for v in (low, high, values[outside].min(), values[outside].max())]
            shown = text[2] if text[2] == text[3] else f"{text[2]} to {text[3]}"
            notes.append(f"{column.name}: {int(outside.sum())} row(s) of {Path(name).name} lie outside the model's domain "
                         f"{text[0]} to {text[1]} ({shown}): they are evaluated as they are")
    return notes
