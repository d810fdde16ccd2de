"""A temporary copy of the ``ct_lightning`` (or ``datamodules``) package, for tests that show what one edit to it does (a new setting, a
new generator file) without touching the checkout: the copy is imported first in a fresh interpreter."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_package(folder: Path) -> Path:
    """``folder/ct_lightning``: a copy of this checkout's package (without byte code)."""
    target = folder / "ct_lightning"
    shutil.copytree(ROOT / "ct_lightning", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def copy_datamodules(folder: Path) -> Path:
    """``folder/datamodules``: a copy of this checkout's data-module package (without byte code)."""
    target = folder / "datamodules"
    shutil.copytree(ROOT / "datamodules", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def run_with_copy(folder: Path, code: str) -> dict:
    """Run ``code`` with ``folder``'s ``ct_lightning`` first on the path (the rest from this checkout); its last
    output line, JSON, is returned."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": ""}
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
