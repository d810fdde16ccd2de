"""A data spec's words for people (``label``, ``unit``, ``values``; ``target: {values: ...}``): checked before any
work, kept with the model, written back, shown by train.py, explain.py (console, --json, --csv, the served model)
and in letters to applicants (``explain.py --letters DIR``).

Found as a credit officer: on the Taiwan credit-card table an applicant was told ``pay_0: 2 → 0``, which means
"repayment status last month: two months late → paid on time", and the spec had no way to say so."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from datamodules.codec import ColumnSpec, TabularCodec
from recipes.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
CREDIT = ROOT / "tests" / "fixtures" / "raw" / "credit" / "UCI_Credit_Card.csv"
TARGET = "default.payment.next.month"
PAY_ORDER = list(range(-2, 9))
SPEC = {"target": {"name": TARGET, "values": {0: "no default", 1: "default"}}, "columns": {
    "PAY_0": {"kind": "ordinal", "order": PAY_ORDER, "label": "Repayment status, September",
              "values": {-1: "paid on time", 1: "one month late", 2: "two months late"}},
    "LIMIT_BAL": {"label": "Credit limit", "unit": "NT$"},
    "SEX": {"kind": "categorical", "mutability": "none", "label": "Sex", "values": {1: "male", 2: "female"}},
    "AGE": {"mutability": "none", "label": "Age", "unit": "years"},
    "EDUCATION": {"label": "Education", "values": {1: "graduate school", 2: "university", 3: "high school"}},
    **{f"BILL_AMT{i}": {"label": f"Bill, month {i}", "unit": "NT$"} for i in range(1, 7)},
    **{f"PAY_AMT{i}": {"label": f"Amount paid, month {i}", "unit": "NT$"} for i in range(1, 7)}}}


def credit_frame() -> pd.DataFrame:
    return pd.read_csv(CREDIT).drop(columns="ID")


def write(tmp_path, spec, name="spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))
    return path


# --- the spec ---------------------------------------------------------------------------------------------------

def test_words_of_columns_and_classes_are_kept_with_the_models_preprocessing():
    codec = TabularCodec.fit(credit_frame(), TARGET, SPEC)
    pay = next(c for c in codec.columns if c.name == "PAY_0")
    assert pay.label == "Repayment status, September" and pay.unit_label is None
    assert pay.value_labels == [[-1, "paid on time"], [1, "one month late"], [2, "two months late"]]
    assert pay.value_label(2) == "two months late" and pay.value_label(0) is None
    limit = next(c for c in codec.columns if c.name == "LIMIT_BAL")
    assert (limit.label, limit.unit_label, limit.heading()) == ("Credit limit", "NT$", "Credit limit (NT$)")
    assert codec.class_labels == [[0, "no default"], [1, "default"]] and codec.class_label(1) == "default"
    payload = json.loads(json.dumps(codec.to_dict()))  # preprocessing.json and the checkpoint keep it as JSON
    assert TabularCodec.from_dict(payload) == codec
    assert TabularCodec.from_dict(payload).columns[codec.columns.index(pay)].value_label(-1) == "paid on time"
    # the file's codes stay the model's: the encoding is the same as without words
    plain = TabularCodec.fit(credit_frame(), TARGET, {"columns": {"PAY_0": {"kind": "ordinal", "order": PAY_ORDER},
                                                                  "SEX": {"kind": "categorical", "mutability": "none"},
                                                                  "AGE": {"mutability": "none"}}})
    rows = credit_frame().drop(columns=TARGET).head(20)
    assert np.array_equal(codec.encode(rows), plain.encode(rows))


def test_a_model_saved_before_words_existed_loads_unchanged():
    codec = TabularCodec.fit(credit_frame(), TARGET, {"columns": {"SEX": {"kind": "categorical"}}})
    old = codec.to_dict()
    assert "class_labels" not in old
    assert not any({"label", "unit_label", "value_labels"} & set(c) for c in old["columns"])
    again = TabularCodec.from_dict(old)
    assert again.to_dict() == old and again.class_labels is None and again.class_label(1) is None
    # a served predictor pickles the columns themselves: one pickled before the fields existed lacks them
    column = ColumnSpec.__new__(ColumnSpec)
    column.__dict__.update({key: value for key, value in vars(codec.columns[1]).items()
                            if key not in ("label", "unit_label", "value_labels")})
    restored = pickle.loads(pickle.dumps(column))
    assert restored.label is None and restored.heading() == "SEX" and restored.value_label(1) is None


@pytest.mark.parametrize("columns, said", [
    ({"PAY_0": {"lable": "Repayment status"}}, "column 'PAY_0': unknown key 'lable' (did you mean 'label'?); allowed: "
     "kind, mutability, lower, upper, step, max_change, order, label, unit, values"),
    ({"LIMIT_BAL": {"units": "NT$"}}, "column 'LIMIT_BAL': unknown key 'units' (did you mean 'unit'?); allowed: kind, "
     "mutability, lower, upper, step, max_change, order, label, unit, values"),
    ({"AGE": {"label": 3}}, "column 'AGE': label 3 (a number, not text: quote it); allowed: one line of text of at "
     "most 200 characters, such as label: Credit limit"),
    ({"AGE": {"unit": ""}}, "column 'AGE': unit '' (empty); allowed: one line of text of at most 200 characters, such "
     "as unit: NT$ (or years, months, %)"),
    ({"SEX": {"kind": "categorical", "values": ["male", "female"]}}, "column 'SEX': values ['male', 'female']; "
     "allowed: a mapping of the column's values to what they mean, such as values: {-1: paid on time, 1: one month "
     "late}"),
    ({"SEX": {"kind": "categorical", "values": {1: None}}}, "column 'SEX': values: 1: None (a NoneType, not text); "
     "allowed: one line of text of at most 200 characters saying what 1 means"),
    ({"SEX": {"kind": "categorical", "values": {1: "male", 3: "other"}}}, "column 'SEX': values: 3 is not a value of "
     "the column in the file; allowed: 1, 2"),
    ({"SEX": {"kind": "categorical", "unit": "people"}}, "column 'SEX': unit 'people' has no meaning for a categorical "
     "column (its values are categories: say what they mean with values:); allowed: unit on a continuous or integer "
     "column"),
    ({"PAY_0": {"kind": "ordinal", "order": PAY_ORDER, "values": {9: "nine months late"}}}, "column 'PAY_0': values: "
     "9 is not in its order; allowed: -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8"),
    ({"EDUCATION": {"values": {1.5: "some college"}}}, "column 'EDUCATION': values: 1.5 is no whole number; allowed: "
     "whole numbers, the codes of an integer column (or declare its kind categorical or ordinal)"),
    ({"EDUCATION": {"values": {1: "graduate school", "1": "again"}}}, "column 'EDUCATION': values: 1 is named twice; "
     "allowed: each value once"),
    ({"LIMIT_BAL": {"kind": "continuous", "values": {20000: "low"}}}, "column 'LIMIT_BAL': values has no meaning for "
     "a continuous column (its numbers are amounts, not codes); allowed: values on a categorical, binary, ordinal or "
     "integer column (a code of categories: declare its kind)"),
])
def test_words_that_cannot_mean_anything_are_refused_in_one_line_before_any_work(tmp_path, capsys, columns, said):
    spec = write(tmp_path, {"columns": columns})
    with pytest.raises(SystemExit) as stop:
        train_main(["--data", str(CREDIT), "--target", TARGET, "--drop-columns", "ID", "--data-spec", str(spec),
                    "--max-epochs", "1", "--tracking-uri", f"sqlite:///{tmp_path}/store/mlflow.db",
                    "--checkpoint-dir", str(tmp_path / "c")])
    assert stop.value.code == 2
    printed = capsys.readouterr()
    assert printed.err.strip().splitlines() == [f"error: --data-spec: {said}"], printed.err
    assert "Traceback" not in printed.out + printed.err
    assert not (tmp_path / "store").exists() and not (tmp_path / "c").exists()


def test_words_of_a_text_category_or_a_class_name_the_one_they_probably_mean():
    loans = pd.read_csv(ROOT / "tests" / "fixtures" / "loans.csv")
    with pytest.raises(ValueError) as error:
        TabularCodec.fit(loans, "approved", {"columns": {"purpose": {"values": {"educaton": "studies"}}}})
    assert str(error.value) == ("data_spec: column 'purpose': values: 'educaton' is not a value of the column in the "
                                "file (did you mean 'education'?); allowed: car, debt_consolidation, education, "
                                "home_improvement, small_business")
    with pytest.raises(ValueError) as error:
        TabularCodec.fit(loans, "approved", {"target": {"name": "approved", "values": {"yess": "approved"}}})
    assert str(error.value) == ("data_spec: target: values: 'yess' is not a class of 'approved' (did you mean "
                                "'yes'?); allowed: no, yes")
    with pytest.raises(ValueError) as error:  # YAML's reading of an unquoted Yes
        TabularCodec.fit(loans, "approved", {"target": {"name": "approved", "values": {True: "approved"}}})
    assert "(YAML reads an unquoted Yes, No, On or Off as true or false: quote it)" in str(error.value)
    # a JSON spec's keys are text: "-1" names the code -1
    codec = TabularCodec.fit(credit_frame(), TARGET, {"columns": {"PAY_2": {"values": {"-1": "paid on time"}}}})
    assert next(c for c in codec.columns if c.name == "PAY_2").value_labels == [[-1, "paid on time"]]


def test_the_written_spec_keeps_the_words_and_trains_the_same(tmp_path, capsys):
    given = write(tmp_path, SPEC, "given.yaml")
    written = tmp_path / "written.yaml"
    train_main(["--data", str(CREDIT), "--target", TARGET, "--drop-columns", "ID", "--data-spec", str(given),
                "--write-data-spec", str(written)])
    text = written.read_text()
    assert "PAY_0: {kind: ordinal, mutability: both, order: [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8], label: 'Repayment " \
           "status, September', values: {-1: paid on time, 1: one month late, 2: two months late}}" in text
    assert "LIMIT_BAL: {kind: integer, mutability: both, label: Credit limit, unit: NT$}" in text
    assert "target: {name: default.payment.next.month, values: {0: no default, 1: default}}" in text
    frame = credit_frame()
    assert TabularCodec.fit(frame, TARGET, written).to_dict() == TabularCodec.fit(frame, TARGET, given).to_dict()


# --- explanations in words ------------------------------------------------------------------------------------

def test_an_explanation_says_its_changes_in_words_beside_the_raw_codes():
    """A real explanation on a preprocessing fitted with words, by a model that reads the repayment status only."""
    from ct_lightning.evaluation.explanation import describe, explain, to_records
    from ct_lightning.experiment.runs.explanations import flat_table
    from ct_lightning.models import build_mlp

    frame = credit_frame()
    codec = TabularCodec.fit(frame, TARGET, SPEC)
    rows = frame.drop(columns=TARGET).iloc[[0]]  # PAY_0 2: two months late
    assert rows["PAY_0"].iloc[0] == 2
    model = build_mlp(len(codec.feature_names), 2, [])
    pay = codec.feature_names.index("PAY_0")
    with torch.no_grad():  # default (class 1) rises with the repayment status, nothing else counts
        model[0].weight.zero_()
        model[0].bias.zero_()
        model[0].weight[1, pay], model[0].weight[0, pay] = 3.0, -3.0
    explained = explain(model, rows, target="No Default", codec=codec, tau=0.9, max_steps=500)  # the class's words
    record = to_records(explained)[0]
    change = next(c for c in record["changes"] if c["feature"] == "PAY_0")
    assert (change["from"], change["label"], change["from_label"]) == (2, "Repayment status, September",
                                                                       "two months late")
    assert record["prediction"] == 1 and record["prediction_label"] == "default"
    assert record["target_label"] == "no default" and record["immutable_labels"] == ["Sex", "Age (years)"]
    text = describe(explained)
    assert "row 0: predicted default [1] (probability " in text and "to get no default [0] (probability " in text
    before, after = change.get("from_label"), change.get("to_label", str(change["to"]))
    assert f"    Repayment status, September: {before} → {after} [PAY_0: 2 → {change['to']}]" in text
    assert "(not allowed to change: Sex, Age (years))" in text
    table = flat_table([{"row": 0, "explained": True, **record}])
    assert table.at[0, "changes"].startswith("PAY_0: 2 → ") and table.at[0, "prediction"] == 1
    assert table.at[0, "changes_in_words"].startswith("Repayment status, September: two months late → ")
    assert list(table.columns[:5]) == ["row", "explained", "prediction", "prediction_label", "prediction_probability"]
    with pytest.raises(ValueError) as refused:
        explain(model, rows, target="no defualt", codec=codec)
    assert str(refused.value) == ("target: got 'no defualt'; allowed: no default [0], default [1] (the words, or the "
                                  "class in brackets)")


def test_the_served_model_gives_the_words_beside_the_codes():
    from ct_lightning.experiment.runs.served_model import RawRowsClassifier, input_columns
    from ct_lightning.models import build_mlp

    codec = TabularCodec.fit(credit_frame(), TARGET, SPEC)
    torch.manual_seed(0)
    served = RawRowsClassifier(build_mlp(len(codec.feature_names), 2, [8]), codec, {"max_steps": 50})
    rows = credit_frame().drop(columns=TARGET).head(3)
    answer = served.predict(None, rows, {"explain": True})
    assert answer["prediction_label"].tolist() == [codec.class_label(c) for c in answer["prediction"]]
    assert answer["target_label"].tolist() == [codec.class_label(c) for c in answer["target"]]
    worded = [c for changes in answer["changes"] for c in changes if c["feature"] == "LIMIT_BAL"]
    assert all(c["label"] == "Credit limit" and c["unit_label"] == "NT$" for c in worded)
    pay = next(c for c in input_columns(codec) if c["name"] == "PAY_0")
    assert pay["label"] == "Repayment status, September" and pay["values"][0] == {"value": -1, "label": "paid on time"}


def test_the_served_models_target_takes_a_class_by_its_words_as_explain_does():
    """``explain.py --target 'no default'`` takes the class's words; the served model's ``target`` param refused them
    (``params: target 'no default'; allowed: 0, 1``), and its refusal named the classes by their codes only."""
    from ct_lightning.experiment.runs.request_checks import check_params
    from ct_lightning.experiment.runs.served_model import RawRowsClassifier
    from ct_lightning.models import build_mlp

    codec = TabularCodec.fit(credit_frame(), TARGET, SPEC)
    check_params(codec, {"explain": True, "target": "No Default"})
    with pytest.raises(ValueError) as refused:
        check_params(codec, {"explain": True, "target": "maybe"})
    assert str(refused.value) == ("params: target 'maybe'; allowed: no default [0], default [1] (the words, or the "
                                  "class in brackets)")
    torch.manual_seed(0)
    served = RawRowsClassifier(build_mlp(len(codec.feature_names), 2, [8]), codec, {"max_steps": 20})
    answer = served.predict(None, credit_frame().drop(columns=TARGET).head(2), {"explain": True, "target": "no default"})
    assert answer["target"].tolist() == [0, 0] and answer["target_label"].tolist() == ["no default"] * 2


def test_the_served_models_signature_names_the_classes_in_words():
    """The predictor's signature (what the MLflow UI shows of a served model) named the classes by their codes only:
    ``target`` defaulted to ``the most likely other class; allowed: 0, 1, as text`` and the outputs left out the
    ``prediction_label`` the predictor gives. A default sent back as an earlier model logged it still asks for no
    class."""
    from ct_lightning.experiment.runs.request_checks import requested_target
    from ct_lightning.experiment.runs import served_model
    from ct_lightning.experiment.runs.served_model import RawRowsClassifier, predictor_signature
    from ct_lightning.models import build_mlp

    codec = TabularCodec.fit(credit_frame(), TARGET, SPEC)
    signature = predictor_signature(codec)
    target = next(p for p in signature.params.params if p.name == "target")
    assert target.default == ("the most likely other class; allowed: no default [0], default [1] (the words, or the "
                              "class in brackets), as text")
    served = RawRowsClassifier(build_mlp(len(codec.feature_names), 2, [8]), codec, {})
    answer = served.predict(None, credit_frame().drop(columns=TARGET).head(2), {})
    assert signature.outputs.input_names() == list(answer.columns) == \
        ["prediction", "prediction_label", "probability", "probability_0", "probability_1"]
    class_entries = served_model.class_entries  # the metadata's legend of the outputs
    assert class_entries(codec) == [{"value": 0, "output": "probability_0", "label": "no default"},
                                    {"value": 1, "output": "probability_1", "label": "default"}]
    for default in (target.default, "the most likely other class; allowed: 0, 1, as text"):  # now's, an earlier one's
        assert requested_target(codec, {"target": default}) is None
    assert requested_target(codec, {"target": "no default"}) == "no default"
    plain = TabularCodec.fit(credit_frame(), TARGET, {"columns": {"SEX": {"kind": "categorical"}}})
    assert next(p for p in predictor_signature(plain).params.params if p.name == "target").default == \
        "the most likely other class; allowed: 0, 1, as text"
    assert "prediction_label" not in predictor_signature(plain).outputs.input_names()
    assert class_entries(plain) == [{"value": 0, "output": "probability_0"}, {"value": 1, "output": "probability_1"}]


def test_an_amount_in_a_currency_is_written_as_money_and_other_units_keep_their_brackets():
    """A letter read ``Yearly income ($): from 37,200 to 41,000``: people write ``Yearly income: from $37,200 to
    $41,000``. A data spec's ``unit`` that is a currency (a symbol, alone or after a country's letters, or an ISO
    code) goes with each amount, the sign first (``-$300``); other units keep theirs in brackets after the label."""
    from ct_lightning.evaluation.explanation import change_of, change_parts, change_words, shown_change
    from datamodules import wording

    spec = yaml.safe_load((ROOT / "examples" / "loans-words.yaml").read_text())
    codec = TabularCodec.fit(pd.read_csv(ROOT / "tests" / "fixtures" / "loans.csv"), "approved", spec)
    columns = {column.name: column for column in codec.columns}
    income = change_of(columns["income"], 37200, 41000)
    assert change_parts(income) == ("Yearly income", "$37,200", "$41,000")
    assert shown_change(income) == "Yearly income: $37,200 → $41,000 [income: 37,200 → 41,000]"  # the raw as it was
    assert change_words(change_of(columns["debt"], 8900, 0)) == "Debt owed: $8,900 → $0"
    assert change_parts(change_of(columns["years_employed"], 3, 5)) == ("Time in employment (years)", "3", "5")
    assert change_parts(change_of(columns["age"], 42, 42))[0] == "Age (years)"
    assert change_parts({"feature": "balance", "from": -300, "to": 1200, "label": "Balance", "unit_label": "€"}) == \
        ("Balance", "-€300", "€1,200")
    assert change_parts({"feature": "limit", "from": 20000, "to": 50000, "unit_label": "NT$"}) == \
        ("limit", "NT$20,000", "NT$50,000")
    assert change_parts({"feature": "limit", "from": 20000, "to": 50000, "unit_label": "USD"}) == \
        ("limit", "USD 20,000", "USD 50,000")
    # a file that wrote its money (60.800 €) keeps its own format, and the heading no second unit
    assert change_parts({"feature": "income", "from": 60800.0, "to": 54800.0, "unit": "{} €", "decimal_comma": True,
                         "thousands": ".", "label": "Income", "unit_label": "€"}) == ("Income", "60.800 €", "54.800 €")
    currency_format = wording.currency_format  # the one rule, which change_parts follows
    assert [currency_format(unit) for unit in ("$", "€", "£", "NT$", "US$", "EUR", " CHF ")] == \
        ["${}", "€{}", "£{}", "NT${}", "US${}", "EUR {}", "CHF {}"]
    assert [currency_format(unit) for unit in ("years", "km", "%", "$ thousands", "PSI", "usd", None)] == [None] * 7


# --- end to end: train with words, explain a batch, write letters ---------------------------------------------------

def test_train_with_words_then_explain_a_batch_and_write_a_letter_to_each_applicant(tmp_path, capsys):
    from ct_lightning.experiment.configuration.validation import CliExit
    from recipes.explain import main as explain_main

    spec = write(tmp_path, SPEC)
    train_main(["--data", str(CREDIT), "--target", TARGET, "--drop-columns", "ID", "--data-spec", str(spec),
                "--balance", "undersample", "--max-epochs", "15", "--nce", "32", "--no-progress",
                "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--checkpoint-dir", str(tmp_path / "ct")])
    started = capsys.readouterr().out
    assert '  LIMIT_BAL "Credit limit" (NT$): integer' in started  # the start-up column list
    assert '  PAY_0 "Repayment status, September": ordinal -2 < -1 < 0' in started
    assert "; values: -1 = paid on time, 1 = one month late, 2 = two months late" in started
    rows = tmp_path / "applicants.csv"
    pd.read_csv(CREDIT).head(10).to_csv(rows, index=False)  # as the file holds them: ID and the target too
    letters = tmp_path / "letters"
    letters.mkdir()
    (letters / "old.txt").write_text("another batch")
    common = ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--rows", str(rows), "--only-predicted", "Default",
              "--max-steps", "200", "--letters", str(letters)]  # the applicants predicted to default, in words
    with pytest.raises(CliExit) as refused:  # refused before any work: no --json written either
        explain_main([*common, "--json", str(tmp_path / "out.json")])
    assert str(refused.value) == (f"--letters: got '{letters}' (the folder holds files); allowed: a new or empty "
                                  "folder, or --overwrite to replace the letters in this one")
    assert not (tmp_path / "out.json").exists()
    records = explain_main([*common, "--overwrite", "--json", str(tmp_path / "out.json"), "--csv",
                            str(tmp_path / "out.csv")])
    out = capsys.readouterr().out
    assert "row 1 (ID 1): predicted " in out and "(not allowed to change: Sex, Age (years))" in out
    explained = [r for r in records if r["explained"]]
    assert 0 < len(explained) < len(records)
    # one letter per explained row, named by the table's ID; old.txt is gone with the batch it belonged to
    assert sorted(p.name for p in letters.iterdir()) == sorted(f"ID-{r['other_columns']['ID']}.txt" for r in explained)
    assert f"wrote {len(explained)} letter(s) to {letters}/" in out
    assert json.loads((tmp_path / "out.json").read_text()) == records
    table = pd.read_csv(tmp_path / "out.csv", encoding="utf-8-sig")
    labels = {"LIMIT_BAL": "Credit limit",  # amounts in NT$: the currency with each amount, not after the label
              **{f"PAY_AMT{i}": f"Amount paid, month {i}" for i in range(1, 7)},
              **{f"BILL_AMT{i}": f"Bill, month {i}" for i in range(1, 7)}}
    for record in explained:
        letter = (letters / f"ID-{record['other_columns']['ID']}.txt").read_text()
        lines = letter.splitlines()
        assert lines[0] == f"Your application (ID {record['other_columns']['ID']})"
        assert f"the model assessed your application as {record['prediction_label']} (probability" in " ".join(lines)
        assert "These facts were held as they are:" in letter
        assert f"  - Sex: {'female' if record['factual']['SEX'] == 2 else 'male'}" in lines
        assert f"  - Age (years): {record['factual']['AGE']}" in lines
        assert all(len(line) <= 78 for line in lines) and "promise" in letter
        for change in record["changes"]:  # raw in --json, worded beside it; the letter speaks in words only
            assert {"feature", "from", "to"} <= set(change)
            if change["feature"] in labels:
                name = labels[change["feature"]]
                assert change["label"] == name and change["unit_label"] == "NT$"
                assert any(re.match(rf"  - {re.escape(name)}: from -?NT\$\d", line) for line in lines), letter
                assert f"{name}: " in table.set_index("row").at[record["row"], "changes_in_words"]
                assert f"{change['feature']}: " in table.set_index("row").at[record["row"], "changes"]
        if record["valid"] and record["changes"]:
            assert "the model would assess it as no default (probability" in " ".join(lines)
        elif not record["valid"]:
            assert "we found no change of the figures that may change" in " ".join(lines)
    assert any(r["valid"] and r["changes"] for r in records), "no letter with changes was written"
    assert table["prediction_label"].tolist() == [r["prediction_label"] for r in records]


def test_the_guides_words_and_the_example_spec_fit_the_credit_table():
    """docs/guide.md's block of words and examples/credit-words.yaml (its worked example's spec) read as written."""
    import re

    from datamodules.codec import read_spec

    guide = (ROOT / "docs" / "guide.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", guide, re.S) if "likely to repay" in b)
    for spec in (yaml.safe_load(block),):
        codec = TabularCodec.fit(credit_frame(), TARGET, spec)
        assert codec.class_label(1) == "likely to default next month"
        pay = next(c for c in codec.columns if c.name == "PAY_0")
        assert pay.value_label(2) == "two months late" and pay.value_label(0) == "paid the minimum"
    # the whole table holds codes the fixture's rows do not (EDUCATION 0 and 6, MARRIAGE 0), which the example words
    frame = credit_frame()
    extra = pd.concat([frame.iloc[[0]]] * 3, ignore_index=True)
    extra["EDUCATION"], extra["MARRIAGE"] = [0, 6, 1], [1, 1, 0]
    example = TabularCodec.fit(pd.concat([frame, extra], ignore_index=True), TARGET,
                               read_spec(ROOT / "examples" / "credit-words.yaml"))
    assert all(c.label for c in example.columns)  # every column of the table in words
    assert next(c for c in example.columns if c.name == "PAY_5").value_label(-2) == "nothing to pay"
    pay = next(c for c in example.columns if c.name == "PAY_0")
    assert pay.value_label(2) == "two months late" and pay.value_label(0) == "paid the minimum"
    assert example.class_label(1) == "likely to default next month"
    # every code the table holds has words (training notes those without), and what an applicant cannot change is
    # held: the demographics, and the history before September's bill and payment
    from datamodules.wording import unworded_note

    assert unworded_note(example.columns) is None
    held = {c.name for c in example.columns if c.mutability == "none"}
    assert held == {"SEX", "MARRIAGE", "AGE", "EDUCATION", "PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6",
                    *(f"{kind}_AMT{month}" for kind in ("BILL", "PAY") for month in range(2, 7))}, held
    # the past months' repayment statuses are history: the worked example's letters never ask to change them
    assert {c.name: c.mutability for c in example.columns if c.name.startswith("PAY_") and "AMT" not in c.name} == \
        {name: "none" for name in ("PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6")}


def test_a_letter_never_offers_changes_that_do_not_reach_the_target_and_names_rows_it_cannot_tell_apart(tmp_path):
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.letters import check_letters_folder, letter_names, letter_text, write_letters

    codec = TabularCodec.fit(credit_frame(), TARGET, SPEC)
    factual = credit_frame().drop(columns=TARGET).iloc[0].to_dict()
    missed = {"row": 3, "explained": True, "factual": factual, "prediction": 1, "prediction_label": "default",
              "prediction_probability": 0.8, "target": 0, "target_label": "no default", "probability": 0.3,
              "valid": False, "counterfactual_prediction": 1, "counterfactual_prediction_label": "default",
              "changes": [{"feature": "LIMIT_BAL", "from": 20000, "to": 90000, "label": "Credit limit",
                           "unit_label": "NT$"}], "immutable": ["SEX", "AGE"], "other_columns": {"ID": 7}}
    text = letter_text(missed, codec)
    assert "we found no change of the figures that may change after which the model would assess it as no " \
           "default." in " ".join(text.split())
    assert "Credit limit" not in text and "90,000" not in text  # changes that miss the target are no advice
    assert "  - Sex: female\n" in text and "  - Age (years): 24\n" in text
    # the lending walk: 'Your application (applicant_id A0012)' and 'Held as they are: these facts were not asked to
    # change' read as code and as a riddle to an applicant
    lines = letter_text({**missed, "other_columns": {"applicant_id": "A0012"}}, codec).splitlines()
    assert lines[0] == "Your application (applicant id A0012)"
    assert "These facts were held as they are:" in lines and not any("asked to change" in line for line in lines)
    # two rows of one ID (or none): the letters are named by row number, never one over another
    twice = [{**missed, "row": 1}, {**missed, "row": 2}, {"row": 3, "explained": False, "problem": "unseen category"}]
    assert letter_names(twice) == {1: "row-1.txt", 2: "row-2.txt"}
    assert write_letters(tmp_path / "out", twice, codec) == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["row-1.txt", "row-2.txt"]
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="a folder for the letters"):
        check_letters_folder(tmp_path / "file")
    check_letters_folder(tmp_path / "out", overwrite=True)  # replaced whole by the next batch
    assert write_letters(tmp_path / "out", [{**missed, "row": 0}], codec, overwrite=True) == 1
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["ID-7.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_only_predicted_counts_and_the_plot_name_the_classes_in_words(tmp_path, capsys):
    """The data spec words the classes, yet the line counting the rows --only-predicted kept said
    '--only-predicted 1: ... predicted 1', and the plot's titles '0 → 1': now in words, the class in brackets, as the
    explanations say them."""
    from matplotlib.text import Text

    from ct_lightning.experiment.runs.explanations import explain_loaded, explanation_figure, load_explainable, \
        search_settings
    from recipes.explain import main as explain_main

    spec = write(tmp_path, SPEC)
    train_main(["--data", str(CREDIT), "--target", TARGET, "--drop-columns", "ID", "--data-spec", str(spec),
                "--max-epochs", "1", "--nce", "16", "--no-progress", "--tracking-uri",
                f"sqlite:///{tmp_path}/mlflow.db", "--checkpoint-dir", str(tmp_path / "ct")])
    rows = tmp_path / "applicants.csv"
    pd.read_csv(CREDIT).head(8).to_csv(rows, index=False)
    capsys.readouterr()
    records = explain_main(["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--rows", str(rows),
                            "--only-predicted", "no default", "--max-steps", "20"])
    out = capsys.readouterr().out
    kept = sum(r["explained"] for r in records)
    assert f"--only-predicted no default [0]: {kept} of 8 rows are predicted no default [0] and explained" in out
    assert all(r["problem"] == "predicted default [1], not no default [0] (--only-predicted)"
               for r in records if not r["explained"])
    loaded = load_explainable(checkpoint=str(tmp_path / "ct" / "last.ckpt"))
    settings = {**search_settings(loaded.module, {}), "max_steps": 20}
    frame = pd.read_csv(rows).drop(columns=["ID", TARGET]).head(2)
    explained = explain_loaded(loaded, frame, None, settings, 0)
    titles = {t.get_text() for t in explanation_figure(explained).findobj(Text) if t.get_text().startswith("row ")}
    assert titles and all(re.search(r": (no default \[0\]|default \[1\]) → (no default \[0\]|default \[1\])$", t)
                          for t in titles), titles


def test_target_refusals_and_evaluates_lines_name_the_classes_in_words(tmp_path, capsys):
    """explain.py's --target of no class said 'allowed: 0, 1 (or their words: no default, default)', after the model
    was built, and evaluate.py named classes by their codes: a table whose target holds a class the model does not
    know ('allowed: 0, 1'), the note under an ordered outcome's metrics ('rejected < interview < offer'), and so did
    train.py's data line and an ordered outcome's line ('with classes 0, 1 (positive: 1)'). Now in the data spec's
    words with the class in brackets, as explain.py's explanations say them; --target is refused before the rows are
    read."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.workflows.evaluate import order_note
    from recipes.evaluate import main as evaluate_main
    from recipes.explain import main as explain_main
    from test_ordered_outcomes import ORDER, hiring_table

    spec = write(tmp_path, SPEC)
    train_main(["--data", str(CREDIT), "--target", TARGET, "--drop-columns", "ID", "--data-spec", str(spec),
                "--max-epochs", "1", "--nce", "16", "--no-progress", "--tracking-uri",
                f"sqlite:///{tmp_path}/mlflow.db", "--checkpoint-dir", str(tmp_path / "ct")])
    started = capsys.readouterr().out  # train.py's data line
    assert f"target '{TARGET}' with classes no default [0], default [1] (positive: default [1])\n" in started
    checkpoint = str(tmp_path / "ct" / "last.ckpt")
    (tmp_path / "empty.csv").write_text("")  # rows it cannot read: refused before the rows are read
    with pytest.raises(CliExit) as refused:
        explain_main(["--checkpoint", checkpoint, "--rows", str(tmp_path / "empty.csv"), "--target", "no defualt"])
    assert str(refused.value) == ("--target: got 'no defualt'; allowed: no default [0], default [1] (the words, or "
                                  "the class in brackets)")
    later = pd.read_csv(CREDIT)
    later.loc[later.index[:5], TARGET] = 2  # a class the model was not trained on
    later.to_csv(tmp_path / "later.csv", index=False)
    with pytest.raises(CliExit) as refused:
        evaluate_main(["--checkpoint", checkpoint, "--data", str(tmp_path / "later.csv"), "--no-log", "--n-runs", "1"])
    assert str(refused.value) == (f"--data: the target column {TARGET!r} holds 2, a class the model was not trained "
                                  "on; allowed: no default [0], default [1]")
    hires = tmp_path / "hires.csv"
    hiring_table().to_csv(hires, index=False)
    words = write(tmp_path, {"target": {"name": "outcome", "order": ORDER, "values": {
        "rejected": "not invited", "interview": "invited to talk", "offer": "offered the job"}}}, "hires.yaml")
    datamodule = build_datamodule({"data": str(hires), "target": "outcome", "data_spec": str(words)})
    note = order_note(datamodule)
    assert ("\noutcome: not invited [rejected] < invited to talk [interview] < offered the job [offer] (explanations "
            "count \"at least\"") in datamodule.describe()  # train.py's and explain.py --target-order's line
    assert note.startswith("note: 'outcome' is ordered (not invited [rejected] < invited to talk [interview] < "
                           "offered the job [offer]), but these metrics count a counterfactual valid only at its exact "
                           "target"), note


