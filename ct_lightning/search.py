"""Batched gradient-based counterfactual search (Eq. 1) over a whole pool at once.

All counterfactuals of a pool live in one tensor. Each step runs one forward and one
backward pass over the rows that are still searching; a row freezes as soon as its
target probability reaches ``tau`` and the loop ends when every row has converged or
``max_steps`` steps are spent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import enforce, mask_gradient


@dataclass
class SearchResult:
    """Outcome of a batched search; one row per factual."""

    counterfactual: torch.Tensor  # mature x'_T
    nascent: torch.Tensor         # x'_{tε}: last path point within ε (ℓ∞) of the factual
    converged: torch.Tensor       # bool: target probability reached τ
    steps: torch.Tensor           # gradient steps taken
    nascent_steps: torch.Tensor   # t_ε: step index of the nascent counterfactual (0 = factual)

    def stats(self) -> dict[str, float]:
        """Share converged, mean steps and share of rows with a nascent counterfactual past t = 0."""
        return {
            "converged": self.converged.float().mean().item(),
            "steps": self.steps.float().mean().item(),
            "nascent": (self.nascent_steps > 0).float().mean().item(),
        }


def search_counterfactuals(model: nn.Module, x: torch.Tensor, target: torch.Tensor, generator,
                           tau: float = 0.75, max_steps: int = 30, epsilon: float = 0.3,
                           mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                           upper: torch.Tensor | None = None) -> SearchResult:
    """Search counterfactuals of ``x`` for classes ``target`` with ``generator``'s penalty.

    ``mutability`` holds per-feature codes from :func:`ct_lightning.constraints.parse_mutability`;
    ``lower``/``upper`` are per-feature domain bounds (``None``: unbounded). Works inside
    Lightning's inference mode: gradients are switched on locally and the model's
    parameters receive none.
    """
    n, n_features = x.shape
    device = x.device
    codes = torch.zeros(n_features, dtype=torch.long, device=device) if mutability is None \
        else mutability.to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(False), torch.enable_grad():
            x = x.detach().clone()
            target = target.detach().clone()
            x_cf, nascent = x.clone(), x.clone()
            steps = torch.zeros(n, dtype=torch.long, device=device)
            nascent_steps = torch.zeros(n, dtype=torch.long, device=device)
            converged = torch.zeros(n, dtype=torch.bool, device=device)
            active = torch.arange(n, device=device)
            for step in range(max_steps + 1):
                if active.numel() == 0:
                    break
                rows = x_cf[active].requires_grad_(step < max_steps)
                rows_target, rows_x = target[active], x[active]
                logits = model(rows)
                done = logits.softmax(1).gather(1, rows_target[:, None]).squeeze(1) >= tau
                converged[active[done]] = True
                if step == max_steps:
                    break
                loss = F.cross_entropy(logits, rows_target, reduction="sum") + \
                    generator.penalty(rows, rows_x, logits, rows_target, step, max_steps).sum()
                (grad,) = torch.autograd.grad(loss, rows)
                keep = ~done
                active, rows, grad, rows_x = active[keep], rows.detach()[keep], grad[keep], rows_x[keep]
                moved = enforce(rows - generator.lr * mask_gradient(grad, codes), rows_x, codes, lower, upper)
                x_cf[active] = moved
                steps[active] += 1
                inside = active[(moved - rows_x).abs().amax(1) <= epsilon]
                nascent[inside] = x_cf[inside]
                nascent_steps[inside] = steps[inside]
    finally:
        model.train(was_training)
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)


def random_targets(predicted: torch.Tensor, n_classes: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Targets drawn uniformly from the classes other than ``predicted``."""
    if n_classes < 2:
        raise ValueError("n_classes: counterfactual targets need at least 2 classes")
    shift = torch.randint(1, n_classes, predicted.shape, generator=generator, device="cpu").to(predicted.device)
    return (predicted + shift) % n_classes


class ClassSampler:
    """Draws, per requested class, the index of a random training sample of that class."""

    def __init__(self, labels: torch.Tensor, n_classes: int):
        labels = labels.detach().cpu()
        self.order = torch.argsort(labels, stable=True)
        self.counts = torch.bincount(labels, minlength=n_classes)
        self.offsets = torch.cumsum(self.counts, 0) - self.counts

    def sample(self, classes: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Indices into the labels, one per entry of ``classes``, drawn with replacement."""
        classes = classes.detach().cpu()
        counts = self.counts[classes]
        if (counts == 0).any():
            missing = sorted(set(classes[counts == 0].tolist()))
            raise ValueError(f"target classes {missing} have no training samples to draw x⁺ from")
        u = torch.rand(classes.shape, generator=generator)
        return self.order[self.offsets[classes] + (u * counts).long().clamp(max=counts - 1)]
