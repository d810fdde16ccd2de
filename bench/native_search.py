"""Issue 25 §4: the search against its bare passes, with the loop's own work in native code and without.

Run: ``PYTHONPATH=. .venv/bin/python bench/native_search.py [--data circles,adult,mnist] [--repeats 9]
[--out bench/native_search.json]``. One torch thread; the set-up of section 1 (``bench.search_bench.trained_pool``:
the paper's MLP after 3 vanilla epochs, pool 1000, ECCo, T = 30, domain ±3) in its two modes (``fixed-T``: τ = 1,
every row takes every step; ``converging``: the data set's τ). Timed, interleaved, medians of ``--repeats`` rounds:

- ``native``: ``search_counterfactuals`` as users run it (the loop's own work in ``native_search.c``);
- ``python``: the same search with its PyTorch loop (``native_search.python_loop_only``), under the default
  ``search_compile=auto`` (the step compiled on MNIST-sized pools): what the library did before;
- ``bare``: the bare passes (``bench.search_bench.bare_passes``: autograd, plain cross-entropy, the same rows per
  iteration), the limit a search cannot beat. The target is ``native`` ≤ ×1.5 of it.

Each mode also checks that the native search's results equal the PyTorch loop's with its eager step
(``search_compile=off``) to the bit. Not a unit test.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIELDS = ("counterfactual", "nascent", "converged", "steps", "nascent_steps")


def measure(name: str, repeats: int) -> list[dict]:
    """Both modes on data set ``name``."""
    import torch

    from bench.search_bench import MAX_STEPS, bare_passes, ecco_modes, pass_schedule
    from ct_lightning.generators import compiled_step, native_search
    from ct_lightning.generators.search import search_counterfactuals

    model, x, target, generator, modes = ecco_modes(name)
    rows = []
    for mode, tau, kwargs in modes:
        native = search_counterfactuals(model, x, target, generator, **kwargs)
        compiled_step.set_search_compile("off")
        with native_search.python_loop_only(packed_as_native=True):
            eager = search_counterfactuals(model, x, target, generator, **kwargs)
        compiled_step.set_search_compile("auto")
        identical = all(torch.equal(getattr(native, f), getattr(eager, f)) for f in FIELDS)
        schedule = pass_schedule(native.steps, MAX_STEPS)

        def python_loop():
            with native_search.python_loop_only():
                search_counterfactuals(model, x, target, generator, **kwargs)

        runs = {"native": lambda: search_counterfactuals(model, x, target, generator, **kwargs),
                "python": python_loop, "bare": lambda: bare_passes(model, x, target, schedule)}
        for run in runs.values():  # warm-up (compilation on MNIST)
            run()
        seconds = {key: [] for key in runs}
        for _ in range(repeats):
            for key, run in runs.items():
                start = time.perf_counter()
                run()
                seconds[key].append(time.perf_counter() - start)
        median = {key: statistics.median(values) for key, values in seconds.items()}
        row = {"data": name, "mode": mode, "tau": tau, "iterations": len(schedule), "passes_rows": sum(schedule),
               "identical_to_pytorch_loop": identical, **{f"{k}_ms": v * 1e3 for k, v in median.items()},
               "native_over_bare": median["native"] / median["bare"],
               "python_over_bare": median["python"] / median["bare"],
               "speedup": median["python"] / median["native"], "threads": torch.get_num_threads()}
        rows.append(row)
        print(f"{name:8} {mode:10} native ×{row['native_over_bare']:.2f} of bare ({row['bare_ms']:.2f} ms), "
              f"PyTorch loop ×{row['python_over_bare']:.2f}; ×{row['speedup']:.2f} faster; identical: {identical}",
              flush=True)
    return rows


def main() -> None:
    from bench.common import run_per_data_set

    run_per_data_set(__doc__, "native_search.json", measure)


if __name__ == "__main__":
    main()
