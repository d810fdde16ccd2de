"""Does ``torch.compile`` pay off for the counterfactual search on this machine? (issue 13)

Two parts of a search step, at the search's shapes (pool 1 000, the paper's MLP), eager against
``torch.compile(dynamic=True)`` (rows drop out as they converge, so the batch size changes):

* the model's forward and input-gradient backward (what the bare search runs every step);
* the step's elementwise work over the n×D pool (SGD step, ℓ1 cost gradient, domain clamp, the
  nascent ε-ball test), which a compiler can fuse into one kernel.

Also the one-off compile time; then the library's whole search with its compiled step
(``search_compile``, ``ct_lightning/generators/compiled_step.py``) off and on, at pools of 1 000 and 5 000.
Usage: ``python bench/compile_bench.py [--device cuda] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ct_lightning.models import build_model

SHAPES = {"circles": (2, 2), "adult": (108, 2), "mnist": (784, 10)}


def _median_ms(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def elementwise_step(x, grad, factual, lower, upper, lr: float, lambda_cost: float, epsilon: float):
    """The search step's work besides the model: SGD with the ℓ1 cost gradient, clamp, ε-ball test."""
    x = x - lr * (grad + lambda_cost * torch.sign(x - factual))
    x = torch.minimum(torch.maximum(x, lower), upper)
    nascent = (x - factual).abs().amax(dim=1) <= epsilon
    return x, nascent


def _problem(name: str, device: torch.device, rows: int):
    """The paper's MLP (seeded) for one data set's shapes, ``rows`` random factuals and targets, domain ±3."""
    n_features, n_classes = SHAPES[name]
    torch.manual_seed(0)
    model = build_model("mlp", n_features, n_classes, [32], "relu").to(device).eval()
    x = torch.randn(rows, n_features, device=device)
    target = torch.randint(n_classes, (rows,), device=device)
    lower, upper = torch.full((n_features,), -3.0, device=device), torch.full((n_features,), 3.0, device=device)
    return model, x, target, lower, upper


def measure(name: str, device: torch.device, rows: int = 1000, repeats: int = 30) -> dict:
    """Eager and compiled times of both parts for one data set's shapes; compile seconds."""
    model, x, target, lower, upper = _problem(name, device, rows)

    def passes(forward):
        def run():
            z = x.clone().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(forward(z), target, reduction="sum")
            torch.autograd.grad(loss, z)
        return run

    compiled_model = torch.compile(model, dynamic=True)
    compiled_step = torch.compile(elementwise_step, dynamic=True)
    started = time.perf_counter()
    passes(compiled_model)()
    compile_model_s = time.perf_counter() - started
    grad = torch.randn_like(x)
    started = time.perf_counter()
    compiled_step(x, grad, x, lower, upper, 0.1, 0.001, 0.3)
    compile_step_s = time.perf_counter() - started
    out = {"data": name, "rows": rows, "features": x.shape[1], "device": str(device),
           "model_eager_ms": _median_ms(passes(model), repeats, device),
           "model_compiled_ms": _median_ms(passes(compiled_model), repeats, device),
           "step_eager_ms": _median_ms(lambda: elementwise_step(x, grad, x, lower, upper, 0.1, 0.001, 0.3),
                                       repeats, device),
           "step_compiled_ms": _median_ms(lambda: compiled_step(x, grad, x, lower, upper, 0.1, 0.001, 0.3),
                                          repeats, device),
           "compile_model_s": compile_model_s, "compile_step_s": compile_step_s}
    print(f"{name}: model fwd+bwd eager {out['model_eager_ms']:.3f} ms, compiled {out['model_compiled_ms']:.3f} ms "
          f"(compile {compile_model_s:.1f} s); elementwise step eager {out['step_eager_ms']:.3f} ms, compiled "
          f"{out['step_compiled_ms']:.3f} ms (compile {compile_step_s:.1f} s)", flush=True)
    return out


def search_end_to_end(name: str, device: torch.device, pools=(1000, 5000), repeats: int = 7) -> list[dict]:
    """The library's search (ECCo, fixed T = 30: τ = 1, domain ±3) with ``search_compile`` off and on, interleaved
    ``repeats`` times after a first compiled call (which compiles, or loads torch's on-disk cache); outputs compared.
    Wall and CPU milliseconds (medians) per pool size."""
    from bench.common import median, timed
    from ct_lightning.generators import ECCo
    from ct_lightning.generators.compiled_step import search_compile, set_search_compile
    from ct_lightning.generators.search import search_counterfactuals

    previous = search_compile()
    out = []
    try:
        for rows in pools:
            model, x, target, lower, upper = _problem(name, device, rows)
            generator = ECCo()

            def search(mode: str):
                set_search_compile(mode)
                return search_counterfactuals(model, x, target, generator, 1.0, 30, 0.3, None, lower, upper)

            first = []
            with timed(first, device):
                compiled = search("on")
            eager = search("off")
            times = {"off": [], "on": []}
            for _ in range(repeats):
                for mode in times:
                    with timed(times[mode], device):
                        search(mode)
            row = {"data": name, "rows": rows, "features": x.shape[1], "first_compiled_call_s": first[0][0],
                   "search_eager_ms": 1e3 * median(w for w, _ in times["off"]),
                   "search_compiled_ms": 1e3 * median(w for w, _ in times["on"]),
                   "search_eager_cpu_ms": 1e3 * median(c for _, c in times["off"]),
                   "search_compiled_cpu_ms": 1e3 * median(c for _, c in times["on"]),
                   "max_abs_difference": float((compiled.counterfactual - eager.counterfactual).abs().max()),
                   "same_converged": bool(torch.equal(compiled.converged, eager.converged)
                                          and torch.equal(compiled.steps, eager.steps))}
            print(f"{name}: search (pool {rows}, fixed T) eager {row['search_eager_ms']:.1f} ms, compiled step "
                  f"{row['search_compiled_ms']:.1f} ms (CPU ×{row['search_compiled_cpu_ms'] / row['search_eager_cpu_ms']:.2f}; "
                  f"first call {row['first_compiled_call_s']:.1f} s); max |Δx'| {row['max_abs_difference']:.2e}",
                  flush=True)
            out.append(row)
    finally:
        set_search_compile(previous)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data", default="circles,adult,mnist")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    results = [measure(name, torch.device(args.device)) for name in args.data.split(",")]
    searches = [row for name in args.data.split(",") for row in search_end_to_end(name, torch.device(args.device))]
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": results,
                       "searches": searches}, handle,
                      indent=2)


if __name__ == "__main__":
    main()
