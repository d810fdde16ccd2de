"""CSV files as real-world tools write them: each is read with its values' meaning, or refused in one line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from datamodules.table import TableDataModule

LOANS = Path(__file__).resolve().parent / "fixtures" / "loans.csv"


@pytest.fixture(scope="module")
def loans() -> pd.DataFrame:
    frame = pd.read_csv(LOANS).head(120)
    return frame.assign(debt_ratio=(frame.debt / frame.income).round(2))


def european(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as a spreadsheet in a European locale writes it: 31.000 for 31 000, 0,26 for 0.26."""
    return frame.assign(income=frame.income.map(lambda v: f"{v:,}".replace(",", ".")),
                        debt_ratio=frame.debt_ratio.map(lambda v: f"{v:.2f}".replace(".", ",")))


def test_semicolons_decimal_commas_thousands_points_a_bom_and_windows_line_ends(tmp_path, loans):
    path = tmp_path / "export.csv"
    with open(path, "w", encoding="utf-8-sig", newline="") as handle:
        european(loans).to_csv(handle, sep=";", index=False, lineterminator="\r\n")
        handle.write(";;;;;;;;\r\n")  # a trailing row of empty cells, as spreadsheets leave
    data = TableDataModule(path, target="approved")
    assert list(data.frame.columns) == list(loans.columns)  # 'age', not '\ufeffage'; one column each, not one in all
    assert data.frame.income.tolist() == loans.income.tolist()  # 31.000 is 31000, not 31.0
    assert data.frame.debt_ratio.tolist() == loans.debt_ratio.tolist()
    kinds = {c.name: c.kind for c in data.codec.columns}
    assert kinds["income"] == "integer" and kinds["debt_ratio"] == "continuous" and len(data.frame) == len(loans)
    assert data.codec.decimal_comma and "note: export.csv: decimal commas (0,5)" in data.describe()


def test_excels_sep_line_tabs_and_windows_1252(tmp_path, loans):
    path = tmp_path / "excel.csv"
    frame = loans.assign(purpose=loans.purpose.replace({"car": "Überweisung"}))
    path.write_bytes(b"sep=;\r\n" + european(frame).to_csv(sep=";", index=False).encode("cp1252"))
    data = TableDataModule(path, target="approved")
    assert list(data.frame.columns) == list(loans.columns) and data.frame.income.tolist() == loans.income.tolist()
    assert "Überweisung" in next(c for c in data.codec.columns if c.name == "purpose").categories
    assert "note: excel.csv is not UTF-8: read as Windows-1252" in data.describe()
    european(loans).to_csv(tmp_path / "tabs.csv", sep="\t", index=False)
    assert TableDataModule(tmp_path / "tabs.csv", target="approved").frame.debt_ratio.tolist() == \
        loans.debt_ratio.tolist()


def test_a_thousands_point_without_decimal_commas_is_refused_not_guessed(tmp_path, loans):
    path = tmp_path / "export.csv"
    loans.assign(income=european(loans).income).drop(columns="debt_ratio").to_csv(path, sep=";", index=False)
    with pytest.raises(ValueError, match=r"^data: column 'income' of .* holds numbers such as '\d+\.\d{3}' in a ';'-"
                                         r"separated file: is '\.' a thousands separator or a decimal point\?"):
        TableDataModule(path, target="approved")


def test_spaces_around_cells_question_marks_and_quoted_commas(tmp_path, loans):
    frame = loans.assign(sex=[" " + s if i % 2 else s + " " for i, s in enumerate(loans.sex)],
                         purpose=loans.purpose.str.replace("_", ", "))
    frame.to_csv(tmp_path / "spaced.csv", index=False)
    data = TableDataModule(tmp_path / "spaced.csv", target="approved")
    columns = {c.name: c for c in data.codec.columns}
    assert columns["sex"].kind == "binary" and columns["sex"].categories == ["female", "male"]
    assert "debt, consolidation" in columns["purpose"].categories
    frame.assign(home_ownership=["?" if i == 3 else h for i, h in enumerate(loans.home_ownership)]).to_csv(
        tmp_path / "unknown.csv", index=False)
    with pytest.raises(ValueError, match=r"column 'home_ownership' has 1 missing value\(s\) \(empty or '\?'\)"):
        TableDataModule(tmp_path / "unknown.csv", target="approved")


def test_a_file_without_a_header_row_is_refused(tmp_path, loans):
    loans.to_csv(tmp_path / "adult.csv", index=False, header=False)
    with pytest.raises(ValueError, match=r"^data: the first row of .*adult.csv looks like data, not column names"):
        TableDataModule(tmp_path / "adult.csv", target="approved")


