"""How a model of your own reads its inputs: ``--model-inputs``, an affine map from ct-lightning's encoding.

A model trained in your own pipeline reads the table as that pipeline encoded it: its own scaling, its own
one-hot columns, its own order. ``--model-inputs FILE`` lists the model's inputs in order, each made from one
column of the raw table (a JSON list; the feature names are the table's columns)::

    [{"feature": "age", "center": 38.5, "scale": 13.2},    # a number: (value - center) / scale
     {"feature": "home_ownership", "category": "rent"},     # a one-hot column: 1 for that category, else 0
     {"feature": "education", "codes": {"HS": 0, "BSc": 1}}]  # a code per category (an ordinal encoding)

The file may also be a JSON object ``{"inputs": [...the list...], "outputs": [...]}``: ``outputs`` lists the
classes (values of the target column) of the model's outputs, in the model's order, where that is not ct-lightning's
(the table's classes sorted, the positive class last): a model trained with label 1 for "rejected" lists
``["approved", "rejected"]``. A network with one output unit (a single logit, ``BCEWithLogitsLoss``) lists two
classes ``[negative, positive]``: the unit is the log-odds of the second. A frozen output layer
(:class:`ct_lightning.models.OutputAdapter`, from :func:`output_order`) maps the model's outputs onto ct-lightning's
logits, so everything downstream sees its classes in its own order.

``center`` and ``scale`` default to 0 and 1 (the raw number). StandardScaler is ``center = mean_, scale =
scale_``; MinMaxScaler ``center = data_min_, scale = data_max_ - data_min_`` (for the range 0 to 1). Each such
input is an affine function of ct-lightning's own encoding of the row (numbers standardised, categories one-hot),
so :func:`affine_map` gives the matrix and bias of a frozen layer (:class:`ct_lightning.models.InputAdapter`) that
turns one into the other; your network sits behind it unchanged, and the counterfactual search, the domains, the
mutability and the explanations keep working on ct-lightning's encoding.

:func:`model_inputs_from_sklearn` writes the list from a fitted scikit-learn ``ColumnTransformer`` and
:func:`model_inputs_from_dummies` from the columns of ``pandas.get_dummies``; given ``classes=`` (a
``LabelEncoder``'s ``classes_``: the class of each output, in order) they write the object with ``outputs``. Nothing
here imports torch, pandas or scikit-learn: the checks run before any work starts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from datamodules.suggest import name_hint, path_hint

OPTION = "model_inputs"
FORMS = ('{"feature": F, "center": C, "scale": S} (a number: (value - C) / S)',
         '{"feature": F, "category": V} (a one-hot column)', '{"feature": F, "codes": {V: CODE, ...}} (a code per '
         'category)')
ALLOWED = "a JSON list of the model's inputs in order, each " + ", ".join(FORMS[:-1]) + " or " + FORMS[-1] + \
    ', or an object {"inputs": [that list], "outputs": [the class of each output, in order]}'
OUTPUTS_ALLOWED = ('"outputs": a list of the classes of the target column, one per output of the model in its order '
                   '(two, [negative, positive], for a model with one output unit)')
NUMBER_KEYS, CATEGORY_KEYS, CODES_KEYS = {"center", "scale"}, {"category"}, {"codes"}


def _refuse(source, detail: str, allowed: str = ALLOWED) -> ValueError:
    """The one-line error of a bad inputs list, as every option's: ``model_inputs: got X (detail); allowed: ...``."""
    return ValueError(f"{OPTION}: got {_shown(source)} ({detail}); allowed: {allowed}")


def _shown(source) -> str:
    if isinstance(source, (str, Path)):
        return repr(str(source))
    if isinstance(source, list):
        return f"a list of {len(source)} inputs"
    if isinstance(source, Mapping) and isinstance(source.get("inputs"), list):
        return f"an object of {len(source['inputs'])} inputs and outputs {_json(source.get('outputs'))}"
    return repr(source)


