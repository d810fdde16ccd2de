"""The search with the penalties' gradients in closed form, packed (CPU) or masked (the accelerator path, with no
host sync inside a step; run here on CPU), returns what the autograd search of
commit c742175 (tests/helpers/reference_search.py) returns, up to floating-point rounding, on circles and on
Adult- and MNIST-shaped data, with constraints and domain bounds."""

import pytest
import torch
import torch.nn.functional as F
from reference_search import search_counterfactuals as reference_search

from ct_lightning.constraints import parse_mutability
from ct_lightning.generators import ECCo, Generic
from ct_lightning.generators.search import search_counterfactuals
from ct_lightning.models import build_model
from datamodules import get_datamodule


def trained_model(architecture, x, y, n_classes, epochs=3):
    torch.manual_seed(0)
    model = build_model(architecture, x.shape[1], n_classes)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for start in range(0, len(y), 50):
            optimiser.zero_grad()
            F.cross_entropy(model(x[start:start + 50]), y[start:start + 50]).backward()
            optimiser.step()
    return model.eval()


def circles():
    datamodule = get_datamodule("circles")
    datamodule.setup()
    x, y = datamodule.x_train[:600], datamodule.y_train[:600]
    lower, upper = datamodule.domain(3.0)
    return "mlp", x, y, 2, None, lower, upper


def adult_shaped():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(500, 12, generator=generator)
    y = (x[:, :3].sum(1) + 0.5 * torch.randn(500, generator=generator) > 0).long()
    mutability = parse_mutability({0: "none", 1: "increase", 2: "decrease"}, 12)
    return "mlp", x, y, 2, mutability, x.mean(0) - 3 * x.std(0), x.mean(0) + 3 * x.std(0)


def mnist_shaped(architecture):
    def make():
        generator = torch.Generator().manual_seed(2)
        y = torch.randint(10, (300,), generator=generator)
        prototypes = torch.rand(10, 784, generator=generator) * 2 - 1
        x = (prototypes[y] + 0.3 * torch.randn(300, 784, generator=generator)).clamp(-1, 1)
        return architecture, x, y, 10, None, torch.full((784,), -1.0), torch.full((784,), 1.0)
    return make


CASES = {"circles": circles, "adult-shaped": adult_shaped, "mnist-shaped": mnist_shaped("mlp"),
         "mnist-shaped-cnn": mnist_shaped("cnn")}


def assert_close_but_for_cost_flips(new, old, flip, steps, tolerance=1e-5, max_fraction=0.005):
    """Equal within ``tolerance``, except a few elements that differ by whole ℓ1 cost steps.

    The two searches compute the model's gradient with different operations (closed form against autograd), so
    their points differ in the last bits; where a feature of x' sits on its factual's value, that rounding can
    flip the sign of the cost's subgradient λ_cst·sign(x' − x), and the two paths step ``flip`` = lr·λ_cst apart
    from there (measured on AMD EPYC with MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default: 24 of 31 360 values
    of the CNN case, by 1-2 such steps). At most ``max_fraction`` of the values may do that, by at most
    ``steps`` flips; with λ_cst = 0 every value must be within ``tolerance``.
    """
    difference = (new - old).abs()
    off = difference > tolerance * (1 + old.abs())
    assert float(off.float().mean()) <= max_fraction, f"{int(off.sum())} of {off.numel()} values differ"
    assert float(difference.max()) <= tolerance * (1 + float(old.abs().max())) + steps * flip, \
        f"greatest difference {float(difference.max()):.3g} exceeds {steps} cost steps of {flip:.3g}"


@pytest.mark.parametrize("generator", [ECCo(), ECCo(lambda_cost=0.01, lambda_energy=1.0, lr=0.1), Generic(),
                                       ECCo(lambda_cost=0.0)], ids=["ecco", "ecco-other", "generic", "ecco-no-cost"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "masked"])
