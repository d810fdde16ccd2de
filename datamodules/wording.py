"""What a table's columns and coded values mean, in words: a data spec's ``label``, ``unit`` and ``values``.

A column code (``PAY_0``) and a coded value (``2``) mean nothing to an applicant; the data spec may say what they
mean: ``PAY_0: {kind: ordinal, order: [-2, -1, 0, 1, 2], label: "Repayment status, September", values: {-1: paid on
time, 2: two months late}}``, ``LIMIT_BAL: {label: Credit limit, unit: NT$}``, and for the classes of the target
``target: {name: default, values: {0: no default, 1: default}}``. This module checks those keys (their types when
the spec is read, :func:`check_wording`; their values against the column once its kind and categories are known,
:func:`fitted_value_labels`) and words values for explanations (:func:`label_of`). The codec keeps them
(``ColumnSpec.label``, ``unit_label``, ``value_labels``; ``TabularCodec.class_labels``), so they travel with the
model. Plain Python and pandas: a spec is checked before torch is imported.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence

from datamodules.suggest import did_you_mean

WORDING_KEYS = ("label", "unit", "values")  # a column's words; the target entry takes values only
VALUE_KINDS = ("categorical", "binary", "ordinal", "integer")  # kinds whose values may be labelled (codes)
UNIT_KINDS = ("continuous", "integer")  # kinds whose values are amounts in a unit
LONGEST = 200  # characters of a label: a phrase, not a paragraph
YAML_BOOL = " (YAML reads an unquoted Yes, No, On or Off as true or false: quote it)"


def _text_problem(value) -> str | None:
    """Why ``value`` cannot be a label (``None`` where it can): one line of text, not empty, at most
    :data:`LONGEST` characters."""
    if isinstance(value, bool):
        return "true or false, not text" + YAML_BOOL
    if isinstance(value, numbers.Real):
        return "a number, not text: quote it"
    if not isinstance(value, str):
        return f"a {type(value).__name__}, not text"
    if not value.strip():
        return "empty"
    if "\n" in value or "\r" in value:
        return "more than one line"
    return f"{len(value)} characters" if len(value) > LONGEST else None


def _plain(value):
    """A numpy scalar as the Python value it holds."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def check_wording(where: str, options: Mapping, keys: Sequence[str] = WORDING_KEYS) -> None:
    """A one-line ``ValueError`` (starting ``where``, e.g. ``data_spec: column 'PAY_0':``) for a ``label`` or
    ``unit`` that is no one-line text, and a ``values`` that is no mapping of plain values (text, numbers) to such
    texts. What ``values`` names is checked against the column later (:func:`fitted_value_labels`)."""
    for key in ("label", "unit"):
        if key in keys and options.get(key) is not None:
            problem = _text_problem(options[key])
            if problem:
                example = "label: Credit limit" if key == "label" else "unit: NT$ (or years, months, %)"
                raise ValueError(f"{where} {key} {options[key]!r} ({problem}); allowed: one line of text of at most "
                                 f"{LONGEST} characters, such as {example}")
    given = options.get("values")
    if "values" not in keys or given is None:
        return
    if not isinstance(given, Mapping) or not given:
        raise ValueError(f"{where} values {given!r}; allowed: a mapping of the column's values to what they mean, "
                         "such as values: {-1: paid on time, 1: one month late}")
    for value, text in given.items():
        if not isinstance(value, (str, numbers.Real)) or value != value:  # value != value: NaN
            raise ValueError(f"{where} values: {value!r} is no value of a column; allowed: text or a number, such as "
                             "values: {-1: paid on time}")
        problem = _text_problem(text)
        if problem:
            raise ValueError(f"{where} values: {_plain(value)!r}: {text!r} ({problem}); allowed: one line of text of "
                             f"at most {LONGEST} characters saying what {_plain(value)!r} means")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def same_value(a, b) -> bool:
    """Whether a data spec's ``a`` names the column's value ``b``: numbers as numbers (``2`` and ``2.0``), else as
    text (``'2'`` names ``2``, as a category code is matched elsewhere); ``True`` never names ``1``."""
    if _is_number(a) and _is_number(b):
        return float(a) == float(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return str(a) == str(b)


def fitted_value_labels(where: str, given: Mapping | None, kind: str, categories: Sequence = (),
                        low: float | None = None, high: float | None = None, noun: str = "a value of the column in "
                        "the file") -> list[list] | None:
    """``[[value, text], ...]`` of the ``values`` a data spec gives (``None`` without them), each value as the
    column holds it, in the column's order (its categories; an integer column's ascending). A one-line
    ``ValueError`` (starting ``where``) for a value the column cannot hold: a category no row holds (categorical,
    binary; with the one it is probably a misspelling of), one not in the order (ordinal), for an integer column a
    number that is not whole or lies outside ``low`` … ``high`` (the declared bounds, else the file's values), and
    one value named twice (``1`` and ``'1'``). ``noun``: what a categorical value is (a class of the target). A
    JSON spec's keys are text: ``"-1"`` names the code -1 of an integer column."""
    if not given:
        return None
    found = []
    for value, text in given.items():
        if kind == "integer":
            if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
                value = int(value)
            if not _is_number(value) or not float(value).is_integer():
                raise ValueError(f"{where} values: {_plain(value)!r} is no whole number; allowed: whole numbers, the "
                                 "codes of an integer column (or declare its kind categorical or ordinal)")
            if (low is not None and value < low) or (high is not None and value > high):
                raise ValueError(f"{where} values: {_plain(value)!r} lies outside the column's values "
                                 f"({_number(low)} to {_number(high)}); allowed: whole numbers from {_number(low)} "
                                 f"to {_number(high)} (declare lower/upper to cover it)")
            match = int(value)
        else:
            matches = [c for c in categories if same_value(value, c)]
            if not matches:
                hint = did_you_mean(value, categories) or (YAML_BOOL if isinstance(value, bool) else "")
                where_not = "in its order" if kind == "ordinal" else noun
                raise ValueError(f"{where} values: {_plain(value)!r} is not {where_not}{hint}; allowed: "
                                 f"{', '.join(map(str, categories))}")
            match = matches[0]
        if any(same_value(match, seen) for seen, _ in found):
            raise ValueError(f"{where} values: {_plain(match)!r} is named twice; allowed: each value once")
        found.append([_plain(match), text.strip()])
    if kind == "integer":
        return sorted(found, key=lambda pair: pair[0])
    rank = {i: next(j for j, c in enumerate(categories) if same_value(value, c)) for i, (value, _) in enumerate(found)}
    return [found[i] for i in sorted(rank, key=rank.get)]


def _number(value) -> str:
    value = _plain(value)
    return f"{int(value)}" if isinstance(value, float) and value.is_integer() else str(value)


def label_of(value_labels: Sequence | None, value) -> str | None:
    """The words for ``value`` in ``value_labels`` (``[[value, text], ...]``), ``None`` where it has none."""
    for known, text in value_labels or ():
        if same_value(known, value):
            return text
    return None


def worded(value, words: str | None) -> str:
    """``value`` (a class or a code) as people read it: the data spec's ``words`` for it with the value in brackets
    (``likely to default next month [1]``), else the value as it is."""
    return f"{words} [{_plain(value)}]" if isinstance(words, str) else str(_plain(value))


def worded_values(values, value_labels: Sequence | None, joiner: str = ", ") -> str:
    """``values`` (classes or codes) as a list people read: each :func:`worded` with its words in ``value_labels``
    (``likely to repay [0], likely to default next month [1]``)."""
    return joiner.join(worded(value, label_of(value_labels, value)) for value in values)


def row_number(position: int) -> int:
    """A row's position in a table or request (from 0) as every message shows it and people count rows: from 1, the
    first row under the header (a request's first row) being row 1."""
    return int(position) + 1


def heading(name, label: str | None = None, unit: str | None = None) -> str:
    """A column as a person reads it: its ``label`` (else its ``name``), with its ``unit`` in brackets:
    ``Credit limit (NT$)``."""
    shown = label or str(name)
    return f"{shown} ({unit})" if unit else shown


# ISO 4217 codes a data spec's unit may give instead of a symbol (unit: USD): the common ones; any other unit of
# three capitals (PSI, RPM) is no currency and keeps its brackets.
CURRENCY_CODES = frozenset(("AUD BRL CAD CHF CNY CZK DKK EUR GBP HKD HUF IDR ILS INR JPY KRW MXN NOK NTD NZD PLN "
                            "RON RUB SEK SGD THB TRY TWD USD ZAR").split())


def currency_format(unit: str | None) -> str | None:
    """How an amount in a data spec's ``unit`` is written where that unit is a currency, as a pattern for ``{}``:
    a currency symbol, alone or after at most three letters (``$``, ``€``, ``£``, ``NT$``, ``US$``), goes before the
    number (``${}``: ``$37,200``), a currency code (``USD``, ``EUR``: :data:`CURRENCY_CODES`) before it with a space
    (``USD {}``); ``None`` for any other unit (``years``, ``km``, ``$ thousands``), which a heading shows in brackets
    (:func:`heading`)."""
    import unicodedata  # noqa: PLC0415

    text = (unit or "").strip()
    if text in CURRENCY_CODES:
        return f"{text} {{}}"
    if text and unicodedata.category(text[-1]) == "Sc" and len(text) <= 4 and \
            all("A" <= ch.upper() <= "Z" for ch in text[:-1]):
        return f"{text}{{}}"
    return None


def labels_text(value_labels: Sequence | None, shown: int = 8) -> str:
    """``-1 = paid on time, 2 = two months late``: the start-up lines' list of labelled values, the first ``shown``
    and a count where there are more."""
    pairs = list(value_labels or ())
    text = ", ".join(f"{value} = {words}" for value, words in pairs[:shown])
    return text + (f", … ({len(pairs)} in all)" if len(pairs) > shown else "")


def check_wording_kind(name, kind: str, options: Mapping) -> None:
    """A one-line ``ValueError`` for words a column of ``kind`` cannot have: a ``unit`` on a column of categories
    (its values are words already, or codes to word with ``values:``) and ``values`` on a continuous column (no
    value of it is a code)."""
    if options.get("unit") is not None and kind not in UNIT_KINDS:
        raise ValueError(f"data_spec: column {name!r}: unit {options['unit']!r} has no meaning for a {kind} column "
                         "(its values are categories: say what they mean with values:); allowed: unit on a "
                         f"{' or '.join(UNIT_KINDS)} column")
    if options.get("values") is not None and kind not in VALUE_KINDS:
        raise ValueError(f"data_spec: column {name!r}: values has no meaning for a {kind} column (its numbers are "
                         f"amounts, not codes); allowed: values on a {', '.join(VALUE_KINDS[:-1])} or "
                         f"{VALUE_KINDS[-1]} column (a code of categories: declare its kind)")


def word_column(column, options: Mapping, values) -> None:
    """Give a fitted ``column`` (a ``ColumnSpec``) the data spec's ``label``, ``unit`` and ``values``
    (``options``), the values checked against it (:func:`fitted_value_labels`): an integer column's against its
    declared ``lower``/``upper``, else the range of the file's ``values``."""
    column.label = options["label"].strip() if options.get("label") is not None else None
    column.unit_label = options["unit"].strip() if options.get("unit") is not None else None
    low = high = None
    if column.kind == "integer" and options.get("values"):
        import pandas as pd  # noqa: PLC0415

        numbers = pd.to_numeric(values, errors="coerce").dropna()
        low = column.lower if column.lower is not None else (float(numbers.min()) if len(numbers) else None)
        high = column.upper if column.upper is not None else (float(numbers.max()) if len(numbers) else None)
    column.value_labels = fitted_value_labels(f"data_spec: column {column.name!r}:", options.get("values"),
                                              column.kind, column.categories, low, high)


def unworded_codes(column) -> list[str]:
    """The values of a column of categories that its data spec's ``values`` leaves without words (``[]`` where it
    words them all or none)."""
    if not column.value_labels or column.kind not in ("categorical", "binary", "ordinal"):
        return []
    return [_number(c) for c in column.categories if label_of(column.value_labels, c) is None]


def unworded_note(columns, shown: int = 8) -> str | None:
    """The one start-up note on the columns whose data spec words some of their values but not all (``None`` where
    there are none): explanations and letters show the others as bare codes (``Education: high school → 5``).
    Columns that leave the same codes out are named together."""
    by_codes: dict[tuple, list[str]] = {}
    changeable = False
    for column in columns:
        codes = unworded_codes(column)
        if codes:
            by_codes.setdefault(tuple(codes), []).append(str(column.name))
            changeable = changeable or column.mutability != "none"
    if not by_codes:
        return None
    listed = "; ".join(f"{', '.join(names)}: {', '.join(codes[:shown])}" + (f", … ({len(codes)} in all)"
                                                                           if len(codes) > shown else "")
                       for codes, names in by_codes.items())
    hold = ", or hold a column that may change with mutability: none" if changeable else ""
    return (f"codes the data spec's values give no words: {listed}; explanations and letters show them as codes "
            f"(word them under values:{hold})")


def target_values(spec: Mapping | None) -> Mapping | None:
    """The data spec's ``target: {values: {class: words}}``, ``None`` without it."""
    entry = (spec or {}).get("target")
    return entry.get("values") if isinstance(entry, Mapping) else None
