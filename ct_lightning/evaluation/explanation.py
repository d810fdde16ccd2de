"""Explain single decisions in the user's own units: prediction, counterfactual, and the changes that flip it.

A *codec* turns raw rows (a pandas DataFrame in original units and categories) into model inputs and back
(``encode``/``decode``, ``feature_names``, ``columns`` with ``name``, ``classes``, ``encode_target``,
``decode_target``, ``mutability()``): ``datamodules.codec.TabularCodec`` for tabular data, or
:class:`FeatureCodec` (the model's inputs as they are, named ``x1, x2, ...`` or by the data set's
feature names) for the built-in data sets that have none. The probability of the target is computed
again on the *decoded* counterfactual, re-encoded: the row a person would actually present.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ct_lightning.constraints import FeatureTypes, mutability_pairs, one_hot_groups, parse_mutability
from ct_lightning.evaluation.fewer_changes import column_masks, revert_needless_changes
from ct_lightning.evaluation.ordered_outcomes import (accepted_classes, at_least_probability, at_least_valid,
                                                      class_ranks, next_class_up, search_at_least)
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.generators import FitContext, make_generator, prepare_standalone
from ct_lightning.generators.base import generate_counterfactuals
from datamodules.codec import ColumnSpec, categories_by_case  # ColumnSpec: also the identity codec's columns
from datamodules.table_format import as_written
from datamodules.wording import currency_format, heading, worded, worded_values

EXPLAIN_STEP = 0.05  # the largest search step of an explanation (η); see explanation_search
EXPLAIN_TRAVEL = 25.0  # η·T of the paper's training search (0.25 · 100 steps): how far an explanation may go


def explanation_search(hp) -> dict:
    """The search settings that explain a decision of a model trained with hyperparameters ``hp`` (a ``CTModule``'s
    ``hparams``): its own generator, τ, ε and λs, but steps of at most :data:`EXPLAIN_STEP`, as many as let the
    search go as far as the training's own (η·max(T, 100), at least :data:`EXPLAIN_TRAVEL`).

    A training search needs some counterfactual of each pool row; an applicant needs a near one. With the paper's
    η = 0.25, the first step of a confident model's search overshoots the decision boundary by far (a CT model on
    the lending example: the median change 2.2 standard deviations at η = 0.25, 0.7 at η = 0.05, all valid); the
    search stops at the first step past τ, so finer steps stop nearer to it."""
    trained_lr = float(hp.search_lr)
    lr = min(trained_lr, EXPLAIN_STEP)
    travel = max(trained_lr * max(int(hp.max_steps), 100), EXPLAIN_TRAVEL)
    return {"generator": hp.generator, "tau": hp.tau, "max_steps": math.ceil(travel / lr - 1e-9),
            "epsilon": hp.epsilon, "lambda_cost": hp.lambda_cost, "lambda_energy": hp.lambda_energy, "lr": lr,
            "generator_options": getattr(hp, "generator_options", None) or None}


COLUMNS = ["factual", "prediction", "prediction_probability", "target", "factual_probability", "counterfactual",
           "changes", "probability", "valid", "counterfactual_prediction", "converged", "immutable"]


class FeatureCodec:
    """The identity codec for data without a fitted preprocessing: each model input is a column of its own.

    ``feature_names`` default to ``x1 ... xN``; classes are ``0 ... K-1``. Values are in model units.
    """

    def __init__(self, feature_names: Sequence[str] | None = None, n_features: int | None = None,
                 n_classes: int = 2, mutability: Mapping[str, str] | None = None):
        if feature_names is None:
            if n_features is None:
                raise ValueError("FeatureCodec: give feature_names or n_features")
            feature_names = [f"x{i + 1}" for i in range(n_features)]
        self.feature_names = list(feature_names)
        self.spec = dict(mutability or {})  # by feature name or one-hot group prefix
        self.columns = [ColumnSpec(name, mutability=self.spec.get(name, "both")) for name in self.feature_names]
        self.target, self.classes = "label", list(range(n_classes))
        self.positive = self.classes[-1]

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """The columns, in order, as a float32 array."""
        check_columns(frame, [c.name for c in self.columns])
        return frame[self.feature_names].to_numpy(dtype=np.float32)

    def decode(self, x) -> pd.DataFrame:
        """Model inputs as a DataFrame with one column per feature."""
        return pd.DataFrame(np.asarray(x, dtype=np.float32), columns=self.feature_names)

    def encode_target(self, values) -> np.ndarray:
        """Class labels (``0 ... K-1``) as integers."""
        return np.asarray(values).astype(np.int64)

    def decode_target(self, codes) -> list:
        """Class indices as labels (the same integers)."""
        return [self.classes[int(c)] for c in np.asarray(codes).reshape(-1)]

    def mutability(self) -> dict[str, str]:
        """``{feature or one-hot group: kind}`` as given."""
        return dict(self.spec)

    def to_dict(self) -> dict:
        """A JSON-able description (``from_dict`` rebuilds it)."""
        return {"kind": "features", "feature_names": self.feature_names, "n_classes": len(self.classes),
                "mutability": self.mutability()}

    @classmethod
    def from_dict(cls, payload: dict) -> FeatureCodec:
        """Rebuild from :meth:`to_dict`."""
        return cls(payload["feature_names"], n_classes=payload["n_classes"], mutability=payload.get("mutability"))


def codec_from_dict(payload: dict):
    """A codec from its ``to_dict()`` form: a :class:`FeatureCodec` or a ``datamodules.codec.TabularCodec``."""
    if payload.get("kind") == "features":
        return FeatureCodec.from_dict(payload)
    from datamodules.codec import TabularCodec  # noqa: PLC0415 - only tabular runs have one

    return TabularCodec.from_dict(payload)


def check_columns(frame: pd.DataFrame, columns: Sequence[str], option: str = "rows") -> None:
    """Refuse rows that lack a column or carry one the model does not know (one-line ``ValueError``)."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{option}: missing column {', '.join(map(repr, missing))}; the model needs "
                         f"{', '.join(columns)}")
    unknown = [c for c in frame.columns if c not in columns]
    if unknown:
        raise ValueError(f"{option}: unknown column {', '.join(map(repr, unknown))}; allowed: {', '.join(columns)}")