def test_closed_form_search_matches_the_autograd_search(case, generator, packed):
    architecture, x, y, n_classes, mutability, lower, upper = CASES[case]()
    model = trained_model(architecture, x, y, n_classes, epochs=1 if architecture == "cnn" else 3)
    n = 40 if architecture == "cnn" else len(y)
    x = x[:n]
    with torch.no_grad():
        target = (model(x).argmax(1) + 1 + torch.randint(n_classes - 1, (n,),
                                                          generator=torch.Generator().manual_seed(3))) % n_classes
    assert generator.has_closed_form()
    steps = 12 if architecture == "cnn" else 30
    new = search_counterfactuals(model, x, target, generator, 0.75, steps, 0.3, mutability, lower, upper,
                                 packed=packed, check_every=5)
    old = reference_search(model, x, target, generator, 0.75, steps, 0.3, mutability, lower, upper)
    assert torch.equal(new.converged, old.converged) and torch.equal(new.steps, old.steps)
    assert torch.equal(new.nascent_steps, old.nascent_steps)
    flip = generator.lr * generator.lambda_cost
    assert_close_but_for_cost_flips(new.counterfactual, old.counterfactual, flip, steps)
    assert_close_but_for_cost_flips(new.nascent, old.nascent, flip, steps)
    assert 0 < int(new.converged.sum()) or case == "mnist-shaped-cnn"
    assert not torch.equal(new.counterfactual, x)


def test_penalty_gradient_is_the_autograd_gradient_of_the_penalty():
    """The closed form against autograd for the penalty alone, at several steps."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(7, 3, generator=generator, requires_grad=True)
    x_cf = torch.randn(7, 5, generator=generator, requires_grad=True)
    x = x_cf.detach().clone()
    x[:, 0] += 0.5
    x[:, 1] = x_cf.detach()[:, 1]  # |x' − x| = 0: no gradient, as autograd's abs gives
    target = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    for ecco in (ECCo(), ECCo(lambda_cost=0.2, lambda_energy=2.0), Generic(lambda_cost=0.3)):
        for step in (0, 5, 29):
            penalty = ecco.penalty(x_cf, x, logits, target, step, 30).sum()
            d_logits, d_x = torch.autograd.grad(penalty, (logits, x_cf), allow_unused=True)
            target_logit, lambda_cost = ecco.penalty_gradient(logits.detach(), target, step, 30)
            expected = torch.zeros(7, 3)
            if target_logit is not None:
                expected.scatter_(1, target[:, None], target_logit[:, None])
            torch.testing.assert_close(d_logits if d_logits is not None else torch.zeros(7, 3), expected)
            torch.testing.assert_close(d_x, lambda_cost * torch.sign(x_cf.detach() - x))


def test_a_subclass_overriding_only_the_penalty_is_searched_with_autograd():
    class Squared(ECCo):
        def penalty(self, x_cf, x, logits, target, step, max_steps):
            return (x_cf - x).square().sum(1)

    assert ECCo().has_closed_form() and Generic().has_closed_form()
    assert not Squared().has_closed_form()
    torch.manual_seed(0)
    model = build_model("mlp", 2, 2).eval()
    x = torch.randn(20, 2)
    target = torch.randint(2, (20,))
    new = search_counterfactuals(model, x, target, Squared(), 0.75, 10, 0.3)
    old = reference_search(model, x, target, Squared(), 0.75, 10, 0.3)
    # The same autograd arithmetic as the reference; the packed loop keeps frozen rows a while (REPACK_SHARE), so
    # its matrix products may run over other row counts, which may round differently on another CPU.
    assert torch.equal(new.steps, old.steps) and torch.equal(new.converged, old.converged)
    torch.testing.assert_close(new.counterfactual, old.counterfactual, rtol=1e-5, atol=1e-5)


def test_check_every_must_be_positive():
    model = build_model("mlp", 2, 2).eval()
    with pytest.raises(ValueError, match="check_every: must be at least 1, got 0"):
        search_counterfactuals(model, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), ECCo(), packed=False,
                               check_every=0)
