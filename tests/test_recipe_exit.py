"""A recipe's process leaves its objects out of the garbage collector's last passes (``runner.exit_soon``): the
interpreter's shutdown after a short training took 2.4 s walking them (``bench/short_run.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import gc, sys
sys.argv = ["train.py", *sys.argv[1:]]
from recipes.train import cli
try:
    code = cli()
except SystemExit as exit_:
    code = exit_.code
print(f"exit {code}, frozen {gc.get_freeze_count()}")
"""


def test_console_entry_freezes_the_objects_before_the_process_ends(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["--help"], ["--max-epochs", "-5"]):  # ends well, ends on a bad input (exit 2)
        done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        last = done.stdout.strip().splitlines()[-1]
        code, frozen = last.removeprefix("exit ").split(", frozen ")
        assert code == ("0" if argv == ["--help"] else "2") and int(frozen) > 0, (argv, done.stdout, done.stderr)
