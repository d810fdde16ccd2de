"""What gathering ``best.ckpt`` in memory costs: ``last_checkpoint._copied`` against lightning_utilities'
``apply_to_collection`` (the same copy: collections made anew, tensors cloned) on a real checkpoint dictionary.

Run: ``PYTHONPATH=. .venv/bin/python bench/checkpoint_gather.py [--data mnist] [--out bench/checkpoint_gather.json]``.
A vanilla ``train()`` run of 10 epochs (one torch thread, SQLite store in a temporary folder); at its 9th epoch's end
Lightning's checkpoint dictionary is dumped and copied ``--repeats`` times each way. Not a unit test.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def elements(value) -> int:
    """How many dicts, lists, tuples and leaves ``value`` holds."""
    if isinstance(value, dict):
        return 1 + sum(elements(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(elements(item) for item in value)
    return 1


def main() -> None:
    """Train, dump the checkpoint at the 9th epoch's end, time both copies, write the JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.common import script_parser, single_thread_quiet

    args = script_parser(__doc__, "checkpoint_gather.json", "mnist", 50).parse_args()
    single_thread_quiet()
    import lightning as L
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection

    from ct_lightning.experiment.runs.last_checkpoint import _copied
    from ct_lightning.experiment.runs.train import train

    copies = {"ours (_copied)": _copied,
              "apply_to_collection": lambda c: apply_to_collection(c, torch.Tensor, lambda t: t.detach().clone())}
    result = {}

    class Measure(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch != 8:
                return
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(False)
            result["elements"] = elements(checkpoint)
            for name, copy in copies.items():
                seconds = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    copy(checkpoint)
                    seconds.append(time.perf_counter() - started)
                result[name + " ms"] = statistics.median(seconds) * 1e3

    with tempfile.TemporaryDirectory(prefix="ct-checkpoint-gather-") as folder:
        train({"data": args.data, "objective": "vanilla", "model": "mlp", "max_epochs": 10, "seed": 0,
               "accelerator": "cpu", "progress": False, "tracking_uri": f"sqlite:///{folder}/mlflow.db",
               "experiment": "bench-checkpoint-gather"}, callbacks=[Measure()])
    out = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "data": args.data,
           "repeats": args.repeats, **result}
    print(json.dumps(out))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
