"""explain(): one explanation per row in original units, the target's probability recomputed on the decoded row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from preloaded import run_script
import torch

from ct_lightning.evaluation.explanation import FeatureCodec, describe, explain, format_value, to_records
from ct_lightning.models import build_mlp
from explain_codec import SmallCodec, model_of_income_and_home

ROOT = Path(__file__).resolve().parents[1]


ROWS = pd.DataFrame({"income": [42_000.0, 38_500.0], "home": ["rent", "mortgage"]})


def test_probability_is_recomputed_on_the_decoded_counterfactual():
    codec, model = SmallCodec(), model_of_income_and_home()
    result = explain(model, ROWS, target="yes", codec=codec, generator="generic", tau=0.9, max_steps=200)
    assert len(result) == 2 and list(result["target"]) == ["yes", "yes"]
    for _, row in result.iterrows():
        decoded = pd.DataFrame([row["counterfactual"]])
        assert decoded["home"].iloc[0] in codec.columns[1].categories  # a real category
        with torch.no_grad():  # independent computation: encode the decoded row, softmax, target class
            expected = torch.softmax(model(torch.from_numpy(codec.encode(decoded))), 1)[0, 1].item()
        assert row["probability"] == pytest.approx(expected, rel=1e-5)
        assert row["valid"] == (expected > 0.5)
        changed = {c["feature"] for c in row["changes"]}
        assert changed == {k for k in row["factual"] if row["factual"][k] != row["counterfactual"][k]}
        assert row["prediction"] == "no" and row["prediction_probability"] > 0.5


def test_immutable_columns_never_change():
    codec, model = SmallCodec(immutable_home=True), model_of_income_and_home()
    result = explain(model, ROWS, target="yes", codec=codec, generator="ecco", max_steps=200)
    for _, row in result.iterrows():
        assert row["counterfactual"]["home"] == row["factual"]["home"]
        assert "home" not in {c["feature"] for c in row["changes"]}
    also = explain(model, ROWS, target="yes", codec=SmallCodec(), mutability={"income": "none"}, max_steps=50)
    assert all(r["income"] == f["income"] for r, f in zip(also["counterfactual"], also["factual"]))


def test_bad_rows_and_targets_are_refused():
    codec, model = SmallCodec(), model_of_income_and_home()
    with pytest.raises(ValueError, match="missing column 'home'"):
        explain(model, ROWS[["income"]], codec=codec)
    with pytest.raises(ValueError, match="unknown column 'age'"):
        explain(model, ROWS.assign(age=3), codec=codec)
    with pytest.raises(ValueError, match="target: got 'maybe'; allowed: no, yes"):
        explain(model, ROWS, target="maybe", codec=codec)
    with pytest.raises(ValueError, match="rows: got no rows"):
        explain(model, ROWS.iloc[:0], codec=codec)


def test_default_target_is_the_most_likely_other_class_and_feature_codec_names_inputs():
    torch.manual_seed(0)
    model = build_mlp(3, 4, [8])
    codec = FeatureCodec(n_features=3, n_classes=4)
    assert codec.feature_names == ["x1", "x2", "x3"]
    rows = pd.DataFrame(np.random.default_rng(0).normal(size=(5, 3)), columns=codec.feature_names)
    result = explain(model, rows, codec=codec, max_steps=5)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor(rows.to_numpy(), dtype=torch.float32)), 1)
    p[torch.arange(5), p.argmax(1)] = -1
    assert result["target"].tolist() == p.argmax(1).tolist()


def test_changes_are_shown_with_the_digits_the_applicant_gave_and_never_as_no_change():
    """Fractions were shown with three significant digits: a monthly fee of 95.43 read 95.4, 36,428.20 read 36,428,
    and a change from 0.9 to 0.90006 read ``0.9 → 0.9``."""
    from ct_lightning.evaluation.explanation import format_change

    assert format_change(95.43, 52.41234) == "95.43 → 52.41"
    assert format_change(36428.2, 24582.1337) == "36,428.2 → 24,582.1"
    assert format_change(0.9, 0.90006) == "0.9 → 0.9001"
    assert format_change(0.25, 1 / 3) == "0.25 → 0.33" and format_change(38, 51) == "38 → 51"
    assert format_change(18203.08, 9057.988) == "18,203.08 → 9,057.99" and format_change(0.5, 0.0004) == "0.5 → 0.00040"
    assert format_change(30600.0, 45793.4) == "30,600 → 45,793" and format_change("rent", "own") == "rent → own"
    assert format_change(36428.2, 54848.2, "${}") == "$36,428.2 → $54,848.2"  # as the file wrote them
    assert format_change(7.5, 5.81, "{}%") == "7.5% → 5.8%" and format_change(-12, 3, "{} €") == "-12 € → 3 €"
    assert format_value(1234567.5) == "1,234,568" and format_value(0.123456789) == "0.123457"
    # a count read as floats (its column had a gap: pandas reads 5 as 5.0) changed to a whole number read 5 → 6.0
    assert format_change(5.0, 6) == "5 → 6" and format_change(2.0, 1.0) == "2 → 1"
    assert format_change(5.0, 5.4) == "5 → 5.4" and format_change(0.9, 0.0003) == "0.9 → 0.00030"


def test_text_and_json_forms():
    assert format_value(54600.0) == "54,600" and format_value(0.25) == "0.25" and format_value("rent") == "rent"
    result = explain(model_of_income_and_home(), ROWS, target="yes", codec=SmallCodec(), max_steps=200)
    text = describe(result)
    assert "row 0: predicted no" in text and "income: 42,000 → " in text
    records = json.loads(json.dumps(to_records(result)))
    assert {"factual", "counterfactual", "changes", "target", "probability", "valid"} <= set(records[0])
    # the class as a user may write it: 'YES' is 'yes' (no other class reads the same); a class it is not is refused
    shouted = explain(model_of_income_and_home(), ROWS, target="YES", codec=SmallCodec(), max_steps=200)
    assert shouted["target"].tolist() == ["yes", "yes"] and describe(shouted) == text
    with pytest.raises(ValueError, match="^target: got 'maybe'; allowed: no, yes$"):
        explain(model_of_income_and_home(), ROWS, target="maybe", codec=SmallCodec(), max_steps=200)
    assert all({"feature", "from", "to"} == set(c) for c in records[0]["changes"])
    already = explain(model_of_income_and_home(), ROWS, target="no", codec=SmallCodec(), max_steps=200, tau=0.5)
    assert list(already["prediction"]) == ["no", "no"] and not any(already["changes"])
    assert describe(already).count("nothing needs to change: already no") == 2 and "no change found" not in \
        describe(already)
    # Already the target but below τ (three or more classes: predicted at 0.39 with τ 0.5): the search still moves
    # the row, and the text must not read as if the target were not reached yet.
    unsure = explain(model_of_income_and_home(), ROWS, target="no", codec=SmallCodec(), max_steps=200, tau=0.999)
    assert list(unsure["prediction"]) == ["no", "no"] and all(unsure["changes"])
    lines = describe(unsure).splitlines()
    assert lines[1].startswith("  already no: nothing needs to change; to make it more certain (probability ")
    assert not any(line.startswith("  to get no") for line in lines)


def test_ct_explain_on_a_logged_run_prints_writes_json_and_logs(tmp_path):
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": "moons", "max_epochs": 1, "nce": 20, "progress": False, "tracking_uri": uri,
                 "immutable": ["x2"]})
    out = tmp_path / "explained.json"
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", run["run_id"],
                      "--tracking-uri", uri, "--row", '{"x1": 0.2, "x2": 0.4}', "--json", str(out)], cwd=tmp_path,
                      timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "row 1: predicted" in done.stdout
    records = json.loads(out.read_text())
    assert len(records) == 1 and records[0]["counterfactual"]["x2"] == pytest.approx(0.4)  # immutable, as trained
    folders = [a.path for a in MlflowClient(uri).list_artifacts(run["run_id"], "explanations")]
    files = {a.path.rsplit("/", 1)[1] for a in MlflowClient(uri).list_artifacts(run["run_id"], folders[0])}
    assert files == {"explanations.json", "explanations.csv", "explanations.png"}
    again = ["--run-id", run["run_id"], "--tracking-uri", uri, "--row", '{"x1": 0.3, "x2": 0.4}', "--json", str(out),
             "--no-log"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    before = out.read_text()
    refused = run_script(ROOT / "recipes" / "explain.py", again, cwd=tmp_path, timeout=300, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(f"error: --json: got '{out}' (the file exists)")
    assert "--overwrite" in refused.stderr and out.read_text() == before  # as train.py, unless told
    replaced = run_script(ROOT / "recipes" / "explain.py", [*again, "--overwrite"], cwd=tmp_path, timeout=300, env=env)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads(out.read_text())[0]["factual"]["x1"] == pytest.approx(0.3)


def test_rows_are_counted_from_one_wherever_explain_shows_them(tmp_path):
    """The first applicant of a file without an ID column was ``row 0`` in the console, the refusals, --json, --csv
    and the letters (``row-0.txt``, ``Your application (row 0)``): practitioners count rows from 1. read_rows numbers
    them so, and every output shows that number."""
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, explain_loaded, flat_table, read_rows
    from ct_lightning.experiment.runs.letters import letter_names, letter_text
    from ct_lightning.experiment.workflows.explain import numbered_records

    ROWS.iloc[[0, 0, 1]].assign(home=["rent", "castle", "mortgage"]).to_csv(tmp_path / "rows.csv", index=False)
    rows = read_rows(str(tmp_path / "rows.csv"))
    assert rows.index.tolist() == [1, 2, 3] and read_rows(row='{"income": 1, "home": "rent"}').index.tolist() == [1]
    codec = SmallCodec()
    loaded = Explainable(model_of_income_and_home(), codec, {}, None, True)
    with pytest.raises(InputError, match=r"^--rows: got 'home=castle' \(unseen category in row 2\)"):  # the second
        check_rows(rows.copy(), loaded, "--rows")
    kept, _, skipped = check_rows(rows.copy(), loaded, "--rows", skip_bad_rows=True)
    explained = explain_loaded(loaded, kept, "yes", {"max_steps": 5})
    text = describe(explained)
    assert text.startswith("row 1: predicted no") and "\nrow 3: predicted no" in text and "row 0" not in text
    records = numbered_records(explained, skipped)
    assert [(r["row"], r["explained"]) for r in records] == [(1, True), (2, False), (3, True)]
    assert flat_table(records)["row"].tolist() == [1, 2, 3]
    assert letter_names(records) == {1: "row-1.txt", 3: "row-3.txt"}
    assert letter_text(records[0], codec).startswith("Your application (row 1)\n")


def test_rows_the_model_cannot_read_are_refused_before_the_search():
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows
    from ct_lightning.experiment.configuration.validation import InputError

    loaded = Explainable(model_of_income_and_home(), SmallCodec(), {}, None, True)
    for rows, message in ((ROWS.assign(home=["rent", "castle"]), "--rows: got 'home=castle' (unseen category in "
                                                                  "row 1); allowed: one of rent, own, mortgage"),
                          (ROWS.assign(income=["a lot", 1]), "--rows: got 'income=a lot' (not a number in row 0)"),
                          (ROWS.assign(income=[None, 1.0]), "--rows: got 'income=<missing>' (missing value in row 0)"),
                          # misspelt, beside a column the model never saw: the misspelt one is named, with a hint
                          (ROWS[["home"]].assign(branch=1, incme=3), "--rows: got 'incme' (unknown column; did you "
                                                                     "mean 'income'?); allowed: the model's columns"),
                          (ROWS[["home"]], "--rows: got 'income' (missing column)"),
                          # renamed, beside a new column: the missing one is named, not whichever new one came first
                          (ROWS[["home"]].assign(branch=1, earnings=3),
                           "--rows: got 'income' (missing column; the rows have columns the model does not know: "
                           "branch, earnings (one renamed? give it the model's name)); allowed: rows holding every")):
        with pytest.raises(InputError) as caught:
            check_rows(rows.copy(), loaded, "--rows")
        assert str(caught.value).startswith(message), str(caught.value)
    # every column of the model is there: columns it does not read (a CRM export's) are left out, with a note
    rows, notes, _ = check_rows(ROWS.assign(customer_id=[7, 8], age=3), loaded, "--rows")
    assert list(rows.columns) == list(ROWS.columns) and rows.equals(ROWS)
    assert "--rows: columns the model does not read left out: customer_id, age" in notes


def test_a_fraction_in_an_integer_column_is_refused_before_the_search_as_the_served_model_refuses_it():
    """loans.csv's age and years_employed hold whole numbers: a --row with age 45.5 is refused in one line (the
    search would snap it to a whole number and list "age: 45.5 -> 45.5" as a change of an immutable column), in the
    served model's words; with --skip-bad-rows such a row is left out and listed, the others explained."""
    from datamodules.table import TableDataModule
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows
    from ct_lightning.experiment.runs import request_checks

    codec = TableDataModule(pd.read_csv(LOANS), target="approved").codec
    assert {c.name: c.kind for c in codec.columns}["age"] == "integer"
    assert {c.name: c.kind for c in codec.columns}["years_employed"] == "integer"
    loaded = Explainable(None, codec, {}, None, True)
    rows = pd.read_csv(LOANS).drop(columns="approved").head(4)
    one = rows.head(1).assign(age=45.5)
    with pytest.raises(InputError) as caught:
        check_rows(one.copy(), loaded, "--row")
    assert str(caught.value) == ("--row: got 'age=45.5' (not a whole number in row 0); allowed: whole numbers "
                                 "(the column holds integers)")
    with pytest.raises(ValueError, match=r"^rows: column 'age': 45.5 in row 1 is not a whole number; allowed: "
                                         r"whole numbers \(the column holds integers\)$"):
        request_checks.check_rows(codec, one, 10)  # the served model: the same words
    assert check_rows(rows.head(1).assign(age=45.0).copy(), loaded, "--row")[0]["age"].tolist() == [45]  # whole

    bad = rows.astype({"years_employed": float})
    bad.loc[2, "years_employed"] = 1.5
    with pytest.raises(InputError, match=r"^--rows: got 'years_employed=1.5' \(not a whole number in row 2\); "
                                         r"allowed: whole numbers \(the column holds integers\); --skip-bad-rows"):
        check_rows(bad.copy(), loaded, "--rows")
    kept, _, skipped = check_rows(bad.copy(), loaded, "--rows", skip_bad_rows=True)
    assert kept.index.tolist() == [0, 1, 3]
    assert skipped == [(2, "'years_employed=1.5': not a whole number; allowed: whole numbers (the column holds "
                           "integers)")]