def _column_names(codec) -> list[str]:
    return [c.name for c in codec.columns]


def class_named(label, classes, option: str, words=None):
    """The class of ``classes`` that ``label`` names (as text, or in another case where that is unambiguous: ``yes``
    for ``Yes``; or by the data spec's words for it, ``words`` ``[[class, text], ...]``: ``likely to default`` for
    ``1``), else a one-line ``ValueError`` naming ``option`` and the classes."""
    match = [c for c in classes if c == label or str(c) == str(label)]
    if not match:
        same = categories_by_case(classes).get(str(label).casefold())
        match = [same] if same is not None else []
    if not match:
        said = [c for c, text in words or () if str(text).casefold() == str(label).strip().casefold()]
        match = [c for c in classes if any(_same(c, named) for named in said)]
    if not match:
        raise ValueError(f"{option}: got {label!r}; allowed: {allowed_classes(classes, words)}")
    return match[0]


def allowed_classes(classes, words=None) -> str:
    """The classes as a refusal lists them: in the data spec's ``words`` (``[[class, text], ...]``) with the class in
    brackets, which :func:`class_named` takes either way (``likely to repay [0], likely to default [1] (the words, or
    the class in brackets)``), else as they are (``no, yes``)."""
    return worded_values(classes, words) + (" (the words, or the class in brackets)" if words else "")


def _model_rows(frame: pd.DataFrame, codec) -> tuple[pd.DataFrame, torch.Tensor]:
    """The rows in the model's columns (those it was trained without, ``--drop-columns``, set aside; a missing or an
    unknown column refused), numbered from 0, and their encoding. The copy has no ``attrs``: pandas deep-copies them
    into every column and value read from it, and a batch's (each row's other columns and filled values) made reading
    its values cost 85 of 93 s for 1 200 rows."""
    columns = _column_names(codec)
    if hasattr(codec, "without_dropped"):
        frame = codec.without_dropped(frame)
    check_columns(frame, columns)
    frame = frame[columns].reset_index(drop=True)
    frame.attrs = {}  # a copy's: the caller's rows keep theirs
    return frame, torch.tensor(np.array(codec.encode(frame), dtype=np.float32))


def predictions(model: nn.Module, rows: pd.DataFrame, codec) -> list[tuple[object, float]]:
    """The class the model predicts for each row (in original units, checked as :func:`explain` checks them), as the
    codec's label, with its probability: no search."""
    classifier = getattr(model, "model", model)
    _, x = _model_rows(rows, codec)
    with eval_mode(classifier), torch.no_grad():
        probability, predicted = torch.softmax(classifier(x.to(next(classifier.parameters()).device)), 1).max(1)
    return [(codec.classes[i], p) for i, p in zip(predicted.cpu().tolist(), probability.cpu().tolist())]


