"""docs/worked_example.md runs end to end: its bash blocks, in order, as the page shows them, at a tiny size."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "worked_example.md"
TINY = {"ROWS": "600", "EPOCHS": "3", "CT_EPOCHS": "2"}


def page_commands() -> str:
    """The page's ``bash`` blocks joined, in order."""
    return "\n".join(re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_page_shows_every_step():
    script = page_commands()
    for step in ("make_lending_csv.py", "train_plain_pytorch.py", "--from-checkpoint model.pt", "--immutable age,sex",
                 "ct-explain --run-id $BEFORE", "ct-explain --run-id $AFTER", "mlflow ui", "--screenshot",
                 "mlflow models serve", "/invocations"):
        assert step in script, step


def test_worked_example_end_to_end(tmp_path):
    if not shutil.which("curl"):
        pytest.skip("the page's commands use curl, which is not installed here")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = Path(sys.executable).parent  # ct-train, ct-explain and mlflow of this environment
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    shims = tmp_path / "shims"  # an environment installed before ct-explain existed lacks its script:
    shims.mkdir()               # run the same entry point (tests/test_console_scripts.py checks the entry itself)
    for script in ("ct-train", "ct-explain"):
        if not (bin_dir / script).exists():
            module = script.replace("ct-", "recipes.")
            (shims / script).write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; from {module} import cli; '
                                        f'sys.exit(cli())" "$@"\n')
            (shims / script).chmod(0o755)
    env = {**os.environ, **TINY, "PATH": f"{bin_dir}{os.pathsep}{shims}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "UI_PORT": str(free_port()), "SERVE_PORT": str(free_port()),
           "CHROMIUM": chromium or "true", "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore"}
    env.pop("MLFLOW_TRACKING_URI")
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", page_commands()], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=1500)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the page's own background servers, if it stopped early
    assert process.returncode == 0, output[-5000:]

    before, after = (json.loads((tmp_path / f"explain_{name}.json").read_text()) for name in ("before", "after"))
    for explained in (before, after):
        assert len(explained) == 1
        row = explained[0]
        assert row["factual"]["age"] == 29 and row["target"] == "yes"
        assert row["counterfactual"]["age"] == 29 and row["counterfactual"]["sex"] == "female"  # immutable
        assert row["counterfactual"]["home_ownership"] in ("rent", "mortgage", "own")
        assert float(row["counterfactual"]["income"]).is_integer()
        assert {c["feature"] for c in row["changes"]} <= {"income", "debt", "years_employed", "home_ownership",
                                                          "purpose"}
    assert "row 1: predicted" in output and " → " in output
    answer = json.loads((tmp_path / "answer.json").read_text())["predictions"][0]
    assert answer["prediction"] in ("yes", "no") and {"probability_yes", "probability_no", "changes"} <= set(answer)
    assert answer["counterfactual"]["age"] == 29 and answer["counterfactual"]["sex"] == "female"  # as trained
    if chromium:
        for name in ("compare_runs", "model"):
            assert (tmp_path / "docs" / "img" / f"worked_example_{name}.png").stat().st_size > 10_000