def test_predictor_of_a_tabular_codec_has_typed_named_columns_and_string_classes(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.served_model import log_predictor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("t", artifact_location=str(tmp_path / "a"))).info.run_id
    codec, model = SmallCodec(), model_of_income_and_home()
    mlflow.set_tracking_uri(uri)
    logged = log_predictor(model, codec, torch.from_numpy(codec.encode(ROWS)), {"generator": "generic", "tau": 0.9,
                                                                                 "max_steps": 200}, None, run_id)
    predictor = mlflow.pyfunc.load_model(logged.model_uri)
    inputs = {c["name"]: c["type"] for c in predictor.metadata.metadata["input_columns"]}
    assert inputs == {"income": "double", "home": "string"}
    out = predictor.predict(ROWS, params={"explain": True})
    assert out["prediction"].tolist() == ["no", "no"] and list(out.columns[:4]) == \
        ["prediction", "probability", "probability_no", "probability_yes"]
    direct = explain(model, ROWS, codec=codec, generator="generic", tau=0.9, max_steps=200)
    assert out["changes"].tolist() == direct["changes"].tolist()
    assert out["target_probability"].tolist() == pytest.approx(direct["probability"].tolist())


def test_a_run_that_trained_no_step_is_validated_and_explained_from_its_logged_models(tmp_path):
    """--limit-train-batches 0 --from-checkpoint logs a model as it is (the worked example's "before" run): no
    checkpoint, yet validated (val/acc in the summary and the run, as in every other run) and explainable."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.explanations import explain_loaded, load_explainable, search_settings
    from ct_lightning.experiment.runs.train import train
    from ct_lightning.module import CTModule

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    torch.save(CTModule(n_features=2, n_classes=2).model.state_dict(), tmp_path / "model.pt")
    run = train({"data": "moons", "objective": "vanilla", "limit_train_batches": 0, "max_epochs": 1,
                 "from_checkpoint": str(tmp_path / "model.pt"), "progress": False, "tracking_uri": uri})
    assert run["checkpoints"]["last"] is None
    logged = MlflowClient(tracking_uri=uri).get_run(run["run_id"]).data.metrics
    assert 0 <= run["metrics"]["val/acc"] <= 1 and logged["val/acc"] == pytest.approx(run["metrics"]["val/acc"])
    loaded = load_explainable(run["run_id"], None, uri)
    assert loaded.codec.feature_names == ["x1", "x2"]
    rows = pd.DataFrame({"x1": [0.2, 1.5], "x2": [0.4, -0.3]})
    result = explain_loaded(loaded, rows, None, search_settings(loaded.module, {"max_steps": 50}))
    with torch.no_grad():
        expected = torch.softmax(loaded.module.model(torch.tensor(rows.to_numpy(), dtype=torch.float32)), 1)
    assert result["prediction_probability"].tolist() == pytest.approx(expected.max(1).values.tolist(), rel=1e-5)



def trained_with_gone_class(tmp_path, monkeypatch, module: str, settings: dict) -> dict:
    """A tiny training of ``--model MODULE:CreditNet`` (its file written under ``tmp_path/code``), whose module is
    then gone: removed from ``sys.modules`` and its file deleted, so only the run's logged copy is left."""
    from ct_lightning.experiment.runs.train import train

    code = tmp_path / "code"
    code.mkdir()
    (code / f"{module}.py").write_text(
        "from torch import nn\nclass CreditNet(nn.Sequential):\n    def __init__(self, n_features, n_classes):\n"
        "        super().__init__(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_classes))\n")
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(code))
        run = train({"data": "moons", "max_epochs": 1, "nce": 16, "limit_train_batches": 2, "progress": False,
                     "model": f"{module}:CreditNet", "registered_model": "none", **settings})
    sys.modules.pop(module, None)
    (code / f"{module}.py").unlink()
    return run


