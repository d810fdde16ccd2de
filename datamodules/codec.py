"""The fitted preprocessing of a user's table: raw rows in original units ↔ model inputs, reversibly.

A :class:`TabularCodec` is fitted on the training rows only. Continuous and integer columns are standardised
(mean and standard deviation of the training rows), a categorical column becomes one 0/1 column per category
named ``column=value`` (a one-hot group: one category at a time), a binary column one 0/1 column, an ordinal column
(ordered categories, ``order:`` in the data spec) one input: the category's rank 0 … K−1 in its order,
standardised as an integer column is (the searches keep it on whole ranks, like an integer). ``decode`` maps any
model input back to a row of real values: the category of the group's largest entry, integers rounded, binary
values by the nearer of 0 and 1, an ordinal column's nearest rank as its category. The codec is a plain JSON-able
dict (``to_dict``), saved with every run, so a model and its preprocessing travel together.
"""

from __future__ import annotations

import numbers
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from datamodules.row_bounds import BOUND_VALUES, SIDES, column_rules, read_rules, rule_name, rule_text, rule_words
from datamodules.suggest import did_you_mean, name_hint
from datamodules.table_format import as_written
from datamodules.wording import (WORDING_KEYS, check_wording, check_wording_kind, fitted_value_labels, heading,
                                 label_of, labels_text, row_number, target_values, word_column, worded_values)

if TYPE_CHECKING:  # torch: the searches' structures load on first use, so a table is checked before torch loads
    from datamodules.feature_types import FeatureTypes, RowBound

KINDS = ("continuous", "integer", "categorical", "binary", "ordinal")
LABELLED = ("categorical", "binary", "ordinal")  # kinds whose values are categories (labels), not numbers
RANKED = ("integer", "ordinal")  # kinds the searches keep on whole numbers (an ordinal column: whole ranks)
NUMBER_KINDS = ("continuous", *RANKED)  # kinds with a step and a largest change (an ordinal column's: in ranks)
MUTABILITY = ("both", "increase", "decrease", "none")
MAX_CATEGORIES = 100  # more levels than this is an identifier or free text, not a category
SHOWN_LEVELS = 8  # an ordinal column's categories shown in a message or the start-up lines; the rest are counted
DOMAIN_STD = 3.0  # undeclared bounds: the training mean ± 3 standard deviations, and the training range (SPEC §2)


def _plain(value):
    """A numpy scalar as the Python value JSON keeps (ints stay ints)."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def categories_by_case(categories) -> dict:
    """``{text, case aside: category}`` for each category whose text no other category shares when case is set aside:
    how a value spelt otherwise (``yes`` for ``Yes``, ``false`` for ``FALSE``) finds the one category it means."""
    found: dict[str, list] = {}
    for category in categories:
        found.setdefault(str(category).casefold(), []).append(category)
    return {key: same[0] for key, same in found.items() if len(same) == 1}


def _declared_text(value, decimal_comma: bool = False, thousands: str | None = None) -> str:
    """A number declared in a data spec as the start-up message shows it: ``0``, ``2.5``, ``1000`` (``2,5`` where
    the file writes decimal commas; ``1 000`` where it writes ``thousands`` so, :func:`as_written`)."""
    value = _plain(value)
    return as_written(f"{value:g}" if isinstance(value, float) and not value.is_integer() else str(int(value))
                      if isinstance(value, float) else str(value), decimal_comma, thousands)


def number_text(value, decimal_comma: bool = False, thousands: str | None = None) -> str:
    """A value in a note (``filled with 0,31``, ``5 400``): a number as the file writes numbers (``decimal_comma``,
    its column's ``thousands`` separator: :func:`as_written`), anything else as it is."""
    value = _plain(value)
    plain = isinstance(value, (int, float)) and not isinstance(value, bool)
    return as_written(str(value), decimal_comma, thousands) if plain else str(value)


def _bounds_text(lower, upper, decimal_comma: bool = False, thousands: str | None = None) -> str:
    """Declared bounds in words for the start-up message: ``, at least 0``, ``, at most 5``, ``, from 0 to 5``."""
    shown = [_declared_text(v, decimal_comma, thousands) for v in (lower, upper)]
    if lower is not None and upper is not None:
        return f", from {shown[0]} to {shown[1]}"
    if lower is not None:
        return f", at least {shown[0]}"
    return "" if upper is None else f", at most {shown[1]}"


@dataclass
class ColumnSpec:
    """One raw column: its kind, mutability, bounds in original units and, once fitted, its encoding."""

    name: str
    kind: str = "continuous"
    mutability: str = "both"
    lower: float | None = None
    upper: float | None = None
    categories: list = field(default_factory=list)  # categorical, binary: the values in encoding order; ordinal: the
    # order, lowest first
    mean: float = 0.0  # continuous, integer, ordinal (of the ranks): x_encoded = (x - mean) / scale
    scale: float = 1.0
    train_min: float | None = None
    train_max: float | None = None
    fill: object = None  # trained with --impute median: what a missing value of this column becomes
    unit: str | None = None  # how the file wrote its numbers, as a format: "${}" for $36,428.20, "{}%" for 7.5%
    thousands: str | None = None  # the separator the file wrote its thousands with (" " for 14 999,01 €, "" for none;
    # table_format.THOUSANDS); None: unknown (a file of plain numbers, a model saved before), grouped by "," or "."
    step: float | None = None  # a counterfactual changes the value by whole multiples of it (ordinal: places)
    max_change: float | None = None  # a counterfactual moves the value at most this far (ordinal: places of the order)
    lower_rule: str | None = None  # continuous and integer: a bound that other number columns give per row, as the
    upper_rule: str | None = None  # canonical text of a linear expression (``age - 16``; datamodules.row_bounds)
    label: str | None = None  # what the column means, in words (a data spec's label: "Credit limit"; wording.py)
    unit_label: str | None = None  # the unit its numbers are in, in words (a data spec's unit: "NT$", "years")
    value_labels: list | None = None  # what coded values mean: [[value, text], ...] (a data spec's values:), in the
    # column's order; None defaults (not a factory) keep a column pickled before them (served predictors) readable

    def heading(self) -> str:
        """The column as a person reads it: its label (else its name) with its unit: ``Credit limit (NT$)``."""
        return heading(self.name, self.label, self.unit_label)

    def value_label(self, value) -> str | None:
        """What ``value`` of this column means in words (a data spec's ``values:``), ``None`` where it is not said."""
        return label_of(self.value_labels, value)

    @property
    def encoded_names(self) -> list[str]:
        """The model-input columns of this raw column."""
        return [f"{self.name}={value}" for value in self.categories] if self.kind == "categorical" else [self.name]

    def change_text(self, decimal_comma: bool = False, thousands: str | None = None) -> str:
        """Its ``step`` and ``max_change`` in words, as the start-up lines and the ``ct.constraints`` tag say them:
        ``in steps of 1000, changing by at most 10000``; an ordinal column's in places of its order (``changing by at
        most 2 places``); ``""`` without either. ``decimal_comma``, ``thousands``: numbers as such a file writes them
        (``0,5``, ``1 000``; :func:`~datamodules.table_format.as_written`)."""
        def amount(value) -> str:
            text = _declared_text(value, decimal_comma, thousands)
            return f"{text} place{'' if float(value) == 1 else 's'}" if self.kind == "ordinal" else text
        return ", ".join(([] if self.step is None else [f"in steps of {amount(self.step)}"])
                         + ([] if self.max_change is None else [f"changing by at most {amount(self.max_change)}"]))

    def domain(self) -> tuple[float, float] | None:
        """A numeric column's domain in original units: the declared bounds where given, else the training range
        widened to mean ± 3 sd (SPEC §2), and no lower than 0 for a column without negative training values (see
        :attr:`floored_at_zero`); unbounded where neither is known; an ordinal column's ranks ``[0, K−1]``; ``None``
        for categorical and binary."""
        if self.kind == "ordinal":
            return 0.0, float(len(self.categories) - 1)
        if self.kind in ("categorical", "binary"):
            return None
        fitted = self.train_min is not None and self.train_max is not None
        low = self.lower if self.lower is not None else \
            min(self.mean - DOMAIN_STD * self.scale, self.train_min) if fitted else -np.inf
        if self.floored_at_zero:
            low = max(low, 0.0)
        high = self.upper if self.upper is not None else \
            max(self.mean + DOMAIN_STD * self.scale, self.train_max) if fitted else np.inf
        return float(low), float(high)

    @property
    def floored_at_zero(self) -> bool:
        """Whether the inferred lower bound stops at 0: no lower bound is declared and no training value is negative.
        Amounts, counts and durations (debt, children, years employed) then never become negative in a
        counterfactual, where mean - 3 sd alone would allow a debt of -1 483 to an applicant."""
        return self.lower is None and self.train_min is not None and self.train_min >= 0


def _decimals(scale: float) -> int:
    """Decimals that a continuous column keeps when decoded: a model input is float32, so a decoded value is good to
    about 1e-7 of the column's scale; six significant digits at that scale drop the rounding noise (a value on the
    bound 0 decoding to 2.3e-05, on the bound 2 to 1.9999996) and keep every digit the input held."""
    return max(0, 6 - int(np.floor(np.log10(scale)))) if scale > 0 and np.isfinite(scale) else 6


def category_codes(values: pd.Series, categories) -> np.ndarray:
    """Each value's position in ``categories``, -1 where it is none of them: matched as numbers where the column and
    the categories are numbers (``2.0`` in a column that a missing value made float is the category ``2``), else by
    text (``1`` is the category ``"1"``). Looked up once per distinct value; an object column that mixes kinds of
    values (``1``, ``True``, ``1.0``, equal to one another for pandas, different as text) once per row."""
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values) and \
            all(_is_number(c) for c in categories):
        by_number = {float(c): i for i, c in enumerate(categories)}
        index, distinct = pd.factorize(values)
        return np.array([by_number.get(float(v), -1) for v in distinct] + [-1], dtype=np.int64)[index]
    known = {str(c): i for i, c in enumerate(categories)}
    if values.dtype == object and pd.api.types.infer_dtype(values, skipna=False) != "string":
        return np.array(values.map(lambda v: known.get(str(v), -1)), dtype=np.int64)  # writable, unlike to_numpy's
    index, distinct = pd.factorize(values)  # a missing value is index -1: the appended -1
    return np.array([known.get(str(v), -1) for v in distinct] + [-1], dtype=np.int64)[index]


