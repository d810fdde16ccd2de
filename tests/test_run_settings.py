"""Your CSV, your model: a run remembers what it was trained with, so later commands need not repeat it.

A table read with a data spec, ``--impute``, ``--drop-columns``, and a network of one's own (``--model
package.module:factory`` with BatchNorm, ``--model-inputs``) are trained twice (the model as it is, and CT); then
``compare.py --bl-run-id --ct-run-id`` and ``evaluate.py --checkpoint runs:/ID/model`` take the data and the
model's settings from those runs. A value given that differs from the runs', or runs that differ from each other,
are refused in one line before any work. Real trainings, a real MLflow SQLite store, real recipe processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from preloaded import run_script

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
NUMBERS, CATEGORIES = ["age", "income", "debt", "years_employed"], ["home_ownership", "purpose", "sex"]
TINY = ["--n-runs", "1", "--n-individuals", "4", "--lambda-energy", "1", "--eval-steps", "10", "--no-progress"]
BATCHNORM_NET = (
    "from torch import nn\n"
    "def make(n_features, n_classes):\n"
    "    return nn.Sequential(nn.Linear(n_features, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, n_classes))\n")
# Linear(13, 8) 112 + BatchNorm1d(8) 16 (weight, bias) + Linear(8, 2) 18; its running mean, variance and count (17
# numbers) are buffers, not weights
WEIGHTS, BUFFERS = 146, 17


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The model as it is (``before``), fine-tuned with CT (``after``), and the model as it is on the table read with
    another ``--impute`` (``other``), each with its start-up lines."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from ct_lightning.experiment.runs.train import train
    from ct_lightning.model_inputs import model_inputs_from_sklearn

    folder = tmp_path_factory.mktemp("own-runs")
    table = folder / "applicants.csv"
    rows = pd.read_csv(LOANS)
    rows.insert(0, "applicant_id", range(len(rows)))  # an identifier, no feature: --drop-columns
    rows.to_csv(table, index=False)
    (folder / "spec.yaml").write_text("columns:\n  age: {mutability: none}\n")
    (folder / "bnnet.py").write_text(BATCHNORM_NET)
    preprocess = ColumnTransformer([("cat", OneHotEncoder(drop="if_binary"), CATEGORIES),
                                    ("num", StandardScaler(), NUMBERS)]).fit(rows.drop(columns=["applicant_id",
                                                                                                "approved"]))
    (folder / "model-inputs.json").write_text(json.dumps(model_inputs_from_sklearn(preprocess)))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        import bnnet

        torch.manual_seed(0)
        torch.save(bnnet.make(13, 2).state_dict(), folder / "bn.pt")
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        common = {"data": str(table), "target": "approved", "data_spec": str(folder / "spec.yaml"),
                  "impute": "median", "drop_columns": ["applicant_id"], "model": "bnnet:make",
                  "model_inputs": str(folder / "model-inputs.json"), "from_checkpoint": str(folder / "bn.pt"),
                  "max_epochs": 1, "nce": 16, "tracking_uri": uri, "progress": False}
        made = {}
        for name, extra in {"before": {"objective": "vanilla", "limit_train_batches": 0},
                            "after": {"limit_train_batches": 2, "checkpoint_dir": str(folder / "after")},
                            "other": {"objective": "vanilla", "limit_train_batches": 0, "impute": "none"}}.items():
            lines: list[str] = []
            summary = train({**common, **extra}, echo=lambda *parts, **_: lines.append(" ".join(map(str, parts))))
            made[name] = {"run_id": summary["run_id"], "lines": lines}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)]), "MLFLOW_TRACKING_URI": "",
           "PYTHONWARNINGS": "ignore", "CT_CACHE_DIR": str(folder / "cache")}
    return {**made, "uri": uri, "folder": folder, "table": table, "env": env}


def test_the_weights_of_a_model_with_batchnorm_are_its_parameters_not_its_running_statistics(runs):
    """The start-up line counted every tensor of the state_dict, BatchNorm's running mean, variance and batch count
    included: 163 'weights' for a network of 146."""
    [line] = [line for line in runs["before"]["lines"] if line.startswith("the model as it is: ")]
    assert f"the model bnnet:make, {WEIGHTS} weights, reading the 13 inputs of --model-inputs" in line, line
    assert str(WEIGHTS + BUFFERS) not in line


@pytest.mark.slow  # a recipe process
def test_evaluate_takes_a_logged_model_of_ones_own_from_its_run(runs, tmp_path):
    """``evaluate.py --checkpoint runs:/ID/model`` of a run trained with --model and --model-inputs needed --data,
    --target, --model and --model-inputs again (without --model: a layer-name error); it now reads the model with
    its run's settings, as --run-id does, with no option repeated."""
    uri = f"runs:/{runs['after']['run_id']}/model"
    done = run_script(ROOT / "recipes" / "evaluate.py", ["--checkpoint", uri, "--tracking-uri", runs["uri"], *TINY,
                      "--no-log", "--summary-json", str(tmp_path / "eval.json"), "--out-dir", str(tmp_path / "plots")],
                      env=runs["env"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    payload = json.loads((tmp_path / "eval.json").read_text())
    assert payload["checkpoint"] == uri and payload["data"] == "applicants"
    assert payload["immutable"] == ["age"]  # the data spec the run was trained with holds
    assert 0.0 <= payload["summary"]["validity"] <= 1.0


@pytest.mark.slow  # a recipe process
def test_compare_takes_the_data_and_the_table_settings_from_the_given_runs(runs, tmp_path):
    """``compare.py --bl-run-id --ct-run-id`` needed --data, --target, --data-spec, --impute and --drop-columns
    repeated as the runs were trained; it now takes them from the runs' config.json and says so."""
    argv = ["--bl-run-id", runs["before"]["run_id"], "--ct-run-id", runs["after"]["run_id"], "--no-actionability",
            "--tracking-uri", runs["uri"], "--out-dir", str(tmp_path / "out"), "--n-boot", "10", *TINY]
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "compare.py"), *argv], env=runs["env"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)  # PYTHONPATH: bnnet's folder
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    said = [line for line in output.splitlines() if line.startswith("from the given runs")]
    assert said == [f"from the given runs (their config.json, not repeated on the command line): --data "
                    f"{runs['table']} --target approved --data-spec {runs['folder'] / 'spec.yaml'} --impute median "
                    f"--drop-columns applicant_id"], output[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    [row] = summary["rows"]
    assert row["data"] == "applicants" and row["runs"] == {"bl": runs["before"]["run_id"],
                                                           "ct": runs["after"]["run_id"]}
    assert row["evaluated_under"]["bl"].startswith("immutable: age")  # the runs' data spec held


@pytest.mark.parametrize("given, said", [
    (["--target", "sex"], "error: --target: got 'sex'; allowed: approved, what --bl-run-id {before} was trained with "
                          "(leave --target out to take it from the runs)"),
    (["--impute", "drop"], "error: --impute: got 'drop'; allowed: median, what --bl-run-id {before} was trained with"),
    (["--drop-columns", "sex"], "error: --drop-columns: got 'sex'; allowed: applicant_id, what --bl-run-id {before}"),
    (["--data-spec", "{other_spec}"], "error: --data-spec: got '{other_spec}'; allowed: {spec}, what --bl-run-id"),
    (["--data", "{copy}", "--target", "approved"], "error: --data: got '{copy}'; allowed: {table}, the data "
                                                   "--bl-run-id {before} was trained on"),
    (["--bl-run-id", "{other}"], "error: --ct-run-id: got '{after}' (trained with --impute median); allowed: a run "
                                 "trained with --impute none, as --bl-run-id {other} was"),
    # every role given: compare trains nothing, so a model of one's own would be silently ignored
    (["--model", "bnnet:make"], "error: --model: got 'bnnet:make' (every role is given by run id, so compare trains "
                                "nothing with it); allowed: --model left out, or a role's run id left empty"),
], ids=["target", "impute", "drop-columns", "data-spec", "data", "runs that differ", "model unused"])
def test_a_setting_that_differs_from_the_runs_is_refused_in_one_line(runs, tmp_path, capsys, given, said):
    from recipes.compare import main

    other_spec = tmp_path / "spec.yaml"
    other_spec.write_text("columns:\n  income: {mutability: increase}\n")
    copy = tmp_path / "applicants.csv"  # another table under the same name: its last row left out
    copy.write_text("".join(runs["table"].read_text().splitlines(keepends=True)[:-1]))
    names = {"before": runs["before"]["run_id"], "after": runs["after"]["run_id"], "other": runs["other"]["run_id"],
             "other_spec": other_spec, "spec": runs["folder"] / "spec.yaml", "copy": copy, "table": runs["table"]}
    argv = ["--bl-run-id", runs["before"]["run_id"], "--ct-run-id", runs["after"]["run_id"], "--no-actionability",
            "--tracking-uri", runs["uri"], "--out-dir", str(tmp_path / "out"), *TINY]
    argv += [part.format(**names) for part in given]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert refused.value.code == 2 and len(errors) == 1 and errors[0].startswith(said.format(**names)), errors
    assert not (tmp_path / "out").exists()  # before any work


def test_a_copy_of_the_runs_table_or_one_where_theirs_no_longer_is_is_taken_and_said(runs, tmp_path):
    """A table of the same content elsewhere is the runs' data (a copy); where the runs' table no longer exists (the
    project moved), the given one is taken in its place and the start-up line says so; before, both were refused."""
    import argparse
    import shutil

    from ct_lightning.experiment.runs.train import train
    from ct_lightning.experiment.workflows.compare_runs import settings_from_runs

    def settings(data: Path, *ids: str) -> tuple[list[str], list[str]]:
        args = argparse.Namespace(tracking_uri=runs["uri"], data_sets=str(data), target=None, data_spec=None,
                                  impute=None, drop_columns=None, balance=None)
        return settings_from_runs(args, {"bl": list(ids)}, [str(data)])

    copy = tmp_path / "copy.csv"
    copy.write_bytes(runs["table"].read_bytes())
    names, taken = settings(copy, runs["before"]["run_id"])
    assert names == [str(copy)] and not any("in place of" in part for part in taken)
    gone = tmp_path / "old" / "loans.csv"
    gone.parent.mkdir()
    shutil.copy(LOANS, gone)
    summary = train({"data": str(gone), "target": "approved", "objective": "vanilla", "limit_train_batches": 1,
                     "max_epochs": 1, "tracking_uri": runs["uri"], "progress": False})
    shutil.rmtree(gone.parent)
    moved = tmp_path / "new" / "loans.csv"
    moved.parent.mkdir()
    shutil.copy(LOANS, moved)
    names, taken = settings(moved, summary["run_id"])
    assert names == [str(moved)] and f"(--data {moved} in place of {gone}, which no longer exists)" in taken, taken


def test_the_runs_config_files_are_removed_once_compare_has_read_its_settings(runs, tmp_path, monkeypatch):
    """compare downloads each given run's config.json into a temporary folder; before, the folder was left behind
    (one per run, each comparison)."""
    import argparse
    import tempfile

    from ct_lightning.experiment.workflows.compare_runs import settings_from_runs

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    args = argparse.Namespace(tracking_uri=runs["uri"], data_sets=None, target=None, data_spec=None, impute=None,
                              drop_columns=None, balance=None)
    names, taken = settings_from_runs(args, {"bl": [runs["other"]["run_id"]]}, None)
    assert names == [str(runs["table"])] and args.impute == "none", (names, taken)  # read from the run's file
    assert not list(temporary.glob("ct-compare-*")), list(temporary.iterdir())


def test_explain_reads_a_runs_model_uri_as_its_run_id(runs, capsys):
    """``explain.py --checkpoint runs:/ID/model``, as evaluate.py takes it, was refused as 'not a readable
    checkpoint'; it explains as ``--run-id ID`` does, with a note. A registered model that is not there, and another
    URI, are refused in one line."""
    from recipes.explain import main

    row = pd.read_csv(runs["table"]).drop(columns="approved").iloc[0].to_dict()
    common = ["--tracking-uri", runs["uri"], "--row", json.dumps({k: v.item() if hasattr(v, "item") else v
                                                                  for k, v in row.items()}), "--no-log"]
    run_id = runs["after"]["run_id"]
    by_uri = main(["--checkpoint", f"runs:/{run_id}/model", *common])
    assert f"note: --checkpoint runs:/{run_id}/model read as --run-id {run_id}" in capsys.readouterr().out
    assert by_uri == main(["--run-id", run_id, *common])
    with pytest.raises(SystemExit) as refused:
        main(["--checkpoint", "models:/credit/1", *common])
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: --checkpoint: got 'models:/credit/1' (no registered model 'credit'); allowed: models:/NAME/VERSION")
    with pytest.raises(SystemExit) as refused:
        main(["--checkpoint", "dbfs:/models/credit", *common])
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --checkpoint: got 'dbfs:/models/credit' (explain.py reads no other URI); allowed: a checkpoint file, "
        "runs:/RUN_ID/model, models:/NAME/VERSION, or --run-id ID for a model of an MLflow run")