def test_a_run_of_a_model_class_of_ones_own_is_explained_where_its_module_is_not_importable(tmp_path,
                                                                                           monkeypatch):
    """``explain.py --run-id`` (and ``evaluate.py --run-id``) of a run trained with ``--model
    credit_model:CreditNet``, started from another folder than the one holding ``credit_model.py``, ended in "cannot
    import module 'credit_model'", though the file is logged with the run's MLflow model; now the model is read with
    that logged code."""
    from ct_lightning.experiment.runs.explanations import load_explainable
    from ct_lightning.experiment.runs.loading import load_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = trained_with_gone_class(tmp_path, monkeypatch, "walk_credit_net", {"tracking_uri": uri})
    evaluated = load_run(run["run_id"], uri)  # evaluate.py, compare.py with run ids
    assert type(evaluated.module.model).__name__ == "CreditNet"
    sys.modules.pop("walk_credit_net")
    loaded = load_explainable(run_id=run["run_id"], tracking_uri=uri)
    assert type(loaded.module.model).__name__ == "CreditNet"
    assert explain(loaded.module, pd.DataFrame({"x1": [0.2], "x2": [0.4]}), codec=loaded.codec)["valid"].size == 1


def test_a_checkpoint_of_a_model_class_of_ones_own_is_read_from_another_folder_with_its_runs_code(tmp_path,
                                                                                                monkeypatch):
    """``explain.py --checkpoint`` (and ``evaluate.py --checkpoint``) of ``--model walk_ckpt_net:CreditNet`` from a
    folder where the module is not importable ended in "error: model: cannot import module", naming no option. Now
    the checkpoint in the folder its run wrote is read with the code logged with that run (found by the folder's
    tag); a copy elsewhere is refused in one line on --checkpoint that says what to do."""
    import shutil

    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import load_explainable
    from ct_lightning.experiment.runs.loading import load_checkpoint_with_config

    trained_with_gone_class(tmp_path, monkeypatch, "walk_ckpt_net", {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                                                                     "checkpoint_dir": str(tmp_path / "ckpt")})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "copied").mkdir()  # first: reading the run's code below leaves it importable in this process
    shutil.copy(tmp_path / "ckpt" / "last.ckpt", tmp_path / "copied" / "last.ckpt")  # without the run's folder
    sys.modules.pop("walk_ckpt_net", None)
    with pytest.raises(InputError) as refused:
        load_explainable(None, str(tmp_path / "copied" / "last.ckpt"))
    assert str(refused.value) == (
        f"--checkpoint: got {str(tmp_path / 'copied' / 'last.ckpt')!r} (its model walk_ckpt_net:CreditNet needs "
        "module 'walk_ckpt_net', which is not importable here); allowed: run from the folder that holds "
        "walk_ckpt_net.py, add that folder to PYTHONPATH, or give its MLflow run with --run-id (the run keeps a copy "
        "of the code)")
    for read in (lambda path: load_explainable(None, str(path)).module,  # explain.py
                 lambda path: load_checkpoint_with_config(path).module):  # evaluate.py
        sys.modules.pop("walk_ckpt_net", None)
        model = read(tmp_path / "ckpt" / "last.ckpt").model
        assert type(model).__name__ == "CreditNet" and model(torch.zeros(3, 2)).shape == (3, 2)
    sys.modules.pop("walk_ckpt_net", None)


LOANS = ROOT / "tests" / "fixtures" / "loans.csv"


