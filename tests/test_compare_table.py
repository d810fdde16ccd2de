"""``recipes/compare.py`` on a user's table (issue 23 §1): ``--data FILE --target COL --immutable COLS``.

A real tiny reproduction on tests/fixtures/loans.csv with a data spec (sex immutable, income increase only): four
models (BL and CT with the spec's mutability; BL and CT with --immutable age added), evaluated with the protocol;
the row is named by the file, the protected pair's models hold the columns immutable and the plausibility pair's
do not; the spec holds in the evaluation of both pairs, as in their training, and the report says so; a re-run
reuses every model.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from preloaded import run_script
import torch

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
SPEC = "columns:\n  sex: {mutability: none}\n  income: {mutability: increase}\n"


def _command(store: str, out: Path, spec: Path) -> list[str]:
    return ["--data", str(LOANS), "--target", "approved", "--data-spec", str(spec),
            "--immutable", "age", "--max-epochs", "2", "--n-runs", "1", "--n-individuals", "10", "--n-boot", "10",
            "--tracking-uri", store, "--out-dir", str(out), "--no-progress"]


def _moves(client, run_id: str) -> dict[str, int]:
    """In the run's stored evaluation: how many counterfactuals moved sex, lowered income, moved age."""
    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.studies.reproduce import load_evaluation

    [stored] = [a.path for a in client.list_artifacts(run_id, "evaluations")]
    result = load_evaluation(client.download_artifacts(run_id, stored, tempfile.mkdtemp()))
    names = list(load_run(run_id, client.tracking_uri).module.hparams.feature_names)
    step = torch.as_tensor(result.counterfactuals) - torch.as_tensor(result.factuals)
    return {"sex": int((step[:, names.index("sex")].abs() > 1e-6).sum()),
            "income_down": int((step[:, names.index("income")] < -1e-6).sum()),
            "age": int((step[:, names.index("age")].abs() > 1e-6).sum())}


@pytest.mark.slow
def test_compare_on_a_table_trains_evaluates_and_resumes(tmp_path):
    from mlflow.tracking import MlflowClient

    store, out, spec = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "out", tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""}
    first = run_script(ROOT / "recipes" / "compare.py", _command(store, out, spec), env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Traceback" not in first.stdout + first.stderr
    summary = json.loads((out / "summary.json").read_text())
    [row] = summary["rows"]
    assert row["data"] == "loans" and set(row["runs"]) == {"bl", "ct", "bl_protected", "ct_protected"}
    table = (out / "table.md").read_text()
    assert "| loans |" in table
    client = MlflowClient(tracking_uri=store)
    names = {role: client.get_run(run_id).info.run_name for role, run_id in row["runs"].items()}
    assert len({name.rsplit("-", 1)[0] for name in names.values()}) == 4, names  # four roles, four names
    assert "-BL-protected-" in names["bl_protected"] and "-CT-protected-" in names["ct_protected"], names
    registered = {m.name for m in client.search_registered_models()}
    assert {"ct-loans-bl", "ct-loans-ct", "ct-loans-bl-protected", "ct-loans-ct-protected"} <= registered, registered
    # registered without MLflow's own lines ("Successfully registered model ...", "Created version ...")
    assert "registered model" not in first.stdout + first.stderr and "Created version" not in first.stderr
    plausibility = "immutable: sex; increase only: income; within the data domain"
    actionability = "immutable: age, sex; increase only: income; within the data domain"
    for role, run_id in row["runs"].items():
        params = client.get_run(run_id).data.params
        assert params["target"] == "approved" and params["data"].endswith("loans.csv"), params
        immutable = params.get("immutable", "[]")
        protected = role.endswith("protected")
        assert ("age" in immutable) == protected, (role, immutable)  # --immutable: the actionability pair only
        # the data spec is a fact of the data: it holds in the evaluation of every model, as in its training
        assert row["evaluated_under"][role] == (actionability if protected else plausibility), row["evaluated_under"]
        moves = _moves(client, run_id)
        assert moves["sex"] == 0 and moves["income_down"] == 0, (role, moves)
        assert moves["age"] == 0 or not protected, (role, moves)
    assert f"- loans, IP/IP*: {plausibility}" in table and f"- loans, Cost: {actionability}" in table, table
    assert f"- loans, IP/IP*: {plausibility}" in first.stdout, first.stdout[-3000:]
    second = run_script(ROOT / "recipes" / "compare.py", _command(store, out, spec), env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("reuse finished run") == 4, second.stdout[-3000:]
