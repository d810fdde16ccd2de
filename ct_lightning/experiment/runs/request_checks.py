"""Requests to a predictor checked before the model runs: each refusal is one line naming the column.

The ``predictor`` is logged without an input schema (its signature holds the outputs and the ``explain``/
``target``/``max_steps`` params only; the columns and their types are in the model's ``metadata`` and input
example, see :func:`ct_lightning.experiment.runs.served_model.input_columns`), so MLflow's scoring server
(``mlflow models serve``) and ``mlflow.pyfunc.load_model(URI).predict`` hand the rows over as they came: the
server refuses only a body that is not JSON (or CSV, Parquet) of its own. Everything else is checked here,
against the fitted preprocessing: how many rows one request may hold, missing and unknown columns, missing
values, the type of each value (a number for a numeric column, a whole number for an integer column, one of
the training categories with their own type for a category column, ordinal ones too: ``"40"`` is text, not a
number, and ``True`` is not ``1``), numbers outside the model's domain, and the ``target``/``max_steps`` parameters.

:func:`check_rows` and :func:`check_params` raise a one-line ``ValueError``; the predictor answers it as
:class:`~ct_lightning.experiment.runs.served_model.RequestRefused` (HTTP 400, the message as it is). No MLflow
here: ``explain.py`` checks its rows with the same domain check (:func:`domain_mask`) and starts without MLflow.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np
import pandas as pd

from datamodules.codec import LABELLED, categories_by_case
from datamodules.suggest import label_hint, name_hint
from datamodules.table_format import undressed_number
from datamodules.wording import row_number

MAX_ROWS = ("CT_SERVE_MAX_ROWS", 10_000)  # rows in one prediction request
MAX_EXPLAIN_ROWS = ("CT_SERVE_MAX_EXPLAIN_ROWS", 100)  # rows in one request with explain=true (a search per row)
MAX_STEPS = 10_000  # the most search steps a request may ask for (params max_steps)


def serving() -> bool:
    """Whether this process is MLflow's scoring server (``mlflow models serve`` marks its environment)."""
    return os.environ.get("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "").strip().lower() in ("true", "1")


def row_limit(explain: bool = False) -> float:
    """The most rows one served request may hold: ``$CT_SERVE_MAX_ROWS`` (default 10000), with ``explain``
    ``$CT_SERVE_MAX_EXPLAIN_ROWS`` (default 100), as set where the server runs. No limit outside the scoring
    server: ``mlflow.pyfunc.load_model(URI).predict(rows)`` in Python scores a table of any size."""
    if not serving():
        return math.inf
    name, default = MAX_EXPLAIN_ROWS if explain else MAX_ROWS
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise RuntimeError(f"{name}: {raw!r} on the server; allowed: a whole number of rows, at least 1")
    return value


def number_text(value) -> str:
    """A number as messages show it: whole numbers without a decimal point, others with 6 significant digits."""
    value = float(value)
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def _shown(value) -> str:
    """A request's value as the client wrote it (numpy scalars as plain Python values), cut to 60 characters."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first(mask) -> int:
    return int(np.asarray(mask, dtype=bool).nonzero()[0][0])


def _sort(value) -> str:
    """What a request's value is: ``text``, ``a number``, ``true/false`` or ``other`` (a list, an object)."""
    if isinstance(value, (bool, np.bool_)):
        return "true/false"
    if isinstance(value, numbers.Real):
        return "a number"
    return "text" if isinstance(value, str) else "other"


_UNSEEN = object()


def _category_key(value):
    """A category and a value match when they are the same text, the same number (``1`` and ``1.0``) or the same
    truth value; never across sorts: ``"1"`` is not ``1`` and ``True`` is not ``1``."""
    sort = _sort(value)
    if sort == "a number":
        return sort, float(value)
    if sort == "true/false":
        return sort, bool(value)
    return (sort, value) if sort == "text" else None


def _categories(column, values: pd.Series) -> pd.Series:
    """The values as the column's own categories (``1.0`` becomes the category ``1``), else a one-line refusal
    of the first unseen one (with the sort of value the categories are, when the value is of another)."""
    known = {_category_key(c): c for c in column.categories}
    # text that differs from a text category only in case ('Female' for 'female') is that category, where no other
    # text category reads the same: explain.py reads it so too (explanations._matched_categories)
    by_case = categories_by_case(c for c in column.categories if isinstance(c, str))

    def category(value):
        found = known.get(_category_key(value), _UNSEEN)
        return by_case.get(value.casefold(), _UNSEEN) if found is _UNSEEN and isinstance(value, str) else found

    matched = values.map(category).astype(object)
    unseen = matched.map(lambda v: v is _UNSEEN)
    if unseen.any():
        row = _first(unseen)
        value, sorts = values.iloc[row], sorted({_sort(c) for c in column.categories})
        hint = "" if _sort(value) in sorts else f" ({_sort(value)}; the categories are {' and '.join(sorts)})"
        raise ValueError(f"rows: column {column.name!r}: unseen category {_shown(value)} in row {row_number(row)}"
                         f"{hint}; allowed: {', '.join(map(str, column.categories))}")
    return matched


def _numbers(column, values: pd.Series, decimal_comma: bool = False) -> pd.Series:
    """The values as ``float64``, else a one-line refusal of the first that is not a finite number of the
    column's kind: text (``"40"`` too: in JSON a number has no quotes), true/false, a fraction in an integer column.
    The refusal of text that writes a number as the training file did names that number (``decimal_comma``: the
    file wrote ``60.800,00 €`` and ``60.800`` for 60800)."""
    if pd.api.types.is_bool_dtype(values):
        raise ValueError(f"rows: column {column.name!r}: {_shown(values.iloc[0])} in row {row_number(0)} is "
                         "true/false; allowed: a number")
    if not pd.api.types.is_numeric_dtype(values):  # text, objects or a mix: each value must be a number itself
        from datamodules.table_format import undressed_number  # noqa: PLC0415 - a refusal's hint only

        sorts = values.map(_sort)
        # "40" and, as the training file may have written them, "$17,665.85" and "7.5%": text that writes a number
        written = values.where(sorts == "text").map(
            lambda v: undressed_number(v, decimal_comma) if isinstance(v, str) else None)
        digits = (sorts == "text") & pd.to_numeric(written, errors="coerce").notna()
        # a value that is no number at all comes first: in a CSV body it turns the whole column into text
        for wrong, why in (((sorts != "a number") & ~digits, None),
                           (digits, "is text; allowed: a number (in JSON without quotes)")):
            if wrong.any():
                row = _first(wrong)
                as_json = pd.to_numeric(values.iloc[row], errors="coerce")  # "60.800" unquoted is 60.8 in JSON
                if why and (pd.isna(as_json) or as_json != float(written.iloc[row])):  # "$17,665.85": its number
                    why += f", here {number_text(float(written.iloc[row]))}"
                why = why or ("is true/false; allowed: a number" if sorts.iloc[row] == "true/false" else "is not a number")
                raise ValueError(f"rows: column {column.name!r}: {_shown(values.iloc[row])} in row {row_number(row)} "
                                 f"{why}")
    numeric = values.astype(float)
    infinite = ~np.isfinite(numeric.to_numpy())
    if infinite.any():
        row = _first(infinite)
        raise ValueError(f"rows: column {column.name!r}: {_shown(values.iloc[row])} in row {row_number(row)} is not a "
                         "finite number")
    fraction = fraction_mask(column, numeric)
    if fraction.any():
        row = _first(fraction)
        raise ValueError(f"rows: column {column.name!r}: {number_text(numeric.iloc[row])} in row {row_number(row)} is "
                         f"{NOT_WHOLE}; "
                         f"allowed: {WHOLE_NUMBERS}")
    return numeric


NOT_WHOLE = "not a whole number"  # a fraction in an integer column: the served model's words, and explain.py's
WHOLE_NUMBERS = "whole numbers (the column holds integers)"


def fraction_mask(column, numeric: pd.Series) -> np.ndarray:
    """Per row, whether its number is a fraction in an integer column (``45.5`` for an age, ``1.5`` children): the
    served model refuses such a row (:func:`check_rows`) and ``explain.py`` too, with the same words
    (:data:`NOT_WHOLE`, :data:`WHOLE_NUMBERS`). Missing and infinite values are not fractions (refused otherwise)."""
    values = pd.to_numeric(numeric, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    if getattr(column, "kind", None) != "integer":
        return np.zeros(len(values), dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (values != np.round(values))


def _check_columns(names: list[str], frame: pd.DataFrame) -> None:
    """Refuse a missing, an unknown or a repeated column, in one line with the model's columns."""
    present = list(frame.columns)
    missing = [n for n in names if n not in present]
    unknown = [c for c in present if c not in names]
    repeated = sorted({str(c) for c in present if present.count(c) > 1})
    if missing or unknown or repeated:
        parts = ([f"missing column {', '.join(map(repr, missing))}"] if missing else []) + \
                ([f"unknown column {', '.join(map(repr, unknown))}"] if unknown else []) + \
                ([f"repeated column {', '.join(map(repr, repeated))}"] if repeated else [])
        raise ValueError(f"rows: {'; '.join(parts)}; the model needs {', '.join(names)}"
                         + (" and no other columns" if unknown else ""))


def check_rows(codec, frame: pd.DataFrame, max_rows: int, held=()) -> pd.DataFrame:
    """``frame``'s columns in the codec's order, each value of its column's type, once every row is one the model
    can answer; else a one-line ``ValueError`` naming the column, the row (counted from 1:
    :func:`~datamodules.wording.row_number`), the value and what is allowed.

    Refused: no rows or more than ``max_rows``; a missing column, a column the model does not know (the target
    too; the columns it was trained without, ``--drop-columns``, are accepted and left out) or one given twice; a missing value
    (unless the model was trained with ``--impute median``: then it is filled as in training); in a category column, a value that is none of the training
    categories with their own type (a text ``"1"`` for the category ``1`` and ``1`` for ``True`` are refused,
    ``1.0`` is the category ``1``); in a numeric column, text (also ``"40"``), true/false, an infinite value, a
    fraction in an integer column, a number outside the column's domain (declared bounds, else the training range
    widened to mean ± 3 sd and not below 0 where no training value is negative: the domain the counterfactual
    search keeps to). Returned: numeric columns as
    ``float64`` (integer columns ``int64``), category columns as the categories themselves; ``attrs["filled"]``:
    ``{row position: [columns]}`` whose missing value was filled in."""
    names = [c.name for c in codec.columns]
    if hasattr(codec, "without_dropped"):  # columns the model was trained without (--drop-columns) may come along
        frame = codec.without_dropped(frame)
    if len(frame) == 0:
        raise ValueError(f"rows: the request holds no rows; send at least one row with the columns {', '.join(names)}")
    if len(frame) > max_rows:
        raise ValueError(f"rows: {len(frame)} rows in one request; allowed: at most {max_rows} "
                         f"(split the request, or raise the limit where the server runs)")
    _check_columns(names, frame)
    filled = {}  # row position: the columns whose missing value is filled in (an explanation marks them)
    if hasattr(codec, "fill_missing"):  # trained with --impute median: missing values are filled as in training
        for column in codec.columns:
            if getattr(column, "fill", None) is not None:
                for position in np.flatnonzero(frame[column.name].isna().to_numpy()):
                    filled.setdefault(int(position), []).append(column.name)
        frame, _ = codec.fill_missing(frame)
    checked = {}
    for column in codec.columns:
        values = frame[column.name]
        if values.isna().any():
            raise ValueError(f"rows: column {column.name!r}: missing value in row {row_number(_first(values.isna()))}")
        if column.kind in LABELLED and getattr(column, "categories", None):
            checked[column.name] = _categories(column, values)
            continue
        numeric = _numbers(column, values, bool(getattr(codec, "decimal_comma", False)))
        outside = outside_domain(column, numeric)
        if outside is not None:
            row, value, allowed = outside
            raise ValueError(f"rows: column {column.name!r}: {value} in row {row_number(row)} is outside the "
                             f"model's domain; allowed: {allowed}")
        if column.kind == "integer" and (numeric.abs() < 2 ** 53).all():
            numeric = numeric.astype("int64")
        checked[column.name] = numeric
    for broken, describe in rule_problems(codec, pd.DataFrame(checked, index=frame.index), held):
        if broken.any():
            row = int(np.flatnonzero(broken)[0])
            name, value, allowed, problem = describe(row)
            raise ValueError(f"rows: column {name!r}: {value} in row {row_number(row)} {problem}; allowed: {allowed}")
    rows = pd.DataFrame(checked, index=frame.index)[names]
    rows.attrs["filled"] = filled
    return rows


def rule_problems(codec, frame: pd.DataFrame, held=()) -> list[tuple[np.ndarray, object]]:
    """Per cross-column bound of the data spec (``experience: {upper: age - 16}``) on a column that may change: the
    rows of ``frame`` (original units) that break it, and per row position ``(column, value, allowed, problem)``. Such
    a row is refused as a number outside the domain is: its explanation would first have to repair the row
    (``experience`` down to ``age - 16``), a change no applicant can make; where the column is immutable (in the data
    spec, or ``held``: by the training's ``--immutable`` or the request's), the row keeps its value and is explained as
    it is."""
    if not callable(getattr(codec, "row_bounds", None)):
        return []
    from datamodules.row_bounds import breaking_rows, rule_name  # noqa: PLC0415

    found = []
    for column, side, shown, broken, bound in breaking_rows(codec, frame):
        if column.mutability == "none" or column.name in held:
            continue

        def describe(p, column=column, side=side, shown=shown, bound=bound, values=frame[column.name]):
            return (column.name, number_text(values.iloc[p]),
                    f"{'at most' if side == 'upper' else 'at least'} {shown} ({number_text(bound[p])} in this row; "
                    "the data spec's rule: correct the row, or the rule in --data-spec and train again)",
                    f"breaks {rule_name(column, side, shown)}")

        found.append((np.asarray(broken, dtype=bool), describe))
    return found


WHOLE_SLACK = 1e-9  # a bound that is a whole number up to float noise is that number


def outside_domain(column, numeric: pd.Series) -> tuple[int, str, str] | None:
    """The first row whose number lies outside ``column``'s domain, that number as text and what is allowed there
    (``"0 to 50000 (the data spec's bounds)"``), or ``None`` when every number lies inside (see :func:`domain_mask`)."""
    outside, allowed = domain_mask(column, numeric)
    if not outside.any():
        return None
    row = _first(outside)
    return row, number_text(numeric.iloc[row]), allowed


def domain_mask(column, numeric: pd.Series, shown=None) -> tuple[np.ndarray, str]:
    """Per row, whether its number lies outside ``column``'s domain, and that domain in words (its bounds written by
    ``shown``, default :func:`number_text`; explain.py's as the training file writes them, ``4.251,72 €``). The
    domain is the one the counterfactual search keeps to: declared bounds, else the training range widened to
    mean ± 3 sd, not below 0 where no training value is negative."""
    shown = shown or number_text
    domain = getattr(column, "domain", None)  # a hand-made codec's columns may know no domain
    low, high = (domain() if domain else None) or (-math.inf, math.inf)
    outside = ((numeric < low) | (numeric > high)).to_numpy()
    declared = (getattr(column, "lower", None) is not None) + (getattr(column, "upper", None) is not None)
    source = ("the data spec's bounds", "the data spec's bound and the training rows' range widened to "
              "mean +/- 3 sd", "the training rows' range widened to mean +/- 3 sd")[2 - declared]
    if getattr(column, "floored_at_zero", False) and low == 0:
        source += ", not below 0: no training value is negative"
    if declared < 2:  # a value a person may well have (12 credit lines where training saw 11): how to accept it
        source += "; to accept more, declare lower/upper in --data-spec and train again"
    if getattr(column, "kind", None) == "integer":  # the whole numbers inside, as the search keeps to (not 2373.05)
        low, high = (math.ceil(low - WHOLE_SLACK) if math.isfinite(low) else low,
                     math.floor(high + WHOLE_SLACK) if math.isfinite(high) else high)
    ends = [shown(v) if math.isfinite(v) else number_text(v) for v in (low, high)]
    return outside, f"{ends[0]} to {ends[1]} ({source})"


def as_rows(model_input) -> pd.DataFrame:
    """The request's input as a DataFrame (MLflow hands a JSON body's ``inputs`` over as a dict or a list), else
    a one-line ``ValueError``."""
    if isinstance(model_input, pd.DataFrame):
        return model_input
    if isinstance(model_input, list) and all(isinstance(row, dict) for row in model_input):
        # a JSON body's "inputs": [{...}] reaches the predictor as records of 0-d arrays (array(29)): their values
        model_input = [{key: value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value
                        for key, value in row.items()} for row in model_input]
    try:
        return pd.DataFrame(model_input)
    except (ValueError, TypeError) as error:
        raise ValueError(f"rows: the input is not a table of rows ({type(model_input).__name__}: "
                         f"{(str(error).splitlines() or [''])[0]}); send dataframe_records or dataframe_split") from None


def target_default(codec) -> str:
    """The ``target`` param's default in the predictor's signature: no class (the most likely other one), in words
    that name the classes, since MLflow refuses a ``target`` of another type than text (a JSON number) before the
    predictor runs, in a message that shows only the param's type and this default. The classes are named as a
    refusal names them (:func:`~ct_lightning.evaluation.explanation.allowed_classes`: in the data spec's words with
    the class in brackets, ``no default [0], default [1]``, where it words them). An ordered outcome's default is the
    class one place above the prediction, and its classes are named lowest first."""
    from ct_lightning.evaluation.explanation import allowed_classes  # noqa: PLC0415 - torch

    order = getattr(codec, "order", None)
    named = allowed_classes(order or codec.classes, getattr(codec, "class_labels", None))
    if order:
        return f"{DEFAULT_TARGETS[1]}{named}, as text"
    return f"{DEFAULT_TARGETS[0]}{named}, as text"


# How target_default begins: a request that sends a default back (MLflow fills it in from the signature, one of
# a model logged before the classes were worded too) asks for no class.
DEFAULT_TARGETS = ("the most likely other class; allowed: ",
                   "the class one place above the prediction (valid: at least it); allowed: ")


def requested_target(codec, params: dict):
    """The class a request asks for (``None``: the default, the most likely other class; a signature's default, this
    version's or an earlier one's, means the same)."""
    target = params.get("target")
    return None if target in (None, "") or (isinstance(target, str) and target.startswith(DEFAULT_TARGETS)) else target


def _listed(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 20 else ", ".join(names[:20]) + f", ... ({len(names)} in all)"


class MutabilityRefused(ValueError):
    """A column, kind, step or largest change asked of an explanation that the model cannot hold; ``param`` is
    ``immutable``, ``mutability``, ``step`` or ``max_change``. Its message is the served model's (``params: ...``);
    ``explain.py`` names its own options."""

    def __init__(self, param: str, value: str, detail: str, allowed: str):
        self.param, self.value, self.detail, self.allowed = param, value, detail, allowed
        super().__init__(f"params: {param} {value!r} ({detail}); allowed: {allowed}")


def _column_hint(name: str, codec, kinds) -> str:
    """The hint for a column the model does not have, after ``"; "``: the one it is probably a misspelling of, or
    the column whose words in the data spec it is (``Yearly income``, or ``Yearly income ($)`` as explanations write
    it, is the label of ``income``), else ``""``."""
    labels = ((column.name, getattr(column, "label", None), getattr(column, "unit_label", None))
              for column in getattr(codec, "columns", []))
    return name_hint(name, kinds, "; {}") or label_hint(name, labels, "; {}")


def _mutability_problem(codec, given: dict) -> tuple[str, str, str] | None:
    """The first entry of ``given`` (``{column: kind}``) that a model with ``codec`` cannot hold, as ``(value,
    problem, allowed)``: an unknown column, an unknown kind, or a direction on a categorical or binary column (an
    ordinal column takes one: higher or lower in its order)."""
    from ct_lightning.constraints import MUTABILITY_KINDS, one_hot_groups  # noqa: PLC0415
    from ct_lightning.evaluation.explanation import constraint_tensors  # noqa: PLC0415

    kinds = {str(c.name): getattr(c, "kind", "continuous") for c in codec.columns}
    # a table codec knows its columns' kinds (a continuous 'ratio=debt/income' is no category); only a codec of bare
    # model inputs leaves one-hot columns to be known by their encoded names
    structured = one_hot_groups(codec) is not None
    unknown = [name for name in given if name not in kinds]
    if unknown:
        hint = _column_hint(unknown[0], codec, kinds) if len(unknown) == 1 else ""  # as train.py's --immutable
        return ",".join(unknown), f"no such column{hint}", f"the model's columns: {_listed(list(kinds))}"
    for name, kind in given.items():
        if kind not in MUTABILITY_KINDS:
            return f"{name}={kind}", "no such kind", ", ".join(MUTABILITY_KINDS)
        column_kind = kinds[name]
        if column_kind not in ("categorical", "binary") and not structured:
            try:
                constraint_tensors(codec, len(codec.feature_names), {name: kind})
            except ValueError:
                column_kind = "categorical"  # one-hot columns, known by their encoded names
        if column_kind in ("categorical", "binary") and kind in ("increase", "decrease"):
            return f"{name}={kind}", f"{name!r} is {column_kind}", "both or none"
    return None


def requested_mutability(codec, params: dict) -> dict[str, str]:
    """``{column: kind}`` from a request's ``immutable`` (comma-separated columns) and ``mutability``
    (``FEATURE=KIND,...``) params (explain.py's options of the same names), which hold in its explanations on top
    of the run's own constraints; :class:`MutabilityRefused` for the first column or kind the model cannot hold, for
    a column given two kinds (twice in ``mutability``, or in both with a kind other than ``none``), and for a kind
    that loosens the training's data spec (its kinds are facts about the data)."""
    from ct_lightning.constraints import mutability_pairs  # noqa: PLC0415
    from ct_lightning.feature_names import KindConflict, immutable_conflict, loosened_kind  # noqa: PLC0415

    spec: dict[str, str] = {}
    for name in ("immutable", "mutability"):
        text = str(params.get(name) or "").strip()
        if not text:
            continue
        try:
            given = {c.strip(): "none" for c in text.split(",") if c.strip()} if name == "immutable" else \
                mutability_pairs(text, f"params: {name}")
            conflict = None if name != "mutability" else immutable_conflict(spec, given) or loosened_kind(
                getattr(codec, "mutability", dict)(), given, "the model's data spec",
                remedy="a model trained with another data spec")
        except KindConflict as error:
            conflict = error
        if conflict is not None:
            raise MutabilityRefused(name, conflict.value, conflict.detail, conflict.allowed)
        problem = _mutability_problem(codec, given)
        if problem is not None:
            raise MutabilityRefused(name, *problem)
        spec.update(given)
    return spec


def check_params(codec, params: dict) -> None:
    """Refuse a ``target`` that is not one of the model's classes (the label, compared as text as
    ``explain.py --target`` compares it: not a class's index; or the data spec's words for it, as there) and a
    ``max_steps`` outside 0 … 10000 (one-line ``ValueError``)."""
    from ct_lightning.evaluation.explanation import allowed_classes, class_named  # noqa: PLC0415 - torch

    target = requested_target(codec, params)
    words = getattr(codec, "class_labels", None)
    if target is not None:
        try:
            class_named(target, list(codec.classes), "target", words)
        except ValueError:
            raise ValueError(f"params: target {target!r}; allowed: {allowed_classes(codec.classes, words)}") from None
    steps = params.get("max_steps")
    if steps not in (None, "") and not 0 <= int(steps) <= MAX_STEPS:
        raise ValueError(f"params: max_steps {steps}; allowed: 0 (the run's own setting) to {MAX_STEPS}")
    requested_mutability(codec, params)
    for param in COLUMN_NUMBER_PARAMS:
        requested_steps(codec, params, param)


STEP_KINDS = ("continuous", "integer", "ordinal")  # the kinds of column a step or a largest change holds (as in a
# data spec; an ordinal column's count places of its order)
COLUMN_NUMBER_PARAMS = {"step": "income=1000", "max_change": "income=10000"}  # param: an example


def _column_items(text: str) -> list[str]:
    """The ``COLUMN=NUMBER`` items of a comma-separated list, where a piece without ``=`` continues the item before
    it: ``income=$1,000,debt=500`` is ``income=$1,000`` and ``debt=500`` (a thousands separator, not a new item)."""
    items: list[str] = []
    for part in (part.strip() for part in text.split(",")):
        if items and "=" not in part and part[:3].isdigit():
            items[-1] += "," + part
        elif part:
            items.append(part)
    return items


def step_number(text: str, decimal_comma: bool) -> float:
    """A ``--step``/``--max-change`` number as the training file writes the column's numbers (``$1,000``, ``2.5%``;
    with decimal commas ``1.000`` is a thousand and ``0,5`` a half, as in the file); NaN where it reads none."""
    written = undressed_number(text, decimal_comma)  # of text: a number, or None where it reads none
    if written is not None:
        return float(written)
    try:
        return float(text)
    except ValueError:
        return math.nan


def requested_steps(codec, params: dict, param: str = "step") -> dict[str, float]:
    """``{column: number}`` from a request's ``step`` param (``explain.py --step``) or ``max_change`` param
    (``explain.py --max-change``): ``COLUMN=NUMBER,...``, the smallest change (``step``) or the largest change either
    way (``max_change``) the explanation may make to each continuous, integer or ordinal column, in the column's own
    units (an ordinal column's: places of its order), on top of the data spec's; :class:`MutabilityRefused` (param
    ``param``) for the first entry the model cannot hold: no such column, a column of another kind, a number that is
    not positive or, for an integer or ordinal column, not whole."""
    text = str(params.get(param) or "").strip()
    if not text:
        return {}
    if not callable(getattr(codec, "feature_types", None)):
        raise MutabilityRefused(param, text, "the model reads no table's columns", "a model trained on a table")
    kinds = {str(c.name): getattr(c, "kind", "continuous") for c in codec.columns}
    numbers = [name for name, kind in kinds.items() if kind in STEP_KINDS]
    which = "number and ordinal" if "ordinal" in kinds.values() else "number"
    allowed = f"COLUMN=NUMBER for the model's {which} columns: {_listed(numbers)}"
    chosen: dict[str, float] = {}
    for item in _column_items(text):
        name, _, value = (part.strip() for part in item.rpartition("="))
        if not name:
            raise MutabilityRefused(param, item, f"expected COLUMN=NUMBER, e.g. {COLUMN_NUMBER_PARAMS[param]}", allowed)
        if name not in kinds:
            raise MutabilityRefused(param, item, f"no such column{_column_hint(name, codec, kinds)}", allowed)
        if kinds[name] not in STEP_KINDS:
            raise MutabilityRefused(param, item, f"{name!r} is {kinds[name]}", allowed)
        number = step_number(value, bool(getattr(codec, "decimal_comma", False)))
        if not 0 < number < math.inf:
            raise MutabilityRefused(param, item, "not a positive number", allowed)
        if kinds[name] == "integer" and not number.is_integer():
            raise MutabilityRefused(param, item, f"{name!r} is integer", "a whole number such as 1 or 5")
        if kinds[name] == "ordinal" and not number.is_integer():
            raise MutabilityRefused(param, item, f"{name!r} is ordinal",
                                    "a whole number of places of its order such as 1 or 2")
        chosen[name] = number
    return chosen
