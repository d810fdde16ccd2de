"""Default classifiers: the paper's MLP, built from primitive settings."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU,
               "leaky_relu": nn.LeakyReLU, "elu": nn.ELU}


def build_mlp(n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (32,),
              activation: str = "relu") -> nn.Sequential:
    """MLP returning logits; the paper's default is one hidden layer of 32 ReLU units."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: unknown {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    width = n_features
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
        width = size
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)
