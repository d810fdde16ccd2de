"""Which constraints hold when a trained model is evaluated: mutability codes, domain and immutable names."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from datamodules.row_bounds import rule_words

from ct_lightning.constraints import (DECREASE, INCREASE, NONE, FeatureTypes, data_mutability, one_hot_features,
                                      one_hot_groups, parse_mutability, resolve_domain, resolve_feature_types)

KIND_WORDS = ((NONE, "immutable"), (INCREASE, "increase only"), (DECREASE, "decrease only"))
NAMES_SHOWN = 8  # an image's protected rows are 140 pixels: name a few, count the rest


@dataclass
class EvaluationConstraints:
    """Mutability codes, domain bounds and the names of immutable features used at evaluation."""

    mutability: torch.Tensor
    lower: torch.Tensor | None
    upper: torch.Tensor | None
    immutable: list[str]
    feature_types: FeatureTypes | None = None  # one-hot groups and integers: counterfactuals stay valid
    feature_names: list[str] = field(default_factory=list)
    # per column, the categorical feature of its one-hot group (None: none); by default guessed from the names
    one_hot: list[str | None] | None = None
    # a table's steps and largest changes in words, one per column (``income in steps of 1000``), from its data spec
    change_limits: list[str] = field(default_factory=list)

    @property
    def protected_mask(self) -> torch.Tensor:
        """Boolean mask of features that may not move at all."""
        return self.mutability == NONE

    def in_words(self) -> str:
        """The constraints in one line, by the names a user gives (a one-hot group once, by its column), with a
        table's steps and largest changes as its start-up lines say them: ``immutable: age; increase only: income;
        income in steps of 1000; grade changing by at most 2 places; within the data domain``."""
        codes = self.mutability.tolist()
        names = self.feature_names or [str(i) for i in range(len(codes))]
        one_hot = self.one_hot if self.one_hot is not None else one_hot_features(names, None, len(codes))
        parts = [f"{word}: {_listed(_columns(names, codes, code, one_hot))}" for code, word in KIND_WORDS
                 if code in codes]
        parts = parts or ["every feature mutable"]
        return "; ".join([*parts, *self.change_limits,
                          "within the data domain" if self.lower is not None else "no domain bounds"])


def _columns(names: list[str], codes: list[int], code: int, one_hot: list[str | None]) -> list[str]:
    """The features of kind ``code``; a one-hot group (``one_hot``: per column, its categorical feature) by its column
    where all of its columns have that kind."""
    shown = []
    for name, kind, group in zip(names, codes, one_hot):
        whole = group is not None and all(k == code for k, g in zip(codes, one_hot) if g == group)
        label = group if whole else name
        if kind == code and label not in shown:
            shown.append(label)
    return shown


def _listed(names: list[str]) -> str:
    if len(names) <= NAMES_SHOWN:
        return ", ".join(names)
    return f"{', '.join(names[:NAMES_SHOWN])}, ... ({len(names)} features)"


def evaluation_constraints(module, datamodule, protect: bool = False,
                           all_mutable: bool = False) -> EvaluationConstraints:
    """Constraints for evaluating ``module`` on ``datamodule``.

    The data's own mutability (a table's data spec, :func:`~ct_lightning.constraints.data_mutability`) always
    holds, as it does in training. By default the model's own training constraints (``hparams.mutability``:
    ``--immutable``, ``--mutability``, ``--protect``) hold at test time too; ``protect`` makes the data set's
    protected features immutable in addition; ``all_mutable`` drops the training constraints beyond the data's
    own. The domain follows ``hparams.domain``.
    """
    hp = module.hparams
    names = list(datamodule.feature_names)
    spec = data_mutability(datamodule)
    if not all_mutable and hp.get("mutability"):
        spec.update(dict(hp.mutability))  # as trained: a --mutability given in training may widen the spec's
    if protect:
        spec.update({feature: "none" for feature in datamodule.protected})
    groups = one_hot_groups(datamodule)  # a table's real one-hot groups: a column `ratio=debt/income` is no category
    codes = parse_mutability(spec or None, datamodule.n_features, names, groups=groups)
    lower, upper = resolve_domain(hp.get("domain", "infer"), datamodule.x_train, hp.get("domain_std", 3.0), datamodule)
    immutable = [names[i] if i < len(names) else str(i) for i in torch.nonzero(codes == NONE).flatten().tolist()]
    types = resolve_feature_types(datamodule, names, datamodule.n_features)
    return EvaluationConstraints(codes, lower, upper, immutable, types, names,
                                 one_hot_features(names, groups, datamodule.n_features), change_limits(datamodule))


def change_limits(datamodule) -> list[str]:
    """A table's steps, largest changes and bounds read from other columns in words, one per column that has some
    (``income in steps of 1000, changing by at most 10000``; an ordinal column's in places of its order;
    ``years_employed at most age − 16``), as its codec's start-up lines say them; ``[]`` for data without a codec."""
    columns = getattr(getattr(datamodule, "codec", None), "columns", None) or ()
    said = [(column.name, ", ".join(filter(None, [column.change_text(), rule_words(column).removeprefix(", ")])))
            for column in columns if callable(getattr(column, "change_text", None))]
    return [f"{name} {text}" for name, text in said if text]
