"""Why the search on MNIST stays near twice its bare passes: memory, measured (issue 25 §4).

Run: ``PYTHONPATH=. .venv/bin/python bench/search_memory.py [--data mnist] [--repeats 7]
[--out bench/search_memory.json]``. One torch thread. Three measurements:

- *streaming*: ``torch.add(a, b, out=c)`` over float32 vectors of growing length: elements per second while the three
  vectors fit the core's caches and once they do not (a search pool of 1 000 MNIST rows is 784 000 values, 3.1 MB
  a tensor);
- *bare passes, same or fresh input*: the bare passes of ``bench/search_bench.bare_passes`` (autograd, cross-entropy),
  which read one input tensor at every step, beside the same passes reading each step's input from another of four
  copies, as a search reads the points its last step wrote;
- *search step parts*: per step of the fixed-T search (τ = 1: every row takes all 30 steps) over the same pool, the
  search itself, its passes by hand and its compiled elementwise step (``constrained_step``) alone.

Interleaved repeats, medians. Not a unit test.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (10_000, 50_000, 200_000, 784_000, 3_000_000)


def clock(function, calls: int = 1) -> float:
    """Seconds per call of ``function`` over ``calls`` calls."""
    started = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - started) / calls


def streaming(repeats: int) -> dict:
    """Elements per second of an add into a kept output vector, by vector length."""
    import torch

    out = {}
    for length in LENGTHS:
        a, b, c = torch.rand(length), torch.rand(length), torch.empty(length)
        calls = max(5, 2_000_000 // length)
        times = [clock(lambda: torch.add(a, b, out=c), calls) for _ in range(repeats)]
        out[str(length)] = {"megabytes_per_vector": 4 * length / 1e6,
                            "giga_elements_per_s": length / statistics.median(times) / 1e9}
    return out


def measure(name: str, repeats: int) -> dict:
    """The bare passes on the same or fresh inputs, and the fixed-T search's step and its parts, per step."""
    import torch

    from bench.search_bench import EPSILON, MAX_STEPS, bare_passes, trained_pool
    from ct_lightning.constraints import Constraints
    from ct_lightning.generators import make_generator
    from ct_lightning.generators.compiled_step import CompiledStep
    from ct_lightning.generators.input_gradient import MLPPasses
    from ct_lightning.generators.search import search_counterfactuals

    datamodule, model, x, target, lower, upper = trained_pool(name)
    generator = make_generator("ecco")
    copies = [x + 0.0 for _ in range(4)]
    schedule = [len(x)]

    def fresh_bare() -> None:
        for step in range(MAX_STEPS):
            bare_passes(model, copies[step % 4], target, schedule)

    hand = MLPPasses(list(model))
    grad_logits = torch.randn(len(x), datamodule.n_classes)
    limits = Constraints(None, lower, upper, x.device, None)
    step = CompiledStep()
    lr, cost = torch.tensor(generator.lr), torch.tensor(generator.lambda_cost)
    grads = [torch.randn_like(x) for _ in range(4)]
    step(copies[1], x, grads[0], lr, cost, limits)  # compiled before timing

    def hand_passes() -> None:
        for i in range(MAX_STEPS):
            logits, saved = hand.forward(copies[i % 4])
            hand.input_gradient(saved, grad_logits)

    def compiled_steps() -> None:
        for i in range(MAX_STEPS):
            step(copies[i % 4], x, grads[i % 4], lr, cost, limits)

    def search() -> None:
        search_counterfactuals(model, x, target, generator, tau=1.0, max_steps=MAX_STEPS, epsilon=EPSILON,
                               lower=lower, upper=upper)

    parts = {"search": search, "bare_same_input": lambda: bare_passes(model, x, target, schedule * MAX_STEPS),
             "bare_fresh_input": fresh_bare, "hand_passes_fresh_input": hand_passes,
             "compiled_step": compiled_steps}
    times = {key: [] for key in parts}
    with torch.no_grad():
        search()
        for _ in range(repeats):
            for key, function in parts.items():
                times[key].append(clock(function) / MAX_STEPS)
    ms = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    return {"n_features": datamodule.n_features, "pool": len(x), "steps": MAX_STEPS, "ms_per_step": ms,
            "search_over_bare_same": ms["search"] / ms["bare_same_input"],
            "search_over_bare_fresh": ms["search"] / ms["bare_fresh_input"]}


def main() -> None:
    """Parse the options, measure, print and write the JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.common import script_parser, single_thread_quiet
    from bench.epoch_bench import quiet

    args = script_parser(__doc__, "search_memory.json", "mnist", 7).parse_args()
    single_thread_quiet()
    quiet()
    load_before = os.getloadavg()
    results = {"streaming": streaming(args.repeats)}
    for length, r in results["streaming"].items():
        print(f"add over {int(length):>9,} floats ({r['megabytes_per_vector']:.2f} MB a vector): "
              f"{r['giga_elements_per_s']:.2f} G elements/s", flush=True)
    for name in args.data.split(","):
        results[name] = r = measure(name, args.repeats)
        print(f"{name}: per step, ms: " + ", ".join(f"{k} {v:.2f}" for k, v in r["ms_per_step"].items())
              + f"; search / bare (same input) ×{r['search_over_bare_same']:.2f}, / bare (fresh input) "
              f"×{r['search_over_bare_fresh']:.2f}", flush=True)
    out = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": 1,
           "repeats": args.repeats, "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
