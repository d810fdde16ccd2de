"""A search step's model passes: the logits at the points and, given the logits' gradient, the points' gradient.

A search differentiates the model with respect to its inputs only, hundreds of times per epoch, over a few
thousand rows of a small model. On a CPU, autograd's own work (recording the graph, scheduling its nodes,
checking versions) then costs as much as the arithmetic: a forward and backward pass of the paper's MLP over
1 000 rows of circles takes 135 µs with autograd and 89 µs without it (bench/input_gradient.py).

:class:`MLPPasses` runs the passes of a plain MLP (``nn.Sequential`` of ``nn.Linear`` and ReLU, tanh or sigmoid,
as :func:`ct_lightning.models.build_mlp` makes it) by hand, with the very kernels autograd calls: ``F.linear``
forward, ``grad.mm(weight)`` and the activations' own backward functions. The logits and gradients are the
same as autograd's, to the bit on the machines we tried (tests/test_input_gradient.py holds them within 1e-6).
Every other model (a CNN, a user's own module, adapters, hooks), and every search under autocast, gets
:class:`AutogradPasses`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ct_lightning.models import ACTIVATION_BACKWARD
from ct_lightning.training.mlp_step import layer_outputs

_by_hand = True


class AutogradPasses:
    """The passes by autograd: any differentiable model."""

    def __init__(self, model: nn.Module):
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """The logits at ``x`` and what :meth:`input_gradient` needs."""
        inputs = x.detach().requires_grad_(True)
        logits = self.model(inputs)
        return logits, (inputs, logits)

    @staticmethod
    def input_gradient(saved: tuple, grad_logits: torch.Tensor) -> torch.Tensor:
        """``∂(grad_logits · logits)/∂x``: the vector-Jacobian product at the forward's ``x``."""
        inputs, logits = saved
        (grad,) = torch.autograd.grad(logits, inputs, grad_outputs=grad_logits)
        return grad


class MLPPasses:
    """The passes of a plain MLP by hand (see the module's docstring); ``layers`` from :func:`plain_mlp_layers`."""

    def __init__(self, layers: list[nn.Module]):
        self.layers = layers

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list]:
        """The logits at ``x`` and each activation's output (what the backward pass reads)."""
        with torch.no_grad():
            outputs = layer_outputs(self.layers, x.detach())
        return outputs[-1], outputs

    def input_gradient(self, saved: list, grad_logits: torch.Tensor) -> torch.Tensor:
        """``∂(grad_logits · logits)/∂x``, layer by layer from the last."""
        grad = grad_logits
        with torch.no_grad():
            for layer, output in zip(reversed(self.layers), reversed(saved)):
                if type(layer) is nn.Linear:
                    grad = grad.mm(layer.weight)
                else:
                    grad = ACTIVATION_BACKWARD[type(layer)](grad, output)
        return grad


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def plain_mlp_layers(model: nn.Module) -> list[nn.Module] | None:
    """``model``'s layers if it is an ``nn.Sequential`` of exactly ``nn.Linear`` and ReLU/tanh/sigmoid (no
    subclasses, hooks or parametrisations, two-dimensional weights, same dtype throughout) that begins and ends
    with a linear layer; else ``None``."""
    if type(model) is not nn.Sequential or _hooked(model) or len(model) == 0:
        return None
    layers = list(model)
    if type(layers[0]) is not nn.Linear or type(layers[-1]) is not nn.Linear:
        return None
    for layer in layers:
        if type(layer) not in (nn.Linear, *ACTIVATION_BACKWARD) or _hooked(layer):
            return None
    hooks = nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks \
            or hooks._global_backward_pre_hooks:
        return None
    dtypes = {p.dtype for p in model.parameters()}
    return layers if len(dtypes) == 1 else None


def _autocast_on() -> bool:
    return any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))


def by_hand() -> bool:
    """Whether the passes of a plain MLP may run by hand (``False`` inside :func:`autograd_only`)."""
    return _by_hand


def model_passes(model: nn.Module) -> AutogradPasses | MLPPasses:
    """The fastest exact way to run ``model``'s search passes: by hand for a plain MLP, else autograd (also under
    autocast, where autograd's backward runs outside the autocast region and the hand-written one would not)."""
    layers = plain_mlp_layers(model) if _by_hand and not _autocast_on() else None
    return AutogradPasses(model) if layers is None else MLPPasses(layers)


@contextlib.contextmanager
def autograd_only() -> Iterator[None]:
    """Within the block, every search and training step uses autograd (to compare the two ways; ``bench/``,
    tests)."""
    global _by_hand
    before, _by_hand = _by_hand, False
    try:
        yield
    finally:
        _by_hand = before