def test_training_notes_the_codes_a_data_spec_leaves_without_words(tmp_path):
    """A spec that words some codes of a column but not all: an explanation or letter would offer the others as bare
    codes ('Education: high school → 5'), so the start-up description says which, once, columns that leave out the
    same codes named together; a column worded in full, or not at all, gets no note."""
    from datamodules.table import TableDataModule

    frame = credit_frame()
    educations = sorted(frame["EDUCATION"].unique())
    spec = {"columns": {"EDUCATION": {"kind": "categorical", "values": {1: "graduate school", 2: "university"}},
                        "MARRIAGE": {"kind": "categorical", "values": {int(v): f"status {v}"
                                                                       for v in frame["MARRIAGE"].unique()}},
                        "SEX": {"kind": "categorical", "values": {1: "male"}, "mutability": "none"}}}
    module = TableDataModule(CREDIT, target=TARGET, drop_columns=["ID"], spec=spec)
    module.setup("fit")
    [note] = [line for line in module.describe().splitlines() if "give no words" in line]
    left = ", ".join(str(v) for v in educations if v not in (1, 2))
    assert note == (f"note: codes the data spec's values give no words: SEX: 2; EDUCATION: {left}; explanations and "
                    "letters show them as codes (word them under values:, or hold a column that may change with "
                    "mutability: none)"), note
    worded = TableDataModule(CREDIT, target=TARGET, drop_columns=["ID"], spec={"columns": {
        "MARRIAGE": spec["columns"]["MARRIAGE"]}})
    worded.setup("fit")
    assert "give no words" not in worded.describe()
