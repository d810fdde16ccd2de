"""The compiled search step (``search_compile``): its formula against a by-hand computation, the compiled search
against the eager one and the autograd reference on circles and Adult- and MNIST-shaped data, the ``auto``
rule, the fallback when compilation fails, and a CT training that is the same with and without it."""

import shutil
import warnings

import pytest
import torch
from reference_search import search_counterfactuals as reference_search
from test_search_closed_form import CASES, trained_model

from ct_lightning.constraints import BOTH, DECREASE, INCREASE, NONE, Constraints
from ct_lightning.experiment.configuration.settings import validate_config
from ct_lightning.generators import ECCo, Generic
from ct_lightning.generators import compiled_step, native_search
from ct_lightning.generators.compiled_step import (AUTO_MIN_VALUES, GPU_COMPILE_SECONDS, GPU_SAVED_SECONDS_PER_VALUE,
                                                   CompiledStep, compile_pays, constrained_step,
                                                   set_expected_searches, set_search_compile, step_for)
from ct_lightning.generators.search import search_counterfactuals


@pytest.fixture(autouse=True)
def pytorch_loop():
    """The compiled step is the PyTorch loop's (a search whose loop runs natively has its own step)."""
    with native_search.python_loop_only():
        yield


@pytest.fixture
def compile_mode():
    """Set the process-wide mode for one test; restore the previous one after it."""
    previous = compiled_step.search_compile()
    yield set_search_compile
    set_search_compile(previous)


def by_hand(rows, x, grad, lr, lambda_cost, lower, upper, codes):
    """The step element by element in Python floats, from the rules as SPEC states them."""
    out, distance = [], []
    for r_row, x_row, g_row in zip(rows.tolist(), x.tolist(), grad.tolist()):
        new_row = []
        for d, (r, f, g) in enumerate(zip(r_row, x_row, g_row)):
            g = g + lambda_cost * ((r > f) - (r < f))
            kind = codes[d]
            if kind == NONE or (kind == INCREASE and g > 0) or (kind == DECREASE and g < 0):
                g = 0.0
            v = min(max(r - lr * g, lower[d]), upper[d])
            v = max(v, f) if kind == INCREASE else min(v, f) if kind == DECREASE else f if kind == NONE else v
            new_row.append(v)
        out.append(new_row)
        distance.append(max(abs(v - f) for v, f in zip(new_row, x_row)))
    return torch.tensor(out), torch.tensor(distance)


def test_constrained_step_is_the_rules_by_hand():
    generator = torch.Generator().manual_seed(0)
    codes = [BOTH, INCREASE, DECREASE, NONE] * 2
    rows, x = torch.randn(5, 8, generator=generator), torch.randn(5, 8, generator=generator)
    x[0, :4] = rows[0, :4]  # x' = x: no cost gradient
    grad = torch.randn(5, 8, generator=generator)
    lower, upper = torch.full((8,), -0.8), torch.full((8,), 0.9)
    limits = Constraints(torch.tensor(codes), lower, upper)
    moved, distance = constrained_step(rows, x, grad, torch.tensor(0.3), torch.tensor(0.05), limits)
    expected, expected_distance = by_hand(rows, x, grad, 0.3, 0.05, lower.tolist(), upper.tolist(), codes)
    torch.testing.assert_close(moved, expected)
    torch.testing.assert_close(distance, expected_distance)
    assert not torch.equal(moved, rows)


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="no C++ compiler: torch.compile cannot build")
@pytest.mark.parametrize("generator", [ECCo(), Generic(), ECCo(lambda_cost=0.0)], ids=["ecco", "generic", "no-cost"])
@pytest.mark.parametrize("case", ["circles", "adult-shaped", "mnist-shaped"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "masked"])
def test_compiled_search_returns_the_eager_search(case, generator, packed, compile_mode):
    architecture, x, y, n_classes, mutability, lower, upper = CASES[case]()
    model = trained_model(architecture, x, y, n_classes)
    with torch.no_grad():
        target = (model(x).argmax(1) + 1 + torch.randint(n_classes - 1, (len(y),),
                                                          generator=torch.Generator().manual_seed(3))) % n_classes
    results = {}
    for mode in ("on", "off"):
        compile_mode(mode)
        with warnings.catch_warnings():  # a failed compilation falls back to the eager step: nothing compared then
            warnings.filterwarnings("error", message="search_compile: torch.compile failed")
            results[mode] = search_counterfactuals(model, x, target, generator, 0.75, 30, 0.3, mutability, lower,
                                                   upper, packed=packed, check_every=5)
    assert compiled_step._shared_step().compiled is not None
    compiled, eager = results["on"], results["off"]
    old = reference_search(model, x, target, generator, 0.75, 30, 0.3, mutability, lower, upper)
    for result in (eager, old):
        assert torch.equal(compiled.converged, result.converged) and torch.equal(compiled.steps, result.steps)
        assert torch.equal(compiled.nascent_steps, result.nascent_steps)
    torch.testing.assert_close(compiled.counterfactual, eager.counterfactual, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled.nascent, eager.nascent, rtol=1e-6, atol=1e-6)
    # Rows froze at different steps (the packed loop repacked them) and some used every step.
    assert 0 < int(compiled.converged.sum()) < len(y) or case == "circles"
    assert len(compiled.steps.unique()) > 2


