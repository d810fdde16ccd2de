"""Explaining a model trained on a spreadsheet export of a European locale (``;``, decimal commas, ``60.800 €``): the
explanation speaks the file's number format, in the console, ``--json``, ``--csv`` and the plot alike."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import torch
import pytest

from ct_lightning.evaluation.explanation import change_text

LOANS = Path(__file__).resolve().parent / "fixtures" / "loans.csv"


def european(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as Excel in Germany writes it: ``31.000,00 €`` for 31 000 euros, ``0,26`` for 0.26."""
    return frame.assign(income=frame.income.map(lambda v: f"{v:,.2f} €".translate(str.maketrans(",.", ".,"))),
                        debt_ratio=(frame.debt / frame.income).round(2).map(lambda v: f"{v:.2f}".replace(".", ",")))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A model trained for one epoch on the European export, and three applicants in the same format."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("european")
    loans = pd.read_csv(LOANS)
    (folder / "export.csv").write_bytes(b"sep=;\r\n" + european(loans).to_csv(sep=";", index=False).encode("cp1252"))
    train({"data": str(folder / "export.csv"), "target": "approved", "immutable": "age,sex", "max_epochs": 1,
           "nce": 16, "seed": 0, "tracking_uri": f"sqlite:///{folder / 'mlflow.db'}", "progress": False,
           "checkpoint_dir": str(folder / "ct")})
    rows = european(loans).drop(columns="approved").head(3)
    rows.insert(0, "applicant_id", [501, 502, 503])
    (folder / "applicants.csv").write_bytes(rows.to_csv(sep=";", index=False).encode("cp1252"))
    return folder, folder / "ct" / "last.ckpt"


def test_changes_are_written_with_the_files_decimal_commas_and_thousands_points(trained, capsys):
    """An HR export (``60.800,00 €``) was explained as ``expected_salary: 60,800 € → 54,800 €``: where the file
    comes from, ``60,800 €`` is sixty euros and eighty cents. The changes now read as the file writes numbers."""
    from recipes.explain import main

    folder, checkpoint = trained
    records = main(["--checkpoint", str(checkpoint), "--rows", str(folder / "applicants.csv"), "--target", "yes",
                    "--all-changes", "--max-steps", "300", "--no-log"])
    out = capsys.readouterr().out
    numbers = [c for r in records for c in r["changes"] if c["feature"] in ("income", "debt", "debt_ratio")]
    assert numbers, out
    for change in numbers:
        assert change["decimal_comma"] is True  # --json says how the file wrote its numbers
        assert f"    {change_text(change)}\n" in out
    income = next(c for c in numbers if c["feature"] == "income")
    start = f"{income['from']:,.0f}".replace(",", ".")
    assert f"income: {start} € → " in out, out  # 30.600 €, not 30,600 €
    debt = next((c for c in numbers if c["feature"] == "debt"), None)
    if debt is not None:  # the export writes debt without a thousands separator (8100): so does the explanation
        assert f"debt: {debt['from']} → " in out and debt["thousands"] == "", out
    assert change_text({"feature": "debt_ratio", "from": 0.26, "to": 0.3125, "decimal_comma": True}) == \
        "debt_ratio: 0,26 → 0,31"
    assert change_text({"feature": "income", "from": 1234.5, "to": 2000.5, "unit": "{} €", "decimal_comma": True}) \
        == "income: 1.234,5 € → 2.000,5 €"
    assert change_text({"feature": "home", "from": "rent", "to": "own", "decimal_comma": True}) == "home: rent → own"


def test_the_table_for_a_spreadsheet_is_written_in_the_files_locale(trained, tmp_path):
    """``--csv`` of a batch from a ``;``-separated export with decimal commas came back ``,``-separated with decimal
    points: Excel in that locale opened it as one column of text. It is now written as the export was: ``;`` and
    decimal commas (still UTF-8 with a byte-order mark, so that ``→`` and ``€`` read as written)."""
    from recipes.explain import main

    folder, checkpoint = trained
    table = tmp_path / "advice.csv"
    records = main(["--checkpoint", str(checkpoint), "--rows", str(folder / "applicants.csv"), "--target", "yes",
                    "--all-changes", "--max-steps", "300", "--no-log", "--csv", str(table)])
    raw = table.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    header = raw[3:].decode("utf-8").splitlines()[0]
    assert header == "row;applicant_id;explained;prediction;prediction_probability;target;probability;valid;" \
                     "counterfactual_prediction;changes;problem"
    written = pd.read_csv(table, sep=";", decimal=",", encoding="utf-8-sig")
    assert written["applicant_id"].tolist() == [501, 502, 503]
    assert written["prediction_probability"].tolist() == pytest.approx(
        [round(r["prediction_probability"], 3) for r in records], abs=1e-9)
    assert "," in raw.decode("utf-8-sig").splitlines()[1].split(";")[4]  # 0,734: a decimal comma
    assert "€ → " in " ".join(written["changes"].dropna())