def _target_codes(target, codec, predicted: torch.Tensor, probabilities: torch.Tensor) -> torch.Tensor:
    """Target class indices: the given label for every row, else the most likely class other than the prediction
    (of an ordered outcome: the class one place above it, :func:`next_class_up`)."""
    ranks = class_ranks(codec)
    if target is None and ranks is not None:
        return next_class_up(predicted, ranks)
    if target is None:
        masked = probabilities.clone()
        masked[torch.arange(len(predicted)), predicted] = -1.0
        return masked.argmax(1)
    labels = list(target) if isinstance(target, (list, tuple, np.ndarray, pd.Series)) else [target] * len(predicted)
    if len(labels) != len(predicted):
        raise ValueError(f"target: {len(labels)} targets for {len(predicted)} rows")
    classes = list(codec.classes)
    codes = [next(i for i, c in enumerate(classes) if c is named or c == named)
             for named in (class_named(label, classes, "target", getattr(codec, "class_labels", None))
                           for label in labels)]
    return torch.tensor(codes, dtype=torch.long)


def _same(a, b) -> bool:
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    return a == b or str(a) == str(b)


def _plain(value):
    """A JSON-able Python scalar."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return value
    return value


def constraint_tensors(codec, n_features: int, mutability=None):
    """Mutability codes (by the codec's own columns, plus ``mutability`` overrides) and encoded domain bounds."""
    own = codec.mutability() or {}
    names = list(codec.feature_names)
    if not isinstance(own, Mapping):  # one kind per encoded feature
        own = {name: kind for name, kind in zip(names, own)}
    spec = {**dict(own), **dict(mutability or {})}
    codes = parse_mutability({k: v for k, v in spec.items() if v != "both"}, n_features, names,
                             argument="mutability", groups=one_hot_groups(codec))
    lower, upper = None, None
    bounds = getattr(codec, "encoded_bounds", None)
    if callable(bounds):
        found = bounds()
        if found is not None:
            lower, upper = (torch.as_tensor(b, dtype=torch.float32) for b in found)
    return codes, lower, upper, spec


def trained_mutability(model) -> dict[str, str]:
    """``{feature: kind}`` of the mutability ``model`` was trained under: a ``CTModule``'s ``mutability``
    hyperparameter (what ``train()`` merged from --mutability, --immutable, --protect and the data spec), by feature
    name; ``{}`` for a plain ``nn.Module``."""
    hp = getattr(model, "hparams", None)
    spec = getattr(hp, "mutability", None) if hp is not None else None
    if not spec:
        return {}
    if isinstance(spec, str):
        return mutability_pairs(spec)
    names = list(getattr(hp, "feature_names", None) or [])
    items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)  # a list: one kind per model input
    return {names[key] if isinstance(key, int) and key < len(names) else key: kind for key, kind in items
            if kind != "both"}


def with_steps(types: FeatureTypes, steps: Mapping[int, float], reach: Mapping[int, float] | None = None
               ) -> FeatureTypes:
    """``types`` with the model inputs ``steps`` (``{input index: step in original units}``) stepped (an integer
    input given a step is stepped instead: a whole step from a whole number stays whole) and the inputs ``reach``
    (``{input index: largest change}``) limited."""
    return dataclasses.replace(types, integers=[c for c in types.integers if c not in steps],
                               steps={**types.steps, **steps}, reach={**types.reach, **(reach or {})})


