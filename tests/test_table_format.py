"""CSV files as real-world tools write them: each is read with its values' meaning, or refused in one line."""

from __future__ import annotations

import cProfile
import json
import pstats
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


def test_a_french_export_whose_only_decimal_commas_carry_a_unit(tmp_path, loans):
    """A French spreadsheet writes ``14 999,01 €`` (a no-break space between thousands) and ``49,1 %``; with no
    plain number showing a decimal comma, the file was taken for one without them and both columns were refused as
    "numbers written as text". Dressed cells now show the decimal comma too."""
    path = tmp_path / "export_fr.csv"
    french = loans.drop(columns="debt_ratio").assign(
        income=loans.income.map(lambda v: f"{v + 0.5:,.2f} €".replace(",", "\u00a0").replace(".", ",")),
        rate=(loans.debt_ratio * 100).map(lambda v: f"{v:.1f} %".replace(".", ",")))
    path.write_bytes(french.to_csv(sep=";", index=False).encode("cp1252"))
    data = TableDataModule(path, target="approved")
    assert data.frame.income.tolist() == pytest.approx((loans.income + 0.5).tolist())
    assert data.frame.rate.tolist() == pytest.approx((loans.debt_ratio * 100).round(1).tolist())
    assert data.codec.decimal_comma and "note: export_fr.csv: decimal commas (0,5) and spaces as the thousands " \
        "separator (14 999,01; 12.000 also reads as 12000)" in data.describe()  # as the file groups them
    assert "income: numbers written as text read as numbers ('30 600,50 €' is 30600.5)" in data.describe()  # not 30600
    units = {c.name: c.unit for c in data.codec.columns if getattr(c, "unit", None)}
    assert units == {"income": "{} €", "rate": "{} %"}, units  # 49,1 % keeps its space in explanations
    # dollars with a thousands comma and no cents ($30,600) show no decimal comma: still refused, not read as 30.6
    loans.assign(income=loans.income.map(lambda v: f"${v:,}")).to_csv(tmp_path / "us.csv", sep=";", index=False)
    with pytest.raises(ValueError, match=r"column 'income' of .* holds numbers written as text \('\$30,600'\)"):
        TableDataModule(tmp_path / "us.csv", target="approved")


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


@pytest.mark.parametrize("written, first, unit", [(lambda v: f"${v:,}", "$30,600", "${}"),
                                                  (lambda v: f"{v / 1000:.1f}%", "30.6%", "{}%"),
                                                  (lambda v: f"€ {v:,.2f}", "€ 30,600.00", "€{}")])
def test_money_and_percentages_are_read_as_numbers_with_a_note(tmp_path, loans, written, first, unit):
    """``$36,428.20`` and ``7.5%`` were refused ("remove currency signs, '%' and thousands separators in the file"):
    the commonest cleaning a credit file needs. They are numbers in the file's units, and rows to explain may write
    them either way."""
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, read_rows

    loans.assign(income=loans.income.map(written)).to_csv(tmp_path / "money.csv", index=False)
    data = TableDataModule(tmp_path / "money.csv", target="approved")
    expected = loans.income / 1000 if first.endswith("%") else loans.income
    assert data.frame.income.tolist() == pytest.approx(expected.tolist(), abs=1e-9)
    income = next(c for c in data.codec.columns if c.name == "income")
    assert income.kind in ("integer", "continuous") and income.unit == unit  # explanations show it: $30,600 → $41,000
    from datamodules.codec import TabularCodec

    assert TabularCodec.from_dict(data.codec.to_dict()).columns[1].unit == unit  # it travels with the model
    assert "unit" not in TableDataModule(loans, target="approved").codec.to_dict()["columns"][1]  # payloads as before
    assert f"note: income: numbers written as text read as numbers ({first!r} is" in data.describe()
    typical = loans[loans.income < loans.income.median()].drop(columns="approved").head(2)
    loaded = Explainable(None, data.codec, {}, None, True)
    rows = typical.assign(income=[written(typical.income.iloc[0]), float(expected[typical.index[1]])])
    checked, _, _ = check_rows(read_rows(row=rows.to_json(orient="records")), loaded, "--row")
    assert checked.income.tolist() == pytest.approx(expected[typical.index].tolist())


