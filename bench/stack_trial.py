"""Anatomy of a stacked grid trial (issue 25): per member of one stack, the training's share, writing its run
(and the parts of that), and its grid evaluation; for the code of this tree or of another commit.

Run: ``PYTHONPATH=. .venv/bin/python bench/stack_trial.py [--members 45] [--max-epochs 100] [--commit REV]
[--out bench/stack_trial.json]``. One fresh process (one torch thread, as a grid worker) plans Note 5 on Moons and
runs its first ``--members`` ECCo points as one stack through ``grids.run_stack`` into an empty SQLite store, as
``recipes/appendix.py`` does. Each phase is timed by wrapping the function that does it. ``--commit REV`` runs the
code of that commit (a temporary ``git worktree``), so that before and after are measured on the same machine.
Not a unit test: timings depend on the machine and its load.
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

ROOT = Path(__file__).resolve().parents[1]
PHASES = {  # module, function name: what each wrapped call is
    "fit": ("ct_lightning.experiment.runs.stacked_train", "fit_stacked"),
    "write_run": ("ct_lightning.experiment.runs.stacked_train", "record_member"),
    "write_models": ("ct_lightning.experiment.runs.stacked_train", "log_models"),
    "write_plots": ("ct_lightning.experiment.runs.stacked_train", "log_training_plots"),
    "write_inputs": ("ct_lightning.experiment.runs.stacked_train", "log_training_inputs"),
    "evaluate": ("ct_lightning.experiment.studies.grids", "evaluate_job"),
}


def inner(members: int, max_epochs: int) -> dict:
    """The timed stack, in this (fresh) process."""
    import importlib

    import torch

    torch.set_num_threads(1)
    from ct_lightning.experiment.studies import grids

    seconds = {phase: 0.0 for phase in PHASES}

    def timed(phase, fn):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[phase] += time.perf_counter() - started
        return wrapper

    for phase, (module_name, name) in PHASES.items():
        module = importlib.import_module(module_name)
        setattr(module, name, timed(phase, getattr(module, name)))
    store = tempfile.mkdtemp(prefix="ct-stack-trial-")
    _, jobs = grids.plan(grids.load_grid("note5"), ["moons"], f"sqlite:///{store}/mlflow.db", "bench",
                         extra={"max_epochs": max_epochs})
    stack = [job for job in jobs.values()
             if job.overrides["objective"] == "full" and job.overrides["generator"] == "ecco"][:members]
    started = time.perf_counter()
    results = grids.run_stack(stack)
    wall = time.perf_counter() - started
    assert len(results) == members and all(r["trained"] and r["evaluated"] for r in results)
    per_member = {phase: round(value / members, 3) for phase, value in seconds.items()}
    return {"wall_per_member": round(wall / members, 3), "per_member": per_member,
            "other_per_member": round((wall - seconds["fit"] - seconds["write_run"] - seconds["evaluate"]) / members,
                                      3)}


def measure(commit: str | None, members: int, max_epochs: int) -> dict:
    """One fresh process on this tree's code, or on ``commit``'s (a temporary worktree)."""
    tree, worktree = ROOT, None
    if commit:
        worktree = Path(tempfile.mkdtemp(prefix="ct-stack-tree-")) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), commit], cwd=ROOT, check=True,
                       capture_output=True)
        tree = worktree
    try:
        env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
        # This file is loaded by its path, so that ``ct_lightning`` comes from ``tree`` (PYTHONPATH) only.
        code = (f"import json, importlib.util as u; s = u.spec_from_file_location('stack_trial', {__file__!r}); "
                f"m = u.module_from_spec(s); s.loader.exec_module(m); "
                f"print('RESULT ' + json.dumps(m.inner({members}, {max_epochs})))")
        done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"stack trial failed:\n{done.stderr[-3000:]}")
        result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                                  text=True).stdout.strip()
        return {"commit": revision, **result}
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)


def main() -> None:
    from bench.common import append_result, machine_fields  # not at the top: inner() runs on other trees' code

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=45)
    parser.add_argument("--max-epochs", type=int, default=100)
    parser.add_argument("--commit", action="append", default=[], help="a commit to measure (repeatable); "
                        "'here' is this tree; default: here")
    parser.add_argument("--out", default="bench/stack_trial.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for commit in args.commit or ["here"]:
        rows.append(measure(None if commit == "here" else commit, args.members, args.max_epochs))
        print(json.dumps(rows[-1]), flush=True)
    result = {"bench": "stack_trial", "data": "moons", "grid": "note5", "generator": "ecco",
              "members": args.members, "max_epochs": args.max_epochs, "threads": 1, **machine_fields(load_before),
              "rows": rows}
    append_result(args.out, result)

if __name__ == "__main__":
    main()
