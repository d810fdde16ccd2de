"""The amortised generator's networks: ``G(x, y_M, y_T, z)`` and the class-conditioned discriminator ``D(x, y)``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.models import build_mlp


def _leaky_relu() -> nn.Module:
    return nn.LeakyReLU(0.2)


def one_hot_groups(feature_names: Sequence[str] | None) -> list[list[int]]:
    """Column indices of the one-hot groups: features named ``group=value`` sharing a prefix (≥ 2 columns)."""
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(feature_names or []):
        if "=" in str(name):
            groups.setdefault(str(name).split("=", 1)[0], []).append(index)
    return [columns for columns in groups.values() if len(columns) >= 2]


class CounterfactualNetwork(nn.Module):
    """``G(x, y_M, y_T, z) → x_CF``: an MLP on ``[x, onehot(y_M), onehot(y_T), z]``.

    ``groups`` lists the column indices of one-hot groups, generated as categories (see module
    docstring); all other columns get ``x + δ``. Noise ``z`` is standard normal while training and
    zero at generation (deterministic counterfactuals) unless given.
    """

    def __init__(self, n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (64, 64), noise_dim: int = 4,
                 groups: Sequence[Sequence[int]] | None = None, keep_bias: float = 2.0):
        super().__init__()
        self.n_classes, self.noise_dim, self.keep_bias = n_classes, noise_dim, keep_bias
        self.body = build_mlp(n_features + 2 * n_classes + noise_dim, n_features, hidden_sizes, _leaky_relu)
        nn.init.zeros_(self.body[-1].weight)
        nn.init.zeros_(self.body[-1].bias)
        groups = [list(g) for g in (groups or []) if len(g) >= 2]
        columns = [c for g in groups for c in g]
        self.register_buffer("cat_columns", torch.tensor(columns, dtype=torch.long))
        self.register_buffer("cat_group", torch.tensor([i for i, g in enumerate(groups) for _ in g], dtype=torch.long))
        self.n_groups = len(groups)

    def _categories(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-group one-hot samples; straight-through Gumbel-softmax in training, arg-max otherwise."""
        n = logits.shape[0]
        group = self.cat_group.expand(n, -1)
        if self.training:
            u = torch.rand_like(logits).clamp_(1e-10, 1.0 - 1e-7)
            logits = logits - torch.log(-torch.log(u))
        top = torch.full((n, self.n_groups), -math.inf, device=logits.device, dtype=logits.dtype)
        top = top.scatter_reduce(1, group, logits, "amax").gather(1, group)
        weights = (logits - top).exp()
        total = torch.zeros(n, self.n_groups, device=logits.device, dtype=logits.dtype).index_add(1, self.cat_group, weights)
        soft = weights / total.gather(1, group)
        hard = (logits == top).to(logits.dtype)
        return hard - soft.detach() + soft

    def forward(self, x: torch.Tensor, y_model: torch.Tensor, y_target: torch.Tensor,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        """Counterfactuals of ``x`` (predicted ``y_model``) for the classes ``y_target``."""
        if noise is None:
            noise = torch.randn(len(x), self.noise_dim, device=x.device) if self.training else \
                x.new_zeros(len(x), self.noise_dim)
        inputs = torch.cat([x, F.one_hot(y_model, self.n_classes).to(x.dtype),
                            F.one_hot(y_target, self.n_classes).to(x.dtype), noise], 1)
        out = self.body(inputs)
        x_cf = x + out
        if self.n_groups:
            logits = out[:, self.cat_columns] + self.keep_bias * x[:, self.cat_columns]
            x_cf = x_cf.index_copy(1, self.cat_columns, self._categories(logits))
        return x_cf


class ConditionalDiscriminator(nn.Module):
    """``D(x, y)``: an MLP on ``[x, onehot(y)]`` returning one logit (real vs generated)."""

    def __init__(self, n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (64, 64)):
        super().__init__()
        self.n_classes = n_classes
        self.body = build_mlp(n_features + n_classes, 1, hidden_sizes, _leaky_relu)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Logit that ``x`` is a real sample of class ``y``."""
        return self.body(torch.cat([x, F.one_hot(y, self.n_classes).to(x.dtype)], 1)).squeeze(1)
