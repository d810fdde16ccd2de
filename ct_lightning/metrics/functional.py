"""Functional forms of the CT evaluation metrics (SPEC §3; paper Eq. 5-7).

All functions are pure torch and vectorised over samples. Inputs with more than
two dimensions (e.g. images) are flattened to ``(N, features)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor, nn

from ct_lightning.attacks import Domain, adversarial_examples
from ct_lightning.training.eval_mode import eval_mode


def _flat(x: Tensor) -> Tensor:
    """View ``x`` as ``(N, features)``."""
    return x.reshape(x.shape[0], -1)


def implausibility(
    counterfactuals: Tensor,
    targets: Tensor,
    reference_x: Tensor,
    reference_y: Tensor,
    p: float = 2.0,
) -> Tensor:
    """Distance-based implausibility IP (Eq. 5), one value per counterfactual.

    For counterfactual ``i`` with target class ``c = targets[i]``: the mean l_p
    distance (default Euclidean) to all reference samples with ``reference_y == c``.
    Returns a tensor of shape ``(N,)``. Raises ``ValueError`` if a target class has
    no reference samples.
    """
    cf, ref = _flat(counterfactuals), _flat(reference_x)
    targets, reference_y = targets.reshape(-1), reference_y.reshape(-1)
    out = cf.new_empty(cf.shape[0])
    for c in torch.unique(targets).tolist():
        ref_c = ref[reference_y == c]
        if ref_c.shape[0] == 0:
            raise ValueError(f"No reference samples for target class {c}")
        mask = targets == c
        if p == 1.0:
            out[mask] = mean_l1_distances(cf[mask], ref_c)
        else:
            out[mask] = torch.cdist(cf[mask], ref_c.to(cf.dtype), p=p).mean(dim=1)
    return out


def mean_l1_distances(points: Tensor, reference: Tensor, chunk_values: int = 1 << 22) -> Tensor:
    """Mean l1 distance of each row of ``points`` ``(n, D)`` to all rows of ``reference`` ``(m, D)``.

    The l1 distance is a sum over features, and for one feature
    ``Σ_j |q - r_j| = q·k - S_k + (S_m - S_k) - q·(m - k)`` with the reference values sorted, ``k`` of them
    ``≤ q`` and ``S`` their prefix sums. So each counterfactual costs a binary search per feature instead of ``m``
    differences: O((n + m)·D·log m) instead of cdist's O(n·m·D). Computed in float64 (the prefix sums would lose
    digits in float32) and returned in ``points``' dtype; equal to ``torch.cdist(points, reference, p=1).mean(1)``
    up to rounding. ``points`` go in chunks of about ``chunk_values`` values.
    """
    ref = reference.to(torch.float64).sort(dim=0).values.T.contiguous()  # (D, m), each feature sorted
    m = ref.shape[1]
    prefix = torch.cat([ref.new_zeros(ref.shape[0], 1), ref.cumsum(dim=1)], dim=1)  # (D, m + 1)
    total = prefix[:, -1:]
    out = points.new_empty(points.shape[0])
    step = max(1, chunk_values // max(ref.shape[0], 1))
    for start in range(0, points.shape[0], step):
        q = points[start:start + step].to(torch.float64).T.contiguous()  # (D, chunk)
        below = torch.searchsorted(ref, q, right=True)  # how many reference values are <= q, per feature
        sum_below = prefix.gather(1, below)
        distance = q * below - sum_below + (total - sum_below) - q * (m - below)
        out[start:start + step] = (distance.sum(dim=0) / m).to(points.dtype)
    return out


def _kernel_sum(a: Tensor, b: Tensor, length_scale: float, chunk_size: int, exclude_diagonal: bool) -> Tensor:
    """Sum of Gaussian kernel values over all pairs ``(a_i, b_j)``, in row chunks of ``a`` (float64 accumulator).

    With ``exclude_diagonal`` (``a is b``) the pairs ``i == j`` are skipped.
    """
    gamma = 1.0 / (2.0 * length_scale**2)
    total = torch.zeros((), dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[0], chunk_size):
        block = torch.exp(-gamma * torch.cdist(a[start : start + chunk_size], b).pow(2))
        if exclude_diagonal:
            rows = torch.arange(block.shape[0], device=a.device)
            block[rows, start + rows] = 0.0
        total = total + block.sum(dtype=torch.float64)
    return total


def mmd2_unbiased(x: Tensor, y: Tensor, length_scale: float = 0.5, chunk_size: int = 1024) -> Tensor:
    """Unbiased estimate of the squared MMD (Gretton et al. 2012; paper Eq. 7).

    ``mean_{i!=j} k(x_i, x_j) + mean_{i!=j} k(y_i, y_j) - 2 mean_{i,j} k(x_i, y_j)`` with the
    Gaussian kernel ``k(a, b) = exp(-||a - b||^2 / (2 length_scale^2))`` (KernelFunctions.jl
    ``with_lengthscale(SqExponentialKernel(), length_scale)``). Kernel sums are computed in
    blocks of ``chunk_size`` rows, so peak memory is ``O(chunk_size * max(m, n))``.
    Can be slightly negative. Returns a scalar tensor in ``x``'s dtype.
    """
    x, y = _flat(x), _flat(y).to(x.dtype)
    m, n = x.shape[0], y.shape[0]
    if m < 2 or n < 2:
        raise ValueError(f"mmd2_unbiased needs at least 2 samples on each side, got {m} and {n}")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"Feature dimensions differ: {x.shape[1]} vs {y.shape[1]}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    kxx = _kernel_sum(x, x, length_scale, chunk_size, True) / (m * (m - 1))
    kyy = _kernel_sum(y, y, length_scale, chunk_size, True) / (n * (n - 1))
    kxy = _kernel_sum(x, y, length_scale, chunk_size, False) / (m * n)
    return (kxx + kyy - 2.0 * kxy).to(x.dtype)


def mmd_implausibility(
    counterfactuals: Tensor,
    targets: Tensor,
    reference_x: Tensor,
    reference_y: Tensor,
    length_scale: float = 0.5,
    max_samples: Optional[int] = 1000,
    generator: Optional[torch.Generator] = None,
    max_counterfactuals: Optional[int] = None,
) -> Tensor:
    """Divergence-based implausibility IP* (Eq. 6), a scalar.

    For each target class ``c`` among ``targets`` with at least 2 counterfactuals:
    ``mmd2_unbiased(counterfactuals[targets == c], reference_x[reference_y == c])``.
    If a class has more than ``max_samples`` reference samples, they are subsampled
    without replacement (``torch.randperm`` with ``generator``, classes in ascending
    order); ``max_samples=None`` uses all. Counterfactuals of a class are subsampled the
    same way (after the reference) when there are more than ``max_counterfactuals``. The
    per-class values are averaged with weights equal to the number of counterfactuals
    per class (i.e. every counterfactual counts equally). Classes with fewer than 2
    counterfactuals are skipped; returns NaN if none remain. Raises ``ValueError`` if
    a used target class has fewer than 2 reference samples.
    """
    cf, ref = _flat(counterfactuals), _flat(reference_x)
    targets, reference_y = targets.reshape(-1), reference_y.reshape(-1)
    values, weights = [], []
    for c in torch.unique(targets).tolist():
        cf_c = cf[targets == c]
        if cf_c.shape[0] < 2:
            continue
        ref_c = ref[reference_y == c]
        if ref_c.shape[0] < 2:
            raise ValueError(f"Need at least 2 reference samples for target class {c}, got {ref_c.shape[0]}")
        if max_samples is not None and ref_c.shape[0] > max_samples:
            gen_device = generator.device if generator is not None else "cpu"
            idx = torch.randperm(ref_c.shape[0], generator=generator, device=gen_device)[:max_samples]
            ref_c = ref_c[idx.to(ref_c.device)]
        if max_counterfactuals is not None and cf_c.shape[0] > max_counterfactuals:
            gen_device = generator.device if generator is not None else "cpu"
            idx = torch.randperm(cf_c.shape[0], generator=generator, device=gen_device)[:max_counterfactuals]
            cf_c = cf_c[idx.to(cf_c.device)]
        values.append(mmd2_unbiased(cf_c, ref_c, length_scale=length_scale))
        weights.append(int((targets == c).sum()))
    if not values:
        return torch.tensor(math.nan, dtype=cf.dtype, device=cf.device)
    w = torch.tensor(weights, dtype=cf.dtype, device=cf.device)
    return (torch.stack(values) * w).sum() / w.sum()


def counterfactual_cost(counterfactuals: Tensor, factuals: Tensor, p: float = 1.0) -> Tensor:
    """Cost per counterfactual: l_p distance to its factual (default l1; ``p=2`` for Euclidean). Shape ``(N,)``."""
    return torch.linalg.vector_norm(_flat(counterfactuals) - _flat(factuals), ord=p, dim=1)


def validity(logits: Tensor, targets: Tensor) -> Tensor:
    """Share of samples whose predicted class ``argmax(logits, -1)`` equals the target (NaN if empty)."""
    return (logits.argmax(dim=-1) == targets.reshape(-1)).float().mean()


def robust_accuracy(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    epsilon: float = 0.03,
    attack: str = "fgsm",
    steps: int = 10,
    step_size: Optional[float] = None,
    domain: Domain = None,
) -> Tensor:
    """Robust accuracy Acc*: accuracy of ``model`` (in eval mode) on ``x`` perturbed by FGSM/PGD.

    ``attack`` is ``"fgsm"`` (paper default, ``epsilon=0.03``) or ``"pgd"`` (``steps``,
    ``step_size``); ``domain=(lower, upper)`` clamps the perturbed inputs. ``epsilon=0``
    gives clean accuracy. The model's train/eval modes are restored afterwards.
    """
    x_adv = adversarial_examples(model, x, y, epsilon, attack=attack, steps=steps, step_size=step_size, domain=domain)
    with torch.no_grad(), eval_mode(model):
        return validity(model(x_adv), y)


__all__ = [
    "implausibility",
    "mmd2_unbiased",
    "mmd_implausibility",
    "counterfactual_cost",
    "validity",
    "robust_accuracy",
]


def median_length_scale(x: torch.Tensor, max_samples: int = 1000) -> float:
    """Median pairwise Euclidean distance of (up to ``max_samples`` rows of) ``x``: a Gaussian-kernel bandwidth."""
    sample = x[:max_samples]
    distances = torch.cdist(sample, sample)
    positive = distances[distances > 0]
    return float(positive.median()) if positive.numel() else 1.0


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise squared Euclidean distances via one matrix product (cheaper to differentiate than cdist)."""
    return (a.square().sum(1, keepdim=True) + b.square().sum(1)[None, :] - 2.0 * a @ b.T).clamp_min(0.0)


