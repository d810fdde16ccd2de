"""Issue 25 §4: where a search's time goes beyond its bare passes, and how low a faster step could bring it.

Run: ``PYTHONPATH=. .venv/bin/python bench/search_parts.py [--data circles,adult,mnist] [--repeats 9]
[--out bench/search_parts.json]``. One torch thread; the set-up of section 1 (``bench.search_bench.trained_pool``:
the paper's MLP after 3 vanilla epochs, pool 1000, ECCo, T = 30, domain ±3) in its two modes (``fixed-T``: τ = 1,
every row takes every step; ``converging``: the data set's τ). Each search runs with its parts timed by wrapping the
library's own functions (a clock read per call, ~0.2 µs):

- ``passes``: the model's forward and input-gradient passes (``MLPPasses``: by hand, as the search runs them);
- ``logit_gradient``: τ-convergence and the loss's gradient at the logits (softmax, the penalty's gradient);
- ``step``: everything after the backward pass that moves the points: the ℓ1 cost's sign, the SGD step, the
  projection and the points' ℓ∞ distances (``FeatureSpace.advance`` and the rest of ``FeatureSpace.gradient``);
- ``loop``: the active-rows loop's own work: freezing rows, nascent points, repacking, the count of frozen rows
  (the whole search less the parts above and the last convergence check, ``reached``).

Each part is given as a multiple of the bare passes (``bench.search_bench.bare_passes``: autograd, plain
cross-entropy, the same rows per iteration), timed interleaved with the searches. ``without_step`` = the search's
ratio with its step free: the least a step fused into one native kernel could reach, which the target ×1.5 needs.
The PyTorch loop's parts (``native_search.python_loop_only``): since 2026-11-29 searches run the loop's own work
natively (``bench/native_search.py``). Not a unit test.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("passes", "logit_gradient", "step", "reached")


class PartClock:
    """Seconds spent in wrapped functions, by part; ``inside`` keeps a part from counting time of a nested one."""

    def __init__(self):
        self.seconds = dict.fromkeys(PARTS, 0.0)

    def wrap(self, owner, name: str, part: str):
        """Replace ``owner.name`` with a timed call that adds its seconds to ``part``; returns the original."""
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start

        setattr(owner, name, timed)
        return original


def measure(name: str, repeats: int) -> list[dict]:
    """Both modes on data set ``name``: the search's seconds, its parts' and the bare passes', medians of
    ``repeats`` interleaved rounds (the PyTorch loop: the parts it times are its functions)."""
    from ct_lightning.generators import native_search

    with native_search.python_loop_only():
        return _measure(name, repeats)


def _measure(name: str, repeats: int) -> list[dict]:
    import torch

    from bench.search_bench import MAX_STEPS, bare_passes, ecco_modes, pass_schedule
    from ct_lightning.generators import input_gradient, search

    model, x, target, generator, modes = ecco_modes(name)
    rows = []
    for mode, tau, kwargs in modes:
        result = search.search_counterfactuals(model, x, target, generator, **kwargs)  # warm-up and schedule
        schedule = pass_schedule(result.steps, MAX_STEPS)
        rounds = []
        for _ in range(repeats):
            clock = PartClock()
            originals = [(input_gradient.MLPPasses, "forward", clock.wrap(input_gradient.MLPPasses, "forward", "passes")),
                         (input_gradient.MLPPasses, "input_gradient",
                          clock.wrap(input_gradient.MLPPasses, "input_gradient", "passes")),
                         (search, "_logit_gradient", clock.wrap(search, "_logit_gradient", "logit_gradient")),
                         (search.FeatureSpace, "gradient", clock.wrap(search.FeatureSpace, "gradient", "step")),
                         (search.FeatureSpace, "advance", clock.wrap(search.FeatureSpace, "advance", "step")),
                         (search.FeatureSpace, "reached", clock.wrap(search.FeatureSpace, "reached", "reached"))]
            start = time.perf_counter()
            search.search_counterfactuals(model, x, target, generator, **kwargs)
            total = time.perf_counter() - start
            for owner, attribute, original in originals:
                setattr(owner, attribute, original)
            start = time.perf_counter()
            bare_passes(model, x, target, schedule)
            bare = time.perf_counter() - start
            parts = dict(clock.seconds)
            parts["step"] -= parts["passes"] + parts["logit_gradient"]  # gradient() holds the passes and the logits
            parts["loop"] = total - sum(parts.values())
            rounds.append({"total": total, "bare": bare, **parts})
        median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        ratios = {key: median[key] / median["bare"] for key in (*PARTS, "loop", "total")}
        row = {"data": name, "mode": mode, "tau": tau, "iterations": len(schedule), "passes_rows": sum(schedule),
               "bare_ms": median["bare"] * 1e3, "search_ms": median["total"] * 1e3,
               "ratio": ratios["total"], "parts_over_bare": ratios,
               "without_step": ratios["total"] - ratios["step"], "threads": torch.get_num_threads()}
        rows.append(row)
        print(f"{name:8} {mode:10} search ×{row['ratio']:.2f} of bare ({row['bare_ms']:.2f} ms): "
              + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items() if k != "total")
              + f"; without the step ×{row['without_step']:.2f}", flush=True)
    return rows


def main() -> None:
    from bench.common import run_per_data_set

    run_per_data_set(__doc__, "search_parts.json", measure)


if __name__ == "__main__":
    main()