def income_model(codec) -> torch.nn.Linear:
    """A linear model of ``codec``'s inputs where only income decides: more income, more "yes"."""
    model = torch.nn.Linear(len(codec.feature_names), 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
        model.weight[1, codec.feature_names.index("income")] = 4.0
    return model


@pytest.mark.parametrize("source", ["checkpoint", "run", "logged-models"])
def test_explanations_keep_the_constraints_the_model_was_trained_under(tmp_path, source):
    """From the checkpoint alone (`--checkpoint last.ckpt` copied without the config.json written beside it), from
    the run, and from the logged models of a run that trained no step, a table's
    model is explained under the mutability it was trained with: --immutable and --mutability alike."""
    from ct_lightning.experiment.runs.explanations import explain_loaded, load_explainable, search_settings
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = {"data": str(LOANS), "target": "approved", "immutable": ["age", "sex"], "mutability": "debt=decrease",
                "max_epochs": 2, "nce": 16, "tracking_uri": uri, "progress": False, "seed": 0}
    if source == "logged-models":  # a model logged as it is (no training: --limit-train-batches 0) has no checkpoint
        first = train({**settings, "max_epochs": 1, "limit_train_batches": 1, "checkpoint_dir": str(tmp_path / "pre")})
        settings.update(max_epochs=1, limit_train_batches=0, from_checkpoint=first["checkpoints"]["last"])
    run = train({**settings, "checkpoint_dir": str(tmp_path / "ct")})
    (tmp_path / "ct" / "config.json").unlink()  # the checkpoint alone, as when last.ckpt is copied elsewhere
    assert (run["checkpoints"]["last"] is None) == (source == "logged-models")
    loaded = load_explainable(None, str(tmp_path / "ct" / "last.ckpt")) if source == "checkpoint" else \
        load_explainable(run["run_id"], None, uri)
    rows = pd.read_csv(LOANS).drop(columns="approved").head(40)
    settings = search_settings(loaded.module, {"max_steps": 60})
    free = explain(loaded.module.model, rows, target="yes", codec=loaded.codec, **settings)  # the bare nn.Module
    assert any(c["feature"] == "age" for changes in free["changes"] for c in changes), \
        "unconstrained, the search moves age somewhere (else this test could not fail)"
    recipe = explain_loaded(loaded, rows, "yes", settings)  # what ct-explain runs
    python_api = explain(loaded.module, rows, target="yes", codec=loaded.codec, **settings)  # the worked example's
    for result in (recipe, python_api):
        for i, changes in enumerate(result["changes"]):
            moved = {c["feature"]: c for c in changes}
            assert not {"age", "sex"} & set(moved), f"row {i}: an immutable column moved: {changes}"
            assert "debt" not in moved or moved["debt"]["to"] <= moved["debt"]["from"], f"row {i}: debt rose"
        assert any(result["changes"]), "the search moved some column"
        assert all(fixed == ["age", "sex"] for fixed in result["immutable"])
    assert "(not allowed to change: age, sex)" in describe(recipe)


def test_explanations_take_finer_steps_than_training_so_they_stop_near_the_boundary():
    from types import SimpleNamespace

    from ct_lightning.evaluation.explanation import EXPLAIN_STEP, explanation_search

    paper = SimpleNamespace(generator="ecco", tau=0.5, max_steps=30, epsilon=0.3, lambda_cost=0.001,
                            lambda_energy=5.0, search_lr=0.25, generator_options=None)
    search = explanation_search(paper)
    assert search["lr"] == EXPLAIN_STEP == 0.05 and search["max_steps"] == 500  # 0.25 · 100 steps of travel
    fine = explanation_search(SimpleNamespace(**{**vars(paper), "search_lr": 0.01, "max_steps": 3000}))
    assert fine["lr"] == 0.01 and fine["max_steps"] == 3000  # a finer training step is kept, with its own travel
    # A confident model: logit of "yes" = 20·x1. One step of the training's η = 0.25 jumps far past the boundary
    # x1 = 0; the explanation's finer steps stop nearer to it, and both counterfactuals are valid.
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.0, 0.0], [20.0, 0.0]]))
        model.bias.zero_()
    codec = FeatureCodec(["x1", "x2"], n_features=2, n_classes=2)
    rows = pd.DataFrame({"x1": [-1.0, -0.5], "x2": [0.0, 0.0]})
    settings = {k: v for k, v in search.items() if k != "generator_options"}
    near = explain(model, rows, target=1, codec=codec, **settings)
    far = explain(model, rows, target=1, codec=codec, **{**settings, "lr": 0.25, "max_steps": 100})
    reached = [[cf["x1"] for cf in result["counterfactual"]] for result in (near, far)]
    assert near["valid"].all() and far["valid"].all()
    assert all(0 <= n < f / 4 for n, f in zip(*reached)), reached  # seen: 0.67 and 1.16 against 6.4 and 6.9


def test_a_learned_generator_explains_the_same_way_twice_with_the_same_seed():
    """amortised builds its own network before the search: the explanation's seed must cover it too."""
    codec, model = SmallCodec(), model_of_income_and_home()
    x_train = torch.from_numpy(codec.encode(pd.concat([ROWS] * 8, ignore_index=True)))
    y_train = torch.zeros(len(x_train), dtype=torch.long)
    runs = [explain(model, ROWS, target="yes", codec=codec, generator="amortised", x_train=x_train, y_train=y_train,
                    max_steps=20, seed=3) for _ in range(2)]
    assert [r["counterfactual"] for r in to_records(runs[0])] == [r["counterfactual"] for r in to_records(runs[1])]


def test_a_checkpoint_folder_names_its_data_so_learned_generators_explain_from_it(tmp_path):
    """train.py writes config.json beside its checkpoints: explain.py --checkpoint (no --run-id) then finds the
    training data that amortised and revise learn from, and evaluate.py needs no --data."""
    from ct_lightning.experiment.runs.explanations import explain_loaded, load_explainable
    from ct_lightning.experiment.runs.train import train

    train({"data": "moons", "max_epochs": 1, "nce": 16, "limit_train_batches": 2, "progress": False,
           "checkpoint_dir": str(tmp_path / "ck"), "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    loaded = load_explainable(None, str(tmp_path / "ck" / "last.ckpt"), None)
    assert loaded.config["data"] == "moons" and loaded.config["max_epochs"] == 1
    explained = explain_loaded(loaded, pd.DataFrame({"x1": [0.2], "x2": [0.9]}),
                               settings={"generator": "amortised", "max_steps": 5})
    assert len(explained) == 1


def test_a_built_in_table_is_explained_in_the_raw_files_units(tmp_path):
    """A run on a built-in table (credit: category codes one-hot, amounts standardised) takes rows straight from the
    raw file (its upper-case column names, ID and target column included) and explains them in the file's units:
    the classes by name, whole numbers whole, codes as written, the immutable column unchanged; its served model
    reads the same rows (found by trying `train.py --data credit` then explain.py: the rows were read as model
    inputs, 20 000 as a standardised value, and amounts went negative)."""
    import mlflow.pyfunc

    from conftest import FIXTURE_DIR
    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": "small_credit:SmallCredit", "max_epochs": 1, "nce": 20, "progress": False,
                 "tracking_uri": uri, "immutable": ["age"]})
    raw = pd.read_csv(FIXTURE_DIR / "credit" / "UCI_Credit_Card.csv").head(4)
    raw.to_csv(tmp_path / "rows.csv", index=False)
    out = tmp_path / "explained.json"
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", run["run_id"], "--tracking-uri", uri, "--rows",
                      str(tmp_path / "rows.csv"), "--json", str(out), "--no-log"], cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LIMIT_BAL as limit_bal" in done.stdout + done.stderr
    assert "row 1 (ID 1): predicted " in done.stdout  # the raw file's ID names the client
    records = json.loads(out.read_text())
    assert len(records) == 4
    for record, written in zip(records, raw.to_dict("records")):
        assert record["prediction"] in ("default", "no default") and record["target"] in ("default", "no default")
        assert record["factual"]["limit_bal"] == written["LIMIT_BAL"] and record["factual"]["sex"] == written["SEX"]
        counterfactual = record["counterfactual"]
        assert counterfactual["age"] == written["AGE"]  # immutable, as trained
        assert counterfactual["sex"] in (1, 2) and counterfactual["education"] in range(7)  # codes as in the file
        for name in ("limit_bal", "pay_0", "bill_amt1", "pay_amt1"):
            assert float(counterfactual[name]) == round(float(counterfactual[name]))  # whole, as in the file
    with _tracking_uri(uri):
        predictor = mlflow.pyfunc.load_model(f"runs:/{run['run_id']}/predictor")
    served = predictor.predict(raw.drop(columns=["ID", "default.payment.next.month"]).rename(columns=str.lower))
    assert set(served["prediction"]) <= {"default", "no default"}
    assert list(served["prediction"]) == [r["prediction"] for r in records]