def test_compiled_search_runs_inside_inference_mode(compile_mode):
    """Lightning validates under inference mode; the search (and its compiled step) must still work there."""
    compile_mode("on")
    architecture, x, y, n_classes, mutability, lower, upper = CASES["adult-shaped"]()
    model = trained_model(architecture, x, y, n_classes)
    target = 1 - y
    with torch.inference_mode():
        inside = search_counterfactuals(model, x, target, ECCo(), 0.75, 30, 0.3, mutability, lower, upper)
    outside = search_counterfactuals(model, x, target, ECCo(), 0.75, 30, 0.3, mutability, lower, upper)
    assert torch.equal(inside.steps, outside.steps)
    # The same compiled kernel on the same shapes, with and without inference mode: bit for bit.
    torch.testing.assert_close(inside.counterfactual, outside.counterfactual, rtol=0, atol=0)


def test_auto_compiles_only_large_pools(compile_mode):
    compile_mode("auto")
    assert step_for(AUTO_MIN_VALUES - 1) is None and step_for(AUTO_MIN_VALUES) is not None
    compile_mode("off")
    assert step_for(10 * AUTO_MIN_VALUES) is None
    compile_mode("on")
    assert step_for(1) is not None


@pytest.fixture
def expected_searches():
    """Set the process-wide expected search count for one test; restore the previous one after it."""
    previous = compiled_step.expected_searches()
    yield set_expected_searches
    set_expected_searches(previous)


def test_auto_on_the_cpu_ignores_the_expected_searches(compile_mode, expected_searches):
    compile_mode("auto")
    for count in (None, 0, 1, 10**6):
        expected_searches(count)
        assert step_for(AUTO_MIN_VALUES - 1, "cpu") is None and step_for(AUTO_MIN_VALUES, "cpu") is not None


def test_auto_on_a_gpu_compiles_when_the_expected_searches_save_more_than_a_compilation(compile_mode,
                                                                                      expected_searches):
    mnist = 5_000 * 784
    saved_per_search = mnist * GPU_SAVED_SECONDS_PER_VALUE  # 12 ms, issue 27's H100 measurement
    assert saved_per_search == pytest.approx(0.012)
    pays_after = GPU_COMPILE_SECONDS / saved_per_search  # ~883 searches of an MNIST pool
    assert not compile_pays(mnist, "cuda", 100) and not compile_pays(mnist, "cuda", int(pays_after))
    assert compile_pays(mnist, "cuda", int(pays_after) + 1) and compile_pays(mnist, "cuda", 5_000)
    assert not compile_pays(mnist, "cuda", None)  # unknown: a compilation costs as much as ~900 searches save
    assert not compile_pays(AUTO_MIN_VALUES - 1, "cuda", 10**9)  # below the CPU's threshold too
    compile_mode("auto")
    expected_searches(100)  # the paper's 100 epochs, pool=epoch
    assert step_for(mnist, "cuda") is None and step_for(mnist, "cpu") is not None
    expected_searches(2_000)
    assert step_for(mnist, "cuda") is not None
    compile_mode("on")
    expected_searches(None)
    assert step_for(mnist, "cuda") is not None
    compile_mode("off")
    expected_searches(10**6)
    assert step_for(mnist, "cuda") is None


