"""``recipes/compare.py`` on a table whose data spec already fixes columns (a user walk-through):

- without ``--immutable`` the actionability pair trained with exactly the plausibility pair's constraints: two of
  the four trainings were duplicates (the same weights). Now the pair's models are the plausibility pair's, trained
  once, evaluated for the cost column with the protected columns immutable, and the plan says so in one line;
- a protected role's start-up line said ``mutability (data spec, --protect)`` though the user gave no ``--protect``:
  it names compare's actionability pair (train.py's own line with ``--protect`` is unchanged);
- with ``--jobs 2`` each worker process printed the table's description and CT settings: now compare prints them
  once, before its trainings;
- every parent run of one table was named ``compare /abs/path/loans.csv``: now ``compare-loans-s0-...`` with what
  tells two compares apart and a short id.

Real tiny trainings (one epoch, two batches), a real MLflow SQLite store; the built-in sets' keys are unchanged.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
SPEC = "columns:\n  sex: {mutability: none}\n  age: {mutability: increase}\n"
TINY = ["--max-epochs", "1", "--nce", "16", "--limit-train-batches", "2", "--n-runs", "1", "--n-individuals", "6",
        "--lambda-energy", "1", "--eval-steps", "10", "--n-boot", "10", "--no-progress"]


def _trainings(client) -> dict[str, str]:
    """``run id → name`` of the training runs in the store (the parent runs left out)."""
    runs = client.search_runs([client.get_experiment_by_name("ct-lightning").experiment_id])
    return {run.info.run_id: run.info.run_name for run in runs if run.data.tags.get("ct.role") != "compare"}


def _parents(client) -> dict[str, str]:
    runs = client.search_runs([client.get_experiment_by_name("ct-lightning").experiment_id])
    return {run.info.run_id: run.info.run_name for run in runs if run.data.tags.get("ct.role") == "compare"}


def _sex_moves(client, run_id: str) -> int:
    """Counterfactuals of the run's stored evaluations that changed sex (every evaluation stored on it)."""
    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.studies.reproduce import load_evaluation

    names = list(load_run(run_id, client.tracking_uri).module.hparams.feature_names)
    moved = 0
    for artifact in client.list_artifacts(run_id, "evaluations"):
        result = load_evaluation(client.download_artifacts(run_id, artifact.path, tempfile.mkdtemp()))
        step = torch.as_tensor(result.counterfactuals) - torch.as_tensor(result.factuals)
        moved += int((step[:, names.index("sex")].abs() > 1e-6).sum())
    return moved


@pytest.mark.slow  # three tiny compares
def test_a_spec_that_already_protects_trains_each_model_once_and_names_the_pair(tmp_path, monkeypatch, capfd):
    from mlflow.tracking import MlflowClient

    from recipes.compare import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "loans.yaml").write_text(SPEC)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--data", str(LOANS), "--target", "approved", "--data-spec", "loans.yaml", "--tracking-uri", store,
            "--out-dir", str(tmp_path / "out"), *TINY]
    client = MlflowClient(tracking_uri=store)

    # --jobs 2: the reused models are evaluated after their training, never trained a second time beside it (capfd:
    # the workers print too)
    summary = main([*argv, "--jobs", "2"])
    out = capfd.readouterr().out
    [row] = summary["rows"]
    runs = row["runs"]
    assert runs["bl_protected"] == runs["bl"] and runs["ct_protected"] == runs["ct"], runs
    assert set(_trainings(client)) == {runs["bl"], runs["ct"]}, _trainings(client)  # two trainings, not four
    assert ("loans: the actionability pair would train exactly as the plausibility pair (no --immutable; the data "
            "spec holds sex immutable in both): its BL and CT are trained once") in out, out[-3000:]
    assert "reuse the model of loans/bl (the same training)" in out, out[-3000:]
    # the table's description and CT settings once for the compare, not once per worker process
    assert out.count("columns (kind from") == 1 and out.count("CT settings (given") == 1, out[-3000:]
    # the cost column is still measured with the protected column immutable (and age only increasing)
    assert row["evaluated_under"]["ct_protected"] == "immutable: sex; increase only: age; within the data domain"
    assert row["evaluated_under"]["bl_protected"] == row["evaluated_under"]["ct_protected"]
    assert summary["rows"][0]["protocol"]["ct_protected"]["tau"] == pytest.approx(0.5)  # the cost pair's protocol
    assert all(_sex_moves(client, run_id) == 0 for run_id in set(runs.values()))
    assert "mutability (data spec): age: increase, sex: none" in out
    first_parent = summary["parent_run_id"]

    # a re-run reuses both models and every evaluation
    again = main(argv)
    out = capfd.readouterr().out
    assert again["rows"][0]["runs"] == runs
    assert "reproduction: 4 models, 4 already trained and evaluated in the store; 0 to do" in out, out[-3000:]
    assert set(_trainings(client)) == {runs["bl"], runs["ct"]}

    # with --immutable age the actionability pair is one of its own: trained (the plausibility pair reused), and
    # its start-up line names compare's pair, not a --protect the user never gave
    protected = main([*argv, "--immutable", "age"])
    out = capfd.readouterr().out
    other = protected["rows"][0]["runs"]
    assert (other["bl"], other["ct"]) == (runs["bl"], runs["ct"])  # the plausibility pair's keys are unchanged
    assert other["bl_protected"] not in runs.values() and other["ct_protected"] not in runs.values()
    assert "mutability (data spec, --immutable, compare's actionability pair): age: none, sex: none" in out, \
        out[-3000:]
    assert "--protect" not in out.replace("--protected", "")

    # two compares of one table (the re-run reopened the first's parent), two names one tells apart in the UI
    parents = _parents(client)
    assert len(parents) == 2 and len(set(parents.values())) == 2, parents
    assert parents[first_parent] == f"compare-loans-s0-spec-loans-1ep-{first_parent[:6]}", parents
    assert parents[protected["parent_run_id"]].startswith("compare-loans-s0-immutable-age-spec-loans-1ep-"), parents


