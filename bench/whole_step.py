"""A prototype, measured and not adopted: the whole search step of a plain MLP as one compiled function (issue 25 §4).

Run: ``PYTHONPATH=. .venv/bin/python bench/whole_step.py [--data circles,adult,mnist] [--repeats 7]
[--out bench/whole_step.json]``. One torch thread. Per data set, the paper's MLP trained briefly (as
``bench/input_gradient.py``) and a pool of 1 000 training rows with random targets; the fixed-T ECCo search
(τ = 1: every row takes all 30 steps), so every version does the same work each step:

- *search*: ``search_counterfactuals`` as it is (passes by hand, the step compiled on MNIST-sized pools);
- *whole, eager* and *whole, compiled*: one function for a whole step (forward, τ-check, the logits' gradient,
  backward to the inputs, the ℓ1 cost's sign, SGD step, domain clamp, the new points' ℓ∞ distances), run eagerly and
  through ``torch.compile(dynamic=True)``; and compiled with the softmax kept as PyTorch's own kernel (a custom op
  the compiler calls and cannot decompose). The search's nascent bookkeeping (a few small kernels a step) is left out,
  so the whole-step versions are a lower bound of what a search built on them would cost;
- *bare*: ``bench/search_bench.bare_passes`` (autograd, cross-entropy), issue 25 §4's yardstick.

Reported: ms per step, each over bare, the compile time, and how far each whole step's final points lie from the
search's and whether they equal them (Inductor's own softmax rounds differently from PyTorch's kernel).
Interleaved repeats, medians. Not a unit test.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _opaque_softmax():
    """Row softmax as a custom op that the compiler calls rather than decomposes: PyTorch's own kernel, so its
    rounding."""
    import torch

    if not hasattr(torch.ops, "ct_bench") or not hasattr(torch.ops.ct_bench, "softmax_rows"):
        @torch.library.custom_op("ct_bench::softmax_rows", mutates_args=(), schema="(Tensor logits) -> Tensor")
        def softmax_rows(logits):
            return logits.softmax(1)

        @softmax_rows.register_fake
        def _(logits):
            return torch.empty_like(logits)
    return torch.ops.ct_bench.softmax_rows


def whole_step_function(layers, opaque_softmax: bool = False):
    """``step(rows, x, target, tau, lr, cost, energy_weight, lower, upper) -> (done, moved, distance)`` for the plain
    MLP ``layers`` (``nn.Linear`` and ReLU), ECCo's closed-form gradient, the domain ``[lower, upper]``; with
    ``opaque_softmax`` the softmax is PyTorch's kernel even when compiled (:func:`_opaque_softmax`)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    softmax = _opaque_softmax() if opaque_softmax else (lambda logits: logits.softmax(1))

    params = [(layer.weight.detach(), layer.bias.detach()) if type(layer) is nn.Linear else None for layer in layers]

    def step(rows, x, target, tau, lr, cost, energy_weight, lower, upper):
        h, saved = rows, []
        for layer_params in params:
            h = F.linear(h, *layer_params) if layer_params is not None else torch.relu(h)
            saved.append(h)
        logits, column = h, target[:, None]
        probs = softmax(logits)
        done = probs.gather(1, column).squeeze(1) >= tau
        energy = -logits.gather(1, column).squeeze(1)
        grad = probs.scatter_add(1, column, (-energy_weight * (1.0 + 2e-3 * energy) - 1.0)[:, None])
        for layer_params, output in zip(reversed(params), reversed(saved)):
            grad = grad.mm(layer_params[0]) if layer_params is not None else \
                torch.ops.aten.threshold_backward(grad, output, 0)
        grad = grad + cost * torch.sign(rows - x)
        moved = (rows - lr * grad).clamp(lower, upper)
        offset = moved - x
        return done, moved, torch.maximum(offset.amax(1), -offset.amin(1))

    return step


