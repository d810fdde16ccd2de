"""The contract every registered counterfactual generator fulfils, checked over the whole registry."""

import pytest
import torch
from torch import nn

from ct_lightning.constraints import FeatureTypes, parse_mutability
from ct_lightning.generators import GENERATORS, FitContext, generate_counterfactuals, make_generator, prepare_standalone

FEATURES = ["income", "age", "colour=red", "colour=blue"]
# Small settings so that generators that learn from data fit in a moment; a generator not listed runs with its defaults.
TINY_OPTIONS = {
    "revise": dict(latent_dim=2, vae_hidden_sizes=[8], vae_epochs=1, use_cache=False),
    "amortised": dict(initial_epochs=2, batch_size=64, hidden_sizes=[16], max_fit_samples=256),
    "sns": dict(steps=3),
}


def tiny_data(n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = torch.Generator().manual_seed(seed)
    continuous = torch.randn(n, 2, generator=rng)
    red = (torch.rand(n, generator=rng) < 0.5).float()
    x = torch.cat([continuous, red[:, None], 1 - red[:, None]], 1)
    return x, (continuous.sum(1) > 0).long()


def tiny_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def build_and_generate(name: str, model: nn.Module, inference: bool = False, types: FeatureTypes | None = None):
    """Seed, build, fit on the tiny training data and generate for 32 factuals (with ``types``: feature types)."""
    x_train, y_train = tiny_data()
    codes = parse_mutability({"age": "none", "income": "increase"}, 4, FEATURES)
    lower, upper = torch.tensor([-2.0, -2.0, 0.0, 0.0]), torch.tensor([2.0, 2.0, 1.0, 1.0])
    torch.manual_seed(0)
    generator = make_generator(name, **TINY_OPTIONS.get(name, {}))
    context = FitContext(model=model, x_train=x_train, y_train=y_train, n_classes=2, feature_names=FEATURES,
                         mutability=codes, lower=lower, upper=upper, name="contract")
    if getattr(generator, "needs_fit", False):
        with pytest.raises(RuntimeError):
            generator.generate(model, x_train[:4], torch.zeros(4, dtype=torch.long))
    prepare_standalone(generator, context)
    x = x_train[:32].clamp(-2.0, 2.0)
    with torch.no_grad():
        target = 1 - model(x).argmax(1)
    # With feature types, through the one entry point that makes any generator's output valid.
    def run():
        if types is None:
            return generator.generate(model, x, target, 0.6, 5, 0.3, codes, lower, upper)
        return generate_counterfactuals(generator, model, x, target, 0.6, 5, 0.3, codes, lower, upper, types)

    if inference:
        with torch.inference_mode():
            result = run()
    else:
        result = run()
    return x, target, codes, lower, upper, result


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generator_contract(name):
    model = tiny_model()
    model.train()
    flags = [p.requires_grad for p in model.parameters()]
    x, target, codes, lower, upper, result = build_and_generate(name, model, inference=True)
    n = len(x)
    # Shapes and types.
    assert result.counterfactual.shape == (n, 4) and result.nascent.shape == (n, 4)
    assert result.converged.shape == (n,) and result.converged.dtype == torch.bool
    assert result.steps.shape == (n,) and result.nascent_steps.shape == (n,)
    assert torch.isfinite(result.counterfactual).all()
    # Mutability and domain hold exactly, for the mature and the nascent counterfactuals.
    for points in (result.counterfactual, result.nascent):
        assert torch.equal(points[:, 1], x[:, 1]), "an immutable feature moved"
        assert (points[:, 0] >= x[:, 0]).all(), "an increase-only feature decreased"
        assert (points >= lower).all() and (points <= upper).all(), "a point left the domain"
    # Inference mode was left for the search and the model is untouched: mode, flags, no gradients.
    assert model.training
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    # Deterministic under a seed.
    again = build_and_generate(name, tiny_model(), inference=False)[-1]
    assert torch.equal(result.counterfactual, again.counterfactual)
    assert torch.equal(result.converged, again.converged)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generator_contract_feature_types(name):
    """Every generator, through ``generate_counterfactuals``, returns real categories (the colour group is one
    category), with convergence judged at those points (integers: tests/test_categorical.py, whose factuals are
    whole numbers; built-in generators take ``feature_types`` themselves, a new one is snapped afterwards)."""
    types = FeatureTypes.from_names(FEATURES)
    model = tiny_model()
    x, target, codes, lower, upper, result = build_and_generate(name, model, inference=True, types=types)
    for points in (result.counterfactual, result.nascent):
        colour = points[:, 2:]
        assert ((colour == 0) | (colour == 1)).all() and torch.equal(colour.sum(1), torch.ones(len(x)))
        assert torch.equal(points[:, 1], x[:, 1]) and (points[:, 0] >= x[:, 0]).all()
    with torch.no_grad():
        probability = model(result.counterfactual).softmax(1).gather(1, target[:, None]).squeeze(1)
    assert torch.equal(result.converged, probability >= 0.6)


def test_registry_names_match_and_unknown_names_are_errors():
    for name, factory in GENERATORS.items():
        generator = make_generator(name, **TINY_OPTIONS.get(name, {}))
        assert generator.config()["generator"].split("+")[0] in (name, "ecco"), name
    with pytest.raises(ValueError, match="generator: unknown 'nope'; allowed: "):
        make_generator("nope")


NEW_GENERATOR = '''"""Random points near the factual, projected onto the constraints (a generator in one file)."""

import torch

from ct_lightning.constraints import Constraints
from ct_lightning.generators.base import CounterfactualGenerator, SearchResult
from ct_lightning.generators.registry import register_generator
from ct_lightning.generators.search import target_reached


@register_generator("noisy")
class Noisy(CounterfactualGenerator):
    def __init__(self, lambda_cost=0.001, lr=0.25, scale=0.1):
        self.scale = scale

    def config(self):
        return {"generator": self.name, "scale": self.scale}

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None, lower=None,
                 upper=None):
        x_cf = Constraints(mutability, lower, upper, x.device).project(x + self.scale * torch.randn_like(x), x)
        with torch.no_grad():
            converged = target_reached(model(x_cf), target, tau)
        inside = (x_cf - x).abs().amax(1) <= epsilon
        zeros = torch.zeros(len(x), dtype=torch.long, device=x.device)
        return SearchResult(x_cf, torch.where(inside[:, None], x_cf, x), converged, zeros, zeros)
'''


@pytest.mark.slow
def test_a_new_generator_is_one_new_file(tmp_path):
    """A generator file dropped into (a copy of) the package, nothing else: it is registered, the command lines'
    catalogue (read from the source, without torch) lists it, and this contract test checks it."""
    import os
    import subprocess
    import sys

    from package_copy import ROOT, copy_package, run_with_copy

    (copy_package(tmp_path) / "generators" / "noisy.py").write_text(NEW_GENERATOR)
    catalogue = run_with_copy(tmp_path, "import json, sys; from ct_lightning.experiment.configuration import catalogue; "
                                        "print(json.dumps([catalogue.generators(), 'torch' in sys.modules]))")
    assert catalogue == [["amortised", "ecco", "generic", "noisy", "revise", "sns"], False]
    registry = run_with_copy(tmp_path, "import json; from ct_lightning.generators import GENERATORS, make_generator; "
                                       "noisy = make_generator('noisy', scale=0.2); "
                                       "print(json.dumps([sorted(GENERATORS), noisy.config()]))")
    assert registry == [catalogue[0], {"generator": "noisy", "scale": 0.2}]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "noisy or registry",
                           str(ROOT / "tests" / "test_generator_contract.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout[-3000:]
