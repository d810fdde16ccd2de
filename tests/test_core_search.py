"""Batched counterfactual search: exact steps, mutability, domain, convergence and nascent CEs."""

import pytest
import torch
from torch import nn

from ct_lightning.constraints import parse_mutability
from ct_lightning.generators import ECCo, Generic
from ct_lightning.generators.search import search_counterfactuals


def linear_model(weight, bias=(0.0, 0.0)) -> nn.Linear:
    model = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight))
        model.bias.copy_(torch.tensor(bias))
    return model


class CountingModel(nn.Module):
    """Wraps a model and counts forward calls."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def test_one_generic_step_by_hand():
    """x' = x − η·(Wᵀ(softmax(Wx) − e_{y⁺}) + λ·sign(x' − x)), sign(0) = 0 at the start."""
    weight = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    model = linear_model(weight.tolist())
    x, target = torch.tensor([[1.0, 0.0]]), torch.tensor([1])
    p = torch.softmax(weight @ x[0], 0)  # logits (1, −1)
    grad = weight.T @ (p - torch.tensor([0.0, 1.0]))
    expected = x[0] - 0.5 * grad
    result = search_counterfactuals(model, x, target, Generic(lambda_cost=0.1, lr=0.5), tau=0.999, max_steps=1)
    assert result.counterfactual[0].tolist() == pytest.approx(expected.tolist())
    assert result.steps.tolist() == [1]


def test_batched_search_equals_per_instance_search():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(12, 3)
    target = (model(x).argmax(1) + 1) % 3
    kwargs = dict(tau=0.8, max_steps=25, epsilon=0.2)
    batched = search_counterfactuals(model, x, target, ECCo(), **kwargs)
    for i in range(len(x)):
        alone = search_counterfactuals(model, x[i:i + 1], target[i:i + 1], ECCo(), **kwargs)
        assert torch.allclose(alone.counterfactual, batched.counterfactual[i:i + 1], atol=1e-6)
        assert torch.allclose(alone.nascent, batched.nascent[i:i + 1], atol=1e-6)
        assert alone.steps.item() == batched.steps[i].item()
        assert alone.converged.item() == batched.converged[i].item()


def test_mutability_is_exact_and_domain_holds():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(300, 4) * 1.3
    target = 1 - model(x).argmax(1)
    codes = parse_mutability({"a": "none", "b": "increase", "c": "decrease"}, 4, ["a", "b", "c", "d"])
    lower, upper = torch.full((4,), -2.0), torch.full((4,), 2.0)
    result = search_counterfactuals(model, x, target, ECCo(lr=1.0), tau=0.99, max_steps=40,
                                    mutability=codes, lower=lower, upper=upper)
    cf = result.counterfactual
    assert torch.equal(cf[:, 0], x[:, 0])  # bit-identical
    assert (cf[:, 1] >= x[:, 1]).all() and (cf[:, 2] <= x[:, 2]).all()
    assert (result.nascent[:, 0] == x[:, 0]).all()
    # a feature that may move stays in the domain (the factual itself may lie outside it)
    assert ((cf[:, 3] >= -2.0) & (cf[:, 3] <= 2.0)).all()
    inside = (x[:, 1:3].abs() <= 2.0).all(1)
    assert ((cf[inside, 1:3] >= -2.0) & (cf[inside, 1:3] <= 2.0)).all()
    assert (cf[:, 1:] != x[:, 1:]).any(), "the search should have moved something"


def test_converges_on_separable_problem_and_stops_early():
    torch.manual_seed(2)
    x = torch.cat([torch.randn(200, 2) * 0.5 + 2, torch.randn(200, 2) * 0.5 - 2])
    model = CountingModel(linear_model([[1.0, 1.0], [-1.0, -1.0]]))
    target = 1 - model(x).argmax(1)
    model.calls = 0
    result = search_counterfactuals(model, x, target, Generic(), tau=0.5, max_steps=100)
    with torch.no_grad():
        validity = (model.inner(result.counterfactual).argmax(1) == target).float().mean().item()
    assert validity >= 0.95
    assert result.converged.all()
    assert model.calls == result.steps.max().item() + 1 < 101  # stopped as soon as every row was done
    # converged rows froze: a longer budget gives the same result
    longer = search_counterfactuals(model, x, target, Generic(), tau=0.5, max_steps=200)
    assert torch.equal(longer.counterfactual, result.counterfactual)


def test_nascent_is_last_path_point_within_epsilon():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(64, 2)
    target = 1 - model(x).argmax(1)
    eps, steps = 0.15, 20
    gen = Generic(lr=0.1)
    result = search_counterfactuals(model, x, target, gen, tau=0.99, max_steps=steps, epsilon=eps)
    assert ((result.nascent - x).abs().amax(1) <= eps + 1e-7).all()
    # independent recomputation of the path with max_steps = t for each t
    expected, expected_t = x.clone(), torch.zeros(len(x), dtype=torch.long)
    for t in range(1, steps + 1):
        point = search_counterfactuals(model, x, target, gen, tau=0.99, max_steps=t).counterfactual
        moved = search_counterfactuals(model, x, target, gen, tau=0.99, max_steps=t).steps == t
        inside = moved & ((point - x).abs().amax(1) <= eps)
        expected[inside], expected_t[inside] = point[inside], t
    assert torch.allclose(result.nascent, expected)
    assert torch.equal(result.nascent_steps, expected_t)
    assert (result.nascent_steps > 0).any() and (result.nascent_steps < result.steps).any()


def test_search_leaves_model_untouched_and_works_in_inference_mode():
    model = nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    with torch.inference_mode():
        x = torch.randn(10, 2)
        target = torch.ones(10, dtype=torch.long)
        result = search_counterfactuals(model, x, target, ECCo(), tau=0.9, max_steps=5)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert result.counterfactual.shape == x.shape