def explain(model: nn.Module, rows, target=None, codec=None, generator: str = "ecco", tau: float = 0.75,
            max_steps: int = 500, epsilon: float = 0.3, lambda_cost: float = 0.001, lambda_energy: float = 5.0,
            lr: float = EXPLAIN_STEP, generator_options: dict | None = None, mutability: Mapping[str, str] | None = None,
            x_train: torch.Tensor | None = None, y_train: torch.Tensor | None = None,
            seed: int = 0, fewer_changes: bool = True, steps: Mapping[str, float] | None = None,
            max_changes: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Explain each row's prediction with a counterfactual, in original units; one output row per input row.

    ``model`` returns logits (an ``nn.Module``, or a ``CTModule``: its codec-free defaults are its own
    settings); ``rows`` is a DataFrame (or a list of dicts) with the codec's columns in original units;
    ``target`` a class label (one for all rows, or one per row; default: the most likely other class).
    Immutable columns (the codec's, those ``model`` was trained under: :func:`trained_mutability`, plus
    ``mutability``) never change. Columns of the result:
    ``factual`` and ``counterfactual`` (column → value), ``prediction`` and its ``prediction_probability``,
    ``target`` and its ``factual_probability``, ``changes`` (a list of ``{feature, from, to}``), ``probability`` (of the target at the
    decoded counterfactual, re-encoded), ``valid`` (the decoded counterfactual is predicted as the
    target), ``converged`` (the search itself reached ``tau`` before decoding) and ``immutable`` (the columns that were
    not allowed to change). ``fewer_changes``: give back each change a valid counterfactual does not need, smallest
    first, while the target keeps a probability of at least ``tau`` (or the one the search reached, if lower):
    :mod:`~ct_lightning.evaluation.fewer_changes`. ``steps`` (``{column: step}``, a table codec's number columns): the
    explanation changes each only by whole multiples of its step from the row's own value, on top of the codec's own
    steps (a data spec's ``step``); ``max_changes`` (``{column: largest change}``) limits how far each may move either
    way, in its units, on top of the codec's (a data spec's ``max_change``).

    An ordered outcome (the codec's ``order``, a data spec's ``target: {order: [...]}``) counts "at least" the target:
    the search aims at the summed probability of the classes at or above it (τ on that sum,
    :mod:`~ct_lightning.evaluation.ordered_outcomes`), ``probability`` and ``factual_probability`` are that sum,
    ``valid`` says the counterfactual's predicted class is one of them, and a column ``valid_classes`` lists them
    (lowest first); the default target is the class one place above the prediction.
    """
    classifier = getattr(model, "model", model)
    hp = getattr(model, "hparams", None)
    if codec is None:
        names = getattr(hp, "feature_names", None) if hp is not None else None
        n_classes = int(getattr(hp, "n_classes", 2)) if hp is not None else 2
        n_features = int(getattr(hp, "n_features", 0) or 0) if hp is not None else 0
        if names is None and not n_features:
            raise ValueError("codec: needed to explain a plain nn.Module (e.g. FeatureCodec(n_features=...))")
        codec = FeatureCodec(names, n_features=n_features, n_classes=n_classes,
                             mutability=getattr(hp, "mutability", None) if hp is not None else None)
    frame = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows
    if frame.empty:
        raise ValueError("rows: got no rows; allowed: one or more rows with the model's columns")
    columns = _column_names(codec)
    frame, x = _model_rows(frame, codec)
    device = next(classifier.parameters()).device
    x = x.to(device)
    codes, lower, upper, spec = constraint_tensors(codec, x.shape[1], {**trained_mutability(model),
                                                                       **dict(mutability or {})})
    with eval_mode(classifier), torch.no_grad():
        probabilities = torch.softmax(classifier(x), dim=1)
    predicted = probabilities.argmax(1)
    targets = _target_codes(target, codec, predicted.cpu(), probabilities.cpu()).to(device)

    torch.manual_seed(seed)  # a generator's own network (amortised) starts from the seed too
    made = make_generator(generator, lambda_cost, lambda_energy, lr, **(generator_options or {}))
    if getattr(made, "needs_fit", False):
        if x_train is None:
            raise ValueError(f"generator: {generator} learns from the training data; give x_train (or use generic "
                             f"or ecco)")
        context = FitContext(model=classifier, x_train=x_train.to(device).float(),
                             y_train=None if y_train is None else y_train.to(device).long(),
                             n_classes=len(codec.classes), feature_names=list(codec.feature_names),
                             mutability=codes.to(device), lower=lower, upper=upper)
        prepare_standalone(made, context)
    # Categories, binaries and integers stay real values during the search (the codec's structure, or one-hot
    # groups from 'feature=value' names), so the point the search reaches is the row a person would present.
    types = codec.feature_types() if hasattr(codec, "feature_types") else \
        FeatureTypes.from_names(list(codec.feature_names), x.shape[1])
    if steps or max_changes:
        index = codec.feature_names.index
        types = with_steps(types, {index(name): step for name, step in (steps or {}).items()},
                           {index(name): change for name, change in (max_changes or {}).items()})
    ranks = class_ranks(codec, device)  # an ordered outcome: the classes at or above the target count
    accepted = None if ranks is None else accepted_classes(ranks, targets)
    torch.manual_seed(seed)
    with eval_mode(classifier):
        bounds = (None if lower is None else lower.to(device), None if upper is None else upper.to(device))
        if accepted is None:
            result = generate_counterfactuals(made, classifier, x, targets, tau, max_steps, epsilon, codes.to(device),
                                              *bounds, feature_types=types)
        else:
            result = search_at_least(made, classifier, x, targets, ranks, tau, max_steps, epsilon, codes.to(device),
                                     *bounds, feature_types=types)

    def of_target(probabilities: torch.Tensor) -> torch.Tensor:
        """Per row, the target's probability (of an ordered outcome: the classes' at or above it, summed)."""
        if accepted is None:
            return probabilities.gather(1, targets[:, None]).squeeze(1)
        return at_least_probability(probabilities, accepted)

    def reaches(probabilities: torch.Tensor) -> torch.Tensor:
        """Per row, whether the predicted class is the target (of an ordered outcome: at or above it)."""
        return probabilities.argmax(1) == targets if accepted is None else at_least_valid(probabilities, accepted)
    factual_decoded = codec.decode(x.detach().cpu().numpy())
    immutable = [c for c in columns if spec.get(c) == "none"]

    def presented(encoded: torch.Tensor):
        """The rows a person would be shown for ``encoded`` (decoded, immutable columns as given), encoded again, and
        the model's probabilities there."""
        rows = codec.decode(encoded.detach().cpu().numpy())
        for column in immutable:  # the search keeps them; decoding must not move them either
            rows[column] = frame[column].to_numpy()
        again = torch.tensor(np.array(codec.encode(rows[columns]), dtype=np.float32)).to(device)
        with eval_mode(classifier), torch.no_grad():
            return rows, again, torch.softmax(classifier(again), dim=1)

    decoded, x_back, back = presented(result.counterfactual)
    masks = column_masks(list(codec.feature_names), columns) if fewer_changes else None
    if masks is not None:
        with eval_mode(classifier):
            x_back = revert_needless_changes(classifier, x, x_back, targets, of_target(back).clamp(max=tau), masks,
                                             reaches(back), accepted)
        decoded, x_back, back = presented(x_back)
    target_probability = of_target(back).cpu()
    factual_probability = of_target(probabilities).cpu()
    valid = reaches(back).cpu()
    # what the model predicts at the changes shown: where it is not the target, the class they lead to instead (of
    # three, perhaps a better one than asked: an offer, not an interview)
    reached_labels = codec.decode_target(back.argmax(1).cpu().numpy())

    predicted_labels = codec.decode_target(predicted.cpu().numpy())
    # an ordered outcome: the classes that count for each row, lowest first (valid: the changes lead to one of them)
    valid_classes = None if accepted is None else [[_plain(c) for c in codec.order[rank:]]
                                                   for rank in ranks[targets].tolist()]
    target_labels = codec.decode_target(targets.cpu().numpy())
    # the file's currency or percent sign ($36,428.20, 7.5%), shown with the numbers (format_change), its decimal
    # commas (60.800,50 €): a change shown as 60,800 € reads as sixty euros and eighty cents where the file came
    # from, and each column's thousands separator (14 999,01 € in a French file, 1'234.50 in a Swiss one, 24062,39)
    by_name = {c.name: c for c in codec.columns}
    comma = bool(getattr(codec, "decimal_comma", False))
    # a data spec's words (label, unit, values: what a code means) beside the raw names and values
    worded = {c.name: c for c in codec.columns if column_words(c)}
    held_words = [worded[c].heading() if c in worded else c for c in immutable] if worded else None
    records = []
    for i in range(len(frame)):
        factual = {c: _plain(frame.at[i, c]) for c in columns}
        counterfactual = {c: _plain(decoded.at[i, c]) for c in columns}
        changes = [change_of(by_name[c], factual[c], counterfactual[c], comma)
                   for c in columns if not _same(factual_decoded.at[i, c], decoded.at[i, c])]
        classes = class_wording(codec, {"prediction": predicted_labels[i], "target": target_labels[i],
                                        "counterfactual_prediction": reached_labels[i]})
        records.append({"factual": factual, "prediction": _plain(predicted_labels[i]),
                        "prediction_probability": float(probabilities[i, predicted[i]]),
                        "target": _plain(target_labels[i]),
                        "factual_probability": float(factual_probability[i]), "counterfactual": counterfactual,
                        "changes": changes,
                        "probability": float(target_probability[i]), "valid": bool(valid[i]),
                        "counterfactual_prediction": _plain(reached_labels[i]),
                        "converged": bool(result.converged[i]), "immutable": list(immutable),
                        **({} if accepted is None else {"valid_classes": valid_classes[i]}),
                        **classes, **({"immutable_labels": held_words} if held_words else {})})
    extra = [key for key in WORDED if any(key in record for record in records)]
    return pd.DataFrame(records, columns=COLUMNS + ["valid_classes"] * (accepted is not None) + extra)


WORDED = ["prediction_label", "target_label", "counterfactual_prediction_label", "immutable_labels"]  # where declared


def change_of(column, before, after, decimal_comma: bool = False) -> dict:
    """One change of ``column`` as an explanation lists it: ``{feature, from, to}`` in original units, with the file's
    currency or percent sign (``unit``: ``"${}"``), and for a number its ``decimal_comma`` and the column's
    ``thousands`` separator where the file wrote them so (:func:`format_change` shows them), and the data spec's words
    (:func:`change_wording`)."""
    change = {"feature": column.name, "from": before, "to": after}
    if getattr(column, "unit", None):
        change["unit"] = column.unit
    if _is_number(before):
        change.update({"decimal_comma": True} if decimal_comma else {})
        if getattr(column, "thousands", None) is not None:
            change["thousands"] = column.thousands
    return {**change, **(change_wording(column, before, after) if column_words(column) else {})}


def column_words(column) -> bool:
    """Whether a data spec gave ``column`` words (``label``, ``unit`` or ``values``)."""
    return any(getattr(column, key, None) for key in ("label", "unit_label", "value_labels"))


def change_wording(column, before, after) -> dict:
    """The words of one change of ``column`` beside its raw values: ``label``, ``unit_label`` (the data spec's
    ``label`` and ``unit``) and ``from_label``/``to_label`` (what the values mean, its ``values:``), each where
    declared."""
    words = {key: getattr(column, name) for key, name in (("label", "label"), ("unit_label", "unit_label"))
             if getattr(column, name, None)}
    for key, value in (("from_label", before), ("to_label", after)):
        text = column.value_label(value) if getattr(column, "value_labels", None) else None
        if text is not None:
            words[key] = text
    return words


def class_wording(codec, labels: Mapping) -> dict:
    """``{KEY_label: words}`` for each class in ``labels`` (``{"prediction": 1, ...}``) that the data spec's ``target:
    {values: ...}`` words (``prediction_label: default``)."""
    if not getattr(codec, "class_labels", None):
        return {}
    words = {f"{key}_label": codec.class_label(label) for key, label in labels.items()}
    return {key: text for key, text in words.items() if text is not None}


def _significant_digits(value: float) -> int:
    """How many significant digits ``value`` is written with (at most 7): 95.43 → 4, 0.9 → 1."""
    mantissa = f"{abs(value):.7g}".split("e")[0].replace(".", "").lstrip("0")
    return max(1, len(mantissa))


def format_value(value) -> str:
    """A value as a person reads it: ``54,600``, ``0.25``, ``36,428.2``, ``'rent'`` → ``rent``; a fraction with the
    significant digits it is written with (three to six), never fewer than its whole part has."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        whole = len(str(int(abs(value)))) if abs(value) >= 1 else 0
        return f"{value:,.{max(3, min(_significant_digits(value), 6), whole)}g}"
    return str(value)


def _decimals(value: float) -> int:
    """How many decimals ``value`` is written with (at most 7): 95.43 → 2, 36428.2 → 1, 38.0 → 0."""
    text = f"{abs(value):.7g}"
    if "e" in text:
        return 0 if abs(value) >= 1 else 7
    return len(text.split(".")[1]) if "." in text else 0


def _is_number(value) -> bool:
    """Whether ``value`` is a number (not ``True``/``False``, not text)."""
    return isinstance(value, (float, np.floating, int, np.integer)) and not isinstance(value, (bool, np.bool_))


def format_change(before, after, unit: str | None = None, decimal_comma: bool = False,
                  thousands: str | None = None) -> str:
    """``before → after`` as a person reads it: ``after`` with the decimals ``before`` is written with
    (``95.43 → 52.41``, ``18,203.08 → 9,057.99``), more where it would read as ``before`` or as less than two
    significant digits (``0.9 → 0.9001``, not ``0.9 → 0.9``), in the file's ``unit`` where it wrote one (``"${}"``:
    ``$36,428.2 → $54,848.2``; ``"{}%"``), and with ``decimal_comma`` and the column's ``thousands`` separator as
    the file writes numbers (``60.800 € → 54.800 €``, ``41,3 → 77,8``, ``14 999,01 € → 24 062,39 €``;
    :func:`~datamodules.table_format.as_written`)."""
    numbers = all(_is_number(v) for v in (before, after))
    if not numbers:
        return f"{format_value(before)} → {format_value(after)}"
    if any(isinstance(v, (float, np.floating)) for v in (before, after)):
        before, after = float(before), float(after)
        shown_decimals = _decimals(before)
        decimals = shown_decimals
        # fewer than two significant digits would show (a whole number, a count 5.0 → 6 from a column with a gap
        # that pandas read as floats, shows whole: 5 → 6)
        if not after.is_integer() and abs(after) < 10 ** (1 - decimals):
            decimals = min(7, 1 - math.floor(math.log10(abs(after))))
        while decimals < 7 and round(after, decimals) == before != after:
            decimals += 1
        shown = [f"{before:,.{shown_decimals}f}", f"{after:,.{decimals}f}"]
    else:
        shown = [format_value(before), format_value(after)]
    shown = [as_written(text, decimal_comma, thousands) for text in shown]
    if unit:
        shown = [f"-{unit.format(text[1:])}" if text.startswith("-") else unit.format(text) for text in shown]
    return f"{shown[0]} → {shown[1]}"


def change_text(change: dict) -> str:
    """One change as a person reads it: ``income: 31,000 → 38,400`` (``31.000 → 38.400`` where the training file
    wrote decimal commas, ``31 000 → 38 400`` where it wrote thousands so: the change's ``thousands``), marked where
    the value was filled in."""
    filled = " (missing: filled in as in training)" if change.get("filled") else ""
    shown = format_change(change["from"], change["to"], change.get("unit"), change.get("decimal_comma", False),
                          change.get("thousands"))
    return f"{change['feature']}{filled}: {shown}"


def change_words(change: dict) -> str:
    """One change in the words a data spec gives (:func:`change_wording`): ``Repayment status, September: two months
    late → paid on time``, ``Credit limit (NT$): 20,000 → 50,000``; a value without words shown as
    :func:`change_text` shows it. A change without words reads as :func:`change_text`."""
    name, before, after = change_parts(change)
    return f"{name}: {before} → {after}"


def change_parts(change: dict) -> tuple[str, str, str]:
    """A change in the data spec's words as its three parts: the column (``Time in employment (years)``, marked where
    its value was filled in), and the values before and after (``two months late``, ``paid on time``; a value without
    words as :func:`format_change` writes it). An amount of a currency (the spec's ``unit: $``, ``NT$``, ``EUR``:
    :func:`~datamodules.wording.currency_format`) is written as money is, the currency with each number and not
    beside the column (``Yearly income``, ``$37,200``, ``-$300``), in the file's own money format where it wrote one."""
    filled = " (missing: filled in as in training)" if change.get("filled") else ""
    money = currency_format(change.get("unit_label"))
    unit_label = None if money else change.get("unit_label")
    style = (change.get("unit") or money, change.get("decimal_comma", False), change.get("thousands"))
    shown = format_change(change["from"], change["to"], *style).split(" → ")
    if len(shown) != 2:  # a value whose own text holds an arrow: each side apart
        shown = [format_change(change["from"], change["from"], *style).split(" → ")[0],
                 format_change(change["to"], change["to"], *style).split(" → ")[0]]
    before, after = change.get("from_label", shown[0]), change.get("to_label", shown[1])
    return f"{heading(change['feature'], change.get('label'), unit_label)}{filled}", before, after


