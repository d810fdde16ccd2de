"""Start-up time of the command lines: ``--help`` and an argument error of each recipe (issue 16: under 2 s).

Run: ``.venv/bin/python bench/startup.py [--repeat 3]``. Prints the median wall time of each command, run
as a user runs it (a fresh interpreter, ``python recipes/X.py ...``). Not a unit test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [
    ("train", ["--help"]), ("evaluate", ["--help"]), ("compare", ["--help"]), ("consistency", ["--help"]),
    ("train_generator", ["--help"]), ("train", ["--max-epochs", "-5"]), ("train", ["--tau", "nan"]),
    ("compare", ["--data", "circles", "--jobs", "0"]), ("evaluate", ["--checkpoint", __file__]),
]


def main() -> None:
    """Time each command ``--repeat`` times and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for recipe, argv in COMMANDS:
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), *argv], env=env,
                                  capture_output=True, text=True, cwd=ROOT)
            times.append(time.perf_counter() - started)
        print(f"{statistics.median(times):6.2f} s  (exit {done.returncode})  recipes/{recipe}.py {' '.join(argv)}")


if __name__ == "__main__":
    main()
