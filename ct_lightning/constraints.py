"""Actionability constraints: per-feature mutability, domain bounds and feature types.

Mutability follows the CARLA/DiCE vocabulary: ``both`` (default), ``increase``,
``decrease`` and ``none``. Internally a constraint set is a tensor of integer
codes, one per feature, so that every operation on it is vectorised.

Feature types (:class:`FeatureTypes`) say which columns form one categorical feature (a one-hot
group), which are integers in original units and which change only in whole steps; :meth:`Constraints.snap`
maps any point to the nearest valid one (one category per group, integers on their grid, stepped features a whole
number of steps from the factual) for all rows at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from datamodules.domain import infer_domain  # noqa: F401  (re-exported: the SPEC §2 formula lives with the data)
# re-exported: data modules describe their types
from datamodules.feature_types import FeatureTypes, one_hot_features, one_hot_groups, one_hot_prefix  # noqa: F401

# re-exported: the kinds and the names of features as a user gives them, in plain Python for the recipes' checks
from ct_lightning.feature_names import MUTABILITY_KINDS, mutability_pairs, unknown_feature_error  # noqa: F401

STEP_SLACK = 1e-4  # of a step: float32 rounding that may not cost a stepped feature the step onto its bound

BOTH, INCREASE, DECREASE, NONE = range(4)


def _resolve_feature(key, feature_names: Sequence[str] | None, n_features: int, argument: str,
                     one_hot: Sequence[str | None] | None = None) -> list[int]:
    """Map a feature name, a one-hot group (its categorical feature) or an index to column indices. ``one_hot``: per
    column, the categorical feature it belongs to, from the real groups (:func:`one_hot_features`); without it a
    group is the columns named ``feature=...``."""
    if isinstance(key, int) or (isinstance(key, str) and key.lstrip("-").isdigit() and
                                (feature_names is None or key not in feature_names)):
        index = int(key)
        if not -n_features <= index < n_features:
            raise ValueError(f"{argument}: feature index {index} is out of range for {n_features} features")
        return [index % n_features]
    names = list(feature_names or [])
    if key in names:
        return [names.index(key)]
    # A categorical feature one-hot encoded as `feature=value` columns is named by its column.
    if one_hot is not None:
        group = [i for i, feature in enumerate(one_hot) if feature is not None and feature == key]
    else:
        group = [i for i, name in enumerate(names) if name.startswith(f"{key}=")]
        one_hot = one_hot_features(names, None, n_features)
    if group:
        return group
    # the features by the names a user gives: a one-hot group once, by its column ("purpose", not "purpose=car")
    features = list(dict.fromkeys(feature if feature is not None else name for name, feature in zip(names, one_hot)))
    raise unknown_feature_error(argument, key, features)


def parse_mutability(spec, n_features: int, feature_names: Sequence[str] | None = None,
                     argument: str = "mutability", groups: Mapping[str, Sequence[int]] | None = None) -> torch.Tensor:
    """Turn a mutability spec into a tensor of codes (0 both, 1 increase, 2 decrease, 3 none).

    ``spec`` may be ``None`` (all ``both``), a mapping ``{feature: kind}`` with features named
    by name, one-hot group prefix or index, a sequence of ``n_features`` kinds, or a string
    ``"age=none,hours_per_week=increase"`` (split at each item's last ``=``: a column may hold ``=`` in its name).

    ``groups``: the real one-hot groups ``{categorical feature: column indices}`` where known (a table codec's,
    :func:`one_hot_groups`); without them a ``feature=value`` name is taken for a one-hot column
    (:func:`one_hot_prefix`), so a continuous column named ``ratio=debt/income`` needs them to be ``increase`` or
    ``decrease``.
    """
    codes = torch.zeros(n_features, dtype=torch.long)
    if spec is None or spec == "" or spec == {}:
        return codes
    if isinstance(spec, str):
        spec = mutability_pairs(spec, argument)
    if isinstance(spec, Mapping):
        items = spec.items()
    else:
        spec = list(spec)
        if len(spec) != n_features:
            raise ValueError(f"{argument}: a list spec needs one kind per feature ({n_features}), got {len(spec)}")
        items = enumerate(spec)
    # the real groups where given for these columns, else the guess from `feature=value` names
    known = groups is not None and all(0 <= int(c) < n_features for columns in groups.values() for c in columns)
    one_hot = one_hot_features(feature_names, groups if known else None, n_features) \
        if feature_names is not None or known else None
    for key, kind in items:
        if kind not in MUTABILITY_KINDS:
            raise ValueError(f"{argument}: unknown kind {kind!r} for feature {key!r}; "
                             f"allowed: {', '.join(MUTABILITY_KINDS)}")
        indices = _resolve_feature(key, feature_names, n_features, argument, one_hot if known else None)
        if kind in ("increase", "decrease") and one_hot is not None and any(one_hot[i] is not None for i in indices):
            raise ValueError(f"{argument}: {key!r} is categorical (one-hot columns), so {kind!r} has no meaning; "
                             "allowed for a categorical feature: both, none")
        for index in indices:
            codes[index] = MUTABILITY_KINDS.index(kind)
    return codes


def data_mutability(datamodule) -> dict[str, str]:
    """The data's own ``{feature: kind}``: facts about the data (a table's data spec: an applicant cannot get
    younger) that hold in training and in every evaluation, whatever a recipe protects on top; ``{}`` for data
    without any (the built-in sets, whose protected features are a choice of the experiment)."""
    return dict(getattr(getattr(datamodule, "codec", None), "mutability", dict)())


def invalid_rows(types: FeatureTypes, x: torch.Tensor, atol: float = 1e-4) -> torch.Tensor:
    """Per row of ``x``: some one-hot group is not exactly one category, or an integer feature is off its grid."""
    limits = Constraints(None, types=types, device=x.device)
    return ((limits.snap(x, x) - x).abs() > atol).any(1)


class Constraints:
    """Mutability codes and domain bounds resolved once, for repeated use inside a search.

    The per-kind feature masks are built once (one host sync) and kinds that no feature uses are
    left out, so a search step pays only for the constraints it has.
    """

    def __init__(self, codes: torch.Tensor | None, lower: torch.Tensor | None = None,
                 upper: torch.Tensor | None = None, device=None, types: FeatureTypes | None = None):
        self.lower, self.upper = lower, upper
        self.none = self.increase = self.decrease = None
        if codes is not None:
            codes = codes.to(device) if device is not None else codes
            present = set(torch.unique(codes).tolist())
            self.none = codes == NONE if NONE in present else None
            self.increase = codes == INCREASE if INCREASE in present else None
            self.decrease = codes == DECREASE if DECREASE in present else None
        self.types = None if types is None or types.empty else types
        self.snaps = self.types is not None  # whether snap() changes anything
        if self.snaps:
            self._set_up_snap(self.types, codes, device if device is not None else
                              (codes.device if codes is not None else None))

    def _set_up_snap(self, types: FeatureTypes, codes: torch.Tensor | None, device) -> None:
        """The index and value tensors :meth:`snap` needs, built once (the loop over groups runs here only)."""
        columns = [c for group in types.groups for c in group]
        if codes is not None and columns:
            monotone = codes.cpu()[torch.tensor(columns)]
            if bool(((monotone == INCREASE) | (monotone == DECREASE)).any()):
                raise ValueError("mutability: a categorical feature (one-hot group) cannot be 'increase' or "
                                 "'decrease'; allowed: both, none")
        # Groups of similar width side by side in a padded (groups × width) index, so that one arg-max over the last
        # axis picks every group's category of that width class at once (the first on ties); padding points at an
        # extra column of -inf. Width classes (powers of two) keep the padding small: Adult's 8 groups take 113
        # padded values per row instead of 8 × 42. One-column groups are 0/1 features: on from a share of 0.5.
        n_features = types.n_features
        self.n_groups = len(types.groups)
        classes: dict[int, list[list[int]]] = {}
        for group in types.groups:
            classes.setdefault(0 if len(group) == 1 else (len(group) - 1).bit_length(), []).append(group)
        self.cat_classes = []  # (binary?, padded index (groups × width), its flat view, row index of the groups)
        for key in sorted(classes):
            groups = classes[key]
            width = max(len(group) for group in groups)
            padded = torch.full((len(groups), width), n_features, dtype=torch.long)
            for g, group in enumerate(groups):
                padded[g, :len(group)] = torch.tensor(group)
            self.cat_classes.append((key == 0, padded.to(device), padded.flatten().to(device),
                                     torch.arange(len(groups), device=device)))
        offset, scale = types.raw_units(list(range(n_features)))
        off, on = (0.0 - offset) / scale, (1.0 - offset) / scale
        categorical = torch.zeros(n_features, dtype=torch.bool)
        categorical[columns] = True
        self.cat_unit = bool((off[categorical] == 0).all() and (on[categorical] == 1).all())  # 0/1 in model units
        # share = (x − off) / (on − off) on categorical columns (x elsewhere), with the padding column appended.
        self.cat_share_shift = torch.cat([torch.where(categorical, off, 0.0), torch.zeros(1)]).to(device)
        self.cat_share_width = torch.cat([torch.where(categorical, on - off, 1.0), torch.ones(1)]).to(device)
        self.cat_keep = (~categorical).float().to(device)  # zero the categorical columns, then set "off" and "on"
        self.cat_off_row = torch.where(categorical, off, 0.0).to(device)
        self.cat_off, self.cat_on = torch.cat([off, off[:1]]).to(device), torch.cat([on, on[:1]]).to(device)
        self.int_columns = torch.tensor(types.integers, dtype=torch.long, device=device)
        offset, scale = types.raw_units(types.integers)
        self.int_offset, self.int_scale = offset.to(device), scale.to(device)
        self.int_low = self.int_high = None
        if types.integers and self.lower is not None and self.upper is not None:
            # Whole numbers inside the domain: rounding never leaves it.
            index = self.int_columns.to(self.lower.device)
            low = _whole_inside(self.lower[index].float().cpu() * scale + offset, offset, up=True)
            high = _whole_inside(self.upper[index].float().cpu() * scale + offset, offset, up=False)
            self.int_low, self.int_high = low.to(device), torch.maximum(low, high).to(device)
        # Stepped features: the point moves from the factual by whole steps (model units: step / scale).
        stepped = sorted(types.steps)
        self.step_columns = torch.tensor(stepped, dtype=torch.long, device=device)
        _, scale = types.raw_units(stepped)
        self.step_width = (torch.tensor([types.steps[c] for c in stepped]) / scale).to(device)
        self.step_low = self.step_high = None
        if stepped and self.lower is not None and self.upper is not None:
            index = self.step_columns.to(self.lower.device)
            self.step_low, self.step_high = self.lower[index].to(device), self.upper[index].to(device)
        # Reach: how far each feature may move from the factual (model units; inf where it is not limited).
        self.reach = None
        if types.reach:
            _, scale = types.raw_units(list(range(n_features)))
            reach = torch.full((n_features,), math.inf)
            whole = set(types.integers)  # an integer feature moves whole numbers only: its reach is one too
            for column, change in types.reach.items():
                reach[column] = (math.floor(change + STEP_SLACK) if column in whole else change) / scale[column]
            self.reach = reach.to(device)
            # whole steps only: a stepped feature goes as many whole steps as its reach holds
            self.step_reach = (reach[stepped] / self.step_width.cpu()).add(STEP_SLACK).floor().to(device)
        self.rules = [_RowRule(rule, types, device) for rule in types.row_bounds]

    def mask_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """Zero gradient components that would move a feature the forbidden way.

        A descent step is ``x - lr * grad``: a positive gradient decreases the feature,
        a negative one increases it.
        """
        forbidden = self.none
        if self.increase is not None:
            rule = self.increase & (grad > 0)
            forbidden = rule if forbidden is None else forbidden | rule
        if self.decrease is not None:
            rule = self.decrease & (grad < 0)
            forbidden = rule if forbidden is None else forbidden | rule
        return grad if forbidden is None else grad.masked_fill(forbidden, 0.0)

    def project(self, x_cf: torch.Tensor, x: torch.Tensor, in_place: bool = False) -> torch.Tensor:
        """Project ``x_cf`` onto the domain, then restore mutability exactly.

        Mutability wins over the domain: a factual outside the domain keeps its own value of a
        feature that may not move, and ``none`` features are copied bit for bit from ``x``.
        ``in_place`` clamps ``x_cf``'s own buffer (for callers that own it).
        """
        if self.lower is not None or self.upper is not None:
            x_cf = x_cf.clamp_(self.lower, self.upper) if in_place else x_cf.clamp(self.lower, self.upper)
        return self._keep_mutability(x_cf, x)

    def snap(self, points: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The nearest valid points: per one-hot group the column with the largest value (in 0/1 units; the
        first on ties) is "on" and the others "off", a one-column group is on from 0.5, integer features are
        rounded in original units (to whole numbers inside the domain), stepped features moved a whole number of
        steps from ``x`` (inside the domain), features with a reach kept within it of ``x``; then mutability is restored
        from ``x``; then each row bound (a data spec's ``upper: age - 16``) holds, read from the point's values in
        raw units, an integer or stepped feature kept whole or on its steps on the bound's inner side; where a row
        bound and the domain or reach disagree the bound wins, and mutability wins over both. All rows and groups at
        once (one arg-max per width class of groups, one pass per row bound). ``points`` itself without types."""
        if not self.snaps:
            return points
        out = points
        if self.n_groups:
            n = len(points)
            extended = torch.cat([points, points.new_full((n, 1), -math.inf)], 1)
            if not self.cat_unit:
                extended = (extended - self.cat_share_shift) / self.cat_share_width
            chosen, values = [], []
            for binary, padded, flat, rows in self.cat_classes:  # a few width classes, not one pass per group
                share = extended.index_select(1, flat).view(n, len(rows), -1)
                if binary:
                    column = padded[:, 0].expand(n, -1)
                    value = torch.where(share[:, :, 0] >= 0.5, self.cat_on[column], self.cat_off[column])
                else:
                    column = padded[rows, share.argmax(2)]  # (rows, groups): the column that is on
                    value = self.cat_on[column]
                chosen.append(column)
                values.append(value)
            chosen, values = torch.cat(chosen, 1), torch.cat(values, 1)
            out = out * self.cat_keep if self.cat_unit else torch.addcmul(self.cat_off_row, out, self.cat_keep)
            out = out.to(points.dtype).scatter_(1, chosen, values.to(points.dtype))
        if len(self.int_columns):
            raw = (points.index_select(1, self.int_columns) * self.int_scale + self.int_offset).round()
            if self.int_low is not None:
                raw = torch.minimum(torch.maximum(raw, self.int_low), self.int_high)
            out = out.index_copy(1, self.int_columns, ((raw - self.int_offset) / self.int_scale).to(points.dtype))
        if len(self.step_columns):
            out = out.index_copy(1, self.step_columns, self._whole_steps(points, x).to(points.dtype))
        if self.reach is not None:
            out = torch.minimum(torch.maximum(out, x - self.reach), x + self.reach)
        out = self._keep_mutability(out, x)
        if self.rules:
            out = out.clone() if out is points else out  # a fresh tensor from here on: its columns are set in place
        for rule in self.rules:  # after mutability: a bound reads an immutable column's own value
            out[:, rule.column] = self._keep_mutability(rule.apply(out, x), x, rule.column)
        return out

    def _keep_mutability(self, values: torch.Tensor, x: torch.Tensor, column: int | None = None) -> torch.Tensor:
        """``values`` with mutability restored from the factuals ``x``: a ``none`` feature keeps ``x``'s value, an
        ``increase`` one no less and a ``decrease`` one no more. ``values`` are all features ``(n, d)`` or, with
        ``column``, that one feature's ``(n,)``; :meth:`project`, :meth:`snap` and each row bound use this one rule."""
        index = slice(None) if column is None else column
        start = x[:, index]
        if self.increase is not None:
            values = torch.where(self.increase[..., index], torch.maximum(values, start), values)
        if self.decrease is not None:
            values = torch.where(self.decrease[..., index], torch.minimum(values, start), values)
        if self.none is not None:
            values = torch.where(self.none[..., index], start, values)
        return values

    def _whole_steps(self, points: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The stepped features of ``points`` moved to the nearest whole number of steps from the factuals ``x``,
        and no further than the domain allows in whole steps (a factual whose domain holds no step away from it
        keeps its value)."""
        start = x.index_select(1, self.step_columns)
        steps = ((points.index_select(1, self.step_columns) - start) / self.step_width).round()
        if self.step_low is not None:
            # a bound exactly a whole number of steps away is reachable despite float32 rounding
            fewest = ((self.step_low - start) / self.step_width - STEP_SLACK).ceil()
            most = ((self.step_high - start) / self.step_width + STEP_SLACK).floor()
            steps = torch.where(fewest <= most, torch.minimum(torch.maximum(steps, fewest), most), 0.0)
        if self.reach is not None:
            steps = torch.minimum(torch.maximum(steps, -self.step_reach), self.step_reach)
        return start + steps * self.step_width

    def step(self, rows: torch.Tensor, grad: torch.Tensor, lr: float, x: torch.Tensor,
             reuse_gradient: bool = False) -> torch.Tensor:
        """One constrained SGD step ``project(rows - lr * mask_gradient(grad), x)``, in a fresh buffer or, with
        ``reuse_gradient`` (for callers that own ``grad`` and need it no more), in ``grad``'s: the step's
        passes then write into memory that is already in use rather than into a new pool-sized block."""
        masked = self.mask_gradient(grad)
        moved = masked.mul_(lr) if reuse_gradient or masked is not grad else torch.mul(masked, lr)
        moved = torch.sub(rows, moved, out=moved)
        return self.project(moved, x, in_place=True)


class _RowRule:
    """One :class:`~datamodules.feature_types.RowBound` as the tensors :meth:`Constraints.snap` applies: the bound
    ``constant + points[:, read] · weights`` in raw units (weights and constant folded with the features' offset and
    scale), the feature's own offset and scale, and how it stays valid (whole numbers, whole steps from the factual
    or any value)."""

    def __init__(self, rule, types: FeatureTypes, device):
        read = [c for c, _ in rule.terms]
        coefficients = torch.tensor([c for _, c in rule.terms], dtype=torch.float64)
        offset, scale = (v.double() for v in types.raw_units(read))
        self.column, self.upper = rule.column, rule.side == "upper"
        self.read = torch.tensor(read, dtype=torch.long, device=device)
        self.weights = (coefficients * scale).to(device)  # raw bound = constant + Σ weight · model input
        self.constant = float(rule.constant + (coefficients * offset).sum())
        # raw-unit noise of the bound (float32 inputs): ~1e-7 of each term's size; a whole bound stays whole
        self.size_weights, self.size_offset = (coefficients.abs() * scale).to(device), (offset / scale).to(device)
        self.size = abs(rule.constant) + 1.0
        own_offset, own_scale = types.raw_units([rule.column])
        self.offset, self.scale = float(own_offset[0]), float(own_scale[0])
        self.whole = rule.column in types.integers
        self.step = types.steps[rule.column] / self.scale if rule.column in types.steps else None

    def apply(self, points: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The feature's values ``(n,)`` kept to the bound: unchanged where they keep it, else the bound itself,
        the nearest whole number or whole number of steps from ``x`` on its inner side."""
        dtype = torch.float32 if points.device.type == "mps" else torch.float64  # MPS has no float64
        read = points.index_select(1, self.read).to(dtype)
        bound = read @ self.weights.to(dtype) + self.constant  # raw units, (n,)
        value = points[:, self.column].to(dtype)
        if self.whole:
            slack = 1e-6 * ((read + self.size_offset.to(dtype)).abs() @ self.size_weights.to(dtype) + self.size)
            nearest = bound.round()
            inner = bound.floor() if self.upper else bound.ceil()
            bound = torch.where((bound - nearest).abs() <= slack, nearest, inner)
        limit = (bound - self.offset) / self.scale  # model units
        if self.step is not None:
            start = x[:, self.column].to(dtype)
            steps = (limit - start) / self.step
            steps = (steps + STEP_SLACK).floor() if self.upper else (steps - STEP_SLACK).ceil()
            limit = start + steps * self.step
        broken = value > limit if self.upper else value < limit
        return torch.where(broken, limit, value).to(points.dtype)