@pytest.mark.slow  # a whole compare
def test_compare_trains_the_missing_role_on_the_given_runs_model_of_ones_own(runs, tmp_path, capsys, monkeypatch):
    """compare with only --bl-run-id of a model of one's own was refused (it would have trained its default MLP for
    the CT role); it now trains that role on the run's network, weights, inputs, epochs and lr, and says so."""
    from recipes.compare import main

    monkeypatch.syspath_prepend(str(runs["folder"]))  # bnnet.py
    before, folder = runs["before"]["run_id"], runs["folder"]
    summary = main(["--bl-run-id", before, "--no-actionability", "--nce", "16", "--limit-train-batches", "2",
                    "--n-boot", "10", "--tracking-uri", runs["uri"], "--out-dir", str(tmp_path / "out"), *TINY])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("from the given runs")]
    assert said and said[0].endswith(f"--model bnnet:make --from-checkpoint {folder / 'bn.pt'} --model-inputs "
                                     f"{folder / 'model-inputs.json'} --max-epochs 1 --lr 0.001"), said
    [row] = summary["rows"]
    trained = row["runs"]["ct"]
    assert row["runs"]["bl"] == before and trained not in (before, runs["after"]["run_id"])
    from mlflow.tracking import MlflowClient

    params = MlflowClient(runs["uri"]).get_run(trained).data.params
    assert (params["model"], params["from_checkpoint"], params["max_epochs"], params["objective"]) == \
        ("bnnet:make", str(folder / "bn.pt"), "1", "full"), params