def mmd2_biased(a: torch.Tensor, b: torch.Tensor, length_scale: float | torch.Tensor) -> torch.Tensor:
    """Biased (V-statistic) MMD² between samples ``a`` and ``b`` with a Gaussian kernel; differentiable in ``a``."""
    gamma = 1.0 / (2.0 * length_scale ** 2)
    kaa = torch.exp(-gamma * squared_distances(a, a)).mean()
    with torch.no_grad():
        kbb = torch.exp(-gamma * squared_distances(b, b)).mean()
    kab = torch.exp(-gamma * squared_distances(a, b)).mean()
    return kaa + kbb - 2.0 * kab


def sparsity(x_cf: torch.Tensor, x: torch.Tensor, groups: Sequence[Sequence[int]] = (), tol: float = 1e-4) -> dict[str, torch.Tensor]:
    """Per-row ``l1`` (all columns), ``l1_numeric`` (columns outside one-hot groups), ``l0`` (changed features,
    a one-hot group counting as one) and ``l0_categorical`` (changed groups); a change is ``|Δ| > tol``."""
    delta = (x_cf - x).abs()
    numeric = torch.ones(x.shape[1], dtype=torch.bool, device=x.device)
    changed_groups = torch.zeros(len(x), device=x.device)
    for columns in groups:
        numeric[list(columns)] = False
        changed_groups += (delta[:, list(columns)] > tol).any(1).float()
    changed_numeric = (delta[:, numeric] > tol).sum(1).float()
    return {"l1": delta.sum(1), "l1_numeric": delta[:, numeric].sum(1),
            "l0": changed_numeric + changed_groups, "l0_categorical": changed_groups}


