"""The data domain of SPEC §2: per-feature bounds inferred from the training data (pure tensors)."""

from __future__ import annotations

import torch


def infer_domain(x_train: torch.Tensor, n_std: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature bounds ``lb = min(μ − nσ, min x)``, ``ub = max(μ + nσ, max x)`` (SPEC §2)."""
    mean, std = x_train.mean(0), x_train.std(0)
    lower = torch.minimum(mean - n_std * std, x_train.min(0).values)
    upper = torch.maximum(mean + n_std * std, x_train.max(0).values)
    return lower, upper
