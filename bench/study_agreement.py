"""Do two runs of the study give the same results? Compares, model by model (same training key), the grid
evaluations of two sets of result files (``recipes/appendix.py`` outputs): test accuracy and F1, and per
``(run, λ_egy)`` group the mean IP, cost and validity.

Run: ``python bench/study_agreement.py OLD_DIR NEW_DIR [--grids note9,note11,note7,note5,note3]
[--out bench/study_agreement.json]``. Each grid's models are read from every ``<grid>*.json`` in each folder (a
grid may have been run in parts, one file per group of data sets). Not a unit test: it reads two finished studies.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def models_of(folder: Path, grid: str) -> dict:
    """Every model of ``grid`` in the result files of ``folder``, by training key."""
    models = {}
    for path in sorted(folder.glob(f"{grid}.json")) + sorted(folder.glob(f"{grid}-*.json")):
        models.update(json.loads(path.read_text())["models"])
    return models


def compare(old: dict, new: dict) -> dict:
    """Largest differences over the models both have (and how many differ in accuracy at all)."""
    shared = sorted(set(old) & set(new))
    worst = {"accuracy": 0.0, "f1": 0.0, "ip_relative": 0.0, "cost_relative": 0.0, "validity": 0.0}
    accuracy_differs = 0
    for key in shared:
        a, b = old[key]["evaluation"], new[key]["evaluation"]
        accuracy_differs += a["accuracy"] != b["accuracy"]
        for name in ("accuracy", "f1"):
            worst[name] = max(worst[name], abs(a[name] - b[name]))
        for ga, gb in zip(a["groups"], b["groups"]):
            worst["validity"] = max(worst["validity"], abs(ga["validity"] - gb["validity"]))
            for name in ("ip", "cost"):
                if ga[name] is not None and gb[name] is not None and math.isfinite(ga[name]):
                    worst[f"{name}_relative"] = max(worst[f"{name}_relative"],
                                                    abs(ga[name] - gb[name]) / max(abs(ga[name]), 1e-12))
    return {"models_old": len(old), "models_new": len(new), "compared": len(shared),
            "accuracy_differs": accuracy_differs, "largest_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--grids", default="note9,note11,note7,note5,note3")
    parser.add_argument("--out", default="bench/study_agreement.json")
    args = parser.parse_args()
    rows = {grid: compare(models_of(args.old, grid), models_of(args.new, grid)) for grid in args.grids.split(",")}
    for grid, row in rows.items():
        print(grid, json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"bench": "study_agreement", "old": str(args.old), "new": str(args.new),
                                          "grids": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