def _classes(values: Tensor) -> Tensor:
    """Class indices from labels (any shape) or from logits/probabilities (last dim = classes, float)."""
    return values.argmax(-1) if values.is_floating_point() else values.long()


def invalidation_rate(base_predictions: Tensor, predictions: Tensor, valid: Tensor | None = None,
                      reduction: str = "mean") -> Tensor:
    """Share of (model, counterfactual) pairs whose predicted class differs from the base model's.

    ``base_predictions``: shape ``(N,)`` classes or ``(N, K)`` logits of the base model at the N
    counterfactuals. ``predictions``: ``(M, N)`` classes or ``(M, N, K)`` logits of M related models
    (``(N,)``/``(N, K)`` for one model). ``valid`` (bool ``(N,)``) restricts the counterfactuals
    counted. ``reduction``: ``mean`` (scalar; NaN if nothing is counted), ``per_model`` ``(M,)``,
    ``per_counterfactual`` ``(N,)`` or ``none`` ``(M, N)`` indicators.
    """
    base = _classes(base_predictions)
    other = _classes(predictions)
    if other.dim() == base.dim():
        other = other.unsqueeze(0)
    if other.shape[1:] != base.shape:
        raise ValueError(f"invalidation_rate: predictions {tuple(other.shape)} do not match base {tuple(base.shape)}")
    changed = (other != base.unsqueeze(0)).float()
    if valid is not None:
        changed = changed[:, valid.bool()]
    if reduction == "none":
        return changed
    if reduction == "per_model":
        return changed.mean(1)
    if reduction == "per_counterfactual":
        return changed.mean(0)
    if reduction == "mean":
        return changed.mean() if changed.numel() else torch.tensor(math.nan)
    raise ValueError(f"reduction: unknown {reduction!r}; allowed: mean, per_model, per_counterfactual, none")