def measure(name: str, repeats: int) -> dict:
    """Per step of the fixed-T search: the search, the whole step eager and compiled, and the bare passes."""
    import torch
    import torch.fx.experimental._config as torch_fx_config

    from bench.search_bench import EPSILON, MAX_STEPS, bare_passes, trained_pool
    from ct_lightning.generators import make_generator
    from ct_lightning.generators.search import search_counterfactuals

    datamodule, model, x, target, lower, upper = trained_pool(name)
    generator = make_generator("ecco")
    eager = whole_step_function(list(model))
    compiled = torch.compile(eager, dynamic=True)
    compiled_opaque = torch.compile(whole_step_function(list(model), opaque_softmax=True), dynamic=True)
    no_duck_shape = torch_fx_config.patch(use_duck_shape=False)
    scalars = [torch.tensor(v) for v in (1.0, generator.lr, generator.lambda_cost)]
    weights = [torch.tensor(generator.energy_weight(s, MAX_STEPS)) for s in range(MAX_STEPS)]

    def run_whole(function):
        rows = x.detach()  # a view: the first step's points are the factuals
        for s in range(MAX_STEPS):
            _, rows, _ = function(rows, x, target, scalars[0], scalars[1], scalars[2], weights[s], lower, upper)
        return rows

    def run_compiled(function=compiled):
        with no_duck_shape:
            return run_whole(function)

    def search():
        return search_counterfactuals(model, x, target, generator, tau=1.0, max_steps=MAX_STEPS, epsilon=EPSILON,
                                      lower=lower, upper=upper).counterfactual

    with torch.no_grad():
        started = time.perf_counter()
        from_compiled = run_compiled()
        compile_seconds = time.perf_counter() - started
        from_opaque = run_compiled(compiled_opaque)
        from_search, from_eager = search(), run_whole(eager)
        parts = {"search": search, "whole_eager": lambda: run_whole(eager), "whole_compiled": run_compiled,
                 "whole_compiled_opaque_softmax": lambda: run_compiled(compiled_opaque),
                 "bare": lambda: bare_passes(model, x, target, [len(x)] * MAX_STEPS)}
        times = {key: [] for key in parts}
        for _ in range(repeats):
            for key, function in parts.items():
                started = time.perf_counter()
                function()
                times[key].append((time.perf_counter() - started) / MAX_STEPS)
    ms = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    return {"n_features": datamodule.n_features, "pool": len(x), "steps": MAX_STEPS, "ms_per_step": ms,
            "over_bare": {key: ms[key] / ms["bare"] for key in ms if key != "bare"},
            "compile_seconds": compile_seconds,
            "max_abs_difference_from_search": {
                "whole_eager": float((from_eager - from_search).abs().max()),
                "whole_compiled": float((from_compiled - from_search).abs().max()),
                "whole_compiled_opaque_softmax": float((from_opaque - from_search).abs().max())},
            "equals_search": {"whole_eager": bool(torch.equal(from_eager, from_search)),
                              "whole_compiled": bool(torch.equal(from_compiled, from_search)),
                              "whole_compiled_opaque_softmax": bool(torch.equal(from_opaque, from_search))}}


def describe(name: str, r: dict) -> str:
    """One data set's line."""
    return (f"{name}: ms a step " + ", ".join(f"{k} {v:.3f}" for k, v in r["ms_per_step"].items())
            + "; over bare " + ", ".join(f"{k} ×{v:.2f}" for k, v in r["over_bare"].items())
            + f"; compiled in {r['compile_seconds']:.1f} s; largest difference from the search "
            + ", ".join(f"{k} {v:.1e}" for k, v in r["max_abs_difference_from_search"].items()))


def main() -> None:
    """Measure each data set, print and write the JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.common import measure_data_sets

    measure_data_sets(__doc__, "whole_step.json", "circles,adult,mnist", 7, measure, describe)


if __name__ == "__main__":
    main()
