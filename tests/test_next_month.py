"""Next month's file for last month's model: fine-tune, evaluate and explain a model trained on October's table on
November's, which arrives with its columns in another order, a column nobody asked for, a column renamed, a
category never seen, numbers beyond October's range and labels missing."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from ct_lightning.experiment.runs.train import train

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from preloaded import run_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
TINY = {"target": "approved", "max_epochs": 1, "nce": 16, "limit_train_batches": 2, "progress": False,
        "accelerator": "cpu"}


@pytest.fixture(scope="module")
def october(tmp_path_factory):
    """October's table (the loans fixture with an applicant id) and a CT model trained on it with age and sex
    immutable, in a store of its own."""
    folder = tmp_path_factory.mktemp("october")
    table = pd.read_csv(LOANS)
    table.insert(0, "applicant_id", range(100001, 100001 + len(table)))
    table.to_csv(folder / "october.csv", index=False)
    store = {"tracking_uri": f"sqlite:///{folder}/mlflow.db", "experiment": "next-month"}
    run = train({**TINY, **store, "data": str(folder / "october.csv"), "immutable": ["age", "sex"],
                 "drop_columns": "applicant_id", "checkpoint_dir": str(folder / "oct-ct")})
    return {"folder": folder, "store": store, "run": run, "table": table,
            "checkpoint": run["checkpoints"]["last"]}


def november(october, **changes) -> pd.DataFrame:
    """November's rows: October's with incomes 20 % higher, another order of columns and new ids."""
    table = october["table"].copy()
    table["applicant_id"] += 100000
    table["income"] = (table["income"] * 1.2).round(-2).astype(int)
    table = table[["approved", "sex", "income", "purpose", "debt", "applicant_id", "age", "home_ownership",
                   "years_employed"]]
    for column, value in changes.items():
        table[column] = value
    return table


def codec_of(checkpoint) -> dict:
    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    found = payload["ct_preprocessing"]
    return json.loads(found) if isinstance(found, str) else found


def test_fine_tuning_on_next_months_file_keeps_the_models_encoding(october, tmp_path, capsys):
    """The network reads its inputs as it was trained to: October's column order, categories and standardisation
    (a codec fitted again on November's higher incomes fed the same weights other numbers, silently); the domain
    widens to November's richest applicant, October's --immutable age,sex still hold, and the new column is named as
    left out. Old code: November's own codec (other means, the file's column order), mutability lost."""
    frame = november(october)
    frame.loc[frame.index[::10], "income"] = 900000  # beyond October's domain, in training rows too
    frame["branch"] = ["Zürich", "Köln", "Berlin"] * (len(frame) // 3)
    frame.to_csv(tmp_path / "november.csv", sep=";", index=False, encoding="cp1252")
    tuned = train({**TINY, **october["store"], "data": str(tmp_path / "november.csv"),
                   "from_checkpoint": october["checkpoint"], "checkpoint_dir": str(tmp_path / "nov-ct")})
    printed = capsys.readouterr().out
    old, new = codec_of(october["checkpoint"]), codec_of(tuned["checkpoints"]["last"])
    assert [c["name"] for c in new["columns"]] == [c["name"] for c in old["columns"]]
    for before, after in zip(old["columns"], new["columns"]):
        assert after.get("categories") == before.get("categories"), before["name"]
        assert after.get("mean") == pytest.approx(before.get("mean")), before["name"]
        assert after.get("scale") == pytest.approx(before.get("scale")), before["name"]
    income = {c["name"]: c for c in new["columns"]}["income"]
    assert income["train_max"] == pytest.approx(900000)
    assert "income: november.csv's training rows reach 900000" in printed
    assert "november.csv: columns the model does not read left out: branch" in printed
    assert "encoding november.csv with the preprocessing the model was trained with" in printed
    state = torch.load(tuned["checkpoints"]["last"], map_location="cpu", weights_only=True)
    assert state["hyper_parameters"]["mutability"] == {"age": "none", "sex": "none"}
    assert "the model was trained with age: none, sex: none" in printed


def test_fine_tuning_refuses_a_renamed_column_and_an_unseen_category(october, tmp_path):
    """One line each, naming --data, what is wrong and what is allowed, before any run exists (old code: a refit
    codec of another width, refused as a shape mismatch that sent the user to --model-inputs)."""
    renamed = november(october).rename(columns={"years_employed": "employment_years"})
    renamed["branch"] = "Berlin"
    renamed.to_csv(tmp_path / "renamed.csv", index=False)
    unseen = november(october)
    unseen.loc[[2, 7, 9], "purpose"] = "wedding"
    unseen.to_csv(tmp_path / "unseen.csv", index=False)
    common = ["--target", "approved", "--from-checkpoint", october["checkpoint"], "--max-epochs", "1",
              "--tracking-uri", october["store"]["tracking_uri"], "--no-progress"]
    done = run_script(ROOT / "recipes" / "train.py", ["--data", "renamed.csv", *common], cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: --data: got '{tmp_path / 'renamed.csv'}' (without the model's column "
                            "'years_employed'; the file has columns the model does not know: employment_years, "
                            "branch (one renamed? give it the model's name)); allowed: a table holding every column")
    assert "Traceback" not in done.stderr
    done = run_script(ROOT / "recipes" / "train.py", ["--data", "unseen.csv", *common], cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --data: got purpose='wedding' (a category the model was not trained on, in 3 "
                            f"row(s) of {tmp_path / 'unseen.csv'}: row 3, 8, 10); allowed: car, debt_consolidation, ")
    assert "MLflow run" not in done.stdout


def test_a_data_spec_that_changes_the_models_inputs_is_refused(october, tmp_path):
    """--data-spec beside a kept preprocessing was silently ignored by the data module; now it must declare what the
    model was trained with."""
    november(october).to_csv(tmp_path / "november.csv", index=False)
    (tmp_path / "spec.yaml").write_text("columns:\n  income: {upper: 500000}\n")
    with pytest.raises(ValueError, match=r"data_spec: got .*spec.yaml' \(income: upper 500000; the model of "
                                         r"--from-checkpoint was trained with None\)"):
        train({**TINY, **october["store"], "data": str(tmp_path / "november.csv"), "data_spec": str(tmp_path / "spec.yaml"),
               "from_checkpoint": october["checkpoint"]})


def test_evaluating_on_next_months_file_takes_every_labelled_row_and_keeps_the_runs_own_metrics(october, tmp_path):
    """evaluate.py --run-id OCT --data november.csv: every labelled row of November (none trained the model; old code:
    its seeded test split only, 45 of 300 rows, silently), the rows without a label and the column the model does not
    read named, and the metrics logged as eval/november/* (old code: over the run's own eval/*, October's)."""
    frame = november(october)
    frame.loc[[0, 1], "approved"] = None
    frame["branch"] = ["Berlin", "Köln"] * (len(frame) // 2)
    frame.to_csv(tmp_path / "november.csv", index=False)
    done = run_script(ROOT / "recipes" / "evaluate.py",
                      ["--run-id", october["run"]["run_id"], "--tracking-uri", october["store"]["tracking_uri"],
                       "--data", "november.csv", "--n-runs", "1", "--n-individuals", "10", "--no-progress",
                       "--summary-json", "eval.json"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "note: 2 row(s) without a value in the target column 'approved' left out" in done.stdout
    assert "note: november.csv: columns the model does not read left out: branch" in done.stdout
    assert "november.csv is not the table the model was trained on (october.csv): 298 labelled rows evaluated " \
           "(every one;" in done.stdout
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert summary["split"] == "all" and summary["trained_on"] == "october.csv"
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(tracking_uri=october["store"]["tracking_uri"]).get_run(october["run"]["run_id"]).data.metrics
    assert "eval/november/acc" in metrics and "eval/acc" not in metrics


def test_fine_tuning_says_which_lines_come_from_the_models_own_preprocessing(tmp_path, capsys):
    """What the model's preprocessing and its training run did is named so in the fine-tuning's start-up lines, not
    as the user's options (old code: 'left out (--drop-columns): applicant_id' with no --drop-columns given, the
    constraints of October's --immutable labelled '(data spec, --mutability)', and October's median filling a gap
    worded as November's training rows' median)."""
    import numpy as np

    frame = pd.read_csv(LOANS)
    frame.insert(0, "applicant_id", range(100001, 100001 + len(frame)))
    gaps = frame.copy()
    gaps.loc[gaps.index[::7], "debt"] = np.nan
    gaps.to_csv(tmp_path / "october.csv", index=False)
    (tmp_path / "spec.yaml").write_text("columns:\n  sex: {mutability: none}\n")
    store = {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "next-month"}
    run = train({**TINY, **store, "data": str(tmp_path / "october.csv"), "data_spec": str(tmp_path / "spec.yaml"),
                 "immutable": ["age"], "impute": "median", "drop_columns": "applicant_id",
                 "checkpoint_dir": str(tmp_path / "oct")})
    fill = {c["name"]: c for c in codec_of(run["checkpoints"]["last"])["columns"]}["debt"]["fill"]
    november = frame.copy()
    november["debt"] = (november["debt"] * 1.5).round(-2)  # another median than October's
    november.loc[november.index[::9], "debt"] = np.nan
    november.to_csv(tmp_path / "november.csv", index=False)
    capsys.readouterr()
    train({**TINY, **store, "data": str(tmp_path / "november.csv"), "impute": "median",
           "from_checkpoint": run["checkpoints"]["last"], "checkpoint_dir": str(tmp_path / "nov")})
    printed = capsys.readouterr().out.splitlines()
    assert not [line for line in printed if "left out (--drop-columns)" in line], printed
    assert "left out: applicant_id, which the model was trained without (--drop-columns of the run that trained it)" \
        in printed
    [filled] = [line for line in printed if line.startswith("note: debt: missing in")]
    assert filled == (f"note: debt: missing in 34 row(s), filled with {fill}, as the model's preprocessing fills it "
                      "(the median of the rows it was trained on, not this file's)"), filled
    [held] = [line for line in printed if line.startswith("mutability (")]
    assert held.startswith("mutability (the data spec the model was trained with, kept from the run that trained the "
                           "model): "), held
    assert set(held.split("): ", 1)[1].split(", ")) == {"age: none", "sex: none"}, held
    assert "the model was trained with age: none (the --immutable/--mutability of the run that trained it)" \
        in "\n".join(printed)


def test_a_fine_tunings_accuracy_as_loaded_is_a_metric_of_its_run(october, tmp_path):
    """loaded/val_acc beside val/acc on the fine-tuned run in the real SQLite store (old code: only in train's
    summary, so MLflow's UI could not put the two side by side); a training from scratch has none."""
    from mlflow.tracking import MlflowClient

    november(october).to_csv(tmp_path / "november.csv", index=False)
    tuned = train({**TINY, **october["store"], "data": str(tmp_path / "november.csv"),
                   "from_checkpoint": october["checkpoint"], "checkpoint_dir": str(tmp_path / "nov-ct")})
    client = MlflowClient(tracking_uri=october["store"]["tracking_uri"])
    [point] = client.get_metric_history(tuned["run_id"], "loaded/val_acc")
    assert point.value == pytest.approx(tuned["loaded_val_acc"], abs=1e-9) and point.step == 0
    assert "val/acc" in client.get_run(tuned["run_id"]).data.metrics
    assert "loaded/val_acc" not in client.get_run(october["run"]["run_id"]).data.metrics


def test_a_fine_tuning_does_not_offer_to_leave_out_an_identifier_its_model_reads(tmp_path, capsys):
    """A model trained on an identifier-like column reads it; its fine-tuning cannot leave it out (--drop-columns of a
    column the model reads is refused), so the start-up note names a new training instead (old code: 'leave it out
    with --drop-columns applicant_id', a command that is then refused)."""
    frame = pd.read_csv(LOANS)
    frame.insert(0, "applicant_id", range(1, 1 + len(frame)))
    frame.to_csv(tmp_path / "october.csv", index=False)
    store = {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "next-month"}
    run = train({**TINY, **store, "data": str(tmp_path / "october.csv"), "checkpoint_dir": str(tmp_path / "oct")})
    assert "applicant_id" in {c["name"] for c in codec_of(run["checkpoints"]["last"])["columns"]}
    capsys.readouterr()
    train({**TINY, **store, "data": str(tmp_path / "october.csv"), "from_checkpoint": run["checkpoints"]["last"],
           "checkpoint_dir": str(tmp_path / "nov")})
    [note] = [line for line in capsys.readouterr().out.splitlines() if "an identifier?" in line]
    assert "leave it out with --drop-columns" not in note, note
    assert note.endswith("the model was trained on it as a feature and reads it; a model without it is a new training: "
                         "--drop-columns applicant_id without --from-checkpoint"), note


def test_a_resumed_fine_tuning_names_the_kept_constraints_as_its_first_start_did(october, tmp_path, capsys):
    """October's --immutable age,sex, kept in November's fine-tuning, were named 'kept from the run that trained the
    model' at its start; resumed (extended by an epoch), its start-up line said '(--mutability)', an option nobody gave,
    because the run's configuration holds the kept pairs in ``mutability`` and did not say where they came from. The
    run now records it (its tag ``ct.kept_mutability``), and the resumed start says what the first said."""
    november(october).to_csv(tmp_path / "november.csv", index=False)
    capsys.readouterr()
    tuned = train({**TINY, **october["store"], "data": str(tmp_path / "november.csv"),
                   "from_checkpoint": october["checkpoint"], "checkpoint_dir": str(tmp_path / "nov-ct")})
    [first] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mutability (")]
    assert first.startswith("mutability (kept from the run that trained the model): "), first
    assert set(first.split("): ", 1)[1].split(", ")) == {"age: none", "sex: none"}, first
    resumed = train({**october["store"], "resume": tuned["run_id"], "max_epochs": 2, "progress": False})
    printed = capsys.readouterr().out.splitlines()
    assert resumed["run_id"] == tuned["run_id"] and any(line.startswith("resume: run ") for line in printed), printed
    [again] = [line for line in printed if line.startswith("mutability (")]
    assert again == first