def test_a_copied_checkpoint_explains_with_learned_generators_given_its_data(tmp_path, capsys):
    """explain.py --checkpoint copied/last.ckpt --data loans.csv: the training data a checkpoint copied without its
    config.json does not name (the --checkpoint help says: else pass --data); where config.json names other data,
    --data wins, with a note."""
    import shutil

    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main as explain_main

    train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "limit_train_batches": 2,
           "progress": False, "checkpoint_dir": str(tmp_path / "ck"),
           "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    (tmp_path / "copied").mkdir()
    shutil.copy(tmp_path / "ck" / "last.ckpt", tmp_path / "copied" / "last.ckpt")
    row = pd.read_csv(LOANS).drop(columns="approved").head(1).to_json(orient="records")
    common = ["--row", row, "--target", "yes", "--max-steps", "5", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    for generator in ("revise", "amortised"):
        records = explain_main(["--checkpoint", str(tmp_path / "copied" / "last.ckpt"), "--data", str(LOANS),
                                "--generator", generator, *common])
        assert len(records) == 1 and records[0]["explained"] and records[0]["target"] == "yes"
    # in a fresh interpreter, as a user runs it: the generator's own Lightning training prints none of its INFO lines
    # (a real interpreter, not run_script's fork server, which has imported Lightning before the recipe starts)
    fresh = subprocess.run([sys.executable, str(ROOT / "recipes" / "explain.py"), "--checkpoint",
                            str(tmp_path / "copied" / "last.ckpt"), "--data", str(LOANS), "--generator", "revise",
                            *common], cwd=tmp_path, timeout=300, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                "CT_CACHE_DIR": str(tmp_path / "cold-cache")})  # its VAE trains in this process
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "row 1: predicted" in fresh.stdout and (tmp_path / "cold-cache" / "vae").is_dir()
    assert not [text for text in ("GPU available", "litlogger", "Trainer.fit") if text in fresh.stdout + fresh.stderr]
    other = tmp_path / "loans-again.csv"  # the same table elsewhere: config.json beside ck/ names tests/fixtures'
    shutil.copy(LOANS, other)
    capsys.readouterr()
    explain_main(["--checkpoint", str(tmp_path / "ck" / "last.ckpt"), "--data", str(other), "--generator", "revise",
                  *common])
    assert f"note: --data: the training data is {other}, not {LOANS}" in capsys.readouterr().out


def test_explain_options_constrain_an_explanation_beyond_the_training(tmp_path, capsys):
    """explain.py's --immutable and --mutability hold in the explanations of a model trained without constraints
    (an applicant's explanation must not ask them to change their age); an unknown column, or a direction on a
    categorical one, is refused in one line before any search."""
    from recipes.explain import main
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(LOANS), "target": "approved", "max_epochs": 2, "nce": 16, "tracking_uri": uri,
                 "progress": False, "seed": 0, "checkpoint_dir": str(tmp_path / "ct")})
    pd.read_csv(LOANS).drop(columns="approved").head(40).to_csv(tmp_path / "rows.csv", index=False)
    common = ["--run-id", run["run_id"], "--tracking-uri", uri, "--rows", str(tmp_path / "rows.csv"), "--target", "yes",
              "--max-steps", "60", "--no-log"]
    free = main(common)
    out = capsys.readouterr().out
    assert "note: every column was free to change" in out
    # a table model's tau is 0.5 (few training rows): the explanation says how to ask for a surer change
    assert "note: the search stops once the target is the more likely class (tau 0.5" in out
    assert "note: the search stops once" not in (main([*common, "--tau", "0.5"]), capsys.readouterr().out)[1]
    # rows already predicted as the target change nothing: no note about a change near the decision boundary
    already = (main([*common, "--only-predicted", "yes"]), capsys.readouterr().out)[1]
    assert "nothing needs to change: already yes" in already and "note: the search stops once" not in already
    assert any(c["feature"] == "age" for record in free for c in record["changes"]), \
        "unconstrained, the search moves age somewhere (else this test could not fail)"
    assert any(c["feature"] == "debt" and c["to"] > c["from"] for record in free for c in record["changes"]), \
        "unconstrained, some debt rises (else this test could not fail)"
    constrained = main([*common, "--immutable", "age,sex", "--mutability", "debt=decrease"])
    for record in constrained:
        moved = {c["feature"]: c for c in record["changes"]}
        assert not {"age", "sex"} & set(moved), f"an immutable column moved: {record['changes']}"
        assert "debt" not in moved or moved["debt"]["to"] <= moved["debt"]["from"], "debt rose"
        assert {"age", "sex"} <= set(record["immutable"]) and record["factual"]["age"] == record["counterfactual"]["age"]
    assert any(record["changes"] for record in constrained), "the search moved some column"
    assert "note: every column was free" not in capsys.readouterr().out
    for option, value, message in (("--immutable", "agee", "--immutable: got 'agee' (no such column; did you mean 'age'?); allowed: "
                                    "the model's columns: age, "),
                                   ("--mutability", "sex=increase", "--mutability: got 'sex=increase' ('sex' is "
                                    "binary); allowed: both or none"),
                                   ("--mutability", "purpose=decrease", "--mutability: got 'purpose=decrease' "
                                    "('purpose' is categorical); allowed: both or none")):
        with pytest.raises(CliExit) as refused:
            main([*common, option, value])
        assert refused.value.code == 2 and str(refused.value).startswith(message), str(refused.value)


def test_a_california_housing_district_is_explained_from_the_raw_files_columns(tmp_path, capsys):
    """A run on California housing reads a district as cal_housing.data holds it (total_rooms, households, ...) and
    explains it in the model's features, derived as training derived them; rows in the model's own columns are
    read as before (found as a gap: such rows were refused as unknown columns)."""
    from conftest import FIXTURE_DIR
    from recipes.explain import main
    from ct_lightning.experiment.runs.train import train
    from datamodules.real import CAL_HOUSING_COLUMNS, housing_features

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": "small_credit:SmallHousing", "max_epochs": 1, "nce": 20, "progress": False,
                 "tracking_uri": uri})
    raw = pd.read_csv(FIXTURE_DIR / "california_housing" / "cal_housing.data", header=None, names=CAL_HOUSING_COLUMNS)
    typical = raw.median_income.between(2.5, 4.5) & (raw.total_rooms / raw.households).between(4, 6)
    raw = raw[typical].head(3).reset_index(drop=True)  # inside the small model's domain
    raw.to_csv(tmp_path / "districts.csv", index=False)
    common = ["--run-id", run["run_id"], "--tracking-uri", uri, "--no-log", "--max-steps", "30"]
    records = main([*common, "--rows", str(tmp_path / "districts.csv")])
    assert "rows in cal_housing.data's columns, read as the model's features" in capsys.readouterr().out
    derived = housing_features(raw)
    assert len(records) == 3
    for record, (_, expected) in zip(records, derived.iterrows()):
        assert record["factual"]["ave_rooms"] == pytest.approx(expected["ave_rooms"], rel=1e-5)
        assert record["factual"]["med_inc"] == pytest.approx(expected["med_inc"], rel=1e-5)
    derived.to_csv(tmp_path / "features.csv", index=False)
    again = main([*common, "--rows", str(tmp_path / "features.csv")])  # the model's own columns: as before
    assert "cal_housing.data's columns" not in capsys.readouterr().out
    assert [r["factual"] for r in again] == [r["factual"] for r in records]


