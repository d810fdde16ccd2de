"""The search loop's own work in native code (ct_lightning/generators/native_search.c) against its PyTorch loop.

Both run the same model passes on the same rows in the same order (the PyTorch loop dropping frozen rows when the
native one does: ``python_loop_only(packed_as_native=True)``), so they are compared to the bit: on any CPU the same
kernels then give the same values (this is not a comparison across batch shapes). The PyTorch loop runs with its
eager step (``search_compile=off``), the one the native step follows operation for operation.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ct_lightning.constraints import parse_mutability
from ct_lightning.generators import ECCo, Generic, compiled_step, native_search
from ct_lightning.generators.search import FeatureSpace, search_counterfactuals

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("counterfactual", "nascent", "converged", "steps", "nascent_steps")

pytestmark = pytest.mark.skipif(native_search.library() is None,
                                reason="no C compiler here: searches run their PyTorch loop")


@pytest.fixture(autouse=True)
def eager_step():
    previous = compiled_step.search_compile()
    compiled_step.set_search_compile("off")
    yield
    compiled_step.set_search_compile(previous)


def mlp(d: int, classes: int = 2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, classes)).eval()


class NotPlain(nn.Module):
    """A model that is no plain MLP: its passes run by autograd."""

    def __init__(self, d: int):
        super().__init__()
        self.inner = mlp(d, 3, seed=1)

    def forward(self, x):
        return self.inner(x) * 1.5


def both(model, x, target, generator, **kwargs):
    """The native search and the PyTorch loop's, with the native library checked to have run."""
    calls = []
    library = native_search.library()
    original = native_search._run

    def counted(*args):
        calls.append(1)
        return original(*args)

    native_search._run = counted
    try:
        native = search_counterfactuals(model, x, target, generator, **kwargs)
    finally:
        native_search._run = original
    assert calls and library is not None, "the native loop did not run"
    with native_search.python_loop_only(packed_as_native=True):
        python = search_counterfactuals(model, x, target, generator, **kwargs)
    return native, python


def assert_same(native, python):
    for field in FIELDS:
        assert torch.equal(getattr(native, field), getattr(python, field)), field


@pytest.mark.parametrize("generator", [ECCo(), Generic(), ECCo(lambda_cost=0.0), Generic(lambda_cost=0.05, lr=0.5)],
                         ids=["ecco", "generic", "no-cost", "large-cost"])
@pytest.mark.parametrize("tau", [0.6, 0.9, 1.0], ids=["converging", "slow", "fixed-T"])
def test_native_search_is_the_pytorch_loop_to_the_bit(generator, tau):
    d = 7
    x = torch.randn(300, d, generator=torch.Generator().manual_seed(4))
    target = torch.randint(0, 2, (300,), generator=torch.Generator().manual_seed(5))
    mutability = parse_mutability({0: "none", 1: "increase", 2: "decrease", 5: "increase"}, d)
    lower, upper = torch.full((d,), -1.5), torch.full((d,), 1.5)
    lower[3] = -0.2  # a bound some factuals lie outside: the projection moves them
    native, python = both(mlp(d), x, target, generator, tau=tau, max_steps=30, epsilon=0.2, mutability=mutability,
                          lower=lower, upper=upper)
    assert_same(native, python)
    if tau == 0.6:  # rows froze at many steps, the packing dropped some, some left the ε-ball
        assert len(native.steps.unique()) > 3 and 0 < int(native.converged.sum()) < len(x)
        assert bool(((native.nascent_steps > 0) & (native.nascent_steps < native.steps)).any())


@pytest.mark.parametrize("max_steps", [0, 1, 2])
def test_native_search_with_few_steps(max_steps):
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(6))
    target = torch.randint(0, 2, (50,), generator=torch.Generator().manual_seed(7))
    assert_same(*both(mlp(3), x, target, ECCo(), tau=0.5, max_steps=max_steps, epsilon=0.3))


@pytest.mark.parametrize("case", ["unbounded", "lower-only", "float64", "autograd-model", "one-row"])
def test_native_search_cases(case):
    d, n = 5, 120
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(8))
    target = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(9))
    model, kwargs = mlp(d), dict(tau=0.7, max_steps=25, epsilon=0.3)
    if case == "lower-only":
        kwargs["lower"] = torch.full((d,), -0.5)
    elif case == "float64":
        model, x = model.double(), x.double()
        kwargs.update(lower=torch.full((d,), -1.0, dtype=torch.float64),
                      upper=torch.full((d,), 1.0, dtype=torch.float64))
    elif case == "autograd-model":
        model = NotPlain(d).eval()
        target = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(9))
    elif case == "one-row":
        x, target = x[:1], target[:1]
    assert_same(*both(model, x, target, Generic(), **kwargs))


