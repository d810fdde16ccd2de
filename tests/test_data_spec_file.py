"""``train.py --write-data-spec``: a data spec to start from, that trains exactly as the file does unedited."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from datamodules.codec import TabularCodec
from datamodules.table import TableDataModule
from recipes.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"


def write_spec(tmp_path, data, *extra) -> Path:
    spec = tmp_path / "spec.yaml"
    summary = train_main(["--data", str(data), "--target", "approved", "--write-data-spec", str(spec),
                          "--tracking-uri", f"sqlite:///{tmp_path}/store/mlflow.db", *extra])
    assert summary["data_spec"] == str(spec.resolve())
    return spec


def test_the_written_spec_trains_exactly_as_the_file_and_the_command_line_did(tmp_path, capsys):
    spec = write_spec(tmp_path, LOANS, "--immutable", "age,sex", "--mutability", "income=increase")
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(f"--data-spec {spec}"), printed  # the command that trains with it
    written = TableDataModule(LOANS, target="approved", spec=spec).codec.to_dict()
    given = TableDataModule(LOANS, target="approved", spec={"columns": {
        "age": {"mutability": "none"}, "sex": {"mutability": "none"}, "income": {"mutability": "increase"}}})
    assert written == given.codec.to_dict()
    assert not (tmp_path / "store").exists(), "nothing is trained or tracked"


def test_each_column_is_one_line_to_edit_with_its_values_beside_it(tmp_path):
    frame = pd.read_csv(LOANS)
    frame["grade"] = (frame["age"] % 4) + 1  # a code of categories, written as numbers
    frame.to_csv(tmp_path / "graded.csv", index=False)
    spec = write_spec(tmp_path, tmp_path / "graded.csv")
    lines = spec.read_text().splitlines()
    grade = next(line for line in lines if line.lstrip().startswith("grade:"))
    assert "{kind: integer, mutability: both}" in grade and "1 to 4 in the file, 4 different values" in grade
    assert "a code of categories? then kind: categorical" in grade
    purpose = next(line for line in lines if line.lstrip().startswith("purpose:"))
    categories = sorted(frame["purpose"].unique())
    assert "{kind: categorical" in purpose and all(c in purpose for c in categories[:6])
    assert yaml.safe_load(spec.read_text())["positive"] == "yes"
    spec.write_text(spec.read_text().replace(grade, grade.replace("kind: integer", "kind: categorical")))
    edited = TableDataModule(tmp_path / "graded.csv", target="approved", spec=spec).codec
    assert next(c for c in edited.columns if c.name == "grade").categories == [1, 2, 3, 4]


def test_column_names_and_labels_that_yaml_would_misread_are_quoted(tmp_path):
    frame = pd.read_csv(LOANS).rename(columns={"debt": "Unnamed: 0", "income": "yes", "sex": "# sex"})
    frame["approved"] = frame["approved"].map({"yes": "007", "no": "no"})
    frame.to_csv(tmp_path / "odd.csv", index=False)
    spec = write_spec(tmp_path, tmp_path / "odd.csv")
    written = TableDataModule(tmp_path / "odd.csv", target="approved", spec=spec).codec.to_dict()
    assert written == TableDataModule(tmp_path / "odd.csv", target="approved").codec.to_dict()
    assert set(yaml.safe_load(spec.read_text())["columns"]) == {c for c in frame.columns if c != "approved"}


@pytest.mark.parametrize("arguments, named", [
    (["--data", "moons"], "--write-data-spec"),
    (["--data", str(LOANS), "--target", "approved", "--immutable", "nope"], "--immutable"),
    (["--data", str(LOANS), "--target", "approved", "--mutability", "purpose=increase"], "--mutability"),
])
def test_a_spec_that_cannot_be_written_is_refused_in_one_line(tmp_path, capsys, arguments, named):
    spec = tmp_path / "spec.yaml"
    with pytest.raises(SystemExit) as stop:
        train_main([*arguments, "--write-data-spec", str(spec), "--tracking-uri", f"sqlite:///{tmp_path}/s/mlflow.db"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error:") and named in error[0], error
    assert not spec.exists()


@pytest.mark.parametrize("option, value, said", [
    ("--immutable", "AGE", "got 'AGE' (unknown feature; did you mean 'age'?"), ("--mutability", "nope=none", "'nope'"),
    ("--mutability", "purpose=increase", "allowed for a categorical feature: both, none"),
])
def test_training_and_the_spec_writer_refuse_a_bad_column_with_the_same_line(tmp_path, capsys, option, value, said):
    """One check of --immutable/--mutability (configuration.data.command_line_mutability) behind both commands."""
    errors = []
    for extra in (["--write-data-spec", str(tmp_path / "spec.yaml")], ["--max-epochs", "1"]):
        with pytest.raises(SystemExit) as stop:
            train_main(["--data", str(LOANS), "--target", "approved", option, value, *extra,
                        "--tracking-uri", f"sqlite:///{tmp_path}/s/mlflow.db", "--checkpoint-dir", str(tmp_path / "c")])
        assert stop.value.code == 2
        errors.append(capsys.readouterr().err.strip().splitlines())
    assert errors[0] == errors[1], errors
    assert len(errors[0]) == 1 and errors[0][0].startswith(f"error: {option}: ") and said in errors[0][0], errors


def test_an_existing_file_is_never_overwritten(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  age: {mutability: none}  # my edits\n")
    with pytest.raises(SystemExit):
        train_main(["--data", str(LOANS), "--target", "approved", "--write-data-spec", str(spec)])
    error = capsys.readouterr().err
    assert "--write-data-spec" in error and "the file exists" in error
    assert spec.read_text().endswith("# my edits\n")


def test_the_table_may_come_from_a_config_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data": str(LOANS), "target": "approved", "immutable": ["sex"]}))
    spec = tmp_path / "spec.yaml"
    train_main(["--config", str(config), "--write-data-spec", str(spec)])
    assert yaml.safe_load(spec.read_text())["columns"]["sex"] == {"kind": "binary", "mutability": "none"}


# --- a spec that cannot mean what it says is refused in one line, never ignored ---------------------------------

def fit_loans(spec):
    from datamodules.codec import TabularCodec

    return TabularCodec.fit(pd.read_csv(LOANS), "approved", spec)


def test_a_spec_that_is_not_yaml_is_refused_with_the_parsers_line(tmp_path):
    from datamodules.codec import read_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text("columns: [\n")
    with pytest.raises(ValueError) as error:
        read_spec(spec)
    assert str(error.value) == (f"data_spec: got {str(spec)!r} (not valid YAML: line 2, column 1: expected the node "
                                "content, but found '<stream end>'); allowed: a YAML or JSON file with columns: "
                                "{name: {kind, mutability, lower, upper, step, max_change, order, label, unit, values}} and positive")


def test_a_misspelt_key_of_a_column_is_refused_not_ignored():
    with pytest.raises(ValueError) as error:
        fit_loans({"columns": {"age": {"mutabilty": "none"}}})
    assert str(error.value) == ("data_spec: column 'age': unknown key 'mutabilty' (did you mean 'mutability'?); "
                                "allowed: kind, mutability, lower, upper, step, max_change, order, label, unit, values")


def test_a_misspelt_top_level_key_is_refused_not_ignored():
    with pytest.raises(ValueError) as error:
        fit_loans({"column": {"age": {"mutability": "none"}}})
    assert str(error.value) == ("data_spec: unknown key 'column' (did you mean 'columns'?); allowed: columns, "
                                "positive, target")


BOUND = ("a number, or other number columns (continuous or integer) each times a number, joined by + and -, plus a "
         "number, such as upper: age - 16 or upper: 10 * income")


@pytest.mark.parametrize("bounds, said", [
    ({"lower": 80, "upper": 18}, "column 'age': lower 80 is above upper 18; allowed: lower at most upper"),
    ({"lower": "18"}, "column 'age': lower '18' reads no column; allowed: a number without quotes (lower: 18), or "
                      "other number columns (continuous or integer) each times a number, joined by + and -, plus a "
                      "number, such as upper: age - 16 or upper: 10 * income"),
    ({"upper": True}, f"column 'age': upper True; allowed: {BOUND}"),
    ({"lower": float("nan")}, f"column 'age': lower nan; allowed: {BOUND}"),
])
def test_bounds_that_cross_or_are_no_numbers_are_refused(bounds, said):
    with pytest.raises(ValueError) as error:
        fit_loans({"columns": {"age": bounds}})
    assert str(error.value) == f"data_spec: {said}"


@pytest.mark.parametrize("columns, said", [
    ({"age": "integer"}, "column 'age': got 'integer'; allowed: a mapping of kind, mutability, lower, upper, step, max_change, order, label, unit, values such as "
                         "age: {kind: integer}"),
    ({"age": "none"}, "column 'age': got 'none'; allowed: a mapping of kind, mutability, lower, upper, step, max_change, order, label, unit, values such as "
                      "age: {mutability: none}"),
    (["age"], "columns: got a list; allowed: a mapping of column names to {kind, mutability, lower, upper, step, max_change, order, label, unit, values}"),
])
def test_a_column_entry_that_is_not_a_mapping_is_refused(tmp_path, columns, said):
    from datamodules.table import TableDataModule

    with pytest.raises(ValueError) as error:  # the data module reads the spec before the codec does
        TableDataModule(LOANS, target="approved", spec={"columns": columns})
    assert str(error.value) == f"data_spec: {said}"


@pytest.mark.parametrize("spec, said", [
    ({"columns": {"purpose": {"lower": 0}}}, "column 'purpose': lower 0 has no meaning for a categorical column; "
                                             "allowed: kind, mutability, label, values"),
    ({"target": "income"}, "target 'income' is not the column to predict ('approved'); allowed: approved, or no "
                           "target in the data spec"),
    # an entry for the target among the columns was ignored: its class words (values) silently lost
    ({"columns": {"approved": {"values": {"yes": "approved", "no": "declined"}}}},
     "columns: got an entry for 'approved', the target (the column to predict); allowed: entries for the features "
     "(age, income, debt, years_employed, home_ownership, purpose, sex); the classes in words go in target: "
     "{name: approved, values: {CLASS: words}}, the positive class of two in positive:"),
])
def test_keys_that_would_do_nothing_are_refused(spec, said):
    with pytest.raises(ValueError) as error:
        fit_loans(spec)
    assert str(error.value) == f"data_spec: {said}"


def test_every_key_the_writer_writes_is_read_back(tmp_path):
    given = tmp_path / "given.yaml"
    given.write_text("target: approved\npositive: 'no'\ncolumns:\n  age: {mutability: none, lower: 18, upper: 90}\n"
                     "  income: {lower: 0, step: 1000}\n  debt:\n")
    spec = write_spec(tmp_path, LOANS, "--data-spec", str(given))
    assert yaml.safe_load(spec.read_text())["columns"]["age"] == {"kind": "integer", "mutability": "none", "lower": 18,
                                                                  "upper": 90}
    assert yaml.safe_load(spec.read_text())["columns"]["income"] == {"kind": "integer", "mutability": "both", "lower": 0,
                                                                     "step": 1000}
    written = TableDataModule(LOANS, target="approved", spec=spec).codec.to_dict()
    assert written == TableDataModule(LOANS, target="approved", spec=given).codec.to_dict()


@pytest.mark.parametrize("text, said", [
    ("columns: [\n", "(not valid YAML: line 2, column 1: expected the node content, but found '<stream end>'); "
                     "allowed: a YAML or JSON file with columns: {name: {kind, mutability, lower, upper, step, max_change, order, label, unit, values}} and "
                     "positive"),
    ("columns:\n  age: {mutabilty: none}\n", "column 'age': unknown key 'mutabilty' (did you mean 'mutability'?); "
                                             "allowed: kind, mutability, lower, upper, step, max_change, order, label, unit, values"),
    # the table given for the spec (--data-spec loans.csv): YAML reads its lines as one text, once "a str"
    ("age,income\n68,30600\n", "(plain text, as a table's lines read, not keys such as columns:); allowed: a YAML or "
                               "JSON file with columns: {name: {kind, mutability, lower, upper, step, max_change, "
                               "order, label, unit, values}} and positive"),
    ("- age\n- income\n", "(a list, not keys such as columns:); allowed: a YAML or JSON file with columns: {name: "
                          "{kind, mutability, lower, upper, step, max_change, order, label, unit, values}} and positive"),
    # "may age change? no": YAML's false, once refused as "mutability False" without a word of why
    ("columns:\n  age: {mutability: no}\n", "column 'age': mutability False (YAML reads an unquoted no, off or false as "
                                             "false, and yes, on or true as true: write none for a column that may not "
                                             "change, both for one that may); allowed: both, increase, decrease, none"),
    ("columns:\n  income: {mutability: increse}\n", "column 'income': mutability 'increse' (did you mean 'increase'?); "
                                                     "allowed: both, increase, decrease, none"),
])
def test_the_command_line_says_what_is_wrong_with_the_spec_in_one_line(tmp_path, capsys, text, said):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    with pytest.raises(SystemExit) as stop:
        train_main(["--data", str(LOANS), "--target", "approved", "--data-spec", str(spec), "--max-epochs", "1",
                    "--tracking-uri", f"sqlite:///{tmp_path}/store/mlflow.db",
                    "--checkpoint-dir", str(tmp_path / "c")])
    assert stop.value.code == 2
    printed = capsys.readouterr()
    error = printed.err.strip().splitlines()
    assert "Traceback" not in printed.out + printed.err
    start = f"error: --data-spec: got {str(spec)!r} " if said.startswith("(") else "error: --data-spec: "
    assert error == [start + said], error
    assert not (tmp_path / "store").exists() and not (tmp_path / "c").exists()


def test_an_unquoted_yes_as_the_positive_class_says_to_quote_it(tmp_path):
    """``positive: Yes`` is YAML's true: the class 'Yes' of a Yes/No target was refused as ``positive: got True``,
    with neither the option nor the fix."""
    frame = pd.DataFrame({"x": np.arange(40.0), "y": ["Yes", "No"] * 20})
    spec = tmp_path / "spec.yaml"
    spec.write_text("positive: Yes\n")
    with pytest.raises(ValueError, match=r"^data_spec: positive: got True \(YAML reads an unquoted Yes, No, On or Off "
                                         r"as true or false: quote it, positive: 'Yes'\); allowed: No, Yes$"):
        TabularCodec.fit(frame, "y", spec)
    spec.write_text("positive: 'Yes'\n")
    assert TabularCodec.fit(frame, "y", spec).positive == "Yes"


def test_a_column_written_twice_in_the_spec_is_refused_not_last_one_wins(tmp_path):
    # PyYAML keeps the last of two equal keys silently: the first entry's immutability would be lost
    from datamodules.codec import read_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  age: {mutability: none}\n  income: {lower: 0}\n  age: {kind: integer}\n")
    with pytest.raises(ValueError) as error:
        read_spec(spec)
    assert str(error.value).startswith(f"data_spec: got {str(spec)!r} (not valid YAML: line 4, column 3: found "
                                       "'age' twice (a key may be written once)); allowed: ")


def test_a_written_spec_trains_with_the_identifier_it_names_left_out(tmp_path, capsys):
    """--write-data-spec lists an identifier with the hint 'leave it out with --drop-columns'; doing so with that spec
    was refused: '--data-spec: unknown column 'applicant_id''. A spec's line for a dropped column is no feature. The
    console names the identifier too, as training's start-up does (it named it only in the file, and its command to
    train with went on without --drop-columns)."""
    frame = pd.read_csv(LOANS)
    frame.insert(0, "applicant_id", np.arange(1000, 1000 + len(frame)))
    frame.to_csv(tmp_path / "ided.csv", index=False)
    spec = write_spec(tmp_path, tmp_path / "ided.csv")
    assert "note: 'applicant_id' holds a different whole number in every row, numbered like rows: an identifier? " \
           "it trains as a feature; leave it out with --drop-columns applicant_id" in capsys.readouterr().out
    assert "--drop-columns" in next(line for line in spec.read_text().splitlines() if "applicant_id:" in line)
    dropped = TableDataModule(tmp_path / "ided.csv", target="approved", spec=spec, drop_columns=["applicant_id"])
    assert dropped.codec.to_dict() == TableDataModule(LOANS, target="approved").codec.to_dict() | {
        "dropped": ["applicant_id"]}


def test_a_file_with_gaps_gets_its_spec_and_a_command_that_trains(tmp_path, capsys):
    """--write-data-spec refused a file with gaps until --impute was given, though the kinds it writes do not depend
    on it; it writes the spec as --impute median reads the file, says which columns have gaps, and its command adds
    --impute median. A file without gaps gets no --impute."""
    frame = pd.read_csv(LOANS)
    frame.loc[[3, 9], "income"] = np.nan
    frame.loc[5, "purpose"] = None
    frame.to_csv(tmp_path / "gaps.csv", index=False)
    spec = write_spec(tmp_path, tmp_path / "gaps.csv")
    printed = capsys.readouterr().out
    assert "note: income, purpose: missing values; the command below adds --impute median" in printed, printed
    assert printed.rstrip().endswith(f"--data-spec {spec} --impute median"), printed
    written = TableDataModule(tmp_path / "gaps.csv", target="approved", spec=spec, impute="median").codec.to_dict()
    assert written == TableDataModule(tmp_path / "gaps.csv", target="approved", impute="median").codec.to_dict()
    assert yaml.safe_load(spec.read_text())["columns"]["income"]["kind"] == "integer"  # whole, though read as floats
    (tmp_path / "spec.yaml").unlink()
    write_spec(tmp_path, LOANS)
    assert "--impute" not in capsys.readouterr().out


def test_a_misspelt_column_of_a_data_spec_names_the_column_it_probably_means(tmp_path):
    """A data spec's ``loan_amnt:`` was refused as "unknown column 'loan_amnt'; columns: ..." with no hint, where its
    keys (``stepp``) get one."""
    with pytest.raises(ValueError, match=r"^data_spec: unknown column 'incme' \(did you mean 'income'\?\); columns: "):
        TableDataModule(LOANS, target="approved", spec={"columns": {"incme": {"step": 1000}}})
