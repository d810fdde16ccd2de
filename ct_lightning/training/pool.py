"""Drawing CT's counterfactual pool: random targets, ``x⁺`` samples per class, and the pool itself."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


def random_targets(predicted: torch.Tensor, n_classes: int, rng: torch.Generator | None = None) -> torch.Tensor:
    """Targets drawn uniformly from the classes other than ``predicted``."""
    if n_classes < 2:
        raise ValueError("n_classes: counterfactual targets need at least 2 classes")
    shift = torch.randint(1, n_classes, predicted.shape, generator=rng, device="cpu").to(predicted.device)
    return (predicted + shift) % n_classes


def target_tally(converged: torch.Tensor, target: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Per target class: ``[[counterfactuals searched], [of them converged]]``, a ``2 × n_classes`` float tensor (two
    bincounts over the whole pool; no host sync)."""
    searched = torch.bincount(target, minlength=n_classes)
    reached = torch.bincount(target, weights=converged.to(torch.float32), minlength=n_classes)
    return torch.stack([searched.to(torch.float32), reached])


class ClassSampler:
    """Draws, per requested class, the index of a random training sample of that class."""

    def __init__(self, labels: torch.Tensor, n_classes: int):
        labels = labels.detach().cpu()
        self.order = torch.argsort(labels, stable=True)
        self.counts = torch.bincount(labels, minlength=n_classes)
        self.offsets = torch.cumsum(self.counts, 0) - self.counts

    def sample(self, classes: torch.Tensor, rng: torch.Generator | None = None) -> torch.Tensor:
        """Indices into the labels, one per entry of ``classes``, drawn with replacement."""
        classes = classes.detach().cpu()
        counts = self.counts[classes]
        if (counts == 0).any():
            missing = sorted(set(classes[counts == 0].tolist()))
            raise ValueError(f"target classes {missing} have no training samples to draw x⁺ from")
        u = torch.rand(classes.shape, generator=rng)
        return self.order[self.offsets[classes] + (u * counts).long().clamp(max=counts - 1)]


@functools.lru_cache(maxsize=64)
def chunk_bounds(n: int, n_chunks: int) -> tuple[int, ...]:
    """The ``n_chunks + 1`` bounds of near-equal slices of ``range(n)`` (computed once per size: every
    training step asks for its slice)."""
    return tuple(torch.linspace(0, n, n_chunks + 1).round().long().tolist())


@dataclass
class CounterfactualPool:
    """Counterfactuals ready for Eq. 2: positives, negatives, nascent CEs and their labels."""

    x_pos: torch.Tensor
    x_neg: torch.Tensor
    nascent: torch.Tensor
    labels: torch.Tensor
    target: torch.Tensor

    def __len__(self) -> int:
        return len(self.target)

    def chunk(self, index: int, n_chunks: int) -> "CounterfactualPool":
        """The ``index``-th of ``n_chunks`` near-equal slices (empty past the end)."""
        bounds = chunk_bounds(len(self), n_chunks)
        lo, hi = (bounds[index], bounds[index + 1]) if index < n_chunks else (0, 0)
        return CounterfactualPool(*(t[lo:hi] for t in
                                    (self.x_pos, self.x_neg, self.nascent, self.labels, self.target)))
