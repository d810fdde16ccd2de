"""``recipes/compare.py`` on a user's table (issue 23 §1): ``--data FILE --target COL --immutable COLS``.

A real tiny reproduction on tests/fixtures/loans.csv: four models (BL and CT, all mutable; BL and CT with the
given columns protected), evaluated with the protocol; the row is named by the file, the protected pair's
models hold the columns immutable and the plausibility pair's do not; a re-run reuses every model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from preloaded import run_script

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"


def _command(store: str, out: Path) -> list[str]:
    return ["--data", str(LOANS), "--target", "approved",
            "--immutable", "age,sex", "--max-epochs", "2", "--n-runs", "1", "--n-individuals", "10", "--n-boot", "10",
            "--tracking-uri", store, "--out-dir", str(out), "--no-progress"]


@pytest.mark.slow
def test_compare_on_a_table_trains_evaluates_and_resumes(tmp_path):
    from mlflow.tracking import MlflowClient

    store, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""}
    first = run_script(ROOT / "recipes" / "compare.py", _command(store, out), env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Traceback" not in first.stdout + first.stderr
    summary = json.loads((out / "summary.json").read_text())
    [row] = summary["rows"]
    assert row["data"] == "loans" and set(row["runs"]) == {"bl", "ct", "bl_protected", "ct_protected"}
    assert "| loans |" in (out / "table.md").read_text()
    client = MlflowClient(tracking_uri=store)
    names = {role: client.get_run(run_id).info.run_name for role, run_id in row["runs"].items()}
    assert len({name.rsplit("-", 1)[0] for name in names.values()}) == 4, names  # four roles, four names
    assert "-BL-protected-" in names["bl_protected"] and "-CT-protected-" in names["ct_protected"], names
    registered = {m.name for m in client.search_registered_models()}
    assert {"ct-loans-bl", "ct-loans-ct", "ct-loans-bl-protected", "ct-loans-ct-protected"} <= registered, registered
    for role, run_id in row["runs"].items():
        params = client.get_run(run_id).data.params
        assert params["target"] == "approved" and params["data"].endswith("loans.csv"), params
        immutable = params.get("immutable", "[]")
        if role.endswith("protected"):
            assert "age" in immutable and "sex" in immutable, (role, immutable)
        else:
            assert "age" not in immutable, (role, immutable)  # the plausibility pair keeps every feature mutable
    second = run_script(ROOT / "recipes" / "compare.py", _command(store, out), env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("reuse finished run") == 4, second.stdout[-3000:]
