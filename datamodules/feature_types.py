"""Feature types: which columns form one categorical feature (a one-hot group) and which are integers.

A plain description (column indices and the original units) that data modules fill and the core's searches use
(``ct_lightning.constraints.Constraints.snap``) without knowing pandas or any codec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from datamodules.suggest import name_hint


def one_hot_prefix(name) -> str | None:
    """The categorical feature a ``feature=value`` column belongs to (``None`` for other names), guessed from the
    name alone: the fallback where no structure is known (:func:`one_hot_features`). A table's own column may hold
    ``=`` in its name (``ratio=debt/income``) without being a category: where a codec knows the columns, ask it
    (:func:`one_hot_groups`)."""
    name = str(name)
    return name.split("=", 1)[0] if "=" in name else None


def one_hot_groups(source) -> dict[str, list[int]] | None:
    """The real one-hot groups ``{categorical column: its model-input indices}`` of a table codec (a
    ``datamodules.codec.TabularCodec``: its ``columns`` and their ``encoded_names``), or of a data module holding
    one (``.codec``); ``None`` where no such structure is known (a data set without a codec, a codec of model inputs
    only), so that callers fall back to the ``feature=value`` names (:func:`one_hot_prefix`)."""
    codec = getattr(source, "codec", None) if source is not None and not hasattr(source, "columns") else source
    columns = getattr(codec, "columns", None)
    # a codec that knows its structure describes it (feature_types); one of bare model inputs does not
    if columns is None or not callable(getattr(codec, "feature_types", None)):
        return None
    groups, start = {}, 0
    for column in columns:
        encoded = getattr(column, "encoded_names", None)
        if encoded is None:
            return None
        if getattr(column, "kind", None) == "categorical":
            groups[str(column.name)] = list(range(start, start + len(encoded)))
        start += len(encoded)
    return groups


def one_hot_features(feature_names: Sequence[str] | None, groups: Mapping[str, Sequence[int]] | None = None,
                     n_features: int | None = None) -> list[str | None]:
    """Per column, the categorical feature whose one-hot group it belongs to, else ``None``: from the real
    ``groups`` (:func:`one_hot_groups`) where known, else guessed from ``feature=value`` names
    (:func:`one_hot_prefix`; Adult's ``workclass=Private``, Credit's ``sex=1``)."""
    names = [str(n) for n in (feature_names or [])]
    n_features = len(names) if n_features is None else int(n_features)
    if groups is None:
        return [one_hot_prefix(name) for name in names] + [None] * (n_features - len(names))
    if any(not 0 <= int(column) < n_features for columns in groups.values() for column in columns):
        return one_hot_features(names, None, n_features)  # a structure of other features: not these columns'
    features: list[str | None] = [None] * n_features
    for feature, columns in groups.items():
        for column in columns:
            features[int(column)] = str(feature)
    return features


@dataclass(frozen=True)
class RowBound:
    """A bound of one feature that other features give per row, in raw units: ``raw[column] <= constant +
    Σ coefficient · raw[feature]`` (``side`` ``"upper"``; ``>=`` for ``"lower"``) over ``terms`` ``((feature,
    coefficient), ...)``; ``text`` names it in messages (``experience <= age - 16``)."""

    column: int
    side: str
    terms: tuple[tuple[int, float], ...]
    constant: float = 0.0
    text: str = ""


@dataclass
class FeatureTypes:
    """Which columns are categorical (one-hot groups) and which are integers, for valid counterfactuals.

    ``groups``: per categorical feature, the column indices of its one-hot encoding (a group of one
    column is a 0/1 binary feature). ``integers``: indices of integer features. ``offset`` and
    ``scale`` (per feature, optional) give original units as ``raw = x * scale + offset``: a one-hot
    column is 1 ("on") at ``(1 - offset) / scale`` and 0 at ``-offset / scale``, and an integer feature
    lies on the grid of whole numbers in raw units. ``steps`` (``{column: step in raw units}``): features that
    change only by whole multiples of their step from the factual's own value (a data spec's ``step: 1000``).
    ``reach`` (``{column: largest change in raw units}``): features that move at most that far from the factual's
    value, either way (a data spec's ``max_change: 10000``). ``row_bounds`` (:class:`RowBound`): bounds that other
    features give per row (a data spec's ``upper: age - 16``), applied in their order.
    ``names`` (optional) are for messages.
    """

    n_features: int
    groups: list[list[int]] = field(default_factory=list)
    integers: list[int] = field(default_factory=list)
    offset: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    names: list[str] | None = None
    steps: dict[int, float] = field(default_factory=dict)
    reach: dict[int, float] = field(default_factory=dict)
    row_bounds: list[RowBound] = field(default_factory=list)

    def __post_init__(self):
        self.groups = [[int(c) for c in group] for group in self.groups if len(group)]
        self.integers = [int(c) for c in self.integers]
        self.steps = {int(c): float(step) for c, step in self.steps.items()}
        columns = [c for group in self.groups for c in group] + self.integers + list(self.steps)
        if any(not 0 <= c < self.n_features for c in columns):
            raise ValueError(f"feature types: a column index is out of range for {self.n_features} features")
        if len(set(columns)) != len(columns):
            raise ValueError("feature types: a column belongs to two one-hot groups or has two of the kinds "
                             "categorical, integer and stepped")
        if any(not step > 0 or step == float("inf") for step in self.steps.values()):
            raise ValueError("feature types: every step must be a positive finite number")
        self.reach = {int(c): float(change) for c, change in self.reach.items()}
        if any(not 0 <= c < self.n_features for c in self.reach) or \
                any(c in group for group in self.groups for c in self.reach):
            raise ValueError("feature types: a largest change needs a number feature's column")
        if any(not change >= 0 for change in self.reach.values()):
            raise ValueError("feature types: every largest change must be a number of at least 0")
        self.row_bounds = list(self.row_bounds)
        grouped = {c for group in self.groups for c in group}
        for rule in self.row_bounds:
            read = [c for c, _ in rule.terms]
            if rule.side not in ("lower", "upper") or any(not 0 <= c < self.n_features or c in grouped
                                                          for c in [rule.column, *read]) or rule.column in read:
                raise ValueError(f"feature types: the row bound {rule.text or rule} needs number features' columns "
                                 "other than its own and a side lower or upper")
        for name in ("offset", "scale"):
            value = getattr(self, name)
            if value is not None:
                value = torch.as_tensor(value, dtype=torch.float32).flatten()
                if len(value) != self.n_features:
                    raise ValueError(f"feature types: {name} needs {self.n_features} values, got {len(value)}")
                setattr(self, name, value)
        if self.scale is not None and bool((self.scale <= 0).any()):
            raise ValueError("feature types: every scale must be positive")

    @classmethod
    def from_names(cls, feature_names: Sequence[str] | None, n_features: int | None = None,
                   integer_features: Sequence[str] = (), offset=None, scale=None) -> "FeatureTypes":
        """One-hot groups from ``feature=value`` names (columns sharing the prefix before ``=``), integer
        features by name (a categorical name is refused), and the raw-unit ``offset``/``scale``."""
        names = [str(n) for n in (feature_names or [])]
        n_features = len(names) if n_features is None else int(n_features)
        groups: dict[str, list[int]] = {}
        for index, name in enumerate(names):
            prefix = one_hot_prefix(name)
            if prefix is not None:
                groups.setdefault(prefix, []).append(index)
        integers = []
        for name in integer_features:
            if name not in names:
                raise ValueError(f"integer_features: unknown feature {name!r}{name_hint(name, names)}; known: {', '.join(names[:30])}")
            if one_hot_prefix(name) is not None:
                raise ValueError(f"integer_features: {name!r} is a one-hot column, not an integer feature")
            integers.append(names.index(name))
        return cls(n_features, list(groups.values()), integers, offset, scale, names or None)

    @property
    def empty(self) -> bool:
        """No categorical, integer, stepped, reach-limited or row-bounded features: every point is valid."""
        return not self.groups and not self.integers and not self.steps and not self.reach and not self.row_bounds

    def raw_units(self, columns: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(offset, scale)`` of ``columns`` (0 and 1 where none were given)."""
        index = torch.tensor(columns, dtype=torch.long)
        offset = torch.zeros(len(columns)) if self.offset is None else self.offset[index]
        scale = torch.ones(len(columns)) if self.scale is None else self.scale[index]
        return offset, scale