def shown_change(change: dict) -> str:
    """One change as the console shows it: in words where the data spec gives them, with the raw column and values
    in brackets (``Repayment status, September: two months late → paid on time [PAY_0: 2 → 0]``), else
    :func:`change_text`."""
    if not any(key in change for key in ("label", "unit_label", "from_label", "to_label")):
        return change_text(change)
    raw = format_change(change["from"], change["to"], change.get("unit"), change.get("decimal_comma", False),
                        change.get("thousands"))
    return f"{change_words(change)} [{change['feature']}: {raw}]"


def class_shown(row, key: str) -> str:
    """The class under ``key`` of an explanation (``prediction``, ``target``, ``counterfactual_prediction``) as the
    console shows it: in the data spec's words with the class in brackets (``default [1]``), else as it is."""
    return worded(row.get(key), row.get(f"{key}_label"))


def class_text(codec, label) -> str:
    """The class ``label`` of a model whose preprocessing is ``codec`` as every console line and message shows it:
    in the data spec's words with the class in brackets (``likely to default next month [1]``), else as it is."""
    return worded(label, codec.class_label(label) if getattr(codec, "class_labels", None) else None)


def row_label(row: int, other_columns: Mapping | None = None) -> str:
    """``row 5`` (``row`` as given: explain.py's rows are numbered from 1 when read, ``explanations.read_rows``;
    :func:`explain`'s by position from 0), with the row's columns the model does not read where it has some
    (``row 5 (applicant_id 1005)``), so that an explanation can be told to its applicant; long text cut to 30
    characters, empty cells left out (not ``notes None``)."""
    present = {name: value for name, value in (other_columns or {}).items() if not _missing(value)}
    if not present:
        return f"row {row}"
    shown = []
    for name, value in present.items():
        text = str(value) if isinstance(value, (int, np.integer)) else format_value(value)  # an id, not 1,005
        shown.append(f"{name} {text if len(text) <= 30 else text[:29] + '…'}")
    return f"row {row} ({', '.join(shown)})"


