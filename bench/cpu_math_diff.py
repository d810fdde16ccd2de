"""How far the models and the Table 1 cells of one row move between CPU math settings (issue 24).

Reads the stores written by ``bench/cpu_math.sh`` (one compare.py run of circles, seed 0, per setting) and
prints, per setting and role, the largest absolute difference of the trained weights from the ``native``
run, and the row's cells. Writes docs/cpu_math.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ct_lightning.experiment.runs.loading import load_run

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/cpu")


def weights(store: Path, run_id: str) -> dict[str, torch.Tensor]:
    loaded = load_run(run_id, f"sqlite:///{store.resolve()}")
    return {k: v.detach().clone() for k, v in loaded.module.state_dict().items() if v.is_floating_point()}


def main() -> None:
    settings = sorted(p.name for p in ROOT.iterdir() if (p / "out" / "summary.json").is_file())
    rows = {s: json.loads((ROOT / s / "out" / "summary.json").read_text())["rows"][0] for s in settings}
    reference = {role: weights(ROOT / "native" / "mlflow.db", run) for role, run in rows["native"]["runs"].items()}
    report = {}
    for setting in settings:
        row = rows[setting]
        diffs = {}
        for role, run in row["runs"].items():
            other = weights(ROOT / setting / "mlflow.db", run)
            diffs[role] = max(float((other[k] - reference[role][k]).abs().max()) for k in other)
        report[setting] = {"max_abs_weight_diff": diffs,
                           "cells": {m: [row[f"{m}_reduction_pct"], row["significant"][m]]
                                     for m in ("ip", "ip_star", "cost")}}
        print(setting, json.dumps(report[setting]))
    Path("docs").mkdir(exist_ok=True)
    Path("docs/cpu_math.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
