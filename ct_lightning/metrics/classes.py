"""torchmetrics ``Metric`` forms of the CT evaluation metrics, for your own Lightning loop.

The classes only accumulate states (DDP-safe: list states use ``dist_reduce_fx="cat"``,
counters ``"sum"``); all computation is delegated to :mod:`ct_lightning.metrics.functional`.
They can be logged directly with ``self.log("val/ip", metric)`` in a LightningModule, and
``tests/test_metric_contract.py`` holds each equal to its functional over one or several batches.

The library itself computes the functional forms: the evaluation protocol keeps a value per
counterfactual and per ``(run, λ_egy)`` group for Table 1's bootstrap (a class reduces to one pooled
number), and ``CTModule``'s per-step epoch metrics avoid a Metric update per step (see ``CTModule._accumulate``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from . import functional as F


class _ReferenceSetMetric(Metric):
    """Base for metrics comparing collected counterfactuals with a fixed reference set.

    The reference set (e.g. the test samples and labels) is given at construction and
    stored as non-persistent buffers, so it moves with the metric (``.to(device)``) but
    is neither synchronised across processes nor saved in checkpoints. Callers should
    pass only *valid* counterfactuals to ``update``.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    def __init__(self, reference_x: Tensor, reference_y: Tensor, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("reference_x", torch.as_tensor(reference_x).detach().clone(), persistent=False)
        self.register_buffer("reference_y", torch.as_tensor(reference_y).detach().clone(), persistent=False)
        self.add_state("cf", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")

    def update(self, counterfactuals: Tensor, targets: Tensor) -> None:
        """Collect a batch of (valid) counterfactuals and their target classes."""
        self.cf.append(counterfactuals.detach())
        self.target.append(targets.detach().reshape(-1))

    def _collected(self) -> Optional[tuple[Tensor, Tensor]]:
        """Concatenated ``(counterfactuals, targets)``, or ``None`` if nothing was collected."""
        if isinstance(self.cf, list) and len(self.cf) == 0:
            return None
        return dim_zero_cat(self.cf), dim_zero_cat(self.target)


class Implausibility(_ReferenceSetMetric):
    """Mean distance-based implausibility IP (Eq. 5) over all collected counterfactuals.

    ``Implausibility(reference_x, reference_y, p=2.0)``; ``update(counterfactuals, targets)``
    with valid counterfactuals only. ``compute()`` returns the mean of
    :func:`~ct_lightning.metrics.functional.implausibility` (NaN if nothing collected).
    """

    def __init__(self, reference_x: Tensor, reference_y: Tensor, p: float = 2.0, **kwargs: Any) -> None:
        super().__init__(reference_x, reference_y, **kwargs)
        self.p = p

    def compute(self) -> Tensor:
        """Mean IP of the collected counterfactuals."""
        data = self._collected()
        if data is None or data[0].shape[0] == 0:
            return torch.tensor(math.nan, device=self.reference_x.device)
        return F.implausibility(data[0], data[1], self.reference_x, self.reference_y, p=self.p).mean()


class MMDImplausibility(_ReferenceSetMetric):
    """Divergence-based implausibility IP* (Eq. 6) of all collected counterfactuals.

    ``MMDImplausibility(reference_x, reference_y, length_scale=0.5, max_samples=1000, seed=0)``;
    ``update(counterfactuals, targets)`` with valid counterfactuals only. ``compute()`` calls
    :func:`~ct_lightning.metrics.functional.mmd_implausibility` with a fresh CPU
    ``torch.Generator`` seeded with ``seed``, so the reference subsample is reproducible.
    """

    def __init__(
        self,
        reference_x: Tensor,
        reference_y: Tensor,
        length_scale: float = 0.5,
        max_samples: Optional[int] = 1000,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(reference_x, reference_y, **kwargs)
        self.length_scale = length_scale
        self.max_samples = max_samples
        self.seed = seed

    def compute(self) -> Tensor:
        """Class-weighted IP* of the collected counterfactuals (NaN if no class has >= 2)."""
        data = self._collected()
        if data is None:
            return torch.tensor(math.nan, device=self.reference_x.device)
        generator = torch.Generator().manual_seed(self.seed)
        return F.mmd_implausibility(
            data[0], data[1], self.reference_x, self.reference_y,
            length_scale=self.length_scale, max_samples=self.max_samples, generator=generator,
        )


class CounterfactualCost(Metric):
    """Mean cost (l_p distance, default l1) between counterfactuals and their factuals.

    ``update(counterfactuals, factuals)``; pass valid counterfactuals only.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    def __init__(self, p: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.p = p
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, counterfactuals: Tensor, factuals: Tensor) -> None:
        """Accumulate the costs of a batch."""
        cost = F.counterfactual_cost(counterfactuals.detach(), factuals.detach(), p=self.p)
        self.total += cost.sum().to(self.total.dtype)
        self.count += cost.numel()

    def compute(self) -> Tensor:
        """Mean cost (NaN if nothing collected)."""
        return self.total / self.count


class _ArgmaxAccuracy(Metric):
    """Share of ``argmax(logits) == targets``, accumulated as ``correct``/``total`` sums."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, logits: Tensor, targets: Tensor) -> None:
        """Count correct argmax predictions in a batch."""
        targets = targets.reshape(-1)
        self.correct += (logits.detach().argmax(dim=-1) == targets).sum()
        self.total += targets.numel()

    def compute(self) -> Tensor:
        """``correct / total`` (NaN if nothing collected)."""
        return self.correct.float() / self.total


class Validity(_ArgmaxAccuracy):
    """Validity: share of counterfactuals whose predicted class is the target.

    ``update(logits, targets)`` with the model's logits at the counterfactuals.
    """


class RobustAccuracy(_ArgmaxAccuracy):
    """Robust accuracy Acc*: accuracy on adversarially perturbed inputs.

    The metric does not hold the model: ``update(adv_logits, y)`` takes logits that the
    caller computed on inputs perturbed with :func:`ct_lightning.attacks.fgsm` /
    :func:`ct_lightning.attacks.pgd`. For a one-shot computation from the model use
    :func:`ct_lightning.metrics.functional.robust_accuracy`.
    """


__all__ = ["Implausibility", "MMDImplausibility", "CounterfactualCost", "Validity", "RobustAccuracy"]


class InvalidationRate(Metric):
    """torchmetrics form of :func:`~ct_lightning.metrics.functional.invalidation_rate`: accumulates over ``update`` calls, ``compute`` → scalar."""

    higher_is_better = False
    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("changed", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, base_predictions: Tensor, predictions: Tensor, valid: Tensor | None = None) -> None:
        """Add the pairs of one batch of counterfactuals (shapes as in :func:`~ct_lightning.metrics.functional.invalidation_rate`)."""
        indicators = F.invalidation_rate(base_predictions, predictions, valid, reduction="none")
        self.changed += indicators.sum().double()
        self.total += indicators.numel()

    def compute(self) -> Tensor:
        """Share of changed predictions over all pairs seen (NaN if none)."""
        return (self.changed / self.total).float() if self.total > 0 else torch.tensor(math.nan)


class Sparsity(Metric):
    """Mean ℓ0 (changed features, a one-hot group counting as one) of counterfactuals, see
    :func:`~ct_lightning.metrics.functional.sparsity`; ``update(counterfactuals, factuals)``."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    def __init__(self, groups: Sequence[Sequence[int]] = (), tol: float = 1e-4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.groups, self.tol = [list(g) for g in groups], tol
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, counterfactuals: Tensor, factuals: Tensor) -> None:
        """Accumulate the ℓ0 of a batch."""
        l0 = F.sparsity(counterfactuals.detach(), factuals.detach(), self.groups, self.tol)["l0"]
        self.total += l0.sum().double()
        self.count += l0.numel()

    def compute(self) -> Tensor:
        """Mean ℓ0 (NaN if nothing collected)."""
        return (self.total / self.count).float() if self.count > 0 else torch.tensor(math.nan)
