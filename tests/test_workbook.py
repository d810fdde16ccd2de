"""An analyst's Excel workbook (.xlsx, .xlsm) as a table file: the same columns, codec and one-line refusals as the same
table saved as CSV; a sheet picked with book.xlsx#SHEET; .xls and formulas without a stored value refused."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import openpyxl
import pandas as pd
import pytest
import torch
from preloaded import run_script

from datamodules.table import TableDataModule

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def write_book(path: Path, sheets: dict[str, pd.DataFrame], percent: str | None = None) -> Path:
    """``sheets`` as a workbook written by openpyxl, as Excel leaves one: ``percent``'s cells shown as percentages,
    a formatted empty cell past the last row and column (Excel keeps such cells in the sheet's range)."""
    book = openpyxl.Workbook()
    book.remove(book.active)
    for title, frame in sheets.items():
        sheet = book.create_sheet(title)
        sheet.append(list(frame.columns))
        for row in frame.itertuples(index=False):
            sheet.append([None if pd.isna(value) else value.item() if hasattr(value, "item") else value
                          for value in row])
        if percent is not None and percent in frame.columns:
            column = list(frame.columns).index(percent) + 1
            for cells in sheet.iter_rows(min_row=2, min_col=column, max_col=column):
                cells[0].number_format = "0.0%"
        sheet.cell(row=len(frame) + 4, column=len(frame.columns) + 3).number_format = "0.00"
    book.save(path)
    return path


def loans() -> pd.DataFrame:
    """The loans fixture with what a bank's workbook holds beyond it: a rate in a percent-formatted column (0.075
    stored), an amount typed as text with its currency sign ('$1,200'), a yes/no flag as Excel's TRUE/FALSE."""
    frame = pd.read_csv(LOANS)
    frame.insert(4, "rate", [round(0.04 + 0.001 * (i % 50), 3) for i in range(len(frame))])
    frame.insert(5, "fee", [f"${1000 + 25 * (i % 40):,}" for i in range(len(frame))])
    frame.insert(6, "cosigned", [i % 3 == 0 for i in range(len(frame))])
    return frame


def test_a_workbook_reads_and_encodes_as_the_same_table_saved_as_csv(tmp_path):
    """train.py refused loans.xlsx (only .csv/.tsv/.txt/.parquet were tables). A workbook's sheet now reads as the
    same table saved as CSV: the same columns and dtypes (a cell shown as 5.0% is 5.0 with its '%', as the CSV
    Excel saves holds it, '$1,200' text is 1200 with its unit, TRUE/FALSE are the CSV's categories), the same codec and split, and the formatted empty cells
    Excel leaves past the table become neither rows with gaps nor 'Unnamed' columns."""
    frame = loans()
    csv = tmp_path / "loans.csv"
    frame.assign(cosigned=frame["cosigned"].map({True: "TRUE", False: "FALSE"}),
                 rate=frame["rate"].map(lambda v: f"{100 * v:.1f}%")).to_csv(csv, index=False)
    book = write_book(tmp_path / "loans.xlsx", {"Applications": frame}, percent="rate")
    from_csv, from_book = (TableDataModule(str(path), target="approved") for path in (csv, book))
    pd.testing.assert_frame_equal(from_book.frame, from_csv.frame)
    assert list(from_book.frame.columns) == list(frame.columns) and from_book.frame["rate"].iloc[10] == 5.0
    assert from_book.codec.to_dict() == from_csv.codec.to_dict()
    assert {c.name: c.unit for c in from_book.codec.columns if c.unit} == {"rate": "{}%", "fee": "${}"}
    assert all((from_book.rows[s] == from_csv.rows[s]).all() for s in from_book.rows)
    assert from_book.name == "loans" and "note: loans.xlsx: sheet 'Applications', each cell's stored value, in the " \
        "units Excel shows it with" in from_book.describe()


def test_a_formula_reads_as_the_value_excel_stored_with_it(tmp_path):
    """A formula cell holds its formula and the value Excel last computed; the value is read (pandas' reading), as a
    CSV saved from the workbook holds it, and the formula, whose value could be missing, needs no gaps around it."""
    frame = pd.read_csv(LOANS)
    book = write_book(tmp_path / "raw.xlsx", {"Sheet1": frame.assign(doubled=[f"=B{i + 2}*2" for i in frame.index])})
    with zipfile.ZipFile(book) as archive:  # as Excel saves it: each formula with its value (openpyxl writes none)
        parts = {name: archive.read(name) for name in archive.namelist()}
    parts["xl/worksheets/sheet1.xml"] = re.sub(
        rb"<f>B(\d+)\*2</f><v ?/>", lambda m: b"<f>B%s*2</f><v>%d</v>" % (m.group(1), 2 * frame["income"][int(m.group(1)) - 2]),
        parts["xl/worksheets/sheet1.xml"])
    with zipfile.ZipFile(tmp_path / "saved.xlsx", "w") as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    frame.assign(doubled=2 * frame["income"]).to_csv(tmp_path / "saved.csv", index=False)
    from_book, from_csv = (TableDataModule(str(tmp_path / name), target="approved") for name in ("saved.xlsx", "saved.csv"))
    pd.testing.assert_frame_equal(from_book.frame, from_csv.frame)
    with pytest.raises(ValueError, match=r"^data: 300 cell\(s\) of raw.xlsx hold a formula without a stored value"):
        TableDataModule(str(book), target="approved")


def _problem(kind: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The loans table with one thing a training refuses."""
    frame = frame.copy()
    if kind == "gap":
        frame["income"] = frame["income"].astype(object)
        frame.loc[3, "income"] = None
    if kind == "dates":  # date cells: the workbook stores datetimes
        frame["applied"] = [dt.datetime(2023, 1 + i % 12, 1 + i % 28) for i in range(len(frame))]
    if kind == "mixed %":  # text with '%' beside a number stored without one
        frame["rate"] = pd.Series([f"{4 + i % 10}%" for i in range(len(frame))], dtype=object)
        frame.loc[5, "rate"] = 0.075
    if kind == "rare class":
        frame.loc[7, "approved"] = "Approvd"
    return frame


@pytest.mark.parametrize("kind", ["gap", "dates", "mixed %", "rare class"])
def test_a_workbook_is_refused_with_the_line_the_same_csv_gets(tmp_path, kind):
    """Gaps, dates, numbers with and without '%', a class too rare for the splits: the workbook gets the CSV's one
    line, naming the workbook instead of the CSV."""
    frame = _problem(kind, pd.read_csv(LOANS))
    frame.to_csv(tmp_path / "loans.csv", index=False)
    write_book(tmp_path / "loans.xlsx", {"Sheet1": frame})
    said = []
    for name in ("loans.csv", "loans.xlsx"):
        with pytest.raises(ValueError) as caught:
            TableDataModule(str(tmp_path / name), target="approved")
        said.append(str(caught.value).replace(name, "FILE"))
    assert said[0] == said[1] and "\n" not in said[1], said


def _train_py(tmp_path: Path, data: str, script: str = "train.py") -> subprocess.CompletedProcess:
    """train.py (or ``script``) on ``data`` (exits before its training here), with whether torch was imported by
    then."""
    code = (f"import runpy, sys\nsys.argv = [{script!r}, '--data', sys.argv[1], '--target', 'approved', "
            f"'--tracking-uri', 'sqlite:///{tmp_path}/store/mlflow.db']\n"
            f"try:\n    runpy.run_path({str(ROOT / 'recipes' / script)!r}, run_name='__main__')\n"
            "except SystemExit as stop:\n    print('exit', stop.code, 'torch imported:', 'torch' in sys.modules)\n")
    return subprocess.run([sys.executable, "-c", code, data], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                          timeout=120)


@pytest.mark.parametrize("data, error", [
    ("book.xlsx", "error: --data: book.xlsx has 2 sheets ('Applications', 'Notes'): which one holds the table? "
                  "allowed: the sheet named after '#': book.xlsx#Applications, book.xlsx#Notes"),
    ("book.xlsx#Aplications", "error: --data: book.xlsx has no sheet 'Aplications' (did you mean 'Applications'?); "
                              "allowed: one of its sheets: 'Applications', 'Notes'"),
    ("old.xls", "error: --data: got 'old.xls' (an old binary Excel workbook (.xls)); allowed: an .xlsx or .csv file: "
                "open it in Excel and save it as 'Excel Workbook (.xlsx)' or as CSV"),
    ("gaps.xlsx", "error: --data: column 'income' has 1 missing value(s) (empty or '?') in gaps.xlsx; pass --impute "
                  "drop"),
    ("titled.xlsx", "error: --data: row 1 of titled.xlsx names 1 of its 8 columns (only 'Loan book 2023'): are the "
                    "column names on a lower row, below a title? allowed: a sheet whose row 1 holds the column names: "
                    "delete row 1 (row 2 holds 'age', 'income', 'debt', ...)"),
    ("formula.xlsx", "error: --data: 300 cell(s) of formula.xlsx hold a formula without a stored value (first: I2, "
                     "=B2/C2): the file was written by a program that does not compute formulas; allowed: a workbook "
                     "saved by Excel or LibreOffice"),
])
def test_train_refuses_a_workbook_in_one_line_before_torch_is_imported(tmp_path, data, error):
    """Several sheets and none named, a sheet it lacks, an .xls file (another reader, not installed), a gap, a title
    above the column names (read from row 1, the names would be a row of data), a formula whose value no program computed (openpyxl writes none: read as stored it would be a column of gaps):
    one line naming --data, the value and what is allowed, exit code 2, torch never imported, nothing written."""
    frame = pd.read_csv(LOANS)
    write_book(tmp_path / "book.xlsx", {"Applications": frame, "Notes": pd.DataFrame({"checked by": ["ann"]})})
    write_book(tmp_path / "gaps.xlsx", {"Sheet1": _problem("gap", frame)})
    titled = pd.concat([pd.DataFrame([frame.columns], columns=frame.columns), frame], ignore_index=True)
    write_book(tmp_path / "titled.xlsx", {"Sheet1": titled.set_axis(["Loan book 2023", *[None] * 7], axis=1)})
    write_book(tmp_path / "formula.xlsx", {"Sheet1": frame.assign(ratio=[f"=B{i + 2}/C{i + 2}" for i in frame.index])})
    done = _train_py(tmp_path, data)
    assert done.stdout.strip().splitlines()[-1] == "exit 2 torch imported: False", done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].replace(f"{tmp_path}/", "").startswith(error), done.stderr
    assert not (tmp_path / "store").exists(), "nothing was written"


@pytest.mark.parametrize("data", ["book.xlsx", "book.xlsx#Aplications"])
def test_compare_refuses_a_workbooks_missing_sheet_with_train_pys_line(tmp_path, data):
    """compare.py said 'error: data: ...' with the sheets as absolute paths, after its start-up; it now gives
    train.py's line (--data, the value as typed), exit code 2, before torch is imported and before any run."""
    write_book(tmp_path / "book.xlsx", {"Applications": pd.read_csv(LOANS), "Notes": pd.DataFrame({"by": ["ann"]})})
    trained, compared = (_train_py(tmp_path, data, script) for script in ("train.py", "compare.py"))
    assert compared.stdout.strip().splitlines()[-1] == "exit 2 torch imported: False", compared.stdout
    assert compared.stderr.strip().splitlines() == trained.stderr.strip().splitlines(), compared.stderr
    assert trained.stderr.startswith("error: --data: book.xlsx has") and not (tmp_path / "store").exists()


def test_a_chart_sheet_beside_the_table_is_no_second_sheet_for_compare_either(tmp_path):
    """A workbook of one worksheet and a chart sheet reads without '#' (a chart holds no table); compare.py's early
    check of the sheet counted the chart sheet and refused it as a workbook of 2 sheets."""
    from openpyxl.chart import BarChart, Reference

    from datamodules.workbook import check_sheet

    path = write_book(tmp_path / "book.xlsx", {"Applications": pd.read_csv(LOANS)})
    book = openpyxl.load_workbook(path)
    chart = BarChart()
    chart.add_data(Reference(book["Applications"], min_col=2, min_row=1, max_row=20))
    book.create_chartsheet("Income").add_chart(chart)
    book.save(path)
    assert openpyxl.load_workbook(path, read_only=True).sheetnames == ["Applications", "Income"]
    assert check_sheet(str(path), "--data") == "Applications"
    assert TableDataModule(str(path), target="approved").name == "book"


def test_a_workbooks_sheet_trains_and_explains_rows_of_another_sheet(tmp_path):
    """A run trained on book.xlsx#Applications names its data with the sheet (so evaluate.py, explain.py and
    compare.py read the same table), takes its name from the file and the sheet ('loans-Applications', so that two
    sheets of one workbook are told apart; it was 'loans' for both), and explain.py --rows takes rows from another
    sheet of a workbook (book.xlsx#Rows) in their own units."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train
    from ct_lightning.experiment.workflows.compare import resolve_names

    frame = pd.read_csv(LOANS)
    rows = frame.drop(columns="approved").head(2).assign(applicant=["A-17", "B-04"])
    write_book(tmp_path / "loans.xlsx", {"Applications": frame, "Rows": rows})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(tmp_path / "loans.xlsx#Applications"), "target": "approved", "max_epochs": 1, "nce": 16,
                 "tracking_uri": uri, "progress": False, "checkpoint_dir": str(tmp_path / "ckpt")})
    assert run["config"]["data"] == f"{tmp_path / 'loans.xlsx'}#Applications"
    recorded = MlflowClient(uri).get_run(run["run_id"])
    assert recorded.data.tags["data"] == "loans-Applications"
    assert recorded.info.run_name.startswith("loans-Applications-full-ecco-s0-")
    assert resolve_names("loans.xlsx#Applications,moons".replace("loans", str(tmp_path / "loans"))) == \
        [run["config"]["data"], "moons"]
    out = tmp_path / "explained.json"
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", run["run_id"], "--tracking-uri", uri, "--rows",
                      "loans.xlsx#Rows", "--json", str(out), "--no-log"], cwd=tmp_path, timeout=300,
                      env={**ENV, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [r["factual"]["income"] for r in records] == frame["income"].head(2).tolist()
    refused = run_script(ROOT / "recipes" / "explain.py", ["--run-id", run["run_id"], "--tracking-uri", uri, "--rows",
                         "loans.xlsx", "--no-log"], cwd=tmp_path, timeout=300, env={**ENV, "HOME": str(tmp_path)})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("error: --rows: got 'loans.xlsx' (loans.xlsx has 2 "
                                                              "sheets ('Applications', 'Rows'): which one"), refused.stderr


def _with_macros(book: Path, path: Path) -> Path:
    """``book`` as Excel saves a macro-enabled workbook (.xlsm): the macro-enabled main part's content type and a
    VBA project part (here a stand-in: a reader that ran macros would fail on it)."""
    with zipfile.ZipFile(book) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "[Content_Types].xml":
                data = data.replace(b"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
                                    b"application/vnd.ms-excel.sheet.macroEnabled.main+xml")
                assert b"macroEnabled" in data
            target.writestr(item, data)
        target.writestr("xl/vbaProject.bin", b"not a VBA project")
    return path


def test_a_macro_enabled_workbook_reads_as_the_same_workbook_without_macros(tmp_path):
    """Finance teams keep tables in .xlsm workbooks; train.py refused them as an unknown data set. An .xlsm file's
    sheet now reads as the same .xlsx's (its macros are never run), with the sheet picked after '#' and the same
    one-line refusal for several sheets and none named, before torch is imported."""
    frame = loans()
    book = write_book(tmp_path / "loans.xlsx", {"Applications": frame, "Notes": pd.DataFrame({"by": ["ann"]})},
                      percent="rate")
    macro = _with_macros(book, tmp_path / "loans.xlsm")
    from_book, from_macro = (TableDataModule(f"{path}#Applications", target="approved") for path in (book, macro))
    pd.testing.assert_frame_equal(from_macro.frame, from_book.frame)
    assert from_macro.codec.to_dict() == from_book.codec.to_dict() and from_macro.name == "loans-Applications"
    done = _train_py(tmp_path, "loans.xlsm")
    assert done.stdout.strip().splitlines()[-1] == "exit 2 torch imported: False", done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --data: loans.xlsm has 2 sheets ('Applications', 'Notes'): which one holds the table? allowed: the "
        "sheet named after '#': loans.xlsm#Applications, loans.xlsm#Notes"], done.stderr


SHOWN = {  # a column's number format in Excel, and the text the same column holds in a CSV saved from Excel
    "rate": ("0.0%", lambda v: f"{100 * v:.1f}%"),
    "fee": ('"$"#,##0', lambda v: f"${v:,}"),
    "deposit": ('#,##0.00\\ "€"', lambda v: f"{v:,.2f} €"),
    "bonus": ("[$€-407] #,##0", lambda v: f"€ {v:,}"),
    "savings": ('_("£"* #,##0.00_);_("£"* \\(#,##0.00\\);_("£"* "-"??_);_(@_)', lambda v: f"£{v:,.2f}"),
}


def _formatted_book(path: Path, frame: pd.DataFrame, formats: dict[str, str]) -> Path:
    """``frame`` as a workbook whose columns ``formats`` names are shown with those number formats."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(list(frame.columns))
    for row in frame.itertuples(index=False):
        sheet.append([value.item() if hasattr(value, "item") else value for value in row])
    for name, number_format in formats.items():
        column = list(frame.columns).index(name) + 1
        for (cell,) in sheet.iter_rows(min_row=2, min_col=column, max_col=column):
            cell.number_format = number_format
    book.save(path)
    return path


def test_a_cell_shown_as_a_percent_or_an_amount_reads_in_its_units_as_the_csv_excel_saves(tmp_path):
    """A cell Excel shows as 7.5% stores 0.075 and one shown as $1,200 stores 1200 with a number format; the model
    saw 0.075 and explanations read 'rate: 0.075 → 0.06'. A workbook now reads as the CSV Excel saves from it
    (7.5%, $1,200, 1,200.50 €, € 1,200, £1,200.50): the same values (7.5, not 0.075), units, labels as written,
    codec, and the same explanation, in the applicant's units ('rate: 7.5% → ...')."""
    from ct_lightning.evaluation.explanation import describe, explain
    from ct_lightning.models import build_mlp

    frame = pd.read_csv(LOANS)
    n = len(frame)
    frame = frame.assign(rate=[round(0.04 + 0.001 * (i % 50), 3) for i in range(n)],
                         fee=[1000 + 25 * (i % 40) for i in range(n)],
                         deposit=[round(500 + 10.25 * (i % 30), 2) for i in range(n)],
                         bonus=[100 * (i % 7) for i in range(n)], savings=[1200.5 + 100 * (i % 9) for i in range(n)])
    frame.loc[0, "rate"] = 0.075
    _formatted_book(tmp_path / "loans.xlsx", frame, {name: shown[0] for name, shown in SHOWN.items()})
    frame.assign(**{name: frame[name].map(shown[1]) for name, shown in SHOWN.items()}).to_csv(tmp_path / "loans.csv",
                                                                                              index=False)
    from_csv, from_book = (TableDataModule(str(tmp_path / n), target="approved") for n in ("loans.csv", "loans.xlsx"))
    pd.testing.assert_frame_equal(from_book.frame, from_csv.frame)
    assert from_book.frame.loc[0, "rate"] == 7.5 and from_book.frame.loc[0, "fee"] == 1000
    assert from_book.frame.attrs["units"] == from_csv.frame.attrs["units"] == {
        "rate": "{}%", "fee": "${}", "deposit": "{} €", "bonus": "€{}", "savings": "£{}"}
    assert from_book.frame.attrs["written"] == from_csv.frame.attrs["written"]
    assert from_book.codec.to_dict() == from_csv.codec.to_dict()
    said = []
    for module in (from_csv, from_book):
        torch.manual_seed(0)
        model = build_mlp(len(module.codec.feature_names), 2, [8])
        rows = module.frame.drop(columns="approved").head(1)
        fixed = {name: "none" for name in rows.columns if name != "rate"}  # the rate is the one change
        said.append(describe(explain(model, rows, codec=module.codec, mutability=fixed, max_steps=50, tau=0.99)))
    assert said[0] == said[1] and "rate: 7.5% → " in said[1], said


@pytest.mark.parametrize("number_format", ["0.00", "#,##0", "General", "0.00E+00", '#,##0 "kr"', "[$CHF] #,##0.00",
                                           '"US$"#,##0', "@"])
def test_a_number_format_without_a_unit_the_reader_knows_reads_the_stored_number(tmp_path, number_format):
    """Plain formats (decimals, thousands, scientific, text) and units the CSV reader keeps no sign of (kr, CHF,
    US$): the stored number, without a unit, never a wrong one ('US$' is no '$')."""
    frame = pd.read_csv(LOANS)
    frame = frame.assign(amount=[1200 + 0.5 * i for i in range(len(frame))])
    book = _formatted_book(tmp_path / "plain.xlsx", frame, {"amount": number_format})
    module = TableDataModule(str(book), target="approved")
    assert module.frame["amount"].tolist() == frame["amount"].tolist()
    assert "amount" not in module.frame.attrs["units"] and "amount" not in module.frame.attrs["written"]


def test_a_column_of_percent_cells_beside_a_share_is_refused_as_in_the_csv(tmp_path):
    """Most cells shown as 4% to 8% and one stored 0.075 without the format (Excel shows 0.075): a share (7.5%), or
    0.075%? The CSV saved from the workbook is refused with a question, and the workbook with the same line; a
    plain 6 among 4% to 8% is 6% in both, as in a CSV."""
    frame = pd.read_csv(LOANS)
    frame = frame.assign(rate=[0.04 + 0.01 * (i % 5) for i in range(len(frame))])
    for stored, shown in ((0.075, "0.075"), (6, "6")):
        frame.loc[5, "rate"] = stored
        book = _formatted_book(tmp_path / "mixed.xlsx", frame, {"rate": "0%"})
        openpyxl_book = openpyxl.load_workbook(book)
        openpyxl_book.active["I7"].number_format = "General"
        openpyxl_book.save(book)
        text = [f"{round(100 * v)}%" for v in frame["rate"]]
        text[5] = shown
        frame.assign(rate=text).to_csv(tmp_path / "mixed.csv", index=False)
        if stored == 6:
            from_csv, from_book = (TableDataModule(str(tmp_path / n), target="approved")
                                   for n in ("mixed.csv", "mixed.xlsx"))
            pd.testing.assert_frame_equal(from_book.frame, from_csv.frame)
            assert from_book.frame.loc[5, "rate"] == 6 and from_book.frame.loc[6, "rate"] == 5
            continue
        said = []
        for name in ("mixed.csv", "mixed.xlsx"):
            with pytest.raises(ValueError) as caught:
                TableDataModule(str(tmp_path / name), target="approved")
            said.append(str(caught.value).replace(name, "FILE"))
        assert said[0] == said[1] and "is 0.075 a share (7.5%) or 0.075%?" in said[1], said


def test_an_openpyxl_without_style_numbers_reads_the_same_units(tmp_path, monkeypatch):
    """The reader asks each style's number format once, by openpyxl's private ``_style_id``; a release without it
    must read the same values and units from each cell's number format, not lose them."""
    import datamodules.workbook as workbook

    frame = pd.read_csv(LOANS).assign(fee=lambda f: 1000 + 25 * (f.index % 40))
    _formatted_book(tmp_path / "loans.xlsx", frame, {"fee": SHOWN["fee"][0]})
    numbered = TableDataModule(str(tmp_path / "loans.xlsx"), target="approved")
    monkeypatch.setattr(workbook, "numbered_styles", lambda cell_class: False)
    by_format = TableDataModule(str(tmp_path / "loans.xlsx"), target="approved")
    assert by_format.frame.attrs["units"] == numbered.frame.attrs["units"] == {"fee": "${}"}
    pd.testing.assert_frame_equal(by_format.frame, numbered.frame)


GERMAN = str.maketrans(",.", ".,")  # 54,400.50 → 54.400,50


def _hr_frame() -> pd.DataFrame:
    """An HR export: an amount in €, a plain share with decimals (General), whole years, a yes/no decision."""
    n = 120
    salary = [30000 + 375.25 * (i % 80) for i in range(n)]
    return pd.DataFrame({"Berufserfahrung (Jahre)": [i % 15 for i in range(n)],
                         "Teilzeitanteil": [round(0.5 + 0.0625 * (i % 8), 4) for i in range(n)],
                         "Gehaltswunsch": salary, "Eingestellt": ["ja" if s < 44000 else "nein" for s in salary]})


def test_a_workbook_of_amounts_formatted_as_in_germany_reads_and_shows_numbers_as_its_csv_does(tmp_path):
    """A German HR workbook whose salaries Excel shows as '54.400,50 €' (number format #,##0.00\\ "€") was read as
    '54,400.50 €': explanations said 'Gehaltswunsch: 29,700 € → 40,379 €' (to a German reader 29 euros 70) and
    '--row {"Gehaltswunsch": "55.000,00 €"}' was refused as no number. It now reads as the CSV that Excel in
    Germany saves ('54.400,50 €', '0,5625'; ';'-separated): the same frame and codec, decimal commas in explanations,
    and rows written as the file writes them."""
    from ct_lightning.evaluation.explanation import describe, explain
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.models import build_mlp

    frame = _hr_frame()
    _formatted_book(tmp_path / "bewerbungen.xlsx", frame, {"Gehaltswunsch": '#,##0.00\\ "€"'})
    frame.assign(Gehaltswunsch=frame["Gehaltswunsch"].map(lambda v: f"{v:,.2f} €".translate(GERMAN)),
                 Teilzeitanteil=frame["Teilzeitanteil"].map(lambda v: repr(v).replace(".", ","))
                 ).to_csv(tmp_path / "bewerbungen.csv", sep=";", index=False)
    from_csv, from_book = (TableDataModule(str(tmp_path / n), target="Eingestellt")
                           for n in ("bewerbungen.csv", "bewerbungen.xlsx"))
    pd.testing.assert_frame_equal(from_book.frame, from_csv.frame)
    assert from_book.frame["Gehaltswunsch"].tolist() == frame["Gehaltswunsch"].tolist()
    assert from_book.frame["Teilzeitanteil"].tolist() == frame["Teilzeitanteil"].tolist()
    assert from_book.codec.to_dict() == from_csv.codec.to_dict() and from_book.codec.decimal_comma
    assert "'54.400,50 €' is" not in from_book.describe() and "decimal commas" in from_book.describe()
    torch.manual_seed(0)
    model = build_mlp(len(from_book.codec.feature_names), 2, [8])
    rows = frame.drop(columns="Eingestellt").head(1)
    fixed = {"Berufserfahrung (Jahre)": "none", "Teilzeitanteil": "none"}
    said = describe(explain(model, rows, codec=from_book.codec, mutability=fixed, max_steps=50, tau=0.99))
    assert re.search(r"Gehaltswunsch: 30\.000 € → \d{1,3}(\.\d{3})*(,\d+)? €", said), said
    loaded = Explainable(model, from_book.codec, {}, None, True)
    typed = pd.DataFrame([{"Berufserfahrung (Jahre)": 3, "Teilzeitanteil": "0,75", "Gehaltswunsch": "35.000,00 €"}])
    checked, _, _ = check_rows(typed, loaded, "--row")
    assert checked.loc[0, "Gehaltswunsch"] == 35000 and checked.loc[0, "Teilzeitanteil"] == 0.75
    with pytest.raises(InputError, match=r"got 'Gehaltswunsch=35,000.00 €' \(not a number in row 0\); allowed: a "
                                         r"number for Gehaltswunsch \(as the training file writes them: 1\.234,5 €; "
                                         r"or plain: 1234\.5\)"):
        check_rows(typed.assign(Gehaltswunsch="35,000.00 €"), loaded, "--row")


@pytest.mark.parametrize("number_format, comma", [
    ('#,##0.00\\ "€"', True), ("#,##0 €", True), ("[$€-407] #,##0", True), ("#,##0.00 [$€-40C]", True),
    ('"$"#,##0.00', False), ('"€"#,##0.00', False), ("[$€-1809]#,##0.00", False), ("[$CHF-807] #,##0.00", False),
    ("0.0%", None), ("General", None), ("#,##0.00", None), ('#,##0 "kr"', None)])
def test_a_number_format_says_which_decimal_separator_excel_shows(number_format, comma):
    """An amount with the € after the number, or a locale tag of a decimal-comma language (407 German, 40C French),
    is written with decimal commas; a currency sign before it, or an English or Swiss tag (1809 Ireland, 807
    Switzerland), with a decimal point; plain formats say nothing (Excel shows them in its reader's locale)."""
    from datamodules.workbook import comma_format

    assert comma_format(number_format) is comma


def test_a_sheet_of_euro_amounts_beside_dollar_ones_keeps_decimal_points(tmp_path):
    """Formats that disagree (1.234,50 € beside $1,234.50) say nothing: the sheet reads as before, decimal points."""
    frame = _hr_frame().assign(Bonus=[1000 + 10 * i for i in range(120)])
    book = _formatted_book(tmp_path / "mixed.xlsx", frame, {"Gehaltswunsch": '#,##0.00\\ "€"', "Bonus": '"$"#,##0'})
    module = TableDataModule(str(book), target="Eingestellt")
    assert not module.codec.decimal_comma and module.frame["Gehaltswunsch"].tolist() == frame["Gehaltswunsch"].tolist()


def test_a_title_and_an_empty_row_above_the_names_are_named_as_the_rows_to_delete(tmp_path):
    """An HR system's export: a title in row 1, an empty row 2, the column names in row 3. The refusal said "delete
    the rows above them"; it now says which rows, and which row holds the names."""
    from datamodules.table_format import TableError

    frame = _hr_frame()
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["Bewerbungen 2024 – alle Stellen"])
    sheet.append([])
    sheet.append(list(frame.columns))
    for row in frame.itertuples(index=False):
        sheet.append(list(row))
    book.save(tmp_path / "export.xlsx")
    with pytest.raises(TableError, match=r"allowed: a sheet whose row 1 holds the column names: delete rows 1 to 2 "
                                         r"\(row 3 holds 'Berufserfahrung \(Jahre\)', 'Teilzeitanteil', "
                                         r"'Gehaltswunsch', \.\.\.\)$"):
        TableDataModule(str(tmp_path / "export.xlsx"), target="Eingestellt")