def test_expected_searches_count_the_runs_searches():
    from types import SimpleNamespace

    from ct_lightning.experiment.runs.train import expected_searches as count

    data = SimpleNamespace(train_tensors=(torch.zeros(95, 2), torch.zeros(95)), batch_size=10)
    base = {"objective": "full", "pool": "epoch", "max_epochs": 7, "limit_train_batches": None}
    assert count(base, data) == 7
    assert count({**base, "pool": "step"}, data) == 7 * 10  # ceil(95 / 10) steps per epoch
    assert count({**base, "pool": "step", "limit_train_batches": 3}, data) == 7 * 3
    assert count({**base, "objective": "vanilla"}, data) == 0
    with pytest.raises(ValueError, match="expected searches"):
        set_expected_searches(-1)


def test_an_unknown_mode_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"search_compile: 'fast' is not allowed; allowed: auto, on, off"):
        set_search_compile("fast")
    with pytest.raises(ValueError, match=r"search_compile.*'fast'.*auto, on, off"):
        validate_config({"search_compile": "fast"})


def test_a_failing_compiler_warns_once_and_steps_eagerly():
    def broken_backend(graph, example_inputs):
        raise RuntimeError("no compiler here")

    generator = torch.Generator().manual_seed(1)
    rows, x, grad = (torch.randn(6, 3, generator=generator) for _ in range(3))
    args = (rows, x, grad, torch.tensor(0.1), torch.tensor(0.01), Constraints(None))
    assert_warns_once_then_eager(CompiledStep(backend=broken_backend), args,
                                 "search_compile: torch.compile failed .*no compiler here")


def assert_warns_once_then_eager(step: CompiledStep, args: tuple, warning: str) -> None:
    """``step`` warns ``warning`` at its first call, not at its second, and both return the eager step's results."""
    with pytest.warns(RuntimeWarning, match=warning):
        first = step(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = step(*args)
    expected = constrained_step(*args)
    for result in (first, second):
        assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])


def test_the_step_at_the_factuals_runs_compiled():
    """At the first step the points are the factuals themselves: that step runs in the compiled kernel too (as a
    view of the factuals, so no variant of its own), with the eager step's results up to rounding."""
    calls = []

    def counting_backend(graph, example_inputs):
        def run(*args):
            calls.append(len(args))
            return graph(*args)
        return run

    step = CompiledStep(backend=counting_backend)
    generator = torch.Generator().manual_seed(3)
    x, grad = (torch.randn(6, 3, generator=generator) for _ in range(2))
    args = (x, x, grad, torch.tensor(0.1), torch.tensor(0.01), Constraints(None, torch.full((3,), -0.5), None))
    result = step(*args)
    assert len(calls) == 1
    expected = constrained_step(*args)
    torch.testing.assert_close(result, expected)  # compiled against eager: up to rounding on other CPUs


