"""Issue 25 §4: the CT work of an epoch with the library's training step by hand and its flat Adam, without Lightning.

Run: ``PYTHONPATH=. .venv/bin/python bench/hand_step.py [--data circles,adult,mnist] [--repeats 2] [--epochs 15]
[--out bench/hand_step.json]``. One torch thread. Each epoch of ``bench.reference_bench``'s plain vanilla loop (the
reference: autograd and PyTorch's default Adam, as a user writes it) is paired with one epoch of each of:
- ``ct``: the plain CT loop as it is (autograd, PyTorch's Adam);
- ``ct_hand``: the same loop whose steps are ``ct_lightning.training.mlp_step.counterfactual_step`` writing into
  ``ct_lightning.training.flat_adam.FlatAdam``'s gradient buffer (what ``CTModule`` runs for a plain MLP on a CPU);
- ``ct_flat_adam``: autograd's backward with ``FlatAdam`` (what a user's own model gets);
- ``vanilla_hand``: the plain vanilla loop with ``conventional_step`` and ``FlatAdam``.
Medians over each run's epochs after the first, as CPU-time ratios to the plain vanilla epoch beside them; the
weights of each variant after the last epoch against those of its autograd twin (largest difference). Not a unit
test.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _by_hand(loop, counterfactual: bool) -> None:
    """Make ``loop`` (a plain loop of ``bench.reference_bench``) step by hand into a FlatAdam."""
    from ct_lightning.training.flat_adam import FlatAdam

    loop.optimiser = FlatAdam(loop.model.parameters(), lr=loop.optimiser.defaults["lr"])
    loop.hand = counterfactual


def _step_ct(loop, x, y, pool, config):
    from ct_lightning.training.mlp_step import counterfactual_step

    lambdas = (config["lambda_clf"], config["lambda_div"], config["lambda_reg"], config["lambda_adv"])
    counterfactual_step(list(loop.model), x, y, pool, lambdas, True, True, loop.optimiser.gradient_views())
    loop.optimiser.step()


def paired_run(name: str, epochs: int) -> dict:
    """One run of the five loops, epoch by epoch, from the same seeds."""
    import torch

    from bench.common import load_datamodule
    from bench.reference_bench import PlainCTLoop, PlainLoop
    from ct_lightning.training.flat_adam import FlatAdam
    from ct_lightning.training.mlp_step import conventional_step

    datamodule = load_datamodule(name)
    device = torch.device("cpu")
    loops = {"plain": PlainLoop(datamodule, "mlp", device), "vanilla_hand": PlainLoop(datamodule, "mlp", device),
             "ct": PlainCTLoop(datamodule, "mlp", device), "ct_hand": PlainCTLoop(datamodule, "mlp", device),
             "ct_flat_adam": PlainCTLoop(datamodule, "mlp", device)}
    loops["ct_flat_adam"].optimiser = FlatAdam(loops["ct_flat_adam"].model.parameters(),
                                               lr=loops["ct"].optimiser.defaults["lr"])
    vanilla = loops["vanilla_hand"]
    vanilla.optimiser = FlatAdam(vanilla.model.parameters(), lr=loops["plain"].optimiser.defaults["lr"])
    layers = list(vanilla.model)

    def vanilla_step(x, y):
        conventional_step(layers, x, y, 1.0, vanilla.optimiser.gradient_views())
        vanilla.optimiser.step()

    vanilla.step = vanilla_step
    hand = loops["ct_hand"]
    hand.optimiser = FlatAdam(hand.model.parameters(), lr=loops["ct"].optimiser.defaults["lr"])
    hand.step = lambda x, y, pool: _step_ct(hand, x, y, pool, hand.config)
    seconds = {key: [] for key in loops}
    for _ in range(epochs):
        for key, loop in loops.items():
            seconds[key].append(loop.epoch()[1])  # CPU seconds
    ratios = {key: statistics.median(a / b for a, b in zip(seconds[key][1:], seconds["plain"][1:]))
              for key in loops if key != "plain"}
    twins = {"vanilla_hand": "plain", "ct_hand": "ct", "ct_flat_adam": "ct"}
    drift = {key: max(float((p - q).abs().max()) for p, q in zip(loops[key].model.parameters(),
                                                                 loops[twin].model.parameters()))
             for key, twin in twins.items()}
    return {"over_plain_vanilla_cpu": ratios, "largest_weight_difference_from_autograd_twin": drift,
            "epoch_cpu_s": {key: statistics.median(v[1:]) for key, v in seconds.items()}}


def main() -> None:
    """Parse the options, run the pairs, print and write the JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.common import repeated_runs

    args, runs, loads = repeated_runs(__doc__, "hand_step.json", "circles", 2, 15, paired_run)
    for name, repeats in runs.items():
        for key in ("vanilla_hand", "ct", "ct_flat_adam", "ct_hand"):
            print(f"{name}: {key} / plain vanilla (CPU time) "
                  + ", ".join(f"×{r['over_plain_vanilla_cpu'][key]:.2f}" for r in repeats)
                  + ("" if key == "ct" else "; weights differ from autograd's by "
                     + ", ".join(f"{r['largest_weight_difference_from_autograd_twin'][key]:.2g}" for r in repeats)),
                  flush=True)
    out = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": 1, "epochs": args.epochs,
           **loads, "runs": runs}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