def test_a_value_filled_in_is_marked_so_in_the_explanation():
    """A row without an income, explained by a model trained with --impute median: its explanation read
    "income: 48,500 → 61,000" as if the applicant had given 48,500, the training median."""
    from datamodules.table import TableDataModule
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, explain_loaded

    frame = pd.read_csv(LOANS)
    frame.loc[frame.index[:5], "income"] = np.nan
    codec = TableDataModule(frame, target="approved", impute="median").codec
    model = income_model(codec)
    rows = frame.drop(columns="approved").iloc[[0, 10]]  # row 0 has no income, row 10 has one
    rows = rows.assign(income=[np.nan, frame.income.median() - 2000.0])
    checked, _, _ = check_rows(rows, Explainable(model, codec, {}, None, True), "--rows")
    explained = explain_loaded(Explainable(model, codec, {}, None, True), checked, target="yes",
                               settings={"max_steps": 400, "lr": 0.05, "tau": 0.6})
    first, second = ({c["feature"]: c for c in changes} for changes in explained["changes"])
    assert first["income"].get("filled") is True and "filled" not in second["income"]
    text = describe(explained)
    assert "income (missing: filled in as in training): " in text and text.count("filled in") == 1
    # the served predictor marks it too (its answer read "from": the median, as if the applicant had sent it)
    from ct_lightning.experiment.runs.served_model import RawRowsClassifier

    served = RawRowsClassifier(model, codec, {"max_steps": 400, "lr": 0.05, "tau": 0.6})
    answer = served.predict(None, rows.astype({"income": object}).where(rows.notna(), None).reset_index(drop=True),
                            {"explain": True, "target": "yes"})
    first, second = ({c["feature"]: c for c in changes} for changes in answer["changes"])
    assert first["income"].get("filled") is True and "filled" not in second["income"]


def test_a_batch_is_written_for_a_spreadsheet_with_each_applicants_id(tmp_path, capsys):
    """Explaining applicants.csv gave "row 5" only: the applicant_id the model was trained without (--drop-columns)
    was read and thrown away, and the table (for a spreadsheet) existed only as an MLflow artifact, without row
    numbers. Now each row is named by the columns the model does not read, in the console, --json and --csv."""
    from recipes.explain import main
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.train import train

    loans = pd.read_csv(LOANS)
    loans.insert(0, "applicant_id", np.arange(500, 500 + len(loans)))
    loans.to_csv(tmp_path / "ided.csv", index=False)
    train({"data": str(tmp_path / "ided.csv"), "target": "approved", "drop_columns": ["applicant_id"], "max_epochs": 1,
           "nce": 16, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False,
           "checkpoint_dir": str(tmp_path / "ct")})
    rows = loans.drop(columns="approved").head(6).astype({"purpose": object})
    rows.loc[2, "purpose"] = "yacht"  # a row the model cannot read
    rows.to_csv(tmp_path / "applicants.csv", index=False)
    table = tmp_path / "explained.csv"
    common = ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--rows", str(tmp_path / "applicants.csv"),
              "--skip-bad-rows", "--max-steps", "60", "--csv", str(table)]
    records = main([*common, "--json", str(tmp_path / "explained.json")])
    out = capsys.readouterr().out
    assert "row 1 (applicant_id 500): predicted " in out and "row 3 (applicant_id 502): not explained: " in out
    assert [r["other_columns"] for r in records] == [{"applicant_id": 500 + i} for i in range(6)]
    assert json.loads((tmp_path / "explained.json").read_text()) == records
    assert table.read_bytes().startswith(b"\xef\xbb\xbf")  # Excel reads a CSV without it as Windows-1252
    written = pd.read_csv(table, encoding="utf-8-sig")
    assert list(written.columns) == ["row", "applicant_id", "explained", "prediction", "prediction_probability",
                                     "target", "probability", "valid", "counterfactual_prediction", "changes",
                                     "problem"]
    assert written["applicant_id"].tolist() == list(range(500, 506)) and written["row"].tolist() == list(range(1, 7))
    assert "unseen category" in written.at[2, "problem"] and not written.at[2, "explained"]  # row 3
    changed = next(r for r in records if r.get("changes"))
    first = changed["changes"][0]
    assert written.set_index("row").at[changed["row"], "changes"].startswith(f"{first['feature']}: ")
    assert " → " in written.set_index("row").at[changed["row"], "changes"]
    with pytest.raises(CliExit) as refused:
        main(common)
    assert str(refused.value).startswith(f"--csv: got '{table}' (the file exists)")


def test_the_logged_plot_shows_amounts_with_their_currency_sign():
    """The plot of explanations drew "salary: $99,000 → $80,950" as "salary: 99,000→80,950": matplotlib read the
    text between the two '$' as a formula."""
    from ct_lightning.experiment.runs.explanations import explanation_figure

    changes = [{"feature": "salary", "from": 99000, "to": 80950, "unit": "${}"}]
    explained = pd.DataFrame([{"prediction": "Rejected", "target": "Hired", "factual_probability": 0.3,
                               "probability": 0.6, "valid": True, "changes": changes,
                               "other_columns": {"note": "asked $90k"}}])
    from matplotlib.text import Text

    figure = explanation_figure(explained)
    figure.canvas.draw()
    texts = {t.get_text(): t for t in figure.findobj(Text) if "$" in t.get_text()}
    assert set(texts) == {"salary: $99,000 → $80,950", "row 0 (note asked $90k): Rejected → Hired"}
    assert all(t.get_parse_math() is False for t in texts.values())  # drawn as written: the '$' signs are no formula


def test_only_the_rows_predicted_as_a_class_are_searched_and_the_others_keep_their_prediction(tmp_path, capsys):
    """An HR batch mixes applicants the model rejects and accepts: explaining all of them told the accepted ones how to
    be rejected. --only-predicted CLASS searches only the rows predicted so; the others are listed with their
    prediction (--json, --csv), and a CLASS that is no class is refused before any search."""
    from recipes.explain import main
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.train import train

    train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "progress": False,
           "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "checkpoint_dir": str(tmp_path / "ct")})
    pd.read_csv(LOANS).drop(columns="approved").head(12).to_csv(tmp_path / "applicants.csv", index=False)
    common = ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--rows", str(tmp_path / "applicants.csv"),
              "--max-steps", "40"]
    every = main(common)
    predictions = [r["prediction"] for r in every]
    chosen = predictions[0]
    capsys.readouterr()
    records = main([*common, "--only-predicted", str(chosen).upper(), "--csv", str(tmp_path / "advice.csv")])
    out = capsys.readouterr().out
    assert [r["explained"] for r in records] == [p == chosen for p in predictions]
    assert [r["prediction"] for r in records] == predictions
    assert all(r["problem"] == f"predicted {r['prediction']}, not {chosen} (--only-predicted)"
               for r in records if not r["explained"])
    kept = sum(p == chosen for p in predictions)
    assert 0 < kept < 12, predictions  # both kinds of rows are there
    assert f"--only-predicted {chosen}: {kept} of 12 rows are predicted {chosen} and explained" in out
    assert [r["prediction_probability"] for r in records] == pytest.approx([r["prediction_probability"] for r in every],
                                                                           abs=1e-6)  # the rows left out keep theirs
    advice = pd.read_csv(tmp_path / "advice.csv", encoding="utf-8-sig")
    assert len(advice) == 12 and advice["prediction_probability"].notna().all()
    with pytest.raises(CliExit) as refused:
        main([*common, "--only-predicted", "maybe"])
    assert str(refused.value).startswith("--only-predicted: got 'maybe'; allowed: ")


