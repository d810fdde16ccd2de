"""A training step of a plain MLP by hand: Eq. 2's loss and its weight gradients, without autograd's graph.

A circles step trains the paper's MLP on 30 rows (and, in CT, on the batch's share of x⁺, x' and x'_tε):
a few dozen small kernels, and on a CPU autograd's own work around them (recording the graph, scheduling
its nodes, accumulating the gradients) costs as much as they do. :func:`conventional_step` and
:func:`counterfactual_step` run the forward pass, the loss and its backward pass with the very kernels
autograd calls (the derivative formulas of ``addmm``, ``log_softmax``, ``nll_loss``, ``gather``, ``mean``,
``pow`` and the activations), in autograd's order, and write the gradients into the optimiser's flat buffer
(:meth:`ct_lightning.training.flat_adam.FlatAdam.gradient_views`). The loss terms and gradients are the same
as autograd's (tests/test_mlp_step.py holds them within 1e-6, and whole trainings within 1e-5).

``CTModule`` uses them for a plain MLP (:func:`ct_lightning.generators.input_gradient.plain_mlp_layers`) on a CPU,
in full precision, on one process, where the optimiser is a :class:`~ct_lightning.training.flat_adam.FlatAdam`;
every other model and setting gets autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.models import ACTIVATION_BACKWARD, ACTIVATION_FORWARD

_aten = torch.ops.aten
_MEAN, _NO_INDEX = 1, -100  # nll_loss's reduction code for "mean" and its default ignore_index


def layer_outputs(layers: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's output at ``x`` (the last one is the logits) for a plain MLP's ``layers``, with the forward
    kernels autograd records (also the search's passes by hand, ``generators.input_gradient``); call it without
    gradient recording."""
    outputs, h = [], x
    for layer in layers:
        h = F.linear(h, layer.weight, layer.bias) if type(layer) is nn.Linear else ACTIVATION_FORWARD[type(layer)](h)
        outputs.append(h)
    return outputs


def _backward(layers: list[nn.Module], x: torch.Tensor, outputs: list[torch.Tensor], grad_logits: torch.Tensor,
              grads: dict) -> None:
    """Write each parameter's gradient into ``grads[parameter]``, from the logits' gradient back to the first
    layer (whose input, the data, needs none)."""
    grad = grad_logits
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        if type(layer) is not nn.Linear:
            grad = ACTIVATION_BACKWARD[type(layer)](grad, outputs[i])
            continue
        torch.mm(grad.t(), outputs[i - 1] if i else x, out=grads[layer.weight])
        if layer.bias is not None:
            torch.sum(grad, 0, out=grads[layer.bias])
        if i:
            grad = grad.mm(layer.weight)


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """``F.cross_entropy`` (mean over rows) and what its backward pass needs."""
    log_probs = torch.log_softmax(logits, 1)
    loss, total_weight = _aten.nll_loss_forward(log_probs, labels, None, _MEAN, _NO_INDEX)
    return loss, (log_probs, labels, total_weight)


def _cross_entropy_grad(grad: torch.Tensor, saved: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The logits' gradient of :func:`_cross_entropy` times the scalar ``grad``."""
    log_probs, labels, total_weight = saved
    grad = _aten.nll_loss_backward(grad, log_probs, labels, None, _MEAN, _NO_INDEX, total_weight)
    return _aten._log_softmax_backward_data(grad, log_probs, 1, dtype)


def conventional_step(layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, lambda_clf: float,
                      grads: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A conventional step's ``(loss, clf, logits)`` as ``CTModule`` computes them, the gradients written into
    ``grads`` (``loss = clf`` when ``lambda_clf`` is 1, else ``lambda_clf · clf``)."""
    with torch.no_grad():
        outputs = layer_outputs(layers, x)
        logits = outputs[-1]
        clf, saved = _cross_entropy(logits, y)
        loss = clf if lambda_clf == 1.0 else lambda_clf * clf
        seed = torch.ones_like(loss)
        _backward(layers, x, outputs, _cross_entropy_grad(seed if lambda_clf == 1.0 else seed * lambda_clf,
                                                          saved, logits.dtype), grads)
    return loss, clf, logits


def counterfactual_step(layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, pool, lambdas: tuple,
                        uses_energy: bool, uses_adversarial: bool, grads: dict
                        ) -> tuple[torch.Tensor, tuple, torch.Tensor]:
    """A CT step's ``(loss, (clf, div, ridge, adv), logits of x)`` as ``CTModule`` computes them (one forward pass
    over [x, x⁺, x', x'_tε] of the step's ``pool``, a non-empty ``CounterfactualPool`` chunk; a term the objective
    leaves out is logged as 0 and gets no gradient), the gradients written into ``grads``."""
    lambda_clf, lambda_div, lambda_reg, lambda_adv = lambdas
    m, target = len(pool), pool.target
    with torch.no_grad():
        inputs = torch.cat([x, pool.x_pos, pool.x_neg, pool.nascent])
        outputs = layer_outputs(layers, inputs)
        sizes = [len(x), m, m, m]
        logits, logits_pos, logits_neg, logits_adv = outputs[-1].split(sizes)
        clf, saved_clf = _cross_entropy(logits, y)
        index = target[:, None]
        energy_pos, energy_neg = -logits_pos.gather(1, index).squeeze(1), -logits_neg.gather(1, index).squeeze(1)
        div, ridge = (energy_pos - energy_neg).mean(), (energy_pos.square() + energy_neg.square()).mean()
        adv, saved_adv = _cross_entropy(logits_adv, pool.labels)
        if not uses_energy:
            div, ridge = div * 0.0, ridge * 0.0
        if not uses_adversarial:
            adv = adv * 0.0
        loss = lambda_clf * clf + lambda_div * div + lambda_reg * ridge + lambda_adv * adv

        seed = torch.ones_like(loss)
        grad_logits = torch.zeros_like(outputs[-1])
        grad, grad_pos, grad_neg, grad_adv = grad_logits.split(sizes)
        grad.copy_(_cross_entropy_grad(seed * lambda_clf, saved_clf, logits.dtype))
        if uses_energy:
            # mean's backward (grad / rows), then sub, pow(·, 2) and neg; the two paths into each energy add up.
            grad_div, grad_ridge = (seed * lambda_div).expand(m) / m, (seed * lambda_reg).expand(m) / m
            grad_energy_pos = grad_div + grad_ridge * (2.0 * energy_pos)
            grad_energy_neg = -grad_div + grad_ridge * (2.0 * energy_neg)
            grad_pos.scatter_add_(1, index, grad_energy_pos.neg()[:, None])
            grad_neg.scatter_add_(1, index, grad_energy_neg.neg()[:, None])
        if uses_adversarial:
            grad_adv.copy_(_cross_entropy_grad(seed * lambda_adv, saved_adv, logits.dtype))
        _backward(layers, inputs, outputs, grad_logits, grads)
    return loss, (clf, div, ridge, adv), logits
