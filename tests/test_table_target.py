"""The target of a user's table: a column a classifier can learn, refused in one line before torch is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from datamodules.table import TableDataModule

ROOT = Path(__file__).resolve().parents[1]


def losses(rows: int = 200) -> pd.DataFrame:
    """Loans with the amount each lost: a number to predict, not a class."""
    return pd.DataFrame({"income": [30000 + 97 * i for i in range(rows)], "home": ["rent", "own"] * (rows // 2),
                         "loss": [round(12.5 * i + 0.25, 2) for i in range(rows)]})


def test_an_amount_as_target_is_refused_as_regression_with_what_to_do():
    """'column 'loss' has 200 distinct values; allowed: a class label with at most 20 classes' did not say why: the
    column holds an amount, and predicting one is regression, which CT does not do; a class made from it is."""
    with pytest.raises(ValueError) as caught:
        TableDataModule(losses(), target="loss")
    message = str(caught.value)
    assert message.startswith("target: column 'loss' of DataFrame holds an amount (200 different numbers: 0.25, 12.75, "
                              "25.25, ...): predicting it is regression") and "\n" not in message
    assert message.endswith("allowed: a class label with at most 20 classes, e.g. a column of your own that says "
                            "whether loss is above a threshold")
    with pytest.raises(ValueError, match=r"^target: column 'home' has 21 distinct values in DataFrame; allowed: a "
                                         r"class label with at most 20 classes$"):
        TableDataModule(losses(210).assign(home=[f"h{i % 21}" for i in range(210)]), target="home")


@pytest.mark.parametrize("target, error", [
    ("loss", "error: --target: column 'loss' of loans.csv holds an amount (200 different numbers"),
    ("los", "error: --target: column 'los' not found in loans.csv (did you mean 'loss'?); allowed: income, home, loss"),
    ("Loss", "error: --target: column 'Loss' not found in loans.csv (did you mean 'loss'? names are case-sensitive); "
             "allowed: income, home, loss"),
    # a value typed for the column (explain.py's --target is a class): which column holds it, still before torch
    ("rent", "error: --target: column 'rent' not found in loans.csv ('rent' is a value of the column 'home': --target "
             "names the column to predict, --target home); allowed: income, home, loss"),
])
def test_train_refuses_the_target_before_torch_is_imported(tmp_path, target, error):
    """train.py checked --target only once its data module was built, after torch, Lightning and MLflow were imported:
    8 to 15 s on a shared 2-core machine for a misspelt column. The table is read with pandas alone first."""
    losses().to_csv(tmp_path / "loans.csv", index=False)
    code = ("import runpy, sys\nsys.argv = ['train.py', '--data', 'loans.csv', '--target', sys.argv[1], "
            f"'--tracking-uri', 'sqlite:///{tmp_path}/mlflow.db']\n"
            f"try:\n    runpy.run_path({str(ROOT / 'recipes' / 'train.py')!r}, run_name='__main__')\n"
            "except SystemExit as stop:\n    print('exit', stop.code, 'torch imported:', 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, target], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "exit 2 torch imported: False", done.stdout + done.stderr
    if target == "loss":  # the recipe's first lines come before the table is read: a 200 000-row file takes seconds
        assert done.stdout.startswith("MLflow store: "), done.stdout
    else:  # a name the header line does not hold is refused before them (the line alone is read)
        assert not done.stdout.startswith("MLflow store: "), done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(error), done.stderr


def decisions(rows: int = 200) -> pd.DataFrame:
    """Small-business loans decided Y or N, as a bank's export writes them: a few rows say 'y', 'Yes', 'n', 'No'."""
    frame = pd.DataFrame({"revenue": [40000 + 311 * i for i in range(rows)], "sector": ["Retail", "Services"] * (rows // 2),
                          "approved": ["Y" if i % 3 else "N" for i in range(rows)]})
    frame.loc[[1, 2, 4, 5, 7], "approved"] = ["y", "Yes", "Yes", "Yes", "y"]
    frame.loc[[0, 3, 6, 9], "approved"] = ["n", "No", "n", "No"]
    return frame


def test_one_class_written_several_ways_is_refused_before_a_model_of_six_classes_trains(tmp_path):
    """A Y/N target whose export also wrote 'y', 'Yes', 'n' and 'No' in a few rows (each at least 4 rows, so the
    rare-class check let them pass) trained a six-class model of a yes/no decision, said only in a note on case;
    'Yes' beside 'Y' not even that. The target now is refused in one line naming each spelling with its rows."""
    with pytest.raises(ValueError) as caught:
        TableDataModule(decisions(), target="approved")
    message = str(caught.value)
    assert message == ("target: column 'approved' of DataFrame writes one class in several ways (rows in brackets): "
                       "'Y' (128), 'Yes' (3), 'y' (2); 'N' (63), 'No' (2), 'n' (2); they would train as 6 different "
                       "classes; allowed: each class written one way in the file (e.g. 'Y' for all of 'Y', 'Yes', 'y')")
    clean = decisions().assign(approved=lambda f: f["approved"].str[0].str.upper())
    assert list(TableDataModule(clean, target="approved").codec.classes) == ["N", "Y"]
    # case alone, for any class name; other labels that differ more stay classes of their own
    grades = pd.DataFrame({"x": range(40), "grade": ["Approved", "approved", "Declined", "Referred"] * 10})
    with pytest.raises(ValueError, match=r"'Approved' \(10\), 'approved' \(10\); they would train as 4 different"):
        TableDataModule(grades, target="grade")
    assert len(TableDataModule(grades.replace("approved", "Approved"), target="grade").codec.classes) == 3


def test_a_word_for_a_missing_label_is_refused_as_a_class(tmp_path):
    """Pending applications written 'NA' or 'n/a' in a Y/N column trained a four-class model ('N', 'NA', 'Y', 'n/a'),
    said only in a note that the words were kept as categories. An empty cell or '?' is a row without a label, left
    out with a note, as before; a number target's 'NA' was already a missing label."""
    frame = decisions().assign(approved=lambda f: f["approved"].str[0].str.upper())
    frame.loc[[10, 20, 30, 40], "approved"] = "NA"
    frame.loc[[50, 60, 70, 80, 90], "approved"] = "n/a"
    frame.to_csv(tmp_path / "pending.csv", index=False)
    with pytest.raises(ValueError) as caught:
        TableDataModule(tmp_path / "pending.csv", target="approved")
    assert str(caught.value) == (f"target: column 'approved' of {tmp_path / 'pending.csv'} holds 'n/a' (5), 'NA' (4) "
                                 "(rows in brackets), words other tools write for a missing value: they would train as "
                                 "a class of their own; allowed: an empty cell or '?' for a row without a label (such "
                                 "rows are left out), or a class name that is no such word")
    severity = frame.assign(approved=frame["approved"].replace({"NA": "None", "n/a": "None"}))  # a class, as written
    assert list(TableDataModule(severity, target="approved").codec.classes) == ["N", "None", "Y"]
    frame.loc[[10, 20, 30, 40], "approved"] = ""
    frame.loc[[50, 60, 70, 80, 90], "approved"] = "?"
    frame.to_csv(tmp_path / "pending.csv", index=False)
    data = TableDataModule(tmp_path / "pending.csv", target="approved")
    assert list(data.codec.classes) == ["N", "Y"] and len(data.frame) == 191
    assert "9 row(s) without a value in the target column 'approved' left out" in data.describe()


def test_next_months_file_naming_the_target_otherwise_is_refused_with_the_column_to_rename():
    """A model's own preprocessing reads another month's file; there the target column was renamed (approved ->
    decision). 'target: 'decision' is not the column the model was trained to predict ('approved', ...)' named no
    allowed value and no way out."""
    from datamodules.codec import TabularCodec

    loans = pd.read_csv(ROOT / "tests" / "fixtures" / "loans.csv")
    codec = TabularCodec.fit(loans, "approved")
    with pytest.raises(ValueError, match=r"^target: got 'decision', not the column the model was trained to predict "
                                         r"\('approved', from its ct_preprocessing\) \(the file names it 'decision': "
                                         r"rename that column approved\); allowed: approved$"):
        TableDataModule(loans.rename(columns={"approved": "decision"}), target="decision", codec=codec)
    with pytest.raises(ValueError, match=r"^target: got 'sex', not the column .*\); allowed: approved$"):
        TableDataModule(loans, target="sex", codec=codec)  # the file holds approved: nothing to rename
