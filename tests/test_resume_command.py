"""The printed resume command works from any folder: this Python and recipes/train.py's absolute path when the
recipe runs as a script (even started by a relative path), the ``ct-train`` console script under a console script."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ct_lightning.experiment.runs.lifecycle import project_scripts, resume_command

ROOT = Path(__file__).resolve().parents[1]
STORE = "sqlite:////tmp/a store/mlflow.db"


def test_run_as_a_script_by_a_relative_path_resumes_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["recipes/train.py", "--data", "moons"])
    words = shlex.split(resume_command("abc123", STORE, "my exp"))
    assert Path(words[0]).is_absolute() and Path(words[1]) == ROOT / "recipes" / "train.py"
    assert words[2:] == ["--resume", "abc123", "--tracking-uri", STORE, "--experiment", "my exp"]
    elsewhere = subprocess.run([*words[:2], "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert elsewhere.returncode == 0 and "--resume" in elsewhere.stdout, elsewhere.stderr[-2000:]


@pytest.mark.skipif("ct-train" not in project_scripts(), reason="the project's console scripts are not installed")
def test_run_through_a_console_script_resumes_with_ct_train(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("ct-train", "ct-compare"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(bin_dir / "ct-train"), "--data", "moons"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shlex.split(resume_command("abc", STORE, "e"))[:2] == [str(bin_dir / "ct-train"), "--resume"]
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")  # ct-train on PATH: its name is enough
    assert resume_command("abc", STORE, "e").startswith("ct-train --resume abc ")
    monkeypatch.setattr(sys, "argv", [str(bin_dir / "ct-compare")])  # another recipe's training resumes with ct-train
    assert resume_command("abc", STORE, "e").startswith("ct-train --resume abc ")
