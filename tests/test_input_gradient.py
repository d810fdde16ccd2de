"""The search's model passes by hand for a plain MLP (``generators/input_gradient.py``): the same logits and input
gradients as autograd, the same searches, and autograd for every model the hand-written passes do not cover."""

from pathlib import Path

import pytest
import torch
from torch import nn

from ct_lightning.generators import ECCo, Generic
from ct_lightning.generators.input_gradient import (AutogradPasses, MLPPasses, autograd_only, model_passes,
                                                    plain_mlp_layers)
from ct_lightning.generators.search import search_counterfactuals
from ct_lightning.models import LeNet, build_mlp

EXACT = {"rtol": 1e-6, "atol": 1e-7}  # the same kernels: equal to the bit where we ran it


def autograd_reference(model, x, grad_logits):
    """Logits and ∂(grad_logits · logits)/∂x by autograd, written out independently of the module."""
    inputs = x.clone().requires_grad_(True)
    logits = model(inputs)
    (logits * grad_logits).sum().backward()
    return logits.detach(), inputs.grad


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("hidden", [[32], [16, 8], []])
def test_hand_written_passes_give_autograds_logits_and_input_gradient(activation, hidden):
    torch.manual_seed(0)
    model = build_mlp(7, 3, hidden, activation)
    x, grad_logits = torch.randn(257, 7), torch.randn(257, 3)
    passes = model_passes(model)
    assert isinstance(passes, MLPPasses)
    logits, saved = passes.forward(x)
    gradient = passes.input_gradient(saved, grad_logits)
    assert all(p.grad is None for p in model.parameters()), "the model's parameters receive no gradient"
    assert not logits.requires_grad and not gradient.requires_grad
    reference_logits, reference_gradient = autograd_reference(model, x, grad_logits)
    torch.testing.assert_close(logits, reference_logits, **EXACT)
    torch.testing.assert_close(gradient, reference_gradient, **EXACT)


def test_relu_gradient_at_exact_zero_follows_autograd():
    """ReLU's derivative at 0 is taken as 0, as autograd takes it: pre-activations of exactly zero."""
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -1.0], [1.0, 1.0]]))
        model[0].bias.zero_()
        model[2].weight.copy_(torch.tensor([[2.0, 3.0], [-1.0, 5.0]]))
    x, grad_logits = torch.tensor([[1.0, 1.0], [2.0, -2.0]]), torch.ones(2, 2)  # first unit exactly 0, second 0
    passes = model_passes(model)
    gradient = passes.input_gradient(passes.forward(x)[1], grad_logits)
    torch.testing.assert_close(gradient, autograd_reference(model, x, grad_logits)[1], rtol=0, atol=0)


class Subclassed(nn.Sequential):
    pass


class ScaledLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("make", [
    lambda: build_mlp(4, 2, [8], "gelu"),  # backward reads the input, not the output
    lambda: build_mlp(4, 2, [8], "leaky_relu"),
    lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.ReLU(), nn.Linear(8, 2)),
    lambda: Subclassed(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
    lambda: nn.Sequential(ScaledLinear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
    lambda: nn.Sequential(nn.ReLU(), nn.Linear(4, 2)),
    lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU()),
    lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2).double()),
    lambda: LeNet(64, 10),
], ids=["gelu", "leaky_relu", "dropout", "subclass", "linear-subclass", "starts-with-activation",
        "ends-with-activation", "mixed-dtypes", "lenet"])
def test_other_models_are_differentiated_by_autograd(make):
    model = make()
    assert plain_mlp_layers(model) is None
    assert isinstance(model_passes(model), AutogradPasses)


def test_hooks_send_a_model_to_autograd():
    model = build_mlp(4, 2, [8], "relu")
    handle = model[0].register_forward_hook(lambda module, args, output: output * 2)
    assert isinstance(model_passes(model), AutogradPasses)
    handle.remove()
    assert isinstance(model_passes(model), MLPPasses)
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        assert isinstance(model_passes(model), AutogradPasses)
    finally:
        handle.remove()


def test_mixed_precision_keeps_autograd():
    """Under autocast, autograd's backward runs outside the autocast region; a hand-written backward would not."""
    model = build_mlp(4, 2, [8], "relu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert isinstance(model_passes(model), AutogradPasses)
    assert isinstance(model_passes(model), MLPPasses)


def test_autograd_only_switches_every_search_to_autograd():
    model = build_mlp(4, 2, [8], "relu")
    with autograd_only():
        assert isinstance(model_passes(model), AutogradPasses)
    assert isinstance(model_passes(model), MLPPasses)


def trained(x, y, hidden):
    """``test_categorical``'s small MLP, trained the same way, with ``hidden`` layers."""
    from test_categorical import trained_model

    return trained_model(x, y, hidden)


def both_ways(*arguments, **options):
    by_hand = search_counterfactuals(*arguments, **options)
    with autograd_only():
        by_autograd = search_counterfactuals(*arguments, **options)
    return by_hand, by_autograd


def assert_same_search(by_hand, by_autograd):
    assert torch.equal(by_hand.converged, by_autograd.converged) and torch.equal(by_hand.steps, by_autograd.steps)
    torch.testing.assert_close(by_hand.counterfactual, by_autograd.counterfactual, **EXACT)
    torch.testing.assert_close(by_hand.nascent, by_autograd.nascent, **EXACT)


@pytest.mark.parametrize("generator", [ECCo(lr=0.05), Generic(lr=0.05)], ids=["ecco", "generic"])
@pytest.mark.parametrize("packed", [True, False])
def test_a_search_by_hand_is_the_search_by_autograd(generator, packed):
    torch.manual_seed(1)
    x = torch.randn(400, 5)
    y = (x[:, 0] + x[:, 1] ** 2 > 1).long()
    model = trained(x, y, [32])
    with torch.no_grad():
        target = 1 - model(x).argmax(1)
    by_hand, by_autograd = both_ways(model, x, target, generator, 0.95, 12, 0.3, packed=packed)
    assert 0 < int(by_hand.converged.sum()) < len(x), "some rows converge, some do not: freezing is exercised"
    assert_same_search(by_hand, by_autograd)


def test_a_search_with_one_hot_groups_and_integers_by_hand_is_the_search_by_autograd():
    from datamodules.table import TableDataModule

    data = TableDataModule(Path(__file__).parent / "fixtures" / "loans.csv", target="approved")
    data.setup()
    model = trained(data.x_train, data.y_train, [16])
    x = data.x_test[:40]
    with torch.no_grad():
        target = 1 - model(x).argmax(1)
    lower, upper = data.domain()
    by_hand, by_autograd = both_ways(model, x, target, ECCo(lr=0.5), 0.7, 40, 0.3, None, lower, upper,
                                     feature_types=data.feature_types())
    assert_same_search(by_hand, by_autograd)