def test_an_empty_cell_among_the_columns_the_model_does_not_read_is_left_out_of_the_rows_name(trained, capsys):
    """An applicant without notes in the HR export was named ``row 7 (Bewerber-ID 20250008, ..., Notizen None)``:
    the empty cell is now left out of the name, and a row with only empty such cells is ``row N``."""
    from ct_lightning.evaluation.explanation import row_label
    from recipes.explain import main

    folder, checkpoint = trained
    rows = pd.read_csv(folder / "applicants.csv", sep=";", dtype=str, encoding="cp1252")
    rows.insert(1, "notes", ["strong communicator", None, None])
    rows.loc[2, "applicant_id"] = None
    rows.to_csv(folder / "noted.csv", sep=";", index=False, encoding="cp1252")
    records = main(["--checkpoint", str(checkpoint), "--rows", str(folder / "noted.csv"), "--target", "yes",
                    "--max-steps", "50", "--no-log"])
    out = capsys.readouterr().out
    assert "row 1 (applicant_id 501, notes strong communicator): predicted " in out, out
    assert "row 2 (applicant_id 502): predicted " in out and "row 3: predicted " in out
    assert "None" not in out and "nan" not in out
    assert records[1]["other_columns"] == {"applicant_id": 502, "notes": None}  # --json keeps the empty cell
    assert row_label(4, {"hired_on": pd.NaT, "id": 7}) == "row 4 (id 7)"


def test_a_served_model_names_the_number_a_european_amount_writes(trained):
    """The served model of the HR export refused ``"expected_salary": "60.800,00 €"`` (the export's own spelling) as
    'is not a number', without the 'here 60800' it gives for ``"$17,665.85"``: it read the file's decimal commas
    from the column, which has none (the codec has). And ``"60.800"`` was told to be sent without quotes: 60.8."""
    from ct_lightning.experiment.runs.served_model import RawRowsClassifier, RequestRefused
    from datamodules.table import TableDataModule

    folder, _ = trained
    codec = TableDataModule(folder / "export.csv", target="approved").codec
    served = RawRowsClassifier(torch.nn.Linear(len(codec.feature_names), 2), codec, {})
    row = pd.read_csv(LOANS).drop(columns="approved").head(1)
    row = row.assign(debt_ratio=0.26).astype({"income": object})
    for written, message in (("30.600,00 €", "'30.600,00 €' in row 1 is text; allowed: a number (in JSON "
                                             "without quotes), here 30600"),
                             ("30.600", "'30.600' in row 1 is text; allowed: a number (in JSON without quotes), "
                                        "here 30600"),
                             ("30600", "'30600' in row 1 is text; allowed: a number (in JSON without quotes)")):
        with pytest.raises(RequestRefused) as refused:
            served.predict(None, row.assign(income=[written]), {})
        assert f"rows: column 'income': {message}" in str(refused.value), str(refused.value)


def test_start_up_and_fill_in_notes_write_numbers_as_the_file_does(tmp_path):
    """The start-up lines of a training on such an export said ``filled with 0.31`` and ``from 0.05`` while its
    explanations said ``0,31``: every number a note shows now reads as the file writes numbers."""
    import re

    from datamodules.table import TableDataModule

    rows = european(pd.read_csv(LOANS))
    rows.loc[:3, "debt_ratio"] = ""
    (tmp_path / "export.csv").write_bytes(b"sep=;\r\n" + rows.to_csv(sep=";", index=False).encode("cp1252"))
    spec = {"columns": {"debt_ratio": {"lower": 0.05, "upper": 2.5, "step": 0.01}}}
    data = TableDataModule(tmp_path / "export.csv", target="approved", impute="median", spec=spec)
    described = data.describe()
    assert re.search(r"debt_ratio: missing in 4 row\(s\), filled with 0,\d+, the training rows' median", described), \
        described
    assert "  debt_ratio: continuous, from 0,05 to 2,5, in steps of 0,01" in described, described
    assert re.search(r"\(\d+ below the declared lower bound 0,05\)", described), described
    frame = rows.drop(columns="approved").head(2).assign(debt_ratio=[None, 0.2])
    _, notes = data.codec.fill_missing(frame)  # a row explained or served with a gap
    assert len(notes) == 1 and re.match(r"debt_ratio: missing in 1 row\(s\), filled with 0,\d+, ", notes[0]), notes


def test_a_row_outside_the_domain_is_refused_in_the_files_numbers(trained, capsys):
    """A row of the European export with a debt ratio of 9,5 (written as the file does) was refused as
    ``debt_ratio=9.5 ... allowed: 0 to 0.66``, and an income of 9.000.000 € as ``income=9000000 ... allowed: ... to
    95403.1``: numbers the user never wrote, in a format their file does not use. Both now read as the file does,
    the income with the file's thousands points (``9.000.000 €``, ``162.200 €``)."""
    from ct_lightning.experiment.configuration.validation import CliExit
    from recipes.explain import main

    folder, checkpoint = trained
    row = pd.read_csv(folder / "applicants.csv", sep=";", encoding="cp1252", dtype=str).drop(
        columns="applicant_id").iloc[0].to_dict()
    for column, value, written in (("debt_ratio", "9,5", r"debt_ratio=9,5' \(outside the model's domain in row 1\); "
                                                         r"allowed: 0 to 0,\d+ \(the training"),
                                   ("income", "9.000.000,00 €", r"income=9\.000\.000 €' \(outside the model's domain "
                                                                r"in row 1\); allowed: 0 € to \d{2,3}\.\d{3}(,\d+)? € "
                                                                r"\(the")):
        with pytest.raises(CliExit) as refused:
            main(["--checkpoint", str(checkpoint), "--row", json.dumps({**row, column: value}), "--no-log"])
        assert refused.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert re.search(written, line), line