def test_only_predicted_with_a_gap_filled_in_a_row_it_leaves_out(tmp_path, capsys):
    """A model trained with --impute median, a batch in which an applicant the model does not reject left a field
    empty: --only-predicted ended in a traceback (KeyError: the filled row was not among the explained ones)."""
    from recipes.explain import main
    from ct_lightning.experiment.runs.train import train

    train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "progress": False,
           "impute": "median", "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "checkpoint_dir": str(tmp_path / "ct")})
    rows = pd.read_csv(LOANS).drop(columns="approved").head(12)
    rows["years_employed"] = rows["years_employed"].astype(float)
    rows.loc[:, "years_employed"] = np.nan  # every applicant left it empty: filled in for all of them
    rows.to_csv(tmp_path / "applicants.csv", index=False)
    common = ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--rows", str(tmp_path / "applicants.csv"),
              "--max-steps", "40"]
    predictions = [r["prediction"] for r in main(common)]
    assert len(set(predictions)) == 2, predictions  # both kinds of rows are there
    capsys.readouterr()
    records = main([*common, "--only-predicted", str(predictions[0])])
    assert [r["explained"] for r in records] == [p == predictions[0] for p in predictions]
    assert "filled with" in capsys.readouterr().out


def test_a_model_of_ones_own_given_to_explain_as_weights_is_pointed_to_a_run_that_logs_it(tmp_path):
    """explain.py --checkpoint model.pt (the state_dict of a model trained elsewhere) was refused with "allowed: a
    checkpoint written by train.py" only; the line now says how to get one: log the model as it is and explain its
    run."""
    from recipes.explain import main
    from ct_lightning.experiment.configuration.validation import CliExit

    torch.save(build_mlp(2, 2, [4]).state_dict(), tmp_path / "model.pt")
    with pytest.raises(CliExit) as refused:
        main(["--checkpoint", str(tmp_path / "model.pt"), "--row", '{"x1": 0.2, "x2": 0.4}', "--no-log"])
    assert "--limit-train-batches 0" in str(refused.value) and "--run-id" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1


def test_the_plot_of_a_batch_shows_the_rows_with_changes_first():
    """The logged plot showed a batch's first 8 rows: where those needed no change (already the target), it showed
    no change at all, though later rows had some."""
    from matplotlib.text import Text

    from ct_lightning.experiment.runs.explanations import explanation_figure

    def row(changes):
        return {"prediction": "Hired", "target": "Hired", "factual_probability": 0.9, "probability": 0.9,
                "valid": True, "changes": changes}

    rows = [row([]) for _ in range(9)] + [row([{"feature": "score", "from": 50, "to": 70}])]
    figure = explanation_figure(pd.DataFrame(rows))
    titles = [t.get_text() for t in figure.findobj(Text) if t.get_text().startswith("row ")]
    assert len(titles) == 8 and titles[0].startswith("row 9: ")
    assert titles[1:] == [f"row {i}: Hired → Hired" for i in range(7)]  # the others keep their order
    assert any(t.get_text() == "8 of 10 rows, those with changes first (all: explanations.csv)"
               for t in figure.findobj(Text))


def test_the_low_tau_note_of_a_model_of_three_classes_speaks_of_the_most_likely_class(tmp_path, capsys):
    """Explaining a loan-grade model (A/B/C/D) with --target C said 'the search stops once the target is the more
    likely class (tau 0.5)' beside 'to get C (probability 0.43, valid)': with more than two classes the search stops
    at tau, and a change is valid once the target is the most likely class, perhaps below it."""
    from recipes.explain import main
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(LOANS), "target": "home_ownership", "max_epochs": 2, "nce": 16, "tracking_uri": uri,
                 "progress": False, "seed": 0, "checkpoint_dir": str(tmp_path / "ct")})
    pd.read_csv(LOANS).drop(columns="home_ownership").head(20).to_csv(tmp_path / "rows.csv", index=False)
    main(["--run-id", run["run_id"], "--tracking-uri", uri, "--rows", str(tmp_path / "rows.csv"), "--no-log"])
    out = capsys.readouterr().out
    assert "note: the search stops once the target's probability reaches tau 0.5 (the model's own), and the change is " \
           "valid once the target is the most likely of the 3 classes, perhaps below that" in out, out
    assert "more likely class" not in out


def test_a_category_coded_as_a_number_is_read_in_a_column_a_blank_made_float(tmp_path, capsys):
    """A region coded 1-3 and declared categorical: in a batch where one applicant left it blank, pandas reads the
    column as 1.0, 2.0, 3.0, and every row was refused ('region=3.0': unseen category), not only the blank one."""
    from datamodules.codec import TabularCodec
    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main

    frame = pd.read_csv(LOANS)
    frame["region"] = frame["age"] % 3 + 1
    frame.to_csv(tmp_path / "regions.csv", index=False)
    spec = {"columns": {"region": {"kind": "categorical"}}}
    codec = TabularCodec.fit(frame, "approved", spec)
    rows = frame.drop(columns="approved").head(6)
    floated = rows.assign(region=rows["region"].astype(float))
    np.testing.assert_array_equal(codec.encode(floated), codec.encode(rows))
    floated.loc[2, "region"] = np.nan
    floated.to_csv(tmp_path / "rows.csv", index=False)
    (tmp_path / "spec.yaml").write_text("columns:\n  region: {kind: categorical}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(tmp_path / "regions.csv"), "target": "approved", "data_spec": str(tmp_path / "spec.yaml"),
                 "max_epochs": 1, "nce": 16, "tracking_uri": uri, "progress": False, "seed": 0})
    records = main(["--run-id", run["run_id"], "--tracking-uri", uri, "--rows", str(tmp_path / "rows.csv"),
                    "--skip-bad-rows", "--max-steps", "20", "--no-log"])
    assert [r["explained"] for r in records] == [True, True, False, True, True, True], records
    assert "row 3: not explained: " in capsys.readouterr().out
    assert {r["factual"]["region"] for r in records if r["explained"]} <= {1, 2, 3}


def test_probabilities_near_one_half_get_a_third_decimal():
    """A row predicted yes at 0.503 and its counterfactual reaching no at 0.501 read 'predicted yes (probability 0.50)'
    and 'to get no (probability 0.50)', as if the model gave both classes the same chance."""
    from ct_lightning.evaluation.explanation import probability_text

    assert [probability_text(p) for p in (0.503, 0.4951, 0.5, 0.51, 0.494, 0.87)] == \
        ["0.503", "0.495", "0.50", "0.51", "0.49", "0.87"]
    row = {"prediction": "yes", "prediction_probability": 0.503, "target": "no", "probability": 0.501,
           "factual_probability": 0.497, "valid": True, "changes": [{"feature": "debt", "from": 10, "to": 8}],
           "immutable": []}
    text = describe(pd.DataFrame([row]))
    assert "predicted yes (probability 0.503)" in text and "to get no (probability 0.501, valid)" in text, text


def test_an_explanation_that_misses_its_target_names_the_class_its_changes_lead_to(tmp_path, capsys):
    """Rejected applicants of a three-class model (rejected/interview/offer) explained towards interview: an
    explanation read 'NOT valid: the decoded counterfactual is not predicted as the target', where its changes led
    to an offer, better than asked. The line, --json and --csv now name the class the changes lead to."""
    from recipes.explain import main
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train({"data": str(LOANS), "target": "home_ownership", "max_epochs": 2, "nce": 16, "tracking_uri": uri,
           "progress": False, "seed": 0, "checkpoint_dir": str(tmp_path / "ct")})
    pd.read_csv(LOANS).drop(columns="home_ownership").head(40).to_csv(tmp_path / "rows.csv", index=False)
    common = ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--no-log", "--all-changes"]
    records = main([*common, "--rows", str(tmp_path / "rows.csv"), "--max-steps", "40", "--csv",
                    str(tmp_path / "out.csv")])
    out = capsys.readouterr().out
    missed = [r for r in records if not r["valid"]]
    assert missed
    for r in missed:
        assert r["counterfactual_prediction"] != r["target"]
        assert f"NOT valid: with these changes the model predicts {r['counterfactual_prediction']}, not " \
               f"{r['target']})" in out
    assert all(r["counterfactual_prediction"] == r["target"] for r in records if r["valid"])
    # the class named is the model's prediction of the counterfactual row itself
    pd.DataFrame([r["counterfactual"] for r in missed]).to_csv(tmp_path / "reached.csv", index=False)
    again = main([*common, "--rows", str(tmp_path / "reached.csv"), "--max-steps", "0"])
    assert [r["prediction"] for r in again] == [r["counterfactual_prediction"] for r in missed]
    table = pd.read_csv(tmp_path / "out.csv", encoding="utf-8-sig")
    assert table["counterfactual_prediction"].tolist() == [r["counterfactual_prediction"] for r in records]