def test_compare_refuses_runs_of_other_networks_where_it_trains_roles_beside_them(runs, tmp_path, capsys):
    """Runs of different networks (a default MLP beside a model of one's own), or a --model other than the runs',
    leave compare no one network to train the missing roles with: refused in one line naming the run or option."""
    from ct_lightning.experiment.runs.train import train
    from recipes.compare import main

    mlp = train({"data": str(runs["table"]), "target": "approved", "data_spec": str(runs["folder"] / "spec.yaml"),
                 "impute": "median", "drop_columns": ["applicant_id"], "objective": "vanilla", "max_epochs": 1,
                 "nce": 16, "limit_train_batches": 1, "tracking_uri": runs["uri"], "progress": False})["run_id"]
    before, after = runs["before"]["run_id"], runs["after"]["run_id"]
    for given, said in (
            (["--bl-run-id", mlp, "--ct-run-id", after], f"error: --ct-run-id: got '{after}' (trained with --model "
             f"bnnet:make); allowed: a run trained with --model mlp, as --bl-run-id {mlp} was (compare trains "
             "bl_protected, ct_protected with one network)"),
            (["--bl-run-id", before, "--no-actionability", "--model", "mlp"], "error: --model: got 'mlp'; allowed: "
             f"bnnet:make, what --bl-run-id {before} was trained with (leave --model out to take it from the runs)")):
        with pytest.raises(SystemExit) as refused:
            main([*given, "--tracking-uri", runs["uri"], "--out-dir", str(tmp_path / "out"), *TINY])
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert refused.value.code == 2 and errors == [said], errors
        assert not (tmp_path / "out").exists()
