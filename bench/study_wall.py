"""Wall time of the hyperparameter study (issue 25), measured from an empty store, per grid and data set.

Run: ``PYTHONPATH=. .venv/bin/python bench/study_wall.py [--data moons] [--grids note9,note11,note7,note5,note3]
[--jobs 2] [--out bench/study_wall.json]``, or ``--whole`` for the whole study as one command
(``recipes/appendix.py --grid all``: every grid on all its data sets; needs ``CT_DATA_DIR``).

Each grid runs through ``recipes/appendix.py`` (its default ``--stack``), one after the other, into one fresh
SQLite store, as the study runs them: later grids reuse the trainings they share with earlier ones (the BL, and
the default-setting points). The JSON gets, per grid, the wall seconds of the whole command, the trainings it
ran and the points it evaluated, with the machine, the load before and after, and the code's commit. Real data
sets need ``CT_DATA_DIR``. Not a unit test: the time depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import append_result, machine_fields

ROOT = Path(__file__).resolve().parents[1]


def run_grid(grid: str, data: str, jobs: int, store: Path) -> dict:
    """One grid on one data set from the store in ``store``: wall seconds, trainings and points."""
    out = store / f"{grid}-{data}.json"
    command = [sys.executable, "recipes/appendix.py", "--grid", grid, "--data", data, "--jobs", str(jobs),
               "--tracking-uri", f"sqlite:///{store}/mlflow.db", "--out-dir", str(store)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{grid} on {data} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    results = json.loads(out.read_text())  # appendix.py names it after the grid and the data sets it ran
    models = results["models"].values()
    return {"grid": grid, "data": data, "wall_seconds": round(wall, 1), "points": results["n_points"],
            "trainings": sum(1 for m in models if m.get("trained")),
            "reused_trainings": sum(1 for m in models if not m.get("trained")),
            "failures": len(results["failures"])}


def run_whole(jobs: int, store: Path) -> dict:
    """The whole study as one command from the empty store ``store``: its wall seconds, and per grid the seconds
    and trainings it says it took."""
    command = [sys.executable, "recipes/appendix.py", "--grid", "all", "--jobs", str(jobs),
               "--tracking-uri", f"sqlite:///{store}/mlflow.db", "--out-dir", str(store)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    rows = []
    started = time.perf_counter()
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        for line in process.stdout:
            if line.startswith("study: grid "):  # "study: grid note9 on ls, ... done in 123 s; 456 s so far"
                grid = line.split()[2]
                results = json.loads(next(store.glob(f"{grid}.json")).read_text())
                models = results["models"].values()
                rows.append({"grid": grid, "data": results["data"],
                             "wall_seconds": float(line.split(" done in ")[1].split()[0]),
                             "points": results["n_points"], "trainings": sum(1 for m in models if m.get("trained")),
                             "reused_trainings": sum(1 for m in models if not m.get("trained")),
                             "failures": len(results["failures"])})
                print(json.dumps(rows[-1]), flush=True)
    if process.returncode != 0:
        raise SystemExit(f"the study failed ({process.returncode})")
    return {"rows": rows, "wall_seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="moons")
    parser.add_argument("--grids", default="note9,note11,note7,note5,note3")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="bench/study_wall.json")
    parser.add_argument("--whole", action="store_true", help="the whole study as one command (--grid all)")
    args = parser.parse_args()
    store = Path(tempfile.mkdtemp(prefix="ct-study-"))
    load_before = os.getloadavg()
    rows = []
    if args.whole:
        whole = run_whole(args.jobs, store)
        rows = whole["rows"]
    else:
        for grid in args.grids.split(","):
            rows.append(run_grid(grid, args.data, args.jobs, store))
            print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {"bench": "study_wall", "data": "all nine (--grid all)" if args.whole else args.data, "jobs": args.jobs,
              "commit": commit.strip(), **machine_fields(load_before), "rows": rows,
              "wall_seconds": whole["wall_seconds"] if args.whole else round(sum(r["wall_seconds"] for r in rows), 1)}
    append_result(args.out, result)

if __name__ == "__main__":
    main()