@pytest.mark.parametrize("mutable", [True, False], ids=["all-mutable", "integer-increases"])
def test_native_search_with_snapped_features(mutable):
    """One-hot groups and an integer feature: the points are snapped in PyTorch, the rest is native. With the integer
    feature only increasing, the snapping reads the packed rows' factuals (kept packed by the C as rows freeze)."""
    from datamodules.feature_types import FeatureTypes

    types = FeatureTypes(groups=[[0, 1, 2]], integers=[3], n_features=5)
    x = torch.zeros(80, 5)
    x[torch.arange(80), torch.randint(0, 3, (80,), generator=torch.Generator().manual_seed(1))] = 1.0
    x[:, 3] = torch.randint(0, 5, (80,), generator=torch.Generator().manual_seed(2)).float()
    x[:, 4] = torch.randn(80, generator=torch.Generator().manual_seed(3))
    target = torch.randint(0, 2, (80,), generator=torch.Generator().manual_seed(4))
    mutability = None if mutable else parse_mutability({3: "increase"}, 5)
    native, python = both(mlp(5), x, target, ECCo(), tau=0.7, max_steps=20, epsilon=0.3, feature_types=types,
                          mutability=mutability)
    assert_same(native, python)
    assert len(native.steps.unique()) > 3  # rows froze at several steps: the packing dropped some


def test_what_the_native_loop_does_not_take():
    """Searches it does not apply to run the PyTorch loop: another generator, per-row bounds, an accelerator's dtype."""
    x, target = torch.randn(20, 3), torch.randint(0, 2, (20,))
    from ct_lightning.constraints import Constraints

    def applies(generator, limits, rows=x):
        space = FeatureSpace(mlp(3), generator, limits)
        return native_search.native_search(space, rows, target, 0.7, 10, 0.3) is not None

    assert applies(ECCo(), Constraints(None))
    assert not applies(ECCo(), Constraints(None, torch.full((20, 3), -1.0), None))  # a bound per row
    assert not applies(ECCo(), Constraints(None), x.half())
    target32 = target.int()  # the C reads int64 classes: anything else goes to the PyTorch loop, which refuses it
    space = FeatureSpace(mlp(3), ECCo(), Constraints(None))
    assert native_search.native_search(space, x, target32, 0.7, 10, 0.3) is None
    with pytest.raises(RuntimeError, match="out of bounds"):  # a class the model has not: torch's error, as before,
        native_search.native_search(FeatureSpace(mlp(3), Generic(), Constraints(None)), x, torch.full((20,), 2),
                                    0.7, 10, 0.3)  # not a write out of bounds (Generic's penalty reads no logit)

    class OwnPenalty(ECCo):
        def penalty_gradient(self, logits, target, step, max_steps):
            return super().penalty_gradient(logits, target, step, max_steps)

    assert not applies(OwnPenalty(), Constraints(None))


def test_without_a_compiler_searches_run_their_pytorch_loop(tmp_path):
    """No C compiler on the PATH and an empty cache: no library, and the search still runs (the same results)."""
    script = ("import torch; from ct_lightning.generators import native_search, ECCo;"
              "from ct_lightning.generators.search import search_counterfactuals;"
              "assert native_search.library() is None;"
              "r = search_counterfactuals(torch.nn.Linear(3, 2), torch.randn(30, 3), torch.randint(0, 2, (30,)),"
              "                           ECCo());"
              "print('searched', len(r.steps))")
    env = {**os.environ, "PATH": str(tmp_path), "CT_LIGHTNING_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop("CC", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "searched 30" in out.stdout
    assert not (tmp_path / "cache" / "native").exists() or not any((tmp_path / "cache" / "native").iterdir())


def test_the_library_is_built_once_into_the_cache(tmp_path):
    """A fresh cache folder gets one library; a second process loads it without building."""
    script = ("from ct_lightning.generators import native_search as n; lib = n.library(); print(lib._name)")
    env = {**os.environ, "CT_LIGHTNING_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    built = sorted((tmp_path / "native").glob("*.so"))
    assert len(built) == 1 and first.stdout.strip() == str(built[0])
    stamp = built[0].stat().st_mtime_ns
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert second.stdout.strip() == str(built[0]) and built[0].stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "native").iterdir()] == [built[0].name]  # no scratch left behind


def test_a_native_search_sets_up_no_compiled_step():
    """With ``search_compile=on`` a search still takes its step natively, and torch.compile's set-up (0.7–1.6 s a
    process) is not paid for a compiled step it never calls."""
    script = ("import sys, torch; from ct_lightning.generators import ECCo, compiled_step;"
              "from ct_lightning.generators.search import search_counterfactuals;"
              "compiled_step.set_search_compile('on');"
              "search_counterfactuals(torch.nn.Linear(3, 2), torch.randn(30, 3), torch.randint(0, 2, (30,)), ECCo());"
              "print('dynamo imported:', 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dynamo imported: False" in out.stdout