def _missing(value) -> bool:
    """Whether a cell is empty: ``None``, ``NaN`` or ``NaT``."""
    if value is None:
        return True
    return not isinstance(value, str) and np.ndim(value) == 0 and bool(pd.isna(value))


def mark_filled(changes: pd.Series, filled: Mapping) -> None:
    """Mark each change of a value that was filled in (``--impute median``: the applicant gave none) with
    ``"filled": True``; ``changes`` is the explanations' column of changes, ``filled`` ``{row: [columns]}`` by the
    same row keys (a row that was not explained has no changes to mark)."""
    for row, columns in filled.items():
        for change in changes.get(row, ()):
            if change["feature"] in columns:
                change["filled"] = True


def probability_text(probability: float) -> str:
    """A probability as the text shows it: two decimals, three near one half (``0.497``, ``0.503``), where two would
    read ``0.50`` for a row predicted as one class and for its counterfactual of the other alike."""
    return f"{probability:.3f}" if 0.495 <= probability < 0.505 and probability != 0.5 else f"{probability:.2f}"


def describe(explanations: pd.DataFrame) -> str:
    """The explanations as text, one block per row: the prediction, then each change ``feature: from → to``."""
    lines = []
    for i, row in explanations.iterrows():
        label = row_label(i, row.get("other_columns"))
        lines.append(f"{label}: predicted {class_shown(row, 'prediction')} "
                     f"(probability {probability_text(row['prediction_probability'])})")
        wanted, status, is_already, already_text = _outcome_words(row)
        if is_already and row["changes"]:
            # Already the target, below τ (three or more classes): the changes only make the model more certain.
            lines.append(f"  already {already_text}: nothing needs to change; to make it more certain (probability "
                         f"{probability_text(row['factual_probability'])} → {probability_text(row['probability'])}, "
                         f"{status}):")
        else:
            lines.append(f"  to get {wanted} (probability {probability_text(row['probability'])}, {status}):")
        if not row["changes"]:
            already = row["valid"] and is_already
            lines.append(f"    nothing needs to change: already {already_text}" if already else "    no change found")
        for change in row["changes"]:
            lines.append(f"    {shown_change(change)}")
        if row["changes"] and row.get("immutable"):
            held = row.get("immutable_labels")
            held = held if isinstance(held, list) else row["immutable"]  # a data spec's labels where it gives some
            lines.append(f"    (not allowed to change: {', '.join(map(str, held))})")
    return "\n".join(lines)


