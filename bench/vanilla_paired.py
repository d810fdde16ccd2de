"""Vanilla ``train()`` epochs against the plain-PyTorch loop, paired epoch by epoch (issue 25 §4: vanilla ≤ 1.2×).

Run: ``PYTHONPATH=. .venv/bin/python bench/vanilla_paired.py [--data adult,mnist] [--epochs 40] [--repeats 2]
[--out bench/vanilla_paired.json]``. One vanilla ``train()`` run per data set and repeat (one torch thread, SQLite
store in a temporary folder, no progress display), each of its epochs timed right after one epoch of
``bench.reference_bench.PlainLoop`` (``PairedEpochs``), so that the shared machine's drift hits both alike. Only the
vanilla objective: the reference section of ``bench/run.py`` also runs CT and the plain CT loop, and so pairs only
11 epochs per run in the same time. The first epoch of each run is a warm-up and left out. Not a unit test.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def paired(data: str, epochs: int) -> dict:
    """One vanilla run of ``data``: each epoch's wall seconds, ours and the plain loop's, and their median ratio."""
    import torch

    from bench.reference_bench import PairedEpochs, PlainLoop, our_epochs
    from datamodules.registry import get_datamodule

    datamodule = get_datamodule(data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    device = torch.device("cpu")
    pairs = PairedEpochs({"plain": PlainLoop(datamodule, "mlp", device)}, device)
    with tempfile.TemporaryDirectory(prefix="ct-vanilla-paired-") as folder:
        ours = [wall for wall, _ in our_epochs(data, "vanilla", "mlp", epochs, "cpu", Path(folder), pairs)[1:]]
    plain = [wall for wall, _ in pairs.plain["plain"][1:]]
    return {"ours_s": ours, "plain_s": plain, "ours_median_s": statistics.median(ours),
            "plain_median_s": statistics.median(plain),
            "ratio": statistics.median(a / b for a, b in zip(ours, plain))}


def main() -> None:
    """Parse the options, run the pairs and write the JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.common import repeated_runs

    args, runs, loads = repeated_runs(__doc__, "vanilla_paired.json", "adult,mnist", 2, 40, paired)
    for data, repeats in runs.items():
        print(f"{data}: vanilla/plain " + ", ".join(f"×{r['ratio']:.3f}" for r in repeats)
              + f" (target ×1.2; ours {statistics.median(r['ours_median_s'] for r in repeats) * 1e3:.1f} ms, plain "
              f"{statistics.median(r['plain_median_s'] for r in repeats) * 1e3:.1f} ms per epoch)", flush=True)
    out = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cores": os.cpu_count(), "threads": 1, "epochs": args.epochs,
           **loads, "runs": runs}
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