def test_the_mutability_line_names_who_set_protect():
    """train.py's own line with --protect is as it was; compare's protected roles name the pair instead."""
    from ct_lightning.experiment.configuration.data import mutability_line

    held = {"age": "none", "sex": "none", "income": "increase"}
    config = {"immutable": ["age"], "protect": True}
    assert mutability_line(config, held, from_data=True) == \
        "mutability (data spec, --immutable, --protect): age: none, sex: none, income: increase"
    assert mutability_line(config, held, True, protect_by="compare's actionability pair") == \
        "mutability (data spec, --immutable, compare's actionability pair): age: none, sex: none, income: increase"


def test_a_reopened_parent_with_the_old_name_takes_the_descriptive_one(tmp_path):
    """Parents stored before were all ``compare PATH``; reopened (the same compare again), one gets its new name. A
    new parent's name ends in its short id, so even two compares that differ only where the name does not look
    (--n-runs, say) differ in the UI."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.studies.reproduce import find_or_create_parent

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("ct-lightning", artifact_location=str(tmp_path / "artifacts"))
    old = client.create_run(experiment, run_name=f"compare {LOANS}", tags={"ct.reproduction_key": "k1"}).info.run_id
    assert find_or_create_parent(client, "ct-lightning", None, "k1", "compare-loans-s0") == old
    assert client.get_run(old).info.run_name == f"compare-loans-s0-{old[:6]}"
    client.update_run(old, name="my own name")  # a name the user gave in the UI is kept
    assert find_or_create_parent(client, "ct-lightning", None, "k1", "compare-loans-s0") == old
    assert client.get_run(old).info.run_name == "my own name"
    new = find_or_create_parent(client, "ct-lightning", None, "k2", "compare-loans-s0")
    assert new != old and client.get_run(new).info.run_name == f"compare-loans-s0-{new[:6]}"


@pytest.mark.parametrize("data, keys", [
    ("ls", [("bl", "dd857f8254a0574ee05c", "321f800817bdc0b3c70e"),
            ("ct", "e6d5253551f3c37fb101", "321f800817bdc0b3c70e"),
            ("bl_protected", "b8e7a0a4d55951dd8f2e", "19fbe9dac5aa54ea1316"),
            ("ct_protected", "3812fe12c708095c94ee", "19fbe9dac5aa54ea1316")]),
    ("adult", [("bl", "e8dbbf7f09d4a6664fe7", "0ecbd3c1e6b94bda74ed"),
               ("ct", "3fbb82b2ee446f36658a", "0ecbd3c1e6b94bda74ed"),
               ("bl_protected", "95d96763e4d3607c29ce", "4bba977f92a9b030f0de"),
               ("ct_protected", "8a0de9898b489678835e", "4bba977f92a9b030f0de")]),
])
def test_the_built_in_sets_keep_their_training_and_evaluation_keys(data, keys):
    """Stored Table 1 runs of the built-in sets are found by these keys (values from before the pairs could share a
    training): each role trains and is evaluated as before."""
    from ct_lightning.experiment.studies.reproduce import training_key
    from ct_lightning.experiment.workflows.compare import build_tasks
    from recipes.compare import build_parser

    args = build_parser().parse_args(["--data", data, "--max-epochs", "3"])
    tasks = build_tasks([data], {}, args, None)
    assert [(t.role, training_key(t.resolved_config()), t.eval_key()) for t in tasks] == keys
    assert not any(getattr(t, "training_of", None) for t in tasks)


@pytest.mark.parametrize("immutable, shared", [(None, ["sex"]), ("sex", ["sex"]), ("age", None), ("income", None)])
def test_the_pairs_share_a_training_exactly_when_the_protected_one_adds_nothing(tmp_path, immutable, shared):
    """An --immutable that names only the data spec's immutable columns adds nothing either (the same training);
    one that adds a column, or makes age (increase only) immutable, trains a pair of its own. Shared roles have the
    plausibility roles' training keys; the others keep theirs."""
    from ct_lightning.experiment.studies.reproduce import training_key
    from ct_lightning.experiment.workflows.compare import build_tasks, check_table_options
    from recipes.compare import build_parser

    (tmp_path / "loans.yaml").write_text(SPEC)
    argv = ["--data", str(LOANS), "--target", "approved", "--data-spec", str(tmp_path / "loans.yaml"),
            "--max-epochs", "1", *(["--immutable", immutable] if immutable else [])]
    args = build_parser().parse_args(argv)
    same = check_table_options(args, [str(LOANS)])
    assert same == ({str(LOANS): shared} if shared else {})
    tasks = {t.role: t for t in build_tasks([str(LOANS)], {}, args, None, same)}
    for role in ("bl", "ct"):
        protected = tasks[f"{role}_protected"]
        assert protected.training_of == (role if shared else None)
        same_key = training_key(protected.resolved_config()) == training_key(tasks[role].resolved_config())
        assert same_key == bool(shared)
    # --bl-run-id given: that role's actionability model is compare's own training again (the given run was trained
    # as it was); the CT pair still shares one
    given = build_tasks([str(LOANS)], {"bl": ["RUNID"]}, args, None, same)
    assert [t.training_of for t in given] == [None, None, None, "ct" if shared else None]