def _outcome_words(row) -> tuple[str, str, bool, str]:
    """How :func:`describe` names one explanation's outcome: what it asks for (``interview``; of an ordered outcome
    ``at least interview``), its status (``valid``, ``valid: the model predicts offer, at least interview``, ``NOT
    valid: ... predicts rejected, not interview`` or ``..., below interview``), whether the row already has what it
    asks for, and how that reads (``interview``; ``offer, at least interview``)."""
    counted = row.get("valid_classes")
    ordered = isinstance(counted, list)  # an ordered outcome: classes at or above the target count
    reached, target, prediction = (class_shown(row, key) for key in ("counterfactual_prediction", "target",
                                                                     "prediction"))
    raw = {key: row.get(key) for key in ("counterfactual_prediction", "target", "prediction")}
    wanted = f"at least {target}" if ordered else target
    if not row["valid"]:
        status = f"NOT valid: with these changes the model predicts {reached}, " + \
            (f"below {target}" if ordered else f"not {target}")
    else:
        status = f"valid: the model predicts {reached}, {wanted}" if ordered and \
            not _same(raw["counterfactual_prediction"], raw["target"]) else "valid"
    is_already = any(_same(raw["prediction"], c) for c in counted) if ordered else _same(raw["prediction"],
                                                                                          raw["target"])
    already_text = f"{prediction}, {wanted}" if ordered and not _same(raw["prediction"], raw["target"]) else target
    return wanted, status, is_already, already_text


def to_records(explanations: pd.DataFrame) -> list[dict]:
    """The explanations as a JSON-able list, one object per row (with ``valid_classes`` for an ordered outcome, and
    ``other_columns`` where the rows carried columns the model does not read)."""
    keys = COLUMNS + ["valid_classes"] * ("valid_classes" in explanations.columns) + \
        ["other_columns"] * ("other_columns" in explanations.columns) + \
        [key for key in WORDED if key in explanations.columns]
    out = []
    for _, row in explanations.iterrows():
        out.append({key: (_plain(row[key]) if not isinstance(row[key], (dict, list)) else row[key])
                    for key in keys})
    return out
