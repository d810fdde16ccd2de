"""Gradient-based adversarial attacks (FGSM, PGD) used for robust accuracy (Acc*).

Both attacks are safe to call from Lightning's ``validation_step``/``test_step``
(which run under ``torch.inference_mode()``/``torch.no_grad()``): they re-enable
autograd locally, work on fresh (non-inference) copies of the inputs, run the
model in eval mode (restoring each submodule's previous mode afterwards) and only
differentiate w.r.t. the input, so no ``.grad`` is accumulated on parameters.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ct_lightning.training.eval_mode import eval_mode

Bound = Union[Tensor, float]
Domain = Optional[Tuple[Bound, Bound]]

ATTACKS = ("fgsm", "pgd")


def _copy(t: Bound, like: Tensor) -> Tensor:
    """Fresh, detached, non-inference copy of ``t`` on ``like``'s device (and dtype if floating)."""
    t = torch.as_tensor(t, device=like.device)
    if t.is_floating_point():
        t = t.to(like.dtype)
    return t.detach().clone()


def _clamp(x: Tensor, domain: Domain) -> Tensor:
    """Clamp ``x`` to ``domain=(lower, upper)`` (tensors broadcastable to ``x`` or floats)."""
    if domain is None:
        return x
    lower, upper = domain
    return torch.clamp(x, min=_copy(lower, x), max=_copy(upper, x))


def _input_grad(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Gradient of the summed cross-entropy of ``model(x)`` w.r.t. ``x`` only."""
    x = x.detach().requires_grad_(True)
    loss = F.cross_entropy(model(x), y, reduction="sum")
    (grad,) = torch.autograd.grad(loss, x)
    return grad


def fgsm(model: nn.Module, x: Tensor, y: Tensor, epsilon: float, domain: Domain = None) -> Tensor:
    """Fast Gradient Sign Method (Goodfellow et al. 2015).

    Returns ``x + epsilon * sign(grad_x CE(model(x), y))``, clamped to
    ``domain=(lower, upper)`` if given. The loss is summed over the batch, so each
    sample's perturbation is independent of the batch size. Returns a detached tensor.
    """
    with torch.inference_mode(False), torch.enable_grad(), eval_mode(model):
        x0, y0 = x.detach().clone(), y.detach().clone()
        x_adv = x0 + epsilon * _input_grad(model, x0, y0).sign()
        return _clamp(x_adv, domain).detach()


def pgd(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    epsilon: float,
    steps: int = 10,
    step_size: Optional[float] = None,
    domain: Domain = None,
    random_start: bool = False,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Projected gradient descent attack in the l-inf ball (Madry et al. 2018).

    ``steps`` signed-gradient ascent steps of size ``step_size`` (default
    ``2.5 * epsilon / steps``) on the summed cross-entropy; after every step the
    iterate is projected onto ``[x - epsilon, x + epsilon]`` and clamped to
    ``domain``. With ``random_start`` the start point is drawn uniformly from the
    epsilon ball using ``generator``. Returns a detached tensor.
    """
    if step_size is None:
        step_size = 2.5 * epsilon / max(steps, 1)
    with torch.inference_mode(False), torch.enable_grad(), eval_mode(model):
        x0, y0 = x.detach().clone(), y.detach().clone()
        x_adv = x0
        if random_start:
            device = generator.device if generator is not None else x0.device
            noise = torch.rand(x0.shape, generator=generator, device=device, dtype=x0.dtype)
            x_adv = _clamp(x0 + (2 * noise.to(x0.device) - 1) * epsilon, domain)
        for _ in range(steps):
            x_adv = x_adv + step_size * _input_grad(model, x_adv, y0).sign()
            x_adv = torch.minimum(torch.maximum(x_adv, x0 - epsilon), x0 + epsilon)
            x_adv = _clamp(x_adv, domain)
        return x_adv.detach()


def adversarial_examples(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    epsilon: float,
    attack: str = "fgsm",
    steps: int = 10,
    step_size: Optional[float] = None,
    domain: Domain = None,
) -> Tensor:
    """Dispatch to :func:`fgsm` or :func:`pgd` by name; ``steps``/``step_size`` only apply to PGD."""
    if attack == "fgsm":
        return fgsm(model, x, y, epsilon, domain=domain)
    if attack == "pgd":
        return pgd(model, x, y, epsilon, steps=steps, step_size=step_size, domain=domain)
    raise ValueError(f"Unknown attack {attack!r}; allowed values: {', '.join(ATTACKS)}")


__all__: Sequence[str] = ["fgsm", "pgd", "adversarial_examples", "ATTACKS"]