def _json(value) -> str:
    """``value`` as JSON in a message, its letters as written (``"männlich"``, not ``"m\\u00e4nnlich"``)."""
    return json.dumps(value, ensure_ascii=False)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_model_inputs(source) -> list[dict]:
    """The inputs list of ``source`` (a JSON file's path, the list itself, or the object ``{"inputs", "outputs"}``),
    each entry checked and normalised to ``{"feature", "center", "scale"}``, ``{"feature", "category"}`` or
    ``{"feature", "codes"}``. A bad file or entry is a one-line ``ValueError`` naming the entry, the value and what
    is allowed. What the entries name is checked against the data by :func:`affine_map`."""
    return read_model_spec(source)[0]


def read_model_spec(source) -> tuple[list[dict], list | None]:
    """``(inputs, outputs)`` of ``source`` (as :func:`read_model_inputs`): ``outputs`` the checked class list of the
    object form (distinct texts, numbers or true/false, at least two), ``None`` for a plain list. Which classes it
    names is checked against the table by :func:`output_order`."""
    content = source
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            problem = f"file not found{path_hint(path, '; {}')}" if not path.exists() else "a folder, not a file"
            raise _refuse(source, problem, "a JSON file listing the model's inputs")
        try:
            content = json.loads(path.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError:
            raise _refuse(source, "not a text file", "a JSON file listing the model's inputs") from None
        except json.JSONDecodeError as error:
            raise _refuse(source, f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    entries, outputs = content, None
    if isinstance(content, Mapping) and "inputs" in content:
        unknown = sorted(set(content) - {"inputs", "outputs"})
        if unknown:
            raise _refuse(source, f"unknown key {unknown[0]!r} of the object", 'the keys "inputs" and "outputs"')
        entries, outputs = content["inputs"], content.get("outputs")
        outputs = None if outputs is None else _outputs(source, outputs)
    if not isinstance(entries, list) or not entries:
        what = "an empty list" if isinstance(entries, list) else f"a JSON {type(entries).__name__}, not a list"
        raise _refuse(source, what)
    return [_entry(source, position, entry, len(entries)) for position, entry in enumerate(entries, 1)], outputs


def _outputs(source, outputs) -> list:
    """The ``outputs`` list, checked for its form: at least two classes, each a text, number or true/false, none
    twice."""
    shown = f'"outputs" {_json(outputs)}'
    if not isinstance(outputs, list) or len(outputs) < 2 or any(
            value is None or isinstance(value, (list, dict)) for value in outputs):
        raise _refuse(source, shown, OUTPUTS_ALLOWED + ", at least two")
    for position, value in enumerate(outputs):
        if any(_same(earlier, value) for earlier in outputs[:position]):
            raise _refuse(source, f"{shown}: the class {value!r} twice", OUTPUTS_ALLOWED + ", each once")
    return list(outputs)


def output_order(outputs: Sequence | None, classes: Sequence, width: int | None, source=None) -> list[int] | None:
    """The ct-lightning class (its index in ``classes``, the table's codec's) of each of the model's ``width``
    outputs, from ``outputs`` (:func:`read_model_spec`): one index per output, and for a single output unit the index
    of the class it is the log-odds of (the second of ``outputs``). ``None`` where the outputs are ct-lightning's
    own (no ``outputs`` and not one unit). ``width`` is the model's output width (its checkpoint's last layer),
    ``None`` if unknown (then the number of classes listed). A class of no table, a count other than the width or
    the classes', or one unit on other than two classes is a one-line ``ValueError``."""
    classes, listed = list(classes), ", ".join(map(str, classes))
    if outputs is None:
        if width == 1 and len(classes) == 2:
            raise _refuse(source, "the model has one output unit and no \"outputs\" says which class it scores",
                          f'the object {{"inputs": [...], "outputs": [NEGATIVE, POSITIVE]}}: add "outputs", e.g. '
                          f'{_json(classes)} if the unit is the log-odds of {classes[1]!r}')
        return None
    shown = f'"outputs" {_json(outputs)}'
    indices = [_index(classes, value) for value in outputs]
    if None in indices:
        unknown = outputs[indices.index(None)]
        raise _refuse(source, f"{shown}: unknown class {unknown!r}", f"classes of the target: {listed}")
    width = len(outputs) if width is None else width
    if width == 1:
        if len(outputs) != 2 or len(classes) != 2:
            raise _refuse(source, f"{shown} for a model with one output unit on {len(classes)} classes",
                          'two classes [NEGATIVE, POSITIVE] (the unit is the log-odds of the second), on a table of '
                          f'two classes; classes of the target: {listed}')
        return [indices[1]]
    if len(outputs) != width or len(classes) != width:
        detail = f"lists {len(outputs)} for a model of {width} outputs" if len(outputs) != width else \
            f"for a model of {width} outputs on a table of {len(classes)} classes"
        raise _refuse(source, f"{shown} {detail}", f"one class per output of the model, each class of the target "
                      f"once: {listed} (or two for a model with one output unit)")
    return indices


def reordered_outputs(counts: Sequence[Sequence[int]], labels: Sequence, classes: Sequence) -> tuple[list, float]:
    """The ``"outputs"`` under which a model's predictions score best, and that accuracy: ``counts[p][t]`` is how many
    rows of class ``t`` it predicts as ``p`` (indices of ``classes``, the table's), ``labels`` the class each of its
    outputs is read as now, in the model's order (``[negative, positive]`` for one unit). A model trained with
    another label order (label 1 for "defaulted") scores below the majority class as read, and well above it with
    its outputs read as the classes it was trained on. Every order is tried for up to 6 classes; beyond, ``labels``
    and the accuracy as read."""
    import itertools  # noqa: PLC0415

    n, total = len(classes), sum(map(sum, counts)) or 1
    orders = itertools.permutations(range(n)) if n <= 6 else [tuple(range(n))]
    best = max(orders, key=lambda order: (sum(counts[p][order[p]] for p in range(n)), order == tuple(range(n))))
    indices = [_index(classes, label) for label in labels]
    return [classes[best[i]] for i in indices], sum(counts[p][best[p]] for p in range(n)) / total


def _entry(source, position: int, entry, count: int) -> dict:
    """One entry, checked: ``position`` counts from 1."""
    where = f"input {position} of {count}"
    if not isinstance(entry, Mapping):
        raise _refuse(source, f"{where} is {_json(entry)}, not an object")
    feature = entry.get("feature")
    if not isinstance(feature, str) or not feature.strip():
        raise _refuse(source, f"{where} has no \"feature\" (the table's column it is made from)")
    keys = set(entry) - {"feature"}
    forms = [name for name, allowed in (("number", NUMBER_KEYS), ("category", CATEGORY_KEYS),
                                        ("codes", CODES_KEYS)) if keys & allowed]
    unknown = sorted(keys - NUMBER_KEYS - CATEGORY_KEYS - CODES_KEYS)
    if unknown:
        raise _refuse(source, f"{where} ({feature}): unknown key {unknown[0]!r}",
                      "the keys feature with center and scale, or with category, or with codes")
    if len(forms) > 1:
        raise _refuse(source, f"{where} ({feature}): mixes {' and '.join(sorted(keys))}",
                      "one form per input: " + ", ".join(FORMS))
    if forms == ["category"]:
        value = entry["category"]
        if value is None or isinstance(value, (list, dict)):
            raise _refuse(source, f"{where} ({feature}): category {_json(value)}",
                          "a category of the column: a text, a number or true/false")
        return {"feature": feature, "category": value}
    if forms == ["codes"]:
        codes = entry["codes"]
        if not isinstance(codes, Mapping) or not codes or not all(_finite(v) for v in codes.values()):
            raise _refuse(source, f"{where} ({feature}): codes {_json(codes)}",
                          "an object of each category of the column and its number, e.g. {\"HS\": 0, \"BSc\": 1}")
        return {"feature": feature, "codes": {str(k): float(v) for k, v in codes.items()}}
    center, scale = entry.get("center", 0.0), entry.get("scale", 1.0)
    for name, value in (("center", center), ("scale", scale)):
        if not _finite(value):
            raise _refuse(source, f"{where} ({feature}): {name} {_json(value)}", "a finite number")
    if scale == 0:
        raise _refuse(source, f"{where} ({feature}): scale 0", "a number other than 0 (the input is "
                      "(value - center) / scale; a constant column's StandardScaler scale is 1)")
    return {"feature": feature, "center": float(center), "scale": float(scale)}


def _same(category, value) -> bool:
    """Whether ``value`` (from the inputs file) names ``category`` (of the table): equal, or equal as text (JSON keys
    and CSV categories are text, a table's may be numbers); true/false never stands for 1/0."""
    if isinstance(category, bool) or isinstance(value, bool):
        return str(category).strip() == str(value).strip()
    if category == value or str(category).strip() == str(value).strip():  # a CSV's " Male" is read as "Male"
        return True
    try:  # "1.0" (a code's key, a float category) names the category 1
        return float(category) == float(value)
    except (TypeError, ValueError):
        return False


def _index(categories: Sequence, value) -> int | None:
    return next((i for i, category in enumerate(categories) if _same(category, value)), None)


def affine_map(entries: Sequence[Mapping], codec, source=None) -> tuple[list[list[float]], list[float], list[str]]:
    """``(weight, bias, unused)``: the model's inputs are ``weight @ x + bias`` for ct-lightning's encoding ``x`` of a
    row (``codec``: the table's fitted ``TabularCodec``), ``weight`` one row per entry; ``unused``: the table's
    feature columns that no entry reads. An entry that does not fit the column it names (an unknown column or
    category, a category of a numeric column, a number for a text category) is a one-line ``ValueError``."""
    source = entries if source is None else source
    columns = {column.name: column for column in codec.columns}
    starts, start = {}, 0
    for column in codec.columns:
        starts[column.name] = start
        start += len(column.categories) if column.kind == "categorical" else 1
    weight = [[0.0] * start for _ in entries]
    bias = [0.0] * len(entries)
    for row, entry in enumerate(entries):
        where = f"input {row + 1} of {len(entries)}"
        feature = entry["feature"]
        column = columns.get(feature)
        if column is None:
            if feature in getattr(codec, "dropped", ()):
                detail = f"{where}: feature {feature!r} is left out with --drop-columns"
            elif feature == getattr(codec, "target", None):
                detail = f"{where}: feature {feature!r} is the target"
            else:
                detail = f"{where}: unknown feature {feature!r}{name_hint(feature, columns, '; {}')}"
            raise _refuse(source, detail, "features of the table: " + ", ".join(columns))
        _fill(source, where, entry, column, starts[feature], weight[row], bias, row)
    used = {entry["feature"] for entry in entries}
    return weight, bias, [name for name in columns if name not in used]


def _fill(source, where: str, entry: Mapping, column, start: int, weight: list[float], bias: list[float],
          row: int) -> None:
    """Write the weights and bias of one entry (``weight``: its row of the matrix) over ``column``'s inputs."""
    feature, kind, categories = column.name, column.kind, list(column.categories)
    listed = ", ".join(map(str, categories))
    if "center" in entry:
        center, scale = entry["center"], entry["scale"]
        if kind in ("continuous", "integer"):  # raw = mean + scale·x
            weight[start] = column.scale / scale
            bias[row] = (column.mean - center) / scale
            return
        if kind == "binary" and all(_finite(c) or isinstance(c, bool) for c in categories):
            low, high = (float(c) for c in categories)  # raw = low + (high - low)·x
            weight[start] = (high - low) / scale
            bias[row] = (low - center) / scale
            return
        if kind in ("categorical", "ordinal") and all(_finite(c) and not isinstance(c, bool) for c in categories):
            # a code your pipeline read as a number (EDUCATION 1-6) that the data spec declares categorical: one
            # weight per category, the scaled number it stands for
            values = [(float(c) - center) / scale for c in categories]
            if kind == "ordinal":
                _along_ranks(source, where, column, values, start, weight, bias, row)
            else:
                weight[start:start + len(categories)] = values
            return
        raise _refuse(source, f"{where}: a number (center, scale) for the {kind} column {feature!r} of categories "
                      f"{listed}", f'{{"feature": "{feature}", "category": ...}} or {{"feature": "{feature}", '
                      f'"codes": {{...}}}} for a category column')
    if kind in ("continuous", "integer"):
        form = "category" if "category" in entry else "codes"
        raise _refuse(source, f"{where}: a {form} for the {kind} column {feature!r}",
                      f'{{"feature": "{feature}", "center": C, "scale": S}} for a number (a column your pipeline '
                      f'one-hot encodes must be categorical here too: declare {feature}: {{kind: categorical}} in '
                      f'--data-spec)')
    if "category" in entry:
        codes = {str(category): 1.0 if _same(category, entry["category"]) else 0.0 for category in categories}
        if _index(categories, entry["category"]) is None:
            raise _refuse(source, f"{where}: unknown category {entry['category']!r} of {feature!r}",
                          f"categories of {feature}: {listed}")
    else:
        codes = entry["codes"]
        unknown = [value for value in codes if _index(categories, value) is None]
        if unknown:
            raise _refuse(source, f"{where}: unknown category {unknown[0]!r} of {feature!r} in codes",
                          f"categories of {feature}: {listed}")
        missing = [str(c) for c in categories if not any(_same(c, value) for value in codes)]
        if missing:
            raise _refuse(source, f"{where}: no code for the category {missing[0]!r} of {feature!r}",
                          f"a code for every category of {feature}: {listed}")
        codes = {str(c): float(next(v for k, v in codes.items() if _same(c, k))) for c in categories}
    values = [codes[str(c)] for c in categories]
    if kind == "binary":  # one input x: the first category at 0, the second at 1
        weight[start] = values[1] - values[0]
        bias[row] = values[0]
    elif kind == "ordinal":
        _along_ranks(source, where, column, values, start, weight, bias, row)
    else:
        weight[start:start + len(values)] = values


def _along_ranks(source, where: str, column, values: list[float], start: int, weight: list[float], bias: list[float],
                 row: int) -> None:
    """An input made from an ordinal column, whose one encoded input is its rank (``rank = mean + scale·x``):
    ``values`` (the input's value per category, lowest first) must lie on a straight line in the rank, as an
    ``OrdinalEncoder``'s codes in the data spec's order or evenly spaced grades do; a one-hot column cannot."""
    step = (values[-1] - values[0]) / max(len(values) - 1, 1)
    if any(abs(values[0] + step * rank - value) > 1e-9 * max(1.0, abs(value)) for rank, value in enumerate(values)):
        listed = ", ".join(f"{category}: {value:g}" for category, value in zip(column.categories, values))
        raise _refuse(source, f"{where}: values {listed} of the ordinal column {column.name!r} are not evenly spaced "
                      "along its order (it is one input, the category's rank)", "codes that change by the same step "
                      f"from one category to the next in the order (an OrdinalEncoder's in that order), or declare "
                      f"{column.name}: {{kind: categorical}} in --data-spec for a pipeline that one-hot encodes it")
    weight[start] = step * column.scale
    bias[row] = values[0] + step * column.mean


# --- writing the list from a pipeline you already have -----------------------------------------------------------

IDENTITY = ("SimpleImputer",)  # pass the values through (missing values are ct-lightning's --impute)
SCALERS = ("StandardScaler", "MinMaxScaler", "MaxAbsScaler", "RobustScaler")
ENCODERS = ("OneHotEncoder", "OrdinalEncoder")


def model_inputs_from_sklearn(transformer, classes: Sequence | None = None) -> list[dict] | dict:
    """The inputs list of a fitted scikit-learn ``ColumnTransformer`` (or a ``Pipeline`` that is one), in the order
    of its output columns: ``json.dump(model_inputs_from_sklearn(preprocess), open("model-inputs.json", "w"))``.
    With ``classes`` (the class of each of the model's outputs in order, e.g. a ``LabelEncoder``'s ``classes_``;
    two, ``[negative, positive]``, for one output unit) the object ``{"inputs": [...], "outputs": classes}``.

    Each part may be ``StandardScaler``, ``MinMaxScaler``, ``MaxAbsScaler``, ``RobustScaler`` (also in a
    ``Pipeline``, after a ``SimpleImputer``), ``OneHotEncoder`` (any ``drop``, ``handle_unknown``, infrequent
    categories), ``OrdinalEncoder``, ``"passthrough"`` or ``"drop"``, the remainder too. Any other transformer is
    a ``ValueError`` naming it: it is not an affine map of the columns. scikit-learn itself is not imported.
    """
    if type(transformer).__name__ == "Pipeline":
        steps = [step for _, step in transformer.steps if step not in (None, "passthrough")]
        if len(steps) != 1:
            raise ValueError("model_inputs_from_sklearn: a Pipeline of exactly one ColumnTransformer (pass the "
                             "preprocessing step itself, e.g. pipeline[:-1] without the classifier)")
        transformer = steps[0]
    if not hasattr(transformer, "transformers_"):
        raise ValueError(f"model_inputs_from_sklearn: got a {type(transformer).__name__}; allowed: a fitted "
                         "ColumnTransformer (call fit first)")
    names = list(getattr(transformer, "feature_names_in_", []))
    entries = []
    for name, part, columns in transformer.transformers_:
        if part == "drop":
            continue
        columns = _column_names(columns, names, name)
        if not columns:
            continue
        entries += _part_inputs(part, columns, name)
    return _with_outputs(entries, classes)


def _with_outputs(entries: list[dict], classes: Sequence | None) -> list[dict] | dict:
    """``entries``, or the object form with ``classes`` as its ``outputs`` (numpy values as plain ones)."""
    return entries if classes is None else {"inputs": entries, "outputs": [_plain(c) for c in classes]}


def _column_names(columns, names: list, part: str) -> list[str]:
    """A ``ColumnTransformer`` column selection as the table's column names."""
    if isinstance(columns, str):
        return [columns]
    if isinstance(columns, slice):
        return names[columns]
    selected = list(columns)
    if selected and all(type(c).__name__ in ("bool", "bool_") for c in selected):  # a mask (numpy's or Python's)
        return [n for n, keep in zip(names, selected) if keep]
    if selected and all(isinstance(c, int) or type(c).__name__.startswith("int") for c in selected):
        if not names:
            raise ValueError(f"model_inputs_from_sklearn: part {part!r} selects columns by position, and the "
                             "transformer was not fitted on a DataFrame (no feature_names_in_): fit it on one")
        return [names[int(c)] for c in selected]
    return [str(c) for c in selected]


def _part_inputs(part, columns: list[str], name: str) -> list[dict]:
    """The inputs one part of a ``ColumnTransformer`` makes of ``columns``."""
    steps = [step for _, step in part.steps] if type(part).__name__ == "Pipeline" else [part]
    steps = [s for s in steps if not _identity(s)]
    encoders = [s for s in steps if type(s).__name__ in ENCODERS]
    if encoders:
        if len(steps) != 1:
            raise ValueError(f"model_inputs_from_sklearn: part {name!r}: {type(encoders[0]).__name__} with other "
                             f"steps ({', '.join(type(s).__name__ for s in steps)}); allowed: an encoder alone "
                             f"(after a SimpleImputer)")
        return _encoder_inputs(encoders[0], columns)
    center, scale = [0.0] * len(columns), [1.0] * len(columns)
    for step in steps:  # each scaler: (x - c) / s, applied to the previous step's output
        kind = type(step).__name__
        if kind not in SCALERS:
            raise ValueError(f"model_inputs_from_sklearn: part {name!r}: {kind} is not an affine map of the columns; "
                             f"allowed: {', '.join(SCALERS + ENCODERS + IDENTITY)}, passthrough, drop")
        step_center, step_scale = _scaler(step, len(columns))
        center = [c + sc * s for c, sc, s in zip(center, step_center, scale)]
        scale = [s * ss for s, ss in zip(scale, step_scale)]
    return [{"feature": column, "center": _plain(c), "scale": _plain(s)}
            for column, c, s in zip(columns, center, scale)]


def _identity(step) -> bool:
    """Whether a step passes values through: ``"passthrough"`` (a fitted one is a ``FunctionTransformer`` without a
    function) or a ``SimpleImputer``."""
    if step is None or isinstance(step, str) and step == "passthrough":
        return True
    kind = type(step).__name__
    return kind in IDENTITY or kind == "FunctionTransformer" and getattr(step, "func", 0) is None


def _scaler(step, width: int) -> tuple[list[float], list[float]]:
    """``(center, scale)`` per column of a fitted scaler: its output is ``(x - center) / scale``."""
    kind = type(step).__name__
    ones, zeros = [1.0] * width, [0.0] * width
    if kind == "StandardScaler":
        return (list(step.mean_) if step.mean_ is not None else zeros,
                list(step.scale_) if step.scale_ is not None else ones)
    if kind == "RobustScaler":
        return (list(step.center_) if getattr(step, "center_", None) is not None else zeros,
                list(step.scale_) if getattr(step, "scale_", None) is not None else ones)
    if kind == "MaxAbsScaler":
        return zeros, list(step.scale_)
    # MinMaxScaler: x * scale_ + min_ = (x - (-min_ / scale_)) / (1 / scale_)
    return [-m / s for m, s in zip(step.min_, step.scale_)], [1.0 / s for s in step.scale_]


def _encoder_inputs(encoder, columns: list[str]) -> list[dict]:
    """The output columns of a fitted ``OneHotEncoder`` or ``OrdinalEncoder``, in its order."""
    entries = []
    for index, (column, categories) in enumerate(zip(columns, encoder.categories_)):
        categories = [_plain(c) for c in categories]
        if type(encoder).__name__ == "OrdinalEncoder":
            entries.append({"feature": column, "codes": {str(c): i for i, c in enumerate(categories)}})
            continue
        infrequent = _infrequent(encoder, index)
        dropped = _dropped(encoder, index, categories, infrequent)
        frequent = [c for c in categories if c not in infrequent]
        for category in frequent:
            if category not in dropped:
                entries.append({"feature": column, "category": category})
        if infrequent and not set(infrequent) <= set(dropped):  # one column for all infrequent categories
            entries.append({"feature": column, "codes": {str(c): int(c in infrequent) for c in categories}})
    return entries


def _infrequent(encoder, index: int) -> list:
    if not getattr(encoder, "_infrequent_enabled", False):
        return []
    found = encoder.infrequent_categories_[index]
    return [] if found is None else [_plain(c) for c in found]


def _dropped(encoder, index: int, categories: list, infrequent: list) -> list:
    """The categories whose column ``drop`` removed (the infrequent ones together where it dropped their column)."""
    drop = getattr(encoder, "drop_idx_", None)
    if drop is None or drop[index] is None:
        return []
    if infrequent and hasattr(encoder, "_drop_idx_after_grouping"):
        grouped = [c for c in categories if c not in infrequent] + ["__infrequent__"]
        chosen = grouped[int(encoder._drop_idx_after_grouping[index])]
        return infrequent if chosen == "__infrequent__" else [chosen]
    return [categories[int(drop[index])]]


def model_inputs_from_dummies(columns: Sequence[str], features: Sequence[str], center: Mapping | None = None,
                              scale: Mapping | None = None, prefix_sep: str = "_",
                              classes: Sequence | None = None) -> list[dict] | dict:
    """The inputs list of a model trained on ``pandas.get_dummies`` output: ``columns`` are its input columns in
    order (``list(X.columns)``), ``features`` the raw table's columns. A column named as a feature is a number
    (``center[name]``/``scale[name]`` where your own scaling gave them, else the raw value); ``FEATURE_VALUE`` is
    the one-hot column of that category (the longest feature name that prefixes it wins). ``classes``: as in
    :func:`model_inputs_from_sklearn`."""
    center, scale, entries = dict(center or {}), dict(scale or {}), []
    for name in columns:
        name = str(name)
        if name in features:
            entries.append({"feature": name, "center": _plain(center.get(name, 0.0)),
                            "scale": _plain(scale.get(name, 1.0))})
            continue
        owners = sorted((f for f in features if name.startswith(f"{f}{prefix_sep}")), key=len, reverse=True)
        if not owners:
            raise ValueError(f"model_inputs_from_dummies: column {name!r} is neither a feature nor "
                             f"FEATURE{prefix_sep}VALUE of one; features: {', '.join(map(str, features))}")
        entries.append({"feature": owners[0], "category": name[len(owners[0]) + len(prefix_sep):]})
    return _with_outputs(entries, classes)


def _plain(value):
    """A numpy scalar as the Python value JSON keeps."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) else value