@pytest.mark.slow
def test_ct_training_is_the_same_with_the_compiled_step(tmp_path):
    """A short CT run on circles with the step compiled and eager: the same weights and metrics."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.checkpoints import read_checkpoint
    from ct_lightning.experiment.runs.train import train

    runs = {}
    try:
        for mode in ("on", "off"):
            summary = train({"data": "circles", "max_epochs": 2, "nce": 300, "progress": False,
                             "search_compile": mode, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "checkpoint_dir": str(tmp_path / mode)})
            runs[mode] = summary, read_checkpoint(summary["checkpoints"]["last"])[0]
    finally:
        set_search_compile("auto")
    (on, on_weights), (off, off_weights) = runs["on"], runs["off"]
    # Compiled against eager: other kernels (fused, possibly with FMA), so equal up to rounding, not bit for bit.
    assert on_weights.keys() == off_weights.keys()
    for key in off_weights:
        torch.testing.assert_close(on_weights[key], off_weights[key], rtol=1e-5, atol=1e-6, msg=key)

    def measured(metrics):  # everything but timings
        return {key: value for key, value in metrics.items() if not key.endswith("_seconds")}

    assert measured(on["metrics"]).keys() == measured(off["metrics"]).keys() and "train/div" in on["metrics"]
    assert measured(on["metrics"]) == pytest.approx(measured(off["metrics"]), rel=1e-5, abs=1e-6)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(on["run_id"]).data.params["search_compile"] == "on"


def test_one_compiled_kernel_serves_every_step_of_a_search():
    """Recompiling costs seconds in the middle of a search: the step at the factuals (points aliasing them),
    a single row, and a row count equal to the feature count must not compile variants of their own."""
    from torch._dynamo.utils import counters

    step = CompiledStep()
    generator = torch.Generator().manual_seed(2)
    # float64: a variant no other test compiles (compiled code is cached per function), so exactly one is new.
    options = {"dtype": torch.float64}
    lower, upper = torch.full((7,), -1.0, **options), torch.full((7,), 1.0, **options)
    before = counters["stats"]["unique_graphs"]
    for n in (7, 5, 1, 9, 12, 3):  # first n == the feature count, as when a pool of 1 000 rows has 1 000 features
        x, grad = (torch.randn(n, 7, generator=generator, **options) for _ in range(2))
        for rows in (x, x + 0.1 * torch.randn(n, 7, generator=generator, **options)):
            args = (rows, x, grad, torch.tensor(0.25, **options), torch.tensor(0.001, **options),
                    Constraints(None, lower, upper))  # a new instance per call, as each search makes its own
            result, expected = step(*args), constrained_step(*args)
            torch.testing.assert_close(result, expected)  # compiled against eager: up to rounding
    assert counters["stats"]["unique_graphs"] - before == 1


CAPABILITY_PROBE = """
import torch
from ct_lightning.constraints import Constraints
from ct_lightning.generators.compiled_step import CompiledStep, constrained_step
generator = torch.Generator().manual_seed(0)
rows, x, grad = (torch.randn(700, 50, generator=generator) for _ in range(3))
limits = Constraints(None, torch.full((50,), -2.0), torch.full((50,), 2.0), torch.device("cpu"))
lr, cost = torch.tensor(0.1), torch.tensor(0.001)
compiled, eager = CompiledStep()(rows, x, grad, lr, cost, limits), constrained_step(rows, x, grad, lr, cost, limits)
print(torch.backends.cpu.get_cpu_capability(), int((compiled[0] != eager[0]).sum()), int((compiled[1] != eager[1]).sum()))
"""


@pytest.mark.slow  # two processes, each compiling once
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512", reason="needs a CPU with AVX-512 and AVX2")
def test_a_step_compiled_under_another_cpu_capability_is_not_read_back(tmp_path):
    """Torch's compiled-graph cache does not key kernels by the CPU capability they were made for: a step compiled
    under AVX-512 and read back by an AVX2 process (another node sharing the cache, ``ATEN_CPU_CAPABILITY=avx2``)
    returned wrong points. Each capability gets a cache folder of its own, so both processes compute the eager step."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    for capability in ("avx512", "avx2"):
        done = subprocess.run([sys.executable, "-c", CAPABILITY_PROBE], env={**env, "ATEN_CPU_CAPABILITY": capability},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [capability.upper(), "0", "0"], (done.stdout, done.stderr[-2000:])
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["avx2", "avx512"]


def test_the_step_compiles_into_its_capability_folder_after_the_environment_is_reset(tmp_path, monkeypatch):
    """A process that resets its environment after the first compilation (a test harness restoring os.environ did)
    still compiles into its capability's folder: torch reads the folder at each compilation, and the folder shared by
    every capability may hold another capability's kernels (it crashed the next search)."""
    import torch._dynamo

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    step = CompiledStep()
    capability = torch.backends.cpu.get_cpu_capability().lower()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # as a harness restoring the environment does
    torch._dynamo.reset()  # compile afresh
    rows, x = torch.randn(600, 500), torch.randn(600, 500)
    limits = Constraints(None, torch.full((500,), -2.0), torch.full((500,), 2.0))
    moved, _ = step(rows, x, torch.randn(600, 500), torch.tensor(0.1), torch.tensor(0.01), limits)
    assert moved.shape == rows.shape
    written = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {capability}, written


def test_no_scalar_kernel_where_aten_vectorises(tmp_path, monkeypatch):
    """Where Inductor's probe of the vector instructions fails in a process whose ATen kernels are vectorised, the step
    runs eagerly with one warning, and no kernel is written to the cache folder (a scalar one there took twice the
    eager step's time and was served to every later process)."""
    from torch._inductor import cpu_vec_isa

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("ATen's kernels are scalar here: a scalar compiled step is no slower")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: cpu_vec_isa.invalid_vec_isa)
    step = CompiledStep()
    generator = torch.Generator().manual_seed(5)
    rows, x, grad = (torch.randn(40, 7, generator=generator) for _ in range(3))
    args = (rows, x, grad, torch.tensor(0.1), torch.tensor(0.01), Constraints(None, torch.full((7,), -1.0), None))
    assert_warns_once_then_eager(step, args, "search_compile: Inductor found no vector instructions")
    assert step.compiled is None and not any(p.is_file() for p in tmp_path.rglob("*"))