def mask_gradient(grad: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Zero gradient components that would move a feature the forbidden way (see :class:`Constraints`)."""
    return Constraints(codes).mask_gradient(grad)


def enforce(x_cf: torch.Tensor, x: torch.Tensor, codes: torch.Tensor,
            lower: torch.Tensor | None = None, upper: torch.Tensor | None = None) -> torch.Tensor:
    """Project ``x_cf`` onto the domain ``[lower, upper]``, then restore mutability exactly."""
    return Constraints(codes, lower, upper).project(x_cf, x)


def protect_positive(x_pos: torch.Tensor, x_cf: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Sec. 3.4: set ``x⁺[d] := x'[d]`` where moving ``x'[d]`` towards ``x⁺[d]`` is not allowed.

    Per feature: ``none → x'``, ``increase → max(x', x⁺)``, ``decrease → min(x', x⁺)``,
    ``both → x⁺``. Only the kinds some feature has cost a pass over the rows; with every feature
    ``both`` the result is ``x_pos`` itself.
    """
    kinds = Constraints(codes)  # the masks of the kinds present, as a search uses them
    out = x_pos
    if kinds.none is not None:
        out = torch.where(kinds.none, x_cf, out)
    if kinds.increase is not None:
        out = torch.where(kinds.increase, torch.maximum(x_cf, x_pos), out)
    if kinds.decrease is not None:
        out = torch.where(kinds.decrease, torch.minimum(x_cf, x_pos), out)
    return out


def resolve_feature_types(datamodule, feature_names: Sequence[str] | None, n_features: int) -> FeatureTypes:
    """The data module's :meth:`feature_types` when it has one for these features, else one-hot groups from the
    ``feature=value`` names (no integers)."""
    describe = getattr(datamodule, "feature_types", None)
    if callable(describe):
        types = describe()
        if types is not None and types.n_features == n_features:
            return types
    return FeatureTypes.from_names(feature_names, n_features)


def resolve_domain(domain, x_train: torch.Tensor, n_std: float = 3.0,
                   datamodule=None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Domain bounds from a ``domain`` setting: ``None`` (unbounded), ``"infer"`` or ``[lower, upper]``.

    ``"infer"`` asks ``datamodule.domain(n_std)`` when a datamodule with one is given (it knows fixed
    ranges such as image pixels), else infers the SPEC §2 bounds from ``x_train``. Scalar or
    per-feature ``[lower, upper]`` values are expanded to one bound per feature.
    """
    if domain is None:
        return None, None
    if isinstance(domain, str):
        if domain != "infer":
            raise ValueError(f"domain: allowed 'infer', None or [lower, upper], got {domain!r}")
        if datamodule is not None and hasattr(datamodule, "domain"):
            return datamodule.domain(n_std)
        return infer_domain(x_train, n_std)
    n_features = x_train.shape[1]
    lower, upper = (torch.as_tensor(b, dtype=torch.float32).expand(n_features) for b in domain)
    return lower, upper


def _whole_inside(bound: torch.Tensor, offset: torch.Tensor, up: bool) -> torch.Tensor:
    """The whole number nearest to a domain ``bound`` (original units) on its inner side. A bound that is a whole
    number up to the rounding of its float32 encoding (a lower bound of 0 encoded, then decoded to 0.0004 for a
    column with mean 5 000) is that number: ceil/floor alone would forbid 0 itself."""
    bound = bound.double()
    nearest = bound.round()
    # decoding x·scale + mean from float32 is off by ~1e-7 of |bound − mean|; allow ten times that
    slack = 1e-6 * ((bound - offset.double()).abs() + offset.double().abs() + 1.0)
    inner = bound.ceil() if up else bound.floor()
    return torch.where((bound - nearest).abs() <= slack, nearest, inner).float()

