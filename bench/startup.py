"""Start-up time of the command lines: ``--help`` and an argument error of each recipe (issue 16: under 2 s), and
explaining one row from a checkpoint, as practitioners run ``explain.py`` once per applicant from their scripts.

Run: ``.venv/bin/python bench/startup.py [--repeat 3] [--recipes explain] [--json bench/startup.json --label after]``.
Prints the median wall time of each command, run as a user runs it (a fresh interpreter, ``python recipes/X.py
...``): to its first output line (unbuffered, as a terminal shows it) and to its exit. The explain command needs
a checkpoint: ``--checkpoint``, else a tiny one is trained first (moons, one epoch; not timed). ``--against DIR``
times the same commands in another checkout (e.g. ``git archive BASE | tar -x -C DIR``) as well, alternating with
this one run by run, so that both see the same load on a shared machine. ``--json`` keeps one entry per ``--label``
in the file (an earlier run's entry under the same label is replaced). Not a unit test: timings depend on the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = "{checkpoint}"  # replaced by the checkpoint the explain command reads
COMMANDS = [
    ("train", ["--help"]), ("evaluate", ["--help"]), ("compare", ["--help"]), ("consistency", ["--help"]),
    ("train_generator", ["--help"]), ("train", ["--max-epochs", "-5"]), ("train", ["--tau", "nan"]),
    ("compare", ["--data", "circles", "--jobs", "0"]), ("evaluate", ["--checkpoint", __file__]),
    ("explain", ["--help"]), ("explain", ["--checkpoint", CHECKPOINT, "--row", '{"x1": 0.2, "x2": 0.4}']),
]


def tiny_checkpoint(folder: Path, env: dict) -> Path:
    """A moons model trained for one epoch into ``folder`` (its ``last.ckpt``)."""
    subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), "--data", "moons", "--max-epochs", "1",
                    "--checkpoint-dir", str(folder / "ckpt"), "--tracking-uri", f"sqlite:///{folder}/mlflow.db",
                    "--no-progress"], env=env, cwd=ROOT, check=True, capture_output=True)
    return folder / "ckpt" / "last.ckpt"


def timed_run(argv: list[str], env: dict) -> tuple[float, float, int]:
    """``(seconds to the first line of output, seconds to exit, exit status)`` of one command."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    process.stdout.readline()
    first = time.perf_counter() - started
    process.communicate()
    return first, time.perf_counter() - started, process.returncode


def commit() -> str:
    """The worktree's commit (with ``+changes`` when it has uncommitted changes)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no")
                                                  else "")


def write_json(path: Path, entry: dict) -> None:
    """Keep ``entry`` in ``path`` beside the entries of other labels."""
    runs = json.loads(path.read_text())["runs"] if path.is_file() else []
    runs = [run for run in runs if run["label"] != entry["label"]] + [entry]
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


def main() -> None:
    """Time each command ``--repeat`` times, print the medians and write them to ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--recipes", help="only these recipes, e.g. explain or train,explain (default: all)")
    parser.add_argument("--checkpoint", help="the checkpoint explain.py reads (default: train a tiny one first)")
    parser.add_argument("--json", type=Path, help="write the medians here (one entry per --label)")
    parser.add_argument("--label", default="latest", help="name of this run's entry in --json (default latest)")
    parser.add_argument("--against", type=Path, help="another checkout to time the same commands in, alternately")
    args = parser.parse_args()
    trees = [ROOT] + ([args.against.resolve()] if args.against else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    wanted = set(args.recipes.split(",")) if args.recipes else None
    commands = [(recipe, argv) for recipe, argv in COMMANDS if wanted is None or recipe in wanted]
    loads, results = [os.getloadavg()[0]], []
    with tempfile.TemporaryDirectory(prefix="ct-startup-") as folder:
        checkpoint = args.checkpoint
        if checkpoint is None and any(CHECKPOINT in argv for _, argv in commands):
            checkpoint = str(tiny_checkpoint(Path(folder), env))
        for recipe, argv in commands:
            argv = [checkpoint if a == CHECKPOINT else a for a in argv]
            shown = " ".join(a if a != checkpoint else "CHECKPOINT" for a in argv)
            result = {"command": f"recipes/{recipe}.py {shown}"}
            runs = {tree: [] for tree in trees}
            for _ in range(args.repeat):
                for tree in trees:  # alternating: both trees see the same load
                    runs[tree].append(timed_run([sys.executable, str(tree / "recipes" / f"{recipe}.py"), *argv],
                                                {**env, "PYTHONPATH": str(tree)}))
            for tree, prefix in zip(trees, ("", "against_")):
                first, total = (statistics.median(r[i] for r in runs[tree]) for i in (0, 1))
                print(f"{first:6.2f} s to the first line, {total:6.2f} s to exit  (exit {runs[tree][-1][2]})  "
                      f"{'' if tree == ROOT else f'[{tree}] '}recipes/{recipe}.py {shown}")
                result.update({f"{prefix}first_line_s": round(first, 3), f"{prefix}exit_s": round(total, 3),
                               f"{prefix}exit_status": runs[tree][-1][2]})
            results.append(result)
    loads.append(os.getloadavg()[0])
    if args.json:
        from bench.common import cpu_model  # noqa: PLC0415 - imports torch: only after the timings

        write_json(args.json, {"label": args.label, "commit": commit(),
                               **({"against": str(args.against)} if args.against else {}),
                               "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                               "machine": f"{cpu_model()}, {os.cpu_count()} logical CPUs",
                               "python": platform.python_version(), "repeat": args.repeat,
                               "load_average_1min_start_end": [round(v, 2) for v in loads], "results": results})


if __name__ == "__main__":
    main()
