"""Cost per grid training, separate against stacked (issue 25 §3): Note 5's trainings of one data set and generator.

Run: ``PYTHONPATH=. .venv/bin/python bench/stacked_grid.py [--data moons] [--generator ecco] [--max-epochs 100]
[--separate 3] [--stacks 3,9,45] [--accelerator auto] [--out bench/stacked_grid.json]``.

One warm process, one torch thread, one SQLite store in a temporary folder. ``--accelerator gpu`` runs both forms
on the GPU (a lone training through Lightning's ``Trainer`` on CUDA, a stack with its stacked model on CUDA). The trainings are the first ones of
Note 5's 45 combinations (λ_adv × λ_div × λ_reg) at Note 1's defaults:

- *separate*: ``--separate`` of them, one ``train()`` each, as the grid ran them before (``--stack 1``);
- *stacked*: for each K of ``--stacks``, the first K of them as one ``train_stack`` (``--stack K``).

Each row gives the wall seconds per training: the whole call (data, training, writing the runs, logged models and
plots) and the training alone (``fit_seconds``; a stack's share is its fit divided by K). The first stacked row
also checks that its members' final weights equal the separate trainings' (largest absolute difference).
The grid's evaluation of each model is the same in both forms and is not timed here. Not a unit test: timings
depend on the machine and its load, which is recorded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def note5_points(n: int) -> list[dict]:
    """The first ``n`` of Note 5's (λ_adv, λ_div, λ_reg) combinations, in the grid's order."""
    from ct_lightning.experiment.studies.grids import load_grid

    space = load_grid("note5").space
    values = itertools.product(space["lambda_adv"], space["lambda_div"], space["lambda_reg"])
    return [{"lambda_adv": a, "lambda_div": d, "lambda_reg": r} for a, d, r in itertools.islice(values, n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="moons")
    parser.add_argument("--generator", default="ecco")
    parser.add_argument("--max-epochs", type=int, default=100)
    parser.add_argument("--separate", type=int, default=3)
    parser.add_argument("--stacks", default="3,9,45")
    parser.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "gpu"))
    parser.add_argument("--out", default="bench/stacked_grid.json")
    args = parser.parse_args()
    import torch

    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.runs.stacked_train import train_stack
    from ct_lightning.experiment.runs.train import train
    from ct_lightning.experiment.studies.grids import NOTE1

    torch.set_num_threads(1)
    stacks = [int(k) for k in args.stacks.split(",")]
    points = note5_points(max([args.separate, *stacks]))
    folder = tempfile.mkdtemp(prefix="ct-bench-stack-")
    uri = f"sqlite:///{folder}/mlflow.db"
    base = {**NOTE1, "data": args.data, "generator": args.generator, "max_epochs": args.max_epochs,
            "tracking_uri": uri, "experiment": "bench", "progress": False, "accelerator": args.accelerator}
    rows, separate_weights = [], []
    load_before = os.getloadavg()
    train({**base, **points[0], "max_epochs": 1})  # warm-up: the store, imports, the VAE cache (REVISE)
    t = time.perf_counter()
    fits = []
    for point in points[:args.separate]:
        summary = train({**base, **point})
        fits.append(summary["metrics"]["fit_seconds"])
        separate_weights.append(load_run(summary["run_id"], uri).module.state_dict())
    wall = time.perf_counter() - t
    rows.append({"form": "separate", "trainings": args.separate, "wall_per_training": wall / args.separate,
                 "fit_per_training": sum(fits) / len(fits)})
    print(json.dumps(rows[-1]), flush=True)
    for k in stacks:
        t = time.perf_counter()
        summaries = train_stack([{**base, **point} for point in points[:k]])
        wall = time.perf_counter() - t
        row = {"form": "stacked", "trainings": k, "wall_per_training": wall / k,
               "fit_per_training": summaries[0]["metrics"]["fit_seconds"]}
        if k >= args.separate and "max_weight_difference" not in rows[-1]:
            differences = []
            for summary, reference in zip(summaries, separate_weights):
                weights = load_run(summary["run_id"], uri).module.state_dict()
                differences.append(max((weights[n] - reference[n]).abs().max().item() for n in reference))
            row["max_weight_difference"] = max(differences)
        rows.append(row)
        print(json.dumps(row), flush=True)
    separate = rows[0]
    for row in rows[1:]:
        row["speed_up_wall"] = separate["wall_per_training"] / row["wall_per_training"]
        row["speed_up_fit"] = separate["fit_per_training"] / row["fit_per_training"]
    result = {"bench": "stacked_grid", "data": args.data, "generator": args.generator,
              "max_epochs": args.max_epochs, "threads": 1, "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "accelerator": args.accelerator,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    out = Path(args.out)
    existing = json.loads(out.read_text()) if out.exists() else []
    existing = existing if isinstance(existing, list) else [existing]
    existing.append(result)
    out.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
