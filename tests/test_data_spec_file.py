"""``train.py --write-data-spec``: a data spec to start from, that trains exactly as the file does unedited."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

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
    ("--immutable", "AGE", "unknown feature 'AGE' (did you mean 'age'?"), ("--mutability", "nope=none", "'nope'"),
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