def test_a_batchs_notes_on_its_rows_are_not_copied_into_every_value_the_explanation_reads():
    """Explaining 1 200 candidates of an HR export took 93 s, 85 of them in copying: the checked rows carry each
    row's other columns and filled values in ``attrs``, and pandas deep-copied them into every value read while the
    explanations were written (one copy per row and column). Now they are copied a fixed number of times."""
    from datamodules.table import TableDataModule
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, explain_loaded

    class Counted:
        copies = 0

        def __deepcopy__(self, memo):
            Counted.copies += 1
            return self

    frame = pd.read_csv(LOANS)
    codec = TableDataModule(frame, target="approved").codec
    loaded = Explainable(torch.nn.Linear(len(codec.feature_names), 2), codec, {}, None, True)
    rows, _, _ = check_rows(frame.drop(columns="approved").head(40), loaded, "--rows")
    rows.attrs["notes"] = Counted()
    Counted.copies = 0
    explained = explain_loaded(loaded, rows, target="yes", settings={"max_steps": 5, "lr": 0.05, "tau": 0.6})
    assert len(explained) == 40 and Counted.copies <= 4, Counted.copies
    assert isinstance(rows.attrs["notes"], Counted)  # the caller's rows keep their notes


def test_a_whole_number_column_with_a_gap_keeps_whole_numbers_in_json():
    """In an HR batch where one candidate left the expected salary empty (--impute median), --json wrote every
    candidate's salary as a float ("from": 60800.0, "to": 54800; "factual": {"expected_salary": 65200.0}): the gap
    made pandas read the column as floats. An integer column's values are whole numbers again once filled."""
    from datamodules.table import TableDataModule
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, explain_loaded

    frame = pd.read_csv(LOANS)
    codec = TableDataModule(frame, target="approved", impute="median").codec
    model = income_model(codec)
    rows = frame.drop(columns="approved").head(4).astype({"income": float})
    rows.loc[1, "income"] = np.nan
    loaded = Explainable(model, codec, {}, None, True)
    checked, _, _ = check_rows(rows, loaded, "--rows")
    explained = explain_loaded(loaded, checked, target="yes", settings={"max_steps": 400, "lr": 0.05, "tau": 0.6})
    records = to_records(explained)
    assert all(type(r["factual"][c]) is int for r in records for c in ("age", "income", "debt", "years_employed"))
    changed = [c for r in records for c in r["changes"] if c["feature"] == "income"]
    assert changed and all(type(c["from"]) is int and type(c["to"]) is int for c in changed)


def test_training_on_a_table_ends_with_an_explain_command_that_runs_as_printed(tmp_path, capsys):
    """The next step after training on one's own table, explaining a decision, is printed as a command with the
    table's first test row in the file's own units ($12,500 reads 12500), and it runs as printed."""
    import shlex

    from ct_lightning.experiment.runs.train import announce, train
    from datamodules.table import TableDataModule
    from recipes.explain import main as explain_main

    rng = np.random.default_rng(0)
    income = rng.integers(1000, 30000, 120)
    table = pd.DataFrame({"income": [f"${v:,}" for v in income], "sector": rng.choice(["Retail", "Food"], 120),
                          "approved": np.where(income > 12000, "yes", "no")})
    table.to_csv(tmp_path / "money.csv", index=False)
    summary = train({"data": str(tmp_path / "money.csv"), "target": "approved", "max_epochs": 1, "nce": 16,
                     "progress": False, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    command = summary["explain_command"]
    assert f"Explain a decision in the table's own units (its first test row; --rows FILE.csv for many):\n  {command}" \
        in announce(summary)
    argv = shlex.split(command)
    assert argv[1].endswith("recipes/explain.py") and argv[argv.index("--run-id") + 1] == summary["run_id"]
    module = TableDataModule(tmp_path / "money.csv", target="approved")
    first = module.rows["test"][0]
    row = json.loads(argv[argv.index("--row") + 1])
    assert row == {"income": int(income[first]), "sector": table.loc[first, "sector"]}
    capsys.readouterr()
    records = explain_main([*argv[2:], "--no-log"])
    assert len(records) == 1 and "row 1: predicted" in capsys.readouterr().out
    assert summary.get("explain_command") and "explain_command" not in train(
        {"data": "moons", "max_epochs": 1, "nce": 16, "progress": False,
         "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})


def test_the_explain_command_writes_a_tables_umlauts_as_the_file_does(tmp_path):
    """A German HR table's first test row was printed as ``"Geschlecht": "m\\u00e4nnlich"`` and
    ``"F\\u00fchrungserfahrung": "ja"`` (JSON's ASCII escapes): the row to edit into an applicant's own should read
    as the file does."""
    import shlex

    from ct_lightning.experiment.runs.train import train

    rng = np.random.default_rng(1)
    years = rng.integers(0, 20, 120)
    pd.DataFrame({"Berufserfahrung (Jahre)": years, "Geschlecht": rng.choice(["männlich", "weiblich"], 120),
                  "Führungserfahrung": rng.choice(["ja", "nein"], 120), "Eingestellt": np.where(years > 8, "ja", "nein")}
                 ).to_csv(tmp_path / "bewerbungen.csv", index=False)
    summary = train({"data": str(tmp_path / "bewerbungen.csv"), "target": "Eingestellt", "max_epochs": 1, "nce": 16,
                     "progress": False, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    command = summary["explain_command"]
    assert "\\u" not in command and '"Führungserfahrung": ' in command
    assert re.search(r'"Geschlecht": "(männlich|weiblich)"', command), command
    argv = shlex.split(command)
    assert set(json.loads(argv[argv.index("--row") + 1])) == {"Berufserfahrung (Jahre)", "Geschlecht",
                                                               "Führungserfahrung"}
    from recipes.explain import main  # and explain.py --json writes them so too, in UTF-8

    records = main([*argv[argv.index("--run-id"):], "--no-log", "--max-steps", "20", "--json", str(tmp_path / "a.json")])
    written = (tmp_path / "a.json").read_bytes().decode("utf-8")
    assert "\\u00" not in written and '"Führungserfahrung"' in written
    assert json.loads(written)[0]["row"] == records[0]["row"]


def test_only_predicted_of_no_class_is_refused_before_the_rows_are_read_or_the_model_loaded(tmp_path):
    """--only-predicted maybe was refused only after the rows were read and the model built: a rows file it could not
    read, or a run's model to download, came first. The classes come from the checkpoint or the run's
    preprocessing.json, so the refusal names the option, the value and the classes before that work."""
    from recipes.explain import main
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.train import train

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "progress": False,
                     "tracking_uri": store, "checkpoint_dir": str(tmp_path / "ct")})
    unreadable = tmp_path / "applicants.csv"
    unreadable.write_bytes(b"")  # reading these rows fails: the class must be refused first
    classes = ", ".join(map(str, sorted(pd.read_csv(LOANS)["approved"].unique())))
    for model in (["--checkpoint", str(tmp_path / "ct" / "last.ckpt")], ["--run-id", summary["run_id"]]):
        with pytest.raises(CliExit) as refused:
            main([*model, "--rows", str(unreadable), "--only-predicted", "maybe", "--tracking-uri", store])
        assert str(refused.value) == f"--only-predicted: got 'maybe'; allowed: {classes}", model
