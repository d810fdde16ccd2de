"""The search's model passes by hand (``ct_lightning/generators/input_gradient.py``) against autograd.

Run: ``PYTHONPATH=. .venv/bin/python bench/input_gradient.py [--data circles,adult,mnist] [--repeats 7]
[--out bench/input_gradient.json]``. One torch thread. Per data set, the paper's MLP trained briefly (3 vanilla
epochs, as ``bench/run.py``'s search section does) and a pool of 1 000 training rows with random targets:

- *passes*: one forward and one input-gradient pass over the 1 000 rows, by hand and by autograd;
- *search*: ``search_counterfactuals`` (ECCo, T = 30, the data set's τ: converging; τ = 1: fixed-T), by hand and
  inside ``autograd_only()``; the results must be identical (``same``);
- *bare*: the search's forward+backward passes and nothing else (``bench/search_bench.bare_passes``: autograd,
  cross-entropy), the reference of issue 25 §4's "search ≤ 1.5× bare", and the same passes by hand.

Interleaved repeats, medians. Not a unit test.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def hand_bare_passes(passes, x, target, schedule) -> None:
    """``bare_passes`` by hand: per entry of ``schedule``, forward, ∂CE/∂logits = softmax − onehot, input gradient."""
    import torch

    for rows_n in schedule:
        logits, saved = passes.forward(x[:rows_n])
        grad_logits = logits.softmax(1).scatter_add_(1, target[:rows_n, None],
                                                     torch.full((rows_n, 1), -1.0, dtype=logits.dtype))
        passes.input_gradient(saved, grad_logits)


def clock(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def measure(name: str, repeats: int) -> dict:
    """All timings of one data set."""
    import torch

    from bench.search_bench import EPSILON, MAX_STEPS, bare_passes, pass_schedule, trained_pool
    from ct_lightning.generators import make_generator
    from ct_lightning.generators.input_gradient import AutogradPasses, MLPPasses, autograd_only, model_passes
    from ct_lightning.generators.search import search_counterfactuals

    datamodule, model, x, target, lower, upper = trained_pool(name)
    assert isinstance(model_passes(model), MLPPasses)
    generator = make_generator("ecco")
    kwargs = dict(max_steps=MAX_STEPS, epsilon=EPSILON, mutability=None, lower=lower, upper=upper)
    hand, auto = MLPPasses(list(model)), AutogradPasses(model)
    grad_logits = torch.randn(len(x), datamodule.n_classes)

    def passes_by(p):
        with torch.enable_grad():
            logits, saved = p.forward(x)
            p.input_gradient(saved, grad_logits)

    out = {"n_features": datamodule.n_features, "n_classes": datamodule.n_classes,
           "passes_us": {"hand": [], "autograd": []}}
    for _ in range(repeats):
        out["passes_us"]["hand"].append(statistics.median(clock(lambda: passes_by(hand)) for _ in range(50)) * 1e6)
        out["passes_us"]["autograd"].append(statistics.median(clock(lambda: passes_by(auto)) for _ in range(50))
                                            * 1e6)
    out["passes_us"] = {k: statistics.median(v) for k, v in out["passes_us"].items()}
    tau_data = float(datamodule.ct_defaults.get("tau", 0.75))
    for mode, tau in (("converging", tau_data), ("fixed-T", 1.0)):
        by_hand = search_counterfactuals(model, x, target, generator, tau=tau, **kwargs)
        with autograd_only():
            by_autograd = search_counterfactuals(model, x, target, generator, tau=tau, **kwargs)
        same = bool(torch.equal(by_hand.counterfactual, by_autograd.counterfactual)
                    and torch.equal(by_hand.steps, by_autograd.steps)
                    and torch.equal(by_hand.nascent, by_autograd.nascent))
        schedule = pass_schedule(by_hand.steps, MAX_STEPS)
        times = {"search_hand": [], "search_autograd": [], "bare_autograd": [], "bare_hand": []}
        for _ in range(repeats):  # interleaved, so that the machine's drift hits all alike
            times["search_hand"].append(clock(lambda: search_counterfactuals(model, x, target, generator, tau=tau,
                                                                             **kwargs)))
            with autograd_only():
                times["search_autograd"].append(clock(lambda: search_counterfactuals(model, x, target, generator,
                                                                                     tau=tau, **kwargs)))
            times["bare_autograd"].append(clock(lambda: bare_passes(model, x, target, schedule)))
            with torch.no_grad():
                times["bare_hand"].append(clock(lambda: hand_bare_passes(hand, x, target, schedule)))
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        out[mode] = {"tau": tau, "same": same, "cf_steps": int(by_hand.steps.sum()), "ms": ms,
                     "search_speed_up": ms["search_autograd"] / ms["search_hand"],
                     "hand_over_autograd_bare": ms["search_hand"] / ms["bare_autograd"],
                     "autograd_over_autograd_bare": ms["search_autograd"] / ms["bare_autograd"],
                     "hand_over_hand_bare": ms["search_hand"] / ms["bare_hand"]}
    return out


def describe(name: str, r: dict) -> str:
    """One data set's lines."""
    lines = [f"{name}: passes {r['passes_us']['hand']:.0f} µs by hand, {r['passes_us']['autograd']:.0f} µs autograd"]
    for mode in ("converging", "fixed-T"):
        m = r[mode]
        lines.append(f"  {mode:<10} search {m['ms']['search_hand']:.1f} ms by hand, {m['ms']['search_autograd']:.1f} ms "
                     f"autograd (×{m['search_speed_up']:.2f}, same: {m['same']}); bare passes "
                     f"{m['ms']['bare_autograd']:.1f} ms autograd, {m['ms']['bare_hand']:.1f} ms by hand; "
                     f"search/bare(autograd) ×{m['hand_over_autograd_bare']:.2f} (was "
                     f"×{m['autograd_over_autograd_bare']:.2f}), search/bare (by hand) ×{m['hand_over_hand_bare']:.2f}")
    return "\n".join(lines)


def main() -> None:
    """Measure each data set, print and write the JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.common import measure_data_sets

    measure_data_sets(__doc__, "input_gradient.json", "circles,adult,mnist", 7, measure, describe, pool=1000)


if __name__ == "__main__":
    main()
