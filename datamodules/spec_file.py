"""A data spec written out from a table, to edit and pass back as ``--data-spec`` (``train.py --write-data-spec``).

The file states what training would use (every column's kind and mutability, declared bounds, the positive
class of two, the order of three or more where one was given), so that training with it unedited gives the same preprocessing as without it. What a person needs to
decide the rest is written beside each column as a comment: its categories, or its range and how many different
values it holds, and a hint where the kind looks wrong (a number that is a code of categories, an identifier, text
categories that read as ranges or grades: ``<1 year``, ``1-3 years``, ``10+ years``; ``A`` to ``G``). Such a
column stays categorical (no order is guessed); the hint writes the order to paste. An ordinal column is written
with its ``order``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pandas as pd
import yaml

from datamodules.codec import _plain, category_codes

SHOWN_CATEGORIES = 6  # categories listed in a column's comment; the rest are counted
HINTED_LEVELS = 12  # an order longer than this is not suggested in a comment
RANGE = re.compile(r"\d\s*(-|–|to)\s*\$?\d|[<>≤≥]\s*\$?\d|\d\s*\+")  # 1-3 years, <1 year, 10+ years
NUMBER = re.compile(r"\d+(?:\.\d+)?")
GRADE = re.compile(r"[A-Z][1-9]?|[a-z][1-9]?")  # A … G, A1 … C5 (letters from A without a gap)


def yaml_scalar(value) -> str:
    """``value`` as one YAML scalar, quoted only where YAML needs it (``'Unnamed: 0'``, ``'yes'``, ``'007'``)."""
    return yaml.safe_dump(_plain(value), default_flow_style=True, allow_unicode=True, width=10**6).strip() \
        .removesuffix("...").strip()


def flow_scalar(value) -> str:
    """``value`` as one YAML scalar inside a flow mapping or list (``{label: 'Repayment status, September'}``), where
    a comma or a colon would end it unquoted."""
    return yaml.safe_dump([_plain(value)], default_flow_style=True, allow_unicode=True, width=10**6).strip()[1:-1]


def wording_fields(column) -> str:
    """A column's ``label``, ``unit`` and ``values`` as the fields of its spec line (``""`` without them)."""
    fields = [f"{key}: {flow_scalar(value)}" for key, value in (("label", getattr(column, "label", None)),
                                                                 ("unit", getattr(column, "unit_label", None)))
              if value is not None]
    if getattr(column, "value_labels", None):
        fields.append("values: {" + ", ".join(f"{flow_scalar(value)}: {flow_scalar(text)}"
                                             for value, text in column.value_labels) + "}")
    return "".join(f", {field}" for field in fields)


def _number(value) -> str:
    """A number as a person reads it in a comment: ``21``, ``0.25``, ``1e+06`` stays ``1000000``."""
    value = _plain(value)
    return f"{value:,.6g}".replace(",", " ") if isinstance(value, float) and not float(value).is_integer() \
        else f"{int(value):,}".replace(",", " ")


def _comment_text(value) -> str:
    """A category as it reads in a comment: one line, at most 30 characters."""
    text = str(_plain(value)).replace("\n", " ").replace("\r", " ")
    return text if len(text) <= 30 else text[:29] + "…"


def _rank_of_range(text: str) -> float:
    """Where a range such as ``<1 year``, ``1-3 years`` or ``10+ years`` lies: its first number, less a half below
    it (``<``, ``under``), plus a half above it (``+``, ``>``, ``or more``)."""
    number = NUMBER.search(text)
    before, after = text[:number.start()].lower(), text[number.end():].lower()
    below = "<" in before or "≤" in before or any(w in before for w in ("under", "less than", "below"))
    above = ">" in before or "≥" in before or after.lstrip().startswith("+") or "or more" in after or "over" in after
    return float(number.group()) - 0.5 * below + 0.5 * above


def ordered_look(categories) -> list | None:
    """The order text categories seem to have, to suggest (never to apply): ranges, every one with a number and some
    with a range mark (``<1 year``, ``1-3 years``, ``10+ years``: sorted by :func:`_rank_of_range`, each at its own
    place), or grades (``A`` to ``G`` without a gap, ``A1`` … ``C5``); at least three and at most
    :data:`HINTED_LEVELS` of them; else ``None``."""
    texts = [str(c) for c in categories]
    if not 3 <= len(texts) <= HINTED_LEVELS or not all(isinstance(c, str) for c in categories):
        return None
    if all(NUMBER.search(t) for t in texts) and any(RANGE.search(t) for t in texts):
        ranks = {t: _rank_of_range(t) for t in texts}
        return sorted(texts, key=ranks.get) if len(set(ranks.values())) == len(texts) else None
    if all(GRADE.fullmatch(t) for t in texts):
        letters = sorted({t[0].upper() for t in texts})
        if letters[0] == "A" and len(letters) >= 3 and ord(letters[-1]) - ord("A") == len(letters) - 1:
            return sorted(texts)
    return None