def test_accounting_brackets_are_negative_numbers_and_percent_beside_plain_numbers_is_refused(tmp_path, loans):
    """Two silent misreadings of a spreadsheet's money and rates. A net income written as accountants write a loss,
    ``($1,000)``, made the column text: with fewer than 100 different values it trained as unordered categories
    (``'$1,000'``, ``'($2,000)'``, ...). A rate written ``7.5%`` in most cells and ``0.104`` (a share) in a few
    read 0.104 as 0.104 %, a hundredfold off, with only a note. Brackets now make a negative number; a column that
    writes numbers both with and without ``%``, some of those without outside the range of those with, is refused,
    naming both readings."""
    net = [f"(${-v:,})" if v < 0 else f"${v:,}" for v in (loans.income // 1000 * 1000 - 40000)]
    assert any(v.startswith("(") for v in net) and len(set(net)) < 100
    loans.assign(net=net).to_csv(tmp_path / "net.csv", index=False)
    data = TableDataModule(tmp_path / "net.csv", target="approved")
    column = next(c for c in data.codec.columns if c.name == "net")
    assert column.kind == "integer" and column.unit == "${}"
    assert data.frame.net.tolist() == (loans.income // 1000 * 1000 - 40000).tolist()
    rates = [f"{v / 1000:.1f}%" for v in loans.income]
    rates[4], rates[9] = "0.104", "0.2"
    loans.assign(rate=rates).to_csv(tmp_path / "rates.csv", index=False)
    with pytest.raises(ValueError, match=r"^data: column 'rate' of .*rates.csv writes 118 of its numbers with '%' "
                                         r"\('\d+\.\d%'\) and 2 without \('0.104'\): is 0.104 a share \(10.4%\) or "
                                         r"0.104%\?; allowed: every number of the column written one way in the file "
                                         r"\(all with '%', or all as plain numbers\), or leave it out with "
                                         r"--drop-columns rate$"):
        TableDataModule(tmp_path / "rates.csv", target="approved")
    rates[4], rates[9] = "10.4%", "40"  # a '%' left out within the column's range: the same scale, read as it is
    loans.assign(rate=rates).to_csv(tmp_path / "rates.csv", index=False)
    read = TableDataModule(tmp_path / "rates.csv", target="approved").frame.rate
    assert read.iloc[4] == pytest.approx(10.4) and read.iloc[9] == 40


def test_numbers_written_ambiguously_as_text_are_refused_unless_declared(tmp_path, loans):
    """``30,6`` in a comma-separated file: thirty point six, or three hundred and six? Refused, not guessed."""
    few = loans.head(80)  # fewer incomes than a categorical column's limit (100 levels), for the declared case
    few.assign(income=few.income.map(lambda v: f"{v / 1000:.1f}".replace(".", ","))).to_csv(
        tmp_path / "comma.csv", index=False)
    with pytest.raises(ValueError, match=r"^data: column 'income' of .* holds numbers written as text \('30,6'\); "
                                         r"allowed: plain numbers .* --drop-columns income$"):
        TableDataModule(tmp_path / "comma.csv", target="approved")
    assert TableDataModule(tmp_path / "comma.csv", target="approved", drop_columns=["income"]).codec
    declared = TableDataModule(tmp_path / "comma.csv", target="approved",
                               spec={"columns": {"income": {"kind": "categorical"}}})
    assert next(c for c in declared.codec.columns if c.name == "income").kind == "categorical"


def test_a_column_of_numbers_with_a_stray_word_is_refused_not_read_as_categories(tmp_path, loans):
    """An age written 'forty' once trained age as a categorical column of 44 unrelated levels, in silence; a salary
    '85k' among '$85,000' was refused as '133 categories' with the advice to declare it continuous."""
    stray = loans.astype({"age": object, "income": object})
    stray["income"] = [f"${v:,}" for v in loans.income]
    stray.loc[7, "age"] = "forty"
    stray.loc[3, "income"] = "85k"
    stray.to_csv(tmp_path / "stray.csv", index=False)
    with pytest.raises(ValueError) as refused:
        TableDataModule(tmp_path / "stray.csv", target="approved")
    assert "column 'age' of " in str(refused.value) and "holds numbers but for 1 value(s): 'forty'; allowed: a " \
        "number in every row" in str(refused.value)
    assert "column 'income' of " in str(refused.value) and "holds numbers but for 1 value(s): '85k'" in \
        str(refused.value)
    coded = loans.astype({"age": object})
    coded.loc[:1, "age"] = ["A", "B"]  # 2 of 120 rows: codes of categories, declared so
    coded.to_csv(tmp_path / "coded.csv", index=False)
    declared = TableDataModule(tmp_path / "coded.csv", target="approved",
                               spec={"columns": {"age": {"kind": "categorical"}}})
    assert next(c for c in declared.codec.columns if c.name == "age").kind == "categorical"


def test_dates_are_refused_unless_left_out(tmp_path, loans):
    dated = loans.assign(applied=[f"2021-{1 + i % 12:02d}-01" for i in range(len(loans))])
    dated.to_csv(tmp_path / "dated.csv", index=False)
    with pytest.raises(ValueError, match=r"^data: column 'applied' of .* holds dates \('2021-01-01'\); .*"
                                         r"--drop-columns applied"):
        TableDataModule(tmp_path / "dated.csv", target="approved")
    assert "applied" not in TableDataModule(tmp_path / "dated.csv", target="approved",
                                            drop_columns=["applied"]).codec.feature_names
    stored = loans.assign(applied=pd.to_datetime(dated["applied"]))  # a database's Parquet export: a date dtype
    stored.to_parquet(tmp_path / "dated.parquet", index=False)
    with pytest.raises(ValueError, match=r"^data: column 'applied' of .* holds dates \('2021-01-01'\); "):
        TableDataModule(tmp_path / "dated.parquet", target="approved")  # was '2021-01-01 00:00:00'


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


def test_words_for_missing_values_are_missing_in_numbers_and_categories_in_text(tmp_path, loans):
    """``NA`` is North America in a region column and a gap in an income column (R and databases write it so); pandas
    reads both as missing, which refused (or with --impute median overwrote) a third of the regions. ``None``,
    ``NULL`` and ``nan`` alike; a note says which way each column was read."""
    regions = ["NA" if i % 3 == 0 else "EU" if i % 3 == 1 else "APAC" for i in range(len(loans))]
    incomes = ["NULL" if i % 10 == 0 else str(v) for i, v in enumerate(loans.income)]
    path = tmp_path / "regions.csv"
    loans.assign(region=regions, income=incomes, collateral=["None", "car"] * (len(loans) // 2)).to_csv(path, index=False)
    data = TableDataModule(path, target="approved", impute="median")
    kinds = {c.name: (c.kind, c.categories) for c in data.codec.columns}
    assert kinds["region"] == ("categorical", ["APAC", "EU", "NA"]) and kinds["collateral"] == ("binary", ["None", "car"])
    assert kinds["income"][0] == "integer"
    text = data.describe()
    assert "note: income: 'NULL' read as a missing value in 12 row(s)" in text
    assert "note: region: 'NA' kept as a category in 40 row(s) (the column holds text)" in text
    assert "note: income: missing in 12 row(s), filled with" in text and "(--impute median)" in text
    loans.assign(region=regions).to_csv(tmp_path / "semicolons.csv", sep=";", index=False)  # the other reading path
    assert TableDataModule(tmp_path / "semicolons.csv", target="approved").frame.region.tolist() == regions


def test_words_for_missing_values_are_missing_in_money_too_in_training_and_in_rows_to_explain(tmp_path, loans):
    """A bank's export wrote revenue as ``$734,300`` and a gap as ``NA`` or ``n/a``: training refused the column as
    'numbers but for 2 value(s): 'NA', 'n/a'' (a plain number column read them as gaps), and rows to explain with
    such a cell ended in pandas' own words (``error: Unable to parse string 'NA' at position 40``), or refused
    ``"income": "NA"`` in ``--row``, where the training file read it as a gap."""
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, read_rows

    money = [f"${v:,}" for v in loans.income]
    money[3], money[7] = "NA", "n/a"
    ratios = [f"{v}" for v in loans.debt_ratio]
    ratios[5] = "NA"
    path = tmp_path / "export.csv"
    loans.assign(income=money, debt_ratio=ratios).to_csv(path, index=False)
    data = TableDataModule(path, target="approved", impute="median")
    assert {c.name: c.kind for c in data.codec.columns}["income"] == "integer"
    text = data.describe()
    assert "note: income: 'NA', 'n/a' read as a missing value in 2 row(s)" in text
    assert "note: income: missing in 2 row(s), filled with" in text
    loaded = Explainable(None, data.codec, {}, None, True)
    # a free-text column left out: how its cells were read is not said (it said "'n/a' kept as a category")
    loans.assign(income=money, notes=["n/a", "repeat customer"] * (len(loans) // 2)).to_csv(path, index=False)
    assert "note: notes" in TableDataModule(path, target="approved", impute="median").describe()
    kept = TableDataModule(path, target="approved", impute="median", drop_columns=["notes"]).describe()
    assert "note: notes" not in kept and "note: income: 'NA', 'n/a' read as a missing value in 2 row(s)" in kept
    head = loans.iloc[data.rows["train"][:4]].drop(columns="approved").assign(income=["$31,000", "$32,500", "$40,000", "NA"],
                                                          debt_ratio=["NA", "n/a", "0.5", "0.4"])
    head.to_csv(tmp_path / "rows.csv", index=False)  # row 4 holds 'NA' in income, rows 1, 2 debt_ratio
    rows, notes, _ = check_rows(read_rows(str(tmp_path / "rows.csv")), loaded, "--rows")
    fills = {c.name: c.fill for c in data.codec.columns}
    assert rows.income.tolist() == [31000, 32500, 40000, fills["income"]]
    assert rows.debt_ratio.tolist() == [fills["debt_ratio"]] * 2 + [0.5, 0.4]
    assert "--rows: income: missing in 1 row(s), filled with" in " ".join(notes)
    row = head.iloc[0].to_dict() | {"income": "n/a", "debt_ratio": "NA"}
    rows, _, _ = check_rows(read_rows(row=pd.Series(row).to_json()), loaded, "--row")
    assert rows.iloc[0][["income", "debt_ratio"]].tolist() == [fills["income"], fills["debt_ratio"]]
    # a gap beside a word that is no number in one column: the word is refused by name, not by pandas' parser
    head.assign(income=["$31,000", "", "forty", "$32,000"]).to_csv(tmp_path / "typo.csv", index=False)
    with pytest.raises(InputError, match=r"^--rows: got 'income=forty' \(not a number in row 3\); allowed: a number "
                                         r"for income"):
        check_rows(read_rows(str(tmp_path / "typo.csv")), loaded, "--rows")


def test_true_and_false_keep_the_files_spelling_also_with_gaps_and_rows_may_spell_them_otherwise(tmp_path, loans):
    """A TRUE/FALSE column with gaps became the numbers 0.0/1.0 (pandas' booleans through to_numeric): explanations
    read ``member: 0 → 1`` and no row could say TRUE. Now its categories are the file's words, and a row to explain
    may write ``false``, ``False`` or JSON's ``false``."""
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, read_rows

    member = ["" if i % 15 == 0 else "TRUE" if i % 2 else "FALSE" for i in range(len(loans))]
    path = tmp_path / "members.csv"
    loans.assign(member=member).to_csv(path, index=False)
    data = TableDataModule(path, target="approved", impute="median")
    column = next(c for c in data.codec.columns if c.name == "member")
    assert (column.kind, column.categories) == ("binary", ["FALSE", "TRUE"])
    loaded = Explainable(None, data.codec, {}, None, True)
    typical = loans[loans.income < loans.income.median()].drop(columns="approved")  # inside the model's domain
    rows = typical.head(3).assign(member=[False, "true", "TRUE"])
    checked, notes, _ = check_rows(rows, loaded, "--rows")
    assert checked.member.tolist() == ["FALSE", "TRUE", "TRUE"]
    assert "--rows: member: read False as 'FALSE', 'true' as 'TRUE' (the model's spelling)" in notes
    row = typical.head(1).assign(member=False).to_json(orient="records")[1:-1]
    assert check_rows(read_rows(row=row), loaded, "--row")[0].member.tolist() == ["FALSE"]


def test_a_column_named_twice_and_rows_without_a_label_are_not_passed_over_in_silence(tmp_path, loans):
    from datamodules.table_format import TableError, read_table

    path = tmp_path / "twice.csv"
    path.write_text("age,income,income,approved\n30,100,200,yes\n40,300,400,no\n")
    with pytest.raises(TableError, match=r"^data: twice.csv names the column 'income' twice; allowed: a header row "
                                         r"with each column's name once"):
        read_table(path)
    labels = [None if i % 20 == 0 else a for i, a in enumerate(loans.approved)]
    text = TableDataModule(loans.assign(approved=labels), target="approved").describe()
    assert "note: 6 row(s) without a value in the target column 'approved' left out" in text
    gaps = loans.assign(purpose=[None if i % 30 == 0 else p for i, p in enumerate(loans.purpose)])
    assert "note: 4 row(s) with a missing value left out (--impute drop)" in \
        TableDataModule(gaps, target="approved", impute="drop").describe()


def test_an_identifier_is_named_also_with_gaps_and_after_balancing(loans):
    """An applicant number trains as a feature unless left out: the note named it only when its numbers ran on
    without a gap, so neither a register with removed rows nor ``--balance undersample`` (which keeps some rows)
    showed it."""
    numbered = loans.assign(applicant=[1000 + 3 * i // 2 for i in range(len(loans))])
    note = "note: 'applicant' holds a different whole number in every row, numbered like rows: an identifier?"
    assert note in TableDataModule(numbered, target="approved").describe()
    assert note in TableDataModule(numbered, target="approved", balance="undersample").describe()
    assert note not in TableDataModule(loans.assign(applicant=loans.income), target="approved").describe()


def test_every_problem_of_a_file_is_reported_at_once_each_with_its_fix(tmp_path, loans):
    """A messy export needed five runs of about 8 s each to find its five problems, one per run: gaps, a constant
    column, dates, 120 cities, then the next. One run now names them all, in one line."""
    messy = loans.assign(country="FR", applied=[f"2021-01-{1 + i % 28:02d}" for i in range(len(loans))],
                         city=[f"City_{i}" for i in range(len(loans))],
                         notes=[None if i % 3 else "called" for i in range(len(loans))])
    messy.to_csv(tmp_path / "messy.csv", index=False)
    with pytest.raises(ValueError) as caught:
        TableDataModule(tmp_path / "messy.csv", target="approved")
    message = str(caught.value)
    assert message.startswith(f"data: 4 problems in {tmp_path / 'messy.csv'}, each with its fix: (1) column 'notes' "
                              "has 80 missing value(s) (empty or '?')") and "\n" not in message
    for part in ("(2) column 'country' is constant", "(3) column 'applied' of", "holds dates ('2021-01-01')",
                 "(4) column 'city' has 120 categories; allowed: at most 100"):
        assert part in message, message
    fixed = TableDataModule(tmp_path / "messy.csv", target="approved", impute="median",
                            drop_columns=["country", "applied", "city"])
    assert "notes" in fixed.codec.feature_names or any(c.name == "notes" for c in fixed.codec.columns)
    with pytest.raises(ValueError, match=r"^data: columns 'country', 'region' are constant in .*; leave them out with "
                                         r"--drop-columns country,region$"):
        TableDataModule(loans.assign(country="FR", region="EU"), target="approved")


def test_reading_checking_and_encoding_a_table_does_no_python_work_per_cell(tmp_path):
    """A 200 000-row table with ten text columns took 58 s from its file to training (40 s of it converting every
    cell of its category columns in Python, to find out that 'L13' is no '$36,428.20'); each distinct value is
    judged once now, and categories are encoded by their distinct values. No Python function runs once per row."""
    rows = 3000
    frame = pd.DataFrame({"age": [18 + i % 60 for i in range(rows)], "grade": [f"L{i % 50:02d}" for i in range(rows)],
                          "income": [f"${1000 + 3 * (i % 7):,}" for i in range(rows)],
                          "home": ["rent" if i % 3 else "own" for i in range(rows)],
                          "y": ["yes" if i % 4 else "no" for i in range(rows)]})
    frame.to_csv(tmp_path / "wide.csv", index=False)
    profile = cProfile.Profile()
    data = profile.runcall(TableDataModule, tmp_path / "wide.csv", target="y")
    profile.runcall(data.setup, "fit")
    calls = {where: stat[1] for where, stat in pstats.Stats(profile).stats.items() if where[0] != "~"}  # not builtins
    busiest = max(calls, key=calls.get)
    assert calls[busiest] < rows, f"{busiest} ran {calls[busiest]} times for {rows} rows"
    assert data.frame.income.tolist() == [1000 + 3 * (i % 7) for i in range(rows)]
    grade = data.x_train[:, data.codec.feature_names.index("grade=L07")]
    assert grade.sum() == (data.frame.grade.iloc[data.rows["train"]] == "L07").sum()


def test_a_training_reads_its_file_once(tmp_path, loans):
    """Choosing a table's CT settings (from its training rows) and building its data module each read the file: a
    200 000-row CSV twice. The second reading reuses the first, as long as the file holds the same bytes."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.settings import resolve_config

    path = tmp_path / "loans.csv"
    loans.to_csv(path, index=False)
    profile = cProfile.Profile()
    data = profile.runcall(lambda: build_datamodule(resolve_config({"data": str(path), "target": "approved"})))
    reads = sum(stat[1] for where, stat in pstats.Stats(profile).stats.items()
                if where[0].endswith("table_format.py") and where[2] == "read_csv")
    assert reads == 1 and len(data.frame) == len(loans)
    loans.assign(income=loans.income + 1).to_csv(path, index=False)  # same path, new content: read again
    assert TableDataModule(path, target="approved").frame.income.tolist() == (loans.income + 1).tolist()


@pytest.mark.parametrize("suffix", [".tsv", ".txt"])
def test_a_tab_separated_tsv_or_txt_file_is_a_table(tmp_path, loans, suffix):
    """The reader finds tabs from the header line, but --data took only .csv and .parquet: 'loans.tsv' was refused as
    an unknown data set (rename it to .csv, the error did not say)."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.settings import resolve_config
    from ct_lightning.experiment.runs.lifecycle import data_label

    path = tmp_path / f"loans{suffix}"
    european(loans).to_csv(path, sep="\t", index=False)
    config = resolve_config({"data": str(path), "target": "approved"})
    data = build_datamodule(config)
    assert data.frame.debt_ratio.tolist() == loans.debt_ratio.tolist() and data_label(config["data"]) == "loans"
    assert f"note: loans{suffix}: columns separated by '\\t'" in data.describe()


@pytest.mark.parametrize("suffix", [".tsv", ".pq"])
def test_a_model_of_a_tsv_or_pq_table_is_registered_by_the_files_stem(tmp_path, loans, suffix):
    """Only .csv and .parquet lost their suffix in the registered model's name: loans.tsv registered
    'ct--tmp-...-loans.tsv-ct' (the whole path), where loans.csv registers 'ct-loans-ct'."""
    from ct_lightning.experiment.runs.train import train

    path = tmp_path / f"loans{suffix}"
    loans.to_parquet(path) if suffix == ".pq" else loans.to_csv(path, sep="\t", index=False)
    summary = train({"data": str(path), "target": "approved", "max_epochs": 1, "nce": 16, "progress": False,
                     "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "checkpoint_dir": str(tmp_path / "ct")})
    assert summary["models"]["registered"] == "ct-loans-ct"


def test_a_row_writing_thousands_with_points_for_a_decimal_point_model_gets_a_note(tmp_path, loans):
    """For a model trained on a file with decimal points, ``"income": "31.000"`` in a row to explain was read as 31
    without a word, inside the domain, where a German user means 31 000: the reading now comes with a note."""
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, read_rows

    loaded = Explainable(None, TableDataModule(loans, target="approved").codec, {}, None, True)
    row = {"age": 29, "income": "31.000", "debt": "2500", "years_employed": 2, "home_ownership": "rent",
           "purpose": "car", "sex": "female", "debt_ratio": 0.3}
    rows, notes, _ = check_rows(read_rows(row=json.dumps(row)), loaded, "--row")
    assert rows.iloc[0][["income", "debt"]].tolist() == [31, 2500]  # read as the training file writes numbers
    assert "--row: income: '31.000' read as 31 (a decimal point, as in the training file), not as 31000: write " \
           "31000 for that" in notes
    assert not [n for n in notes if n.startswith("--row: debt")]  # 2500 writes no thousands
    rows, notes, _ = check_rows(read_rows(row=json.dumps({**row, "income": 31000})), loaded, "--row")
    assert not [n for n in notes if "read as" in n]


def test_a_percent_keeps_the_space_the_file_writes_before_its_sign():
    from datamodules.table_format import unit_of

    assert unit_of(["49,1 %", "7,5\u00a0%"]) == "{} %" and unit_of(["7.5%", "12%"]) == "{}%"
    assert unit_of(["7.5%", "12 %"]) == "{}%"  # written both ways: the plain sign, not no unit
    assert unit_of(["7.5%", "$12"]) is None