@pytest.mark.parametrize("written, shown", [(lambda v: f"${v:,}", r"'\$\d+,\d{3}'"), (lambda v: f"{v // 1000 % 100}%", r"'\d+%'")])
def test_numbers_written_as_text_are_refused_unless_declared(tmp_path, loans, written, shown):
    loans.assign(income=loans.income.map(written)).to_csv(tmp_path / "money.csv", index=False)
    with pytest.raises(ValueError, match=rf"^data: column 'income' of .* holds numbers written as text \({shown}\); "
                                         r"allowed: plain numbers .* --drop-columns income$"):
        TableDataModule(tmp_path / "money.csv", target="approved")
    assert TableDataModule(tmp_path / "money.csv", target="approved", drop_columns=["income"]).codec
    declared = TableDataModule(tmp_path / "money.csv", target="approved",
                               spec={"columns": {"income": {"kind": "categorical"}}}) if shown.endswith("%'") else None
    assert declared is None or next(c for c in declared.codec.columns if c.name == "income").kind == "categorical"


def test_dates_are_refused_unless_left_out(tmp_path, loans):
    dated = loans.assign(applied=[f"2021-{1 + i % 12:02d}-01" for i in range(len(loans))])
    dated.to_csv(tmp_path / "dated.csv", index=False)
    with pytest.raises(ValueError, match=r"^data: column 'applied' of .* holds dates \('2021-01-01'\); .*"
                                         r"--drop-columns applied"):
        TableDataModule(tmp_path / "dated.csv", target="approved")
    assert "applied" not in TableDataModule(tmp_path / "dated.csv", target="approved",
                                            drop_columns=["applied"]).codec.feature_names


def test_categories_that_differ_only_in_case_are_named_and_three_classes_have_no_positive(tmp_path, loans):
    frame = loans.assign(sex=[s.title() if i % 3 == 0 else s for i, s in enumerate(loans.sex)],
                         approved=[a if i % 4 else "maybe" for i, a in enumerate(loans.approved)])
    text = TableDataModule(frame, target="approved").describe()
    assert "note: sex: 'Female', 'female'; 'Male', 'male' differ only in case" in text
    assert "with classes 'maybe', 'no', 'yes'\n" in text  # no "(positive: 'yes')" among three classes


def test_rows_to_explain_are_read_as_the_training_file_was(tmp_path, loans):
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, read_rows

    path = tmp_path / "export.csv"
    european(loans).to_csv(path, sep=";", index=False)
    loaded = Explainable(None, TableDataModule(path, target="approved").codec, {}, None, True)
    row = ('{"age": 29, "income": "31.000", "debt": 21000, "years_employed": 2, "home_ownership": " rent",'
           ' "purpose": "car", "sex": "female ", "debt_ratio": "0,68"}')
    rows, _, _ = check_rows(read_rows(row=row), loaded, "--row")
    assert rows.iloc[0][["income", "debt_ratio", "home_ownership"]].tolist() == [31000, 0.68, "rent"]
    european(loans).head(2).to_csv(tmp_path / "rows.csv", sep=";", index=False)
    rows, _, _ = check_rows(read_rows(str(tmp_path / "rows.csv")), loaded, "--rows")
    assert rows.income.tolist() == loans.income.head(2).tolist()
    (tmp_path / "headless.csv").write_text("29,31000\n30,32000\n29,31000\n")
    with pytest.raises(InputError, match=r"^--rows: got '.*' \(the first row of .* looks like data"):
        read_rows(str(tmp_path / "headless.csv"))


def test_rows_to_explain_are_refused_with_the_readers_own_problem_and_allowed_values(tmp_path, loans):
    """``read_table`` refuses ``--rows`` as fields (option, file, problem, allowed), not as text to cut at
    ``"; allowed: "``: a problem asked as a question has no ``;`` before ``allowed:``, an unreadable file no
    ``allowed:`` at all, and a folder may hold ``; allowed: `` in its name; the cut got each of them wrong."""
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import read_rows

    thousands = tmp_path / "export.csv"  # ';'-separated, '30.600' and no decimal comma: a question
    first = european(loans).income.iloc[0]
    loans.assign(income=european(loans).income).drop(columns="debt_ratio").head(3).to_csv(thousands, sep=";",
                                                                                          index=False)
    odd = tmp_path / "rows; allowed: these"
    odd.mkdir()
    (odd / "headless.csv").write_text("29,31000\n30,32000\n29,31000\n")
    (tmp_path / "ragged.csv").write_text("age,income\n29,31000\n30,32000,7,8\n")
    cases = {thousands: f"(column 'income' of {thousands} holds numbers such as {first!r} in a ';'-separated file: is "
                        "'.' a thousands separator or a decimal point?); allowed: numbers without thousands separators "
                        "(127600), or with a decimal comma (127,6)",
             odd / "headless.csv": f"(the first row of {odd / 'headless.csv'} looks like data, not column names ('29', "
                                   "'31000', ... recur as values in their own columns)); allowed: a file whose first row "
                                   "names the columns: add one",
             tmp_path / "ragged.csv": f"(cannot read {tmp_path / 'ragged.csv'} (ParserError: Error tokenizing data. C "
                                      "error: Expected 2 fields in line 3, saw 4)); allowed: a table with a header row "
                                      "and data rows"}
    for path, said in cases.items():
        with pytest.raises(InputError) as refused:
            read_rows(str(path))
        assert str(refused.value) == f"--rows: got {str(path)!r} {said}"
        assert refused.value.option == "--rows" and refused.value.value == str(path)