def column_comment(column, values: pd.Series, code_like: bool, identifier_like: bool) -> str:
    """What the file shows about one column: its categories, or its range and number of different values, and
    a hint where the inferred kind looks wrong."""
    present = values.dropna()
    missing = f"; {len(values) - len(present)} missing" if len(present) < len(values) else ""
    if column.kind == "ordinal":  # its order is the entry's; the comment says which categories the file lacks
        unused = [c for c, n in zip(column.categories, ordinal_counts(column, values)) if not n]
        return f"lowest to highest, {len(column.categories) - len(unused)} of the {len(column.categories)} in the " \
               f"file" + (f"; never in the file: {', '.join(_comment_text(c) for c in unused)}" if unused else "") + \
               missing
    if column.kind in ("categorical", "binary"):
        shown = ", ".join(_comment_text(c) for c in column.categories[:SHOWN_CATEGORIES])
        more = f", … ({len(column.categories)} in all)" if len(column.categories) > SHOWN_CATEGORIES else ""
        order = ordered_look(column.categories) if column.kind == "categorical" else None
        hint = f"; ordered? then kind: ordinal, order: [{', '.join(map(yaml_scalar, order))}]" if order else ""
        return f"{shown}{more}{missing}{hint}"
    numbers = pd.to_numeric(present, errors="coerce").dropna()
    text = (f"{_number(numbers.min())} to {_number(numbers.max())} in the file, {numbers.nunique()} different values"
            if len(numbers) else "no values") + missing
    if identifier_like:
        text += "; a different number in every row: an identifier? leave it out with --drop-columns"
    elif code_like:
        text += "; a code of categories? then kind: categorical (kind: ordinal where they rank)"
    return text


def ordinal_counts(column, values: pd.Series) -> list[int]:
    """How many rows of ``values`` hold each category of an ordinal ``column``'s order, lowest first."""
    ranks = category_codes(values.dropna(), column.categories)
    return [int(n) for n in pd.Series(ranks[ranks >= 0]).value_counts().reindex(range(len(column.categories)),
                                                                              fill_value=0)]


def spec_text(module, mutability: Mapping[str, str] | None = None, source: str = "") -> str:
    """The data spec of a :class:`~datamodules.table.TableDataModule` as YAML with comments: its codec's kinds and
    mutability (``mutability`` by column name on top, e.g. from ``--immutable``), declared bounds, the positive
    class of a yes/no target, and each column's categories or range as a comment (see the module)."""
    codec, mutability = module.codec, dict(mutability or {})
    code_like, identifier_like = set(module.code_like()), set(module.identifier_like())
    lines = [f"# Data spec of {source or module.label_of_source}, written by train.py --write-data-spec.",
             "# Check every column's kind (continuous | integer | categorical | binary | ordinal, with order: its",
             "# categories from lowest to highest) and mutability (both | increase | decrease | none: increase is",
             "# higher in an ordinal column's order); bound a number's counterfactuals in its own units with lower:",
             "# and upper: (without them: the training range widened to mean ± 3 sd, not below 0 for a column with",
             "# no negative value); step: 1000 makes its counterfactuals change it by whole multiples of 1000, and",
             "# max_change: 10000 by at most 10000 either way (an ordinal column's step: and max_change: count",
             "# places of its order: max_change: 2 is at most two places up or down). A bound may read other number",
             "# columns of the same row: upper: age - 16, upper: 10 * income (terms [number *] column joined by + and",
             "# -, plus a number).",
             "# In words, for explanations and letters to applicants: label: Credit limit, unit: NT$ (a number's),",
             "# values: {-1: paid on time, 2: two months late} (what a code means; target: {name: ..., values: ...}",
             "# for the classes).",
             "# Columns left out of this file keep the kind inferred from the file.",
             f"# target {yaml_scalar(codec.target)}: classes {', '.join(_comment_text(c) for c in codec.classes)}"]
    lines += [f"# read: {note}" for note in module.read_notes]  # how the file was written: delimiter, decimal commas
    if codec.dropped:
        lines.append(f"# left out (--drop-columns): {', '.join(map(str, codec.dropped))}")
    class_words = "" if not getattr(codec, "class_labels", None) else \
        ", values: {" + ", ".join(f"{flow_scalar(c)}: {flow_scalar(text)}" for c, text in codec.class_labels) + "}"
    if len(codec.classes) == 2:
        lines.append(f"positive: {yaml_scalar(codec.positive)}  # the class that is label 1 (default: the last in "
                     "sort order)")
        if class_words:
            lines.append(f"target: {{name: {flow_scalar(codec.target)}{class_words}}}  # the classes in words")
    elif getattr(codec, "order", None):  # an ordered outcome: explanations count "at least" a class
        lines.append(f"target: {{name: {flow_scalar(codec.target)}, order: [{', '.join(map(flow_scalar, codec.order))}]"
                     f"{class_words}}}  # its classes from lowest to highest")
    elif class_words:
        lines.append(f"target: {{name: {flow_scalar(codec.target)}{class_words}}}  # the classes in words")
    else:
        lines.append(f"# ordered classes? then target: {{name: "
                     f"{yaml_scalar(codec.target)}, order: [{', '.join(map(yaml_scalar, codec.classes))}]}} with the "
                     "classes from lowest to highest: explanations count \"at least\" a class")
    lines.append("columns:")
    for column in codec.columns:
        entry = {"kind": column.kind, "mutability": mutability.get(column.name, column.mutability)}
        for key in ("lower", "upper", "step", "max_change"):  # a bound other columns give: its expression
            value = getattr(column, key) if getattr(column, key) is not None else getattr(column, f"{key}_rule", None)
            if value is not None:
                entry[key] = _plain(value)
        fields = ", ".join(f"{key}: {yaml_scalar(value)}" for key, value in entry.items())
        if column.kind == "ordinal":
            fields += f", order: [{', '.join(flow_scalar(c) for c in column.categories)}]"
        fields += wording_fields(column)
        comment = column_comment(column, module.frame[column.name], column.name in code_like,
                                 column.name in identifier_like)
        lines.append(f"  {yaml_scalar(column.name)}: {{{fields}}}  # {comment}")
    return "\n".join(lines) + "\n"
