"""The console scripts of pyproject.toml ([project.scripts], ``ct-train`` ...) exit 0 on success and keep the
documented error exit codes (2: a value, 1: the environment) with one ``error:`` line.

Each entry is run the way pip's generated script runs it: its ``module:attribute`` loaded as an entry point and
``sys.exit(entry())``, in a fresh interpreter, with this checkout's code."""

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def run_script(name: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``sys.exit(entry())`` for the console script ``name``, as its generated wrapper does."""
    wrapper = ("import sys; from importlib.metadata import EntryPoint; "
               f"sys.exit(EntryPoint({name!r}, {SCRIPTS[name]!r}, 'console_scripts').load()())")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore",
           "CT_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-c", wrapper, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_recipe_has_a_console_script_entry():
    recipes = {path.stem for path in (ROOT / "recipes").glob("*.py") if path.stem != "__init__"}
    assert {value.split(":")[0].removeprefix("recipes.") for value in SCRIPTS.values()} == recipes
    for name, value in SCRIPTS.items():
        entry = EntryPoint(name, value, "console_scripts").load()
        assert callable(entry) and value.endswith(":cli"), name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help_exits_0(name, tmp_path):
    done = run_script(name, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:") and not done.stderr


def test_ct_train_and_ct_evaluate_exit_0_after_a_tiny_run_and_keep_their_error_codes(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = tmp_path / "summary.json"
    done = run_script("ct-train", "--data", "moons", "--max-epochs", "1", "--limit-train-batches", "2",
                      "--limit-val-batches", "1", "--nce", "20", "--max-steps", "3", "--tracking-uri", store,
                      "--no-progress", "--summary-json", str(summary), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary.is_file() and "MLflow run id:" in done.stdout
    assert "'run_id':" not in done.stdout + done.stderr  # the summary dict is not printed by the wrapper
    run_id = json.loads(summary.read_text())["run_id"]
    evaluated = run_script("ct-evaluate", "--run-id", run_id, "--tracking-uri", store, "--n-individuals", "10",
                           "--n-runs", "1", "--lambda-energy", "1", "--eval-steps", "3", "--no-log", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    bad_value = run_script("ct-train", "--data", "moons", "--max-epochs", "0", "--tracking-uri", store, cwd=tmp_path)
    assert bad_value.returncode == 2
    assert [line for line in bad_value.stderr.splitlines() if line.startswith("error:")] == \
        [bad_value.stderr.strip().splitlines()[-1]] and "--max-epochs" in bad_value.stderr

    missing = run_script("ct-train", "--data", "moons", "--from-checkpoint", str(tmp_path / "missing.ckpt"),
                         "--tracking-uri", store, cwd=tmp_path)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith("error: --from-checkpoint")
