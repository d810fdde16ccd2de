"""K MLPs of one shape as one module: a stacked training's classifier (see :mod:`ct_lightning.stacked`).

The paper's MLPs (one 32-unit layer) are so small that a training step is mostly fixed costs per kernel.
Stacking the parameters of K such models (``[K, out, in]`` weights) turns each layer of K separate
steps into one batched matrix product, while every model keeps its own parameters, gradients and
Adam state: nothing couples the models, because the loss is a sum of one term per model.
"""

from __future__ import annotations

import torch
from torch import nn


def mlp_layers(model: nn.Module) -> list[nn.Module] | None:
    """The layers of a :func:`ct_lightning.models.build_mlp` network (``Linear``, activation, ...,
    ``Linear``), or ``None`` when ``model`` is not one."""
    if not isinstance(model, nn.Sequential):
        return None
    layers = list(model)
    linear = layers[0::2]
    if not layers or not all(type(layer) is nn.Linear for layer in linear) or len(layers) % 2 == 0:
        return None
    if any(isinstance(layer, nn.Linear) or list(layer.parameters()) for layer in layers[1::2]):
        return None
    return layers


class StackedMLP(nn.Module):
    """The parameters of K equally shaped MLPs stacked along a first axis; ``forward`` maps ``[K, n, in]`` to
    ``[K, n, out]`` (row block ``k`` through model ``k``). :meth:`flat` maps ``[K·n, in]`` rows, model by model."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        layers = [mlp_layers(member) for member in members]
        if not members or any(found is None for found in layers):
            raise ValueError("a stacked training needs MLPs built by ct_lightning.models.build_mlp")
        shapes = {tuple(tuple(p.shape) for p in member.parameters()) for member in members}
        if len(shapes) != 1:
            raise ValueError(f"a stacked training needs MLPs of one shape, got {len(shapes)} shapes")
        self.n_models = len(members)
        self.activations = nn.ModuleList(layers[0][1::2])  # stateless, the same in every member
        linear = [found[0::2] for found in layers]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([model[i].weight.detach() for model in linear]).clone())
            for i in range(len(linear[0])))
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([model[i].bias.detach() for model in linear]).clone())
            for i in range(len(linear[0])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
            if i < len(self.activations):
                x = self.activations[i](x)
        return x

    def flat(self, rows: torch.Tensor) -> torch.Tensor:
        """Logits of ``[K·n, in]`` rows, the ``k``-th block of ``n`` rows through model ``k``."""
        return self(rows.view(self.n_models, -1, rows.shape[-1])).flatten(0, 1)

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Model ``k``'s parameters under the names of its :func:`~ct_lightning.models.build_mlp` network."""
        state = {}
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            state[f"{2 * i}.weight"] = weight[k].detach().clone()
            state[f"{2 * i}.bias"] = bias[k].detach().clone()
        return state

    @torch.no_grad()
    def write_to(self, members: list[nn.Module]) -> None:
        """Copy each model's current parameters into its own network."""
        for k, member in enumerate(members):
            member.load_state_dict(self.member_state(k))


class RowStacked(nn.Module):
    """A :class:`StackedMLP` seen as one classifier of ``[K·n, in]`` rows (what a pool search calls)."""

    def __init__(self, stacked: StackedMLP):
        super().__init__()
        self.stacked = stacked

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.stacked.flat(rows)