def infer_kind(values: pd.Series) -> str:
    """The kind of a column from its dtype: bool or two numeric levels 0/1 → binary, text → categorical
    (binary with two levels), integers → integer, other numbers → continuous."""
    present = values.dropna()
    if pd.api.types.is_bool_dtype(values):
        return "binary"
    if pd.api.types.is_numeric_dtype(values):
        levels = set(pd.unique(present))
        if levels and levels <= {0, 1}:
            return "binary"
        if pd.api.types.is_integer_dtype(values) or (len(present) and (present == np.round(present)).all()):
            return "integer"
        return "continuous"
    return "binary" if present.nunique() == 2 else "categorical"


def read_spec(spec) -> dict:
    """A data spec as a dict: ``None``, a dict, or a YAML/JSON file with ``columns: {name: {kind, mutability,
    lower, upper}}`` and optional ``positive``/``target``. A one-line ``ValueError`` for a file that is no YAML, an
    unknown key, a column entry that is no mapping, and bounds that are no numbers or cross (lower above upper)."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return check_spec(spec)
    import yaml  # noqa: PLC0415

    from datamodules.yaml_file import load_yaml, yaml_problem  # noqa: PLC0415

    try:
        with open(spec) as handle:
            loaded = load_yaml(handle) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"data_spec: got {str(spec)!r} (not valid YAML: {yaml_problem(error)}); allowed: "
                         f"{SPEC_FILE}") from None
    if not isinstance(loaded, Mapping):  # a CSV given for the spec reads as one plain text: say so, not 'a str'
        what = "plain text, as a table's lines read" if isinstance(loaded, str) else \
            "a list" if isinstance(loaded, list) else f"a {type(loaded).__name__}"
        raise ValueError(f"data_spec: got {str(spec)!r} ({what}, not keys such as columns:); allowed: {SPEC_FILE}")
    return check_spec(loaded)


SPEC_KEYS = ("columns", "positive", "target")
TARGET_KEYS = ("name", "order", "values")  # target: {name: outcome, order: [...], values: {class: words}}
COLUMN_KEYS = ("kind", "mutability", "lower", "upper", "step", "max_change", "order", *WORDING_KEYS)  # what
# --write-data-spec writes
NUMBER_KEYS = ("lower", "upper", "step", "max_change")  # keys of a number column only
SPEC_FILE = f"a YAML or JSON file with columns: {{name: {{{', '.join(COLUMN_KEYS)}}}}} and positive"


def _unknown_key(key, allowed: Sequence[str]) -> str:
    """An unknown key and the allowed one it is probably a misspelling of: ``'mutabilty' (did you mean ...)``."""
    return f"unknown key {key!r}" + did_you_mean(key, allowed)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value  # NaN is no bound


def check_spec(spec: Mapping) -> dict:
    """``spec`` as a dict, or a one-line ``ValueError`` for what it cannot mean (see :func:`read_spec`): an unknown
    key would otherwise be ignored in silence, a misspelt ``columns`` dropping every declaration."""
    unknown = [key for key in spec if key not in SPEC_KEYS]
    if unknown:
        raise ValueError(f"data_spec: {_unknown_key(unknown[0], SPEC_KEYS)}; allowed: {', '.join(SPEC_KEYS)}")
    _check_target_entry(spec)
    declared = spec.get("columns") or {}
    if not isinstance(declared, Mapping):
        raise ValueError(f"data_spec: columns: got a {type(declared).__name__}; allowed: a mapping of column names "
                         f"to {{{', '.join(COLUMN_KEYS)}}}")
    for name, options in declared.items():
        if options is None:  # ``age:`` with nothing declared: the kind inferred, as for a column not named
            continue
        if not isinstance(options, Mapping):
            example = f"{{kind: {options}}}" if options in KINDS else f"{{mutability: {options}}}" \
                if options in MUTABILITY else "{kind: integer, lower: 0}"
            raise ValueError(f"data_spec: column {name!r}: got {options!r}; allowed: a mapping of "
                             f"{', '.join(COLUMN_KEYS)} such as {name}: {example}")
        unknown = [key for key in options if key not in COLUMN_KEYS]
        if unknown:
            raise ValueError(f"data_spec: column {name!r}: {_unknown_key(unknown[0], COLUMN_KEYS)}; allowed: "
                             f"{', '.join(COLUMN_KEYS)}")
        check_wording(f"data_spec: column {name!r}:", options)  # label, unit, values: types; values: at fit
        lower, upper = options.get("lower"), options.get("upper")
        for bound, value in (("lower", lower), ("upper", upper)):  # text: a rule, read once the columns are known
            if value is not None and not _is_number(value) and not isinstance(value, str):
                raise ValueError(f"data_spec: column {name!r}: {bound} {value!r}; allowed: {BOUND_VALUES}")
        step, change = options.get("step"), options.get("max_change")
        if options.get("kind") == "ordinal":
            _check_places(name, step, change)
        elif step is not None and not (_is_number(step) and 0 < step < float("inf")):
            raise ValueError(f"data_spec: column {name!r}: step {step!r}; allowed: a positive number, the smallest "
                             "change of the column in its own units (step: 1000)")
        if change is not None and not (_is_number(change) and 0 < change < float("inf")):
            raise ValueError(f"data_spec: column {name!r}: max_change {change!r}; allowed: a positive number, the "
                             "largest change of the column either way in its own units (max_change: 10000; a column "
                             "that may not change at all: mutability: none)")
        if _is_number(lower) and _is_number(upper) and lower > upper:
            raise ValueError(f"data_spec: column {name!r}: lower {_plain(lower)} is above upper {_plain(upper)}; "
                             "allowed: lower at most upper")
        _check_order(name, options)
    return dict(spec)


def _check_target_entry(spec: Mapping) -> None:
    """A one-line ``ValueError`` for a ``target`` entry that cannot name the column to predict or rank its classes:
    a mapping with a key other than ``name``/``order``, an ``order`` that is no list of plain values or lists a class
    twice, or an ``order`` beside ``positive`` (the order's last class is the highest). Its classes are checked
    against the table's by :func:`class_order`."""
    entry = spec.get("target")
    if not isinstance(entry, Mapping):
        return  # a column name (or nothing): as before
    unknown = [key for key in entry if key not in TARGET_KEYS]
    if unknown:
        raise ValueError(f"data_spec: target: {_unknown_key(unknown[0], TARGET_KEYS)}; allowed: "
                         f"{', '.join(TARGET_KEYS)} (target: {{name: COLUMN, order: [lowest, ..., highest]}})")
    check_wording("data_spec: target:", entry, ("values",))  # its classes in words: checked against them at fit
    order = entry.get("order")
    if order is None:
        return
    _check_order_list(order, "data_spec: target:", "the target's classes", "class",
                      "such as order: [rejected, interview, offer]")
    if spec.get("positive") is not None:
        raise ValueError(f"data_spec: positive {spec['positive']!r} beside target: order; allowed: one of them "
                         "(positive: for a yes/no target; order: for three or more classes, its last the highest)")


def _mutability_hint(value) -> str:
    """What a data spec's ``mutability`` that is no kind was probably meant as: YAML reads an unquoted ``no`` as
    false (``mutability: no``, "may it change? no"), else the kind it is probably a misspelling of."""
    if isinstance(value, bool):
        return (" (YAML reads an unquoted no, off or false as false, and yes, on or true as true: write none for a "
                "column that may not change, both for one that may)")
    return did_you_mean(value, MUTABILITY)


def positive_class(positive, labels: pd.Series):
    """The class of the target column ``labels`` that the data spec's ``positive`` names (``None`` for none). A
    one-line ``ValueError`` for a value that is no class, and for a target of more than two classes, with each
    class's rows: a spec written for a yes/no target, on a file whose target holds a third class (a few rows written
    apart), would else train that class silently."""
    if positive is None:
        return None
    classes = sorted(pd.unique(labels.dropna()), key=lambda v: (str(type(v)), v))
    match = [c for c in classes if c == positive or str(c) == str(positive)]
    if not match:
        # YAML reads an unquoted Yes/No/On/Off as true/false: the class 'Yes' needs quotes
        hint = " (YAML reads an unquoted Yes, No, On or Off as true or false: quote it, positive: 'Yes')" \
            if isinstance(positive, bool) else ""
        raise ValueError(f"data_spec: positive: got {positive!r}{hint}; allowed: {', '.join(map(str, classes))}")
    if len(classes) > 2:
        counts = labels.value_counts()
        found = ", ".join(f"{c}: {int(counts.get(c, 0))} row(s)" for c in classes)
        raise ValueError(f"data_spec: positive: got {positive!r} for a target of {len(classes)} classes ({found}); "
                         "allowed: positive for a target of two classes only: write each row's class as one of two "
                         f"in the file, or leave positive out to train {len(classes)} classes")
    return match[0]


def target_entry(spec: Mapping | None) -> tuple[object, list | None]:
    """The data spec's ``target``: the column it names (``None``: none) and its ``order`` of classes, lowest first
    (``None``: unordered). ``target: outcome`` names the column only."""
    entry = (spec or {}).get("target")
    if isinstance(entry, Mapping):
        return entry.get("name"), (list(entry["order"]) if entry.get("order") is not None else None)
    return entry, None


def class_order(order, classes: Sequence, target, where: str = "data_spec: target: order") -> list | None:
    """The target's ``classes`` (as the table holds them) in the data spec's ``order``, lowest first; ``None``
    without one. A one-line ``ValueError`` (starting ``where``: the key or option that gave the order) for an order
    naming a value that is no class (with the class it is probably a misspelling of), one that leaves a class out,
    and one for a target of two classes (``positive`` names the higher of two)."""
    if order is None:
        return None
    shown = ", ".join(map(str, classes))
    written = f"[{', '.join(map(str, order))}]"
    if len(classes) < 3:
        raise ValueError(f"{where}: got {written} (for {target!r}, a target of two classes: {shown}); "
                         "allowed: order for a target of three or more classes (of two, positive: names the higher)")
    ranked = []
    for value in order:
        match = [c for c in classes if c == value or str(c) == str(value)]
        if not match:
            hint = name_hint(value, classes, "; {}") if not isinstance(value, bool) else \
                "; YAML reads an unquoted Yes, No, On or Off as true or false: quote it"
            raise ValueError(f"{where}: got {written} ({_plain(value)!r} is not a class of {target!r}{hint}); "
                             f"allowed: {shown}")
        if any(c is match[0] or c == match[0] for c in ranked):
            raise ValueError(f"{where}: got {written} ({_plain(value)!r} listed twice); allowed: each class once, from "
                             f"lowest to highest: {shown}")
        ranked.append(match[0])
    missing = [c for c in classes if not any(c is r or c == r for r in ranked)]
    if missing:
        raise ValueError(f"{where}: got {written} (without {_plain(missing[0])!r}, a class of {target!r}); allowed: "
                         f"every class once, from lowest to highest: {shown}")
    return [_plain(c) for c in ranked]


def _check_places(name, step, change) -> None:
    """A one-line ``ValueError`` for an ordinal column's ``step`` or ``max_change`` that is no whole number of places
    of its order of at least 1 (``max_change: 2``: at most two places up or down; ``step: 2``: two places at a time)."""
    for key, value, example in (("step", step, "step: 2 moves two places at a time"),
                                ("max_change", change, "max_change: 2 moves at most two places either way; a column "
                                                       "that may not change at all: mutability: none")):
        if value is not None and not (_is_number(value) and 1 <= value < float("inf") and float(value).is_integer()):
            raise ValueError(f"data_spec: column {name!r}: {key} {value!r}; allowed: a whole number of places of its "
                             f"order, at least 1, for an ordinal column ({example})")


def _check_order(name, options: Mapping) -> None:
    """A one-line ``ValueError`` for an ``order`` that cannot rank a column: on a kind other than ``ordinal``, not a
    list of at least two plain values, a value listed twice (``1``, ``'1'`` and ``1.0`` are one category), and for
    bounds (``lower``/``upper``) on an ordinal column (its order's ends are its bounds; its ``step`` and
    ``max_change`` count places of the order, :func:`_check_places`)."""
    kind, order = options.get("kind"), options.get("order")
    if kind is not None and kind not in KINDS:
        return  # refused as an unknown kind when the table is read
    if kind != "ordinal":
        if order is not None:
            raise ValueError(f"data_spec: column {name!r}: order has no meaning for "
                             f"{f'a {kind}' if kind else 'a column without kind: ordinal'} column; allowed: order "
                             "with kind: ordinal")
        return
    bounded = [key for key in ("lower", "upper") if options.get(key) is not None]
    if bounded:
        raise ValueError(f"data_spec: column {name!r}: {bounded[0]} {options[bounded[0]]!r} has no meaning for an "
                         "ordinal column (its order's first and last categories are its bounds); allowed: kind, "
                         "mutability, order, step, max_change, label, values")
    if order is None:
        return  # a column of numbers may leave it out (its sorted values); text is refused when the file is read
    _check_order_list(order, f"data_spec: column {name!r}:", "at least two categories", "category",
                      "such as order: [low, medium, high]")


def _check_order_list(order, where: str, listed: str, each: str, example: str) -> None:
    """Refuses in one line (starting ``where``) an ``order:`` that is not a list of at least two plain values
    (``listed`` from lowest to highest, ``example``), or that lists one value twice (``each``: what a value is)."""
    plain = isinstance(order, Sequence) and not isinstance(order, str) and \
        all(isinstance(v, (str, numbers.Real)) and v == v for v in order)  # v == v: no NaN
    if not plain or len(order) < 2:
        raise ValueError(f"{where} order {order!r}; allowed: a list of {listed} from lowest to highest, {example}")
    seen: set = set()
    for value in order:
        same = {str(value), *([float(value)] if _is_number(value) else [])}  # '1', 1 and 1.0 are one value
        if seen & same:
            raise ValueError(f"{where} order lists {_plain(value)!r} twice; allowed: each {each} once, from lowest "
                             "to highest")
        seen |= same


def _order_text(order) -> str:
    """An ordinal column's order as the start-up lines show it: ``HS-grad < Bachelors < Masters``, the first
    :data:`SHOWN_LEVELS` and a count where it is longer."""
    shown = " < ".join(map(str, order[:SHOWN_LEVELS]))
    return shown + (f" < … ({len(order)} in all)" if len(order) > SHOWN_LEVELS else "")


def _column_dict(column: ColumnSpec) -> dict:
    """A column as JSON keeps it; ``unit``, ``thousands``, ``step``, ``max_change`` and the rules only where set
    (payloads without them read as before)."""
    described = asdict(column)
    for key in ("unit", "thousands", "step", "max_change", "lower_rule", "upper_rule", "label", "unit_label",
                "value_labels"):
        if described[key] is None:
            del described[key]
    return described


def _not_in_order(name, value, order) -> ValueError:
    """The one-line error of a value its ordinal column's order does not hold, with the category it is probably a
    misspelling of, or YAML's reading of an unquoted ``No``/``Yes`` as false/true."""
    yaml = any(isinstance(c, bool) for c in order) and isinstance(value, str)
    hint = did_you_mean(value, order) or \
        (" (YAML reads an unquoted Yes, No, On or Off in order: as true or false: quote them)" if yaml else "")
    return ValueError(f"data: column {name!r}: {_plain(value)!r} is not in its order{hint}; allowed: "
                      f"{', '.join(map(str, order))} (or add it to order: in --data-spec where it ranks)")


def _fit_ordinal(column: ColumnSpec, order, values: pd.Series, train: pd.Series) -> ColumnSpec:
    """An ordinal column fitted: its order (the data spec's; a column of numbers without one: its sorted values), which
    must hold every value of the file, and the mean and scale of the training rows' ranks."""
    name, present = column.name, values.dropna()
    if order is None:
        if not pd.api.types.is_numeric_dtype(values):
            levels = sorted(map(str, pd.unique(present)))
            shown = ", ".join(levels[:SHOWN_LEVELS]) + (", ..." if len(levels) > SHOWN_LEVELS else "")
            raise ValueError(f"data_spec: column {name!r}: kind ordinal of text needs order:, its categories from "
                             f"lowest to highest; allowed: order: [{shown}] put in the order they rank")
        order = sorted(pd.unique(present))
    order = [_plain(v) for v in order]
    if len(order) > MAX_CATEGORIES:
        raise ValueError(f"data: column {name!r} is ordinal with {len(order)} categories; allowed: at most "
                         f"{MAX_CATEGORIES} (a number: declare it integer or continuous in --data-spec)")
    ranks = category_codes(values, order)  # an ordinal column's categories are its order: a code is a rank
    unknown = values.notna().to_numpy() & (ranks < 0)
    if unknown.any():
        raise _not_in_order(name, values.iloc[int(np.flatnonzero(unknown)[0])], order)
    fitted = category_codes(train, order)
    fitted = fitted[fitted >= 0].astype(np.float64)
    std = float(np.std(fitted)) if len(fitted) else 0.0
    column.categories = order
    column.mean, column.scale = (float(np.mean(fitted)) if len(fitted) else 0.0), (std if std > 0 else 1.0)
    column.train_min, column.train_max = (float(fitted.min()), float(fitted.max())) if len(fitted) else (None, None)
    return column


def ordinal_orders(spec: dict | None, codec: TabularCodec | None = None) -> dict:
    """``{column: its order, lowest first}`` of the ordinal columns: a trained ``codec``'s (explain.py ``--data`` with
    a model's own preprocessing, whatever data spec its config names), else those the data ``spec`` declares
    (``None``: a column of numbers without ``order:``, ranked by its sorted values)."""
    if codec is not None:
        return {c.name: list(c.categories) for c in codec.columns if getattr(c, "kind", None) == "ordinal"}
    return {name: (options or {}).get("order") for name, options in ((spec or {}).get("columns") or {}).items()
            if (options or {}).get("kind") == "ordinal"}


def text_ordinals(orders: Mapping) -> list[str]:
    """The ordinal columns of ``orders`` (:func:`ordinal_orders`) whose order holds text labels (``10%``, ``$1,000``,
    ``A``): a file's cells of them are matched as written (:func:`~datamodules.table_format.labels_as_written`)."""
    return [name for name, order in orders.items() if any(isinstance(label, str) for label in order or ())]


class TabularCodec:
    """Raw rows ↔ model inputs for one table (see the module docstring); fitted with :meth:`fit`."""

    dropped: Sequence[str] = ()  # also what a codec pickled before --drop-columns existed reads (served predictors)
    decimal_comma: bool = False  # the training file wrote 0,18 and 12.000: rows to explain may be written so too
    balance: str | None = None  # the training's --balance, where recorded: the same table gives the same training rows
    order: list | None = None  # the data spec's target order, lowest first: explanations count "at least" a class
    class_labels: list | None = None  # the data spec's target values: what each class means, [[class, text], ...]

    def __init__(self, target: str, classes: Sequence, columns: Sequence[ColumnSpec], positive=None,
                 dropped: Sequence[str] = ()):
        self.target = target
        self.classes = list(classes)
        self.positive = positive if positive is not None else self.classes[-1]
        self.columns = list(columns)
        self.dropped = list(dropped)  # the table's columns that are no features (--drop-columns): rows may carry them
        self.feature_names = [name for column in self.columns for name in column.encoded_names]
        self._slices, start = {}, 0
        for column in self.columns:
            width = len(column.encoded_names)
            self._slices[column.name] = slice(start, start + width)
            start += width

    # --- fitting -------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, frame: pd.DataFrame, target: str, spec=None, train_rows=None,
            dropped: Sequence[str] = (), fills: Mapping | None = None) -> TabularCodec:
        """Fit on ``frame``'s ``train_rows`` (positions; default all rows): kinds from ``spec`` or the dtypes,
        categories, means and scales; the ``dropped`` columns are no features; ``fills`` (column: value) are what
        missing values become (``--impute median``, see :meth:`fill_missing`). Raises a one-line ``ValueError``
        for data it cannot encode."""
        spec = read_spec(spec)
        declared = dict(spec.get("columns") or {})
        if target not in frame.columns:
            raise ValueError(f"target: column {target!r} not found; columns: {', '.join(map(str, frame.columns))}")
        named, order = target_entry(spec)
        if named is not None and str(named) != str(target):
            raise ValueError(f"data_spec: target {named!r} is not the column to predict ({target!r}); "
                             f"allowed: {target}, or no target in the data spec")
        frame = frame.drop(columns=[c for c in dropped if c in frame.columns])
        # a spec written before --drop-columns was chosen (--write-data-spec lists identifiers) names them: no feature
        unknown = [name for name in declared if name not in frame.columns and name not in dropped]
        if unknown:
            features = [c for c in frame.columns if c != target]
            raise ValueError(f"data_spec: unknown column {unknown[0]!r}{did_you_mean(unknown[0], features)}; columns: "
                             f"{', '.join(map(str, frame.columns))}")
        if any(str(name) == str(target) for name in declared):  # else ignored: its words, kind, mutability unused
            features = ", ".join(str(c) for c in frame.columns if c != target)
            raise ValueError(f"data_spec: columns: got an entry for {target!r}, the target (the column to predict); "
                             f"allowed: entries for the features ({features}); the classes in words go in target: "
                             f"{{name: {target}, values: {{CLASS: words}}}}, the positive class of two in positive:")
        train = frame if train_rows is None else frame.iloc[np.asarray(train_rows)]
        classes = sorted(pd.unique(frame[target].dropna()), key=lambda v: (str(type(v)), v))
        positive = positive_class(spec.get("positive"), frame[target])
        if positive is not None:
            classes = [c for c in classes if c != positive] + [positive]  # the positive class is label 1 (last)
        order = class_order(order, [_plain(c) for c in classes], target)  # the labels stay as they are: training too
        columns, pending = [], []
        for name in frame.columns:
            if name == target:
                continue
            options = dict(declared.get(name) or {})
            kind = options.get("kind") or infer_kind(frame[name])
            if kind not in KINDS:
                raise ValueError(f"data_spec: column {name!r}: kind {kind!r}; allowed: {', '.join(KINDS)}")
            mutability = options.get("mutability", "both")
            if mutability not in MUTABILITY:
                raise ValueError(f"data_spec: column {name!r}: mutability {mutability!r}"
                                 f"{_mutability_hint(mutability)}; allowed: {', '.join(MUTABILITY)}")
            if kind == "categorical" and mutability in ("increase", "decrease"):
                raise ValueError(f"data_spec: column {name!r}: mutability {mutability!r} has no meaning for a "
                                 "categorical column; allowed: both, none")
            bounded = [key for key in NUMBER_KEYS if options.get(key) is not None]
            for key in ("step", "max_change"):
                if kind == "integer" and options.get(key) is not None and float(options[key]) % 1:
                    raise ValueError(f"data_spec: column {name!r}: {key} {options[key]!r} would leave the whole "
                                     "numbers of an integer column; allowed: a whole number such as 1 or 5")
            if kind in ("categorical", "binary") and bounded:
                raise ValueError(f"data_spec: column {name!r}: {bounded[0]} {options[bounded[0]]!r} has no meaning for "
                                 f"a {kind} column; allowed: kind, mutability, label, values")
            check_wording_kind(name, kind, options)
            rules = {side: options.pop(side) for side in SIDES if isinstance(options.get(side), str)}
            columns.append(cls._fit_column(name, kind, mutability, options, frame[name], train[name]))
            columns[-1].fill = _plain((fills or {}).get(name))
            word_column(columns[-1], options, frame[name])
            pending.append((columns[-1], rules))
        read_rules(pending)  # other columns' bounds: read once every column's kind is known
        codec = cls(target, classes, columns, positive, dropped)
        codec.order = order
        codec.class_labels = fitted_value_labels("data_spec: target:", target_values(spec), "categorical",
                                                 [_plain(c) for c in classes], noun=f"a class of {target!r}")
        return codec

    @staticmethod
    def _fit_column(name, kind, mutability, options, values: pd.Series, train: pd.Series) -> ColumnSpec:
        column = ColumnSpec(name, kind, mutability, options.get("lower"), options.get("upper"),
                            step=_plain(options.get("step")), max_change=_plain(options.get("max_change")))
        if kind == "ordinal":
            return _fit_ordinal(column, options.get("order"), values, train)
        if kind in ("categorical", "binary"):
            levels = sorted(pd.unique(values.dropna()), key=lambda v: (str(type(v)), v))
            if kind == "binary" and len(levels) > 2:  # only where declared: an inferred binary has two values
                raise ValueError(f"data_spec: column {name!r}: kind 'binary', but the column has {len(levels)} values "
                                 f"({', '.join(map(str, levels[:5]))}{', ...' if len(levels) > 5 else ''}); allowed: "
                                 "binary for a column of 2 values, categorical for more")
            if len(levels) > MAX_CATEGORIES:
                raise ValueError(f"data: column {name!r} has {len(levels)} categories; allowed: at most "
                                 f"{MAX_CATEGORIES} (an identifier or free text: leave it out with --drop-columns "
                                 f"{shlex.quote(name)}; a number: declare it continuous in --data-spec)")
            if kind == "binary" and len(levels) == 1:
                levels = levels + ([1] if levels[0] == 0 else [0] if levels[0] == 1 else [])
            column.categories = [_plain(v) for v in levels]
            return column
        numeric = pd.to_numeric(values, errors="coerce")
        bad = values[numeric.isna() & values.notna()]
        if len(bad):  # only where the spec declares the kind: one inferred from the dtypes fits the values
            raise ValueError(f"data_spec: column {name!r}: kind {kind!r}, but the column holds non-numeric values "
                             f"such as {bad.iloc[0]!r}; allowed: kind categorical (or ordinal with an order) for a "
                             "column of text, or clean the file's numbers")
        fitted = pd.to_numeric(train, errors="coerce").to_numpy(np.float64)
        std = float(np.std(fitted))
        column.mean, column.scale = float(np.mean(fitted)), (std if std > 0 else 1.0)
        column.train_min, column.train_max = float(np.min(fitted)), float(np.max(fitted))
        return column

    # --- encoding ------------------------------------------------------------------------------------------
    def _check(self, frame: pd.DataFrame) -> None:
        names = [c.name for c in self.columns]
        missing = [n for n in names if n not in frame.columns]
        if missing:
            raise ValueError(f"rows: missing column {missing[0]!r}; the model needs {', '.join(names)}")

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """Raw rows (original columns, any order; extra columns such as the target are ignored) as model
        inputs, float32 ``(n, D)``. Unseen categories, non-numbers and missing values get a one-line error."""
        self._check(frame)
        out = np.zeros((len(frame), len(self.feature_names)), dtype=np.float32)
        for column in self.columns:
            values, where = frame[column.name], self._slices[column.name]
            if values.isna().any():
                first = row_number(np.flatnonzero(values.isna())[0])
                raise ValueError(f"rows: column {column.name!r} has a missing value (row {first})")
            if column.kind in LABELLED:
                codes = category_codes(values, column.categories)  # an ordinal column's: ranks in its order
                if (codes < 0).any():
                    unseen = values.iloc[int(np.flatnonzero(codes < 0)[0])]
                    raise ValueError(f"rows: column {column.name!r}: unseen category {unseen!r}; allowed: "
                                     f"{', '.join(map(str, column.categories))}")
                if column.kind == "binary":
                    out[:, where.start] = codes
                elif column.kind == "ordinal":  # one input: the rank, standardised
                    out[:, where.start] = (codes - column.mean) / column.scale
                else:
                    out[np.arange(len(frame)), where.start + codes] = 1.0
                continue
            numeric = pd.to_numeric(values, errors="coerce")
            if numeric.isna().any():
                bad = values.iloc[int(np.flatnonzero(numeric.isna())[0])]
                raise ValueError(f"rows: column {column.name!r}: {bad!r} is not a number")
            out[:, where.start] = (numeric.to_numpy(np.float64) - column.mean) / column.scale
        return out

    def decode(self, x) -> pd.DataFrame:
        """Model inputs ``(n, D)`` as rows in original units: the category of each one-hot group's largest entry,
        integers rounded, binary columns by the nearer of 0 and 1, ordinal columns by the nearest rank of their
        order (within it), continuous values to six significant digits of the column's scale (:func:`_decimals`)."""
        x = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float64).reshape(-1, len(self.feature_names))
        data = {}
        for column in self.columns:
            where = self._slices[column.name]
            if column.kind == "categorical":
                data[column.name] = [column.categories[i] for i in x[:, where].argmax(1)]
            elif column.kind == "binary":
                data[column.name] = [column.categories[min(int(v >= 0.5), len(column.categories) - 1)]
                                     for v in x[:, where.start]]
            elif column.kind == "ordinal":
                ranks = np.clip(np.round(x[:, where.start] * column.scale + column.mean), 0, len(column.categories) - 1)
                data[column.name] = np.asarray(column.categories, dtype=object)[ranks.astype(np.int64)].tolist()
            else:
                raw = x[:, where.start] * column.scale + column.mean
                data[column.name] = np.round(raw).astype(np.int64) if column.kind == "integer" else \
                    np.round(raw, _decimals(column.scale)) + 0.0  # + 0.0: no -0.0 in an explanation
        return pd.DataFrame(data)

    def encode_target(self, values) -> np.ndarray:
        """Target values as class labels ``0 … K−1`` (the positive class is the last)."""
        labels = category_codes(pd.Series(np.asarray(values, dtype=object).reshape(-1)), self.classes)
        if min(labels, default=0) < 0:
            unknown = next(v for v, code in zip(np.asarray(values, dtype=object).reshape(-1), labels) if code < 0)
            # "data:": the rows given (--data) hold it; the model's own classes are what is allowed
            raise ValueError(f"data: the target column {self.target!r} holds {unknown!r}, a class the model was not "
                             f"trained on; allowed: {worded_values(self.classes, self.class_labels)}")
        return np.asarray(labels, dtype=np.int64)

    def decode_target(self, labels) -> list:
        """Class labels as the target's own values."""
        return [self.classes[int(i)] for i in np.asarray(labels).reshape(-1)]

    # --- structure the search uses --------------------------------------------------------------------------
    @property
    def groups(self) -> list[list[int]]:
        """The one-hot groups: column indices of each categorical column's categories."""
        return [list(range(self._slices[c.name].start, self._slices[c.name].stop))
                for c in self.columns if c.kind == "categorical"]

    @property
    def binary_columns(self) -> list[str]:
        """The model inputs of binary columns (one 0/1 input each)."""
        return [c.name for c in self.columns if c.kind == "binary"]

    @property
    def integer_features(self) -> list[tuple[int, float, float]]:
        """``(index, mean, scale)`` of every column that must be an integer in original units (binary: 0/1; ordinal:
        its rank)."""
        return [(self._slices[c.name].start, c.mean if c.kind in RANKED else 0.0,
                 c.scale if c.kind in RANKED else 1.0) for c in self.columns if c.kind in (*RANKED, "binary")]

    def feature_types(self) -> FeatureTypes:
        """The structure the searches keep valid: each categorical column's one-hot group, each binary column a
        one-column group, integer columns on whole numbers of their original units (``raw = x·scale + mean``),
        ordinal columns on whole ranks (their domain keeps them within the order), columns with a ``step`` a whole
        number of steps from the factual's value (an integer or ordinal column's whole step keeps it whole), columns
        with a ``max_change`` within it of the factual's value (an ordinal column's raw units are its ranks, so both
        count places of its order)."""
        from datamodules.feature_types import FeatureTypes  # noqa: PLC0415 - imports torch

        offset = np.zeros(len(self.feature_names), dtype=np.float32)
        scale = np.ones(len(self.feature_names), dtype=np.float32)
        integers, binary, steps, reach = [], [], {}, {}
        for column in self.columns:
            index = self._slices[column.name].start
            if column.kind in ("continuous", *RANKED):
                offset[index], scale[index] = column.mean, column.scale
            if column.kind in NUMBER_KINDS and column.max_change is not None:
                reach[index] = column.max_change  # an ordinal column's raw units are ranks: places of the order
            if column.kind in NUMBER_KINDS and column.step is not None:
                steps[index] = column.step
            elif column.kind in RANKED:
                integers.append(index)
            elif column.kind == "binary":
                binary.append([index])
        return FeatureTypes(len(self.feature_names), self.groups + binary, integers, offset, scale,
                            list(self.feature_names), steps, reach, self.row_bounds())

    def row_bounds(self) -> list[RowBound]:
        """The data spec's cross-column bounds (``experience: {upper: age - 16}``) by model input, a column's after
        those of the columns it reads (:func:`datamodules.row_bounds.column_rules`)."""
        from datamodules.feature_types import RowBound  # noqa: PLC0415 - imports torch

        index = {c.name: self._slices[c.name].start for c in self.columns}
        return [RowBound(index[column.name], side, tuple((index[n], c) for n, c in terms.items()), constant,
                         rule_name(column, side, rule_text(terms, constant)))
                for column, side, terms, constant in column_rules(self)]

    def mutability(self) -> dict[str, str]:
        """``{column: kind}`` for the columns the spec does not leave free, by the user's own column names."""
        return {c.name: c.mutability for c in self.columns if c.mutability != "both"}

    def encoded_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per model input, the domain: declared bounds (original units) where given, else the training range
        widened to mean ± 3 sd (SPEC §2; not below 0 where no training value is negative); an ordinal column's ranks
        in [0, K−1]; one-hot and binary inputs lie in [0, 1]."""
        lower = np.zeros(len(self.feature_names), dtype=np.float32)
        upper = np.ones(len(self.feature_names), dtype=np.float32)
        for column in self.columns:
            if column.kind in ("categorical", "binary"):
                continue
            low, high = column.domain()
            index = self._slices[column.name].start
            lower[index], upper[index] = (low - column.mean) / column.scale, (high - column.mean) / column.scale
            # float32 rounding must not move a bound outside the domain (a debt floored at 0 decoding to -0.002)
            if float(lower[index]) * column.scale + column.mean < low:
                lower[index] = np.nextafter(lower[index], np.float32(np.inf))
            if float(upper[index]) * column.scale + column.mean > high:
                upper[index] = np.nextafter(upper[index], np.float32(-np.inf))
        return lower, upper

    def describe(self) -> str:
        """One line per column: its kind (categories, an ordinal column's order) and mutability, for the start-up
        message (``education: ordinal HS-grad < Bachelors < Masters, increase``)."""
        lines = []
        for c in self.columns:
            extra = f" {len(c.categories)} categories" if c.kind == "categorical" else \
                f" {c.categories}" if c.kind == "binary" else f" {_order_text(c.categories)}" if c.kind == "ordinal" \
                else ""
            change = c.change_text(self.decimal_comma, c.thousands)
            step = f", {change}" if change else ""
            bounds = _bounds_text(c.lower, c.upper, self.decimal_comma, c.thousands)
            words = (f' "{c.label}"' if getattr(c, "label", None) else "") + \
                (f" ({c.unit_label})" if getattr(c, "unit_label", None) else "")  # a data spec's label and unit
            values = f"; values: {labels_text(c.value_labels)}" if getattr(c, "value_labels", None) else ""
            lines.append(f"  {c.name}{words}: {c.kind}{extra}{bounds}{rule_words(c)}{step}"
                         + ("" if c.mutability == "both" else f", {c.mutability}") + values)
        return "\n".join(lines)

    def class_ranks(self) -> list[int] | None:
        """Each class's place in the target's :attr:`order` (0: the lowest), by class index; ``None`` unordered."""
        if not self.order:
            return None
        return [next(i for i, c in enumerate(self.order) if c == label or str(c) == str(label))
                for label in self.classes]

    def class_label(self, label) -> str | None:
        """What the class ``label`` means in words (a data spec's ``target: {values: ...}``); ``None`` where not
        said."""
        return label_of(self.class_labels, label)

    def outcome_text(self) -> str | None:
        """The start-up line of an ordered target (``outcome: rejected < interview < offer (explanations count "at
        least")``; the classes in the data spec's words where it gives some, ``not invited [rejected] < ...``);
        ``None`` unordered."""
        if not self.order:
            return None
        return f"outcome: {worded_values(self.order, self.class_labels, ' < ')} (explanations count " \
               "\"at least\": a class at or above the one asked for is valid)"

    # --- persistence -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-able description; :meth:`from_dict` rebuilds the same codec."""
        return {"kind": "tabular", "target": self.target, "classes": [_plain(c) for c in self.classes],
                "positive": _plain(self.positive), "columns": [_column_dict(c) for c in self.columns],
                **({"dropped": list(self.dropped)} if self.dropped else {}),
                **({"decimal_comma": True} if self.decimal_comma else {}),
                **({"balance": self.balance} if self.balance not in (None, "none") else {}),
                **({"order": [_plain(c) for c in self.order]} if self.order else {}),
                **({"class_labels": self.class_labels} if self.class_labels else {})}

    @classmethod
    def from_dict(cls, payload: Mapping) -> TabularCodec:
        """The codec :meth:`to_dict` described."""
        columns = [ColumnSpec(**column) for column in payload["columns"]]
        codec = cls(payload["target"], payload["classes"], columns, payload.get("positive"), payload.get("dropped", ()))
        codec.decimal_comma = bool(payload.get("decimal_comma", False))
        codec.balance = payload.get("balance")
        codec.order = list(payload["order"]) if payload.get("order") else None  # a codec saved before: unordered
        codec.class_labels = payload.get("class_labels") or None  # a codec saved before: classes in their own words
        return codec

    def fill_missing(self, frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
        """``frame`` with the missing values of columns that have a :attr:`ColumnSpec.fill` filled in as in training
        (``--impute median``), and one note per column filled (``"MonthlyIncome: missing in 2 row(s), filled with
        5400, the training rows' median (--impute median)"``). Other missing values stay missing."""
        gaps = [c for c in self.columns if c.fill is not None and c.name in frame.columns and frame[c.name].isna().any()]
        if not gaps:
            return frame, []
        frame, notes = frame.copy(), []
        for column in gaps:
            count = int(frame[column.name].isna().sum())
            frame[column.name] = frame[column.name].astype(object).where(frame[column.name].notna(), column.fill)
            if column.kind in ("continuous", "integer"):  # a cell that is no number ('forty') stays, to be refused
                numbers = pd.to_numeric(frame[column.name], errors="coerce")  # by name, with its row, by the caller
                if numbers.notna().all():
                    frame[column.name] = numbers
            what = "median" if column.kind in ("continuous", *RANKED) else "most frequent value"
            notes.append(f"{column.name}: missing in {count} row(s), filled with "
                         f"{number_text(column.fill, self.decimal_comma, column.thousands)}, the training rows' "
                         f"{what} (the model was trained with --impute median)")
        return frame, notes

    def without_dropped(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` less the columns the model does not use (:attr:`dropped`), where it has them."""
        present = [c for c in self.dropped if c in frame.columns]
        return frame.drop(columns=present) if present else frame

    def __eq__(self, other) -> bool:
        return isinstance(other, TabularCodec) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"TabularCodec(target={self.target!r}, columns={len(self.columns)}, inputs={len(self.feature_names)})"



def standardised_codec(feature_names: Sequence[str], categorical: Sequence[str], integer_features: Sequence[str],
                       mean, scale, x_train, target: str, classes: Sequence, dropped: Sequence[str] = ()
                       ) -> TabularCodec:
    """The :class:`TabularCodec` of a table already encoded the way a codec encodes: ``column=value`` one-hot groups
    for the ``categorical`` columns (in the order of ``feature_names``), every other input standardised with
    ``mean`` and ``scale`` (``raw = x·scale + mean``); ``x_train`` (encoded) gives each number's training range, and
    a number whole in every training row is an integer column, as :func:`infer_kind` finds for a user's table.
    ``classes`` name the labels ``0 … K−1``, the last one the positive. The paper's real data sets are built so
    (:class:`datamodules.raw.TabularDataModule`); this codec lets their runs take and give rows in the file's units."""
    names, columns, start = list(feature_names), [], 0
    x_train = np.asarray(x_train, dtype=np.float64)
    while start < len(names):
        group = next((c for c in categorical if names[start].startswith(f"{c}=")), None)
        if group is not None:
            end = start
            while end < len(names) and names[end].startswith(f"{group}="):
                end += 1
            written = [n[len(group) + 1:] for n in names[start:end]]
            # codes (credit's SEX 1/2) stay numbers, as a user's table declared categorical keeps them (_fit_column)
            codes = all(re.fullmatch(r"-?\d+", value) for value in written)
            columns.append(ColumnSpec(group, "categorical", categories=[int(v) for v in written] if codes else written))
            start = end
            continue
        name, raw = names[start], x_train[:, start] * float(scale[start]) + float(mean[start])
        # whole numbers in every training row (counts, ages, amounts): explanations keep them whole, as for a user's
        # table (infer_kind); the float32 encoding leaves ~1e-7 of the value as noise
        whole = bool(np.all(np.abs(raw - np.round(raw)) <= 1e-4 * np.maximum(1.0, np.abs(raw))))
        kind = "integer" if name in integer_features or whole else "continuous"
        low, high = (float(np.round(v)) if kind == "integer" else float(v) for v in (raw.min(), raw.max()))
        columns.append(ColumnSpec(name, kind, mean=float(mean[start]), scale=float(scale[start]),
                                  train_min=low, train_max=high))
        start += 1
    return TabularCodec(target, list(classes), columns, list(classes)[-1], dropped)
