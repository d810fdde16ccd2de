"""Ordered categories (``kind: ordinal`` with ``order:`` in the data spec): one input per column, the category's
rank standardised; searches keep it on whole ranks inside the order; explanations, the served model and
``--write-data-spec`` speak of the categories, and ``increase``/``decrease`` mean higher/lower in the order."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from datamodules.codec import TabularCodec
from datamodules.table import TableDataModule

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
ORDER = ["HS-grad", "Some-college", "Bachelors", "Masters", "Doctorate"]  # no row holds Doctorate
SPEC = {"columns": {"education": {"kind": "ordinal", "order": ORDER, "mutability": "increase"}}}


def graded() -> pd.DataFrame:
    """loans.csv with an education that goes with approval (a higher one, more often approved), and grades 1-5."""
    frame = pd.read_csv(LOANS)
    rng = np.random.default_rng(0)
    rank = np.where(frame["approved"] == "yes", 2, 0) + rng.integers(0, 2, len(frame))
    frame["education"] = np.array(ORDER, dtype=object)[rank]
    frame["grade"] = rng.integers(1, 6, len(frame))
    return frame


def fit(spec, frame=None, **kwargs) -> TabularCodec:
    return TabularCodec.fit(graded() if frame is None else frame, "approved", spec, **kwargs)


def test_one_input_per_ordinal_column_its_rank_standardised_by_the_training_rows():
    frame = graded()
    train = np.arange(0, len(frame), 2)
    codec = fit({"columns": {**SPEC["columns"], "grade": {"kind": "ordinal"}}}, frame, train_rows=train)
    assert codec.feature_names[-2:] == ["education", "grade"]  # one input each, no one-hot group
    education = next(c for c in codec.columns if c.name == "education")
    assert education.categories == ORDER and education.mutability == "increase"
    ranks = frame["education"].map(ORDER.index).to_numpy(float)
    assert education.mean == pytest.approx(ranks[train].mean()) and education.scale == pytest.approx(ranks[train].std())
    x = codec.encode(frame.drop(columns="approved"))
    np.testing.assert_allclose(x[:, -2], (ranks - ranks[train].mean()) / ranks[train].std(), rtol=1e-5, atol=1e-5)
    # a column of numbers without an order: its sorted values (the grades 1 < ... < 5)
    assert next(c for c in codec.columns if c.name == "grade").categories == [1, 2, 3, 4, 5]
    back = codec.decode(x)
    assert back["education"].tolist() == frame["education"].tolist()
    assert back["grade"].tolist() == frame["grade"].tolist()
    # any input decodes to a category of the order: the nearest rank, the ends beyond them
    noisy = x + np.random.default_rng(1).normal(0, 2.0, x.shape).astype(np.float32)
    assert set(codec.decode(noisy)["education"]) <= set(ORDER)
    ends = x[:2].copy()
    ends[:, -2] = [-50.0, 50.0]
    assert codec.decode(ends)["education"].tolist() == ["HS-grad", "Doctorate"]
    # the searches: whole ranks (an integer in rank units) inside [0, K-1], Doctorate included though no row holds it
    types = codec.feature_types()
    index = codec.feature_names.index("education")
    assert index in types.integers and not any(index in group for group in types.groups)
    offset, scale = types.raw_units([index])
    assert float(offset) == pytest.approx(education.mean) and float(scale) == pytest.approx(education.scale)
    lower, upper = codec.encoded_bounds()
    assert lower[index] * education.scale + education.mean == pytest.approx(0.0, abs=1e-5)
    assert upper[index] * education.scale + education.mean == pytest.approx(4.0, abs=1e-5)
    assert education.domain() == (0.0, 4.0)
    assert "  education: ordinal HS-grad < Some-college < Bachelors < Masters < Doctorate, increase" in \
        codec.describe().splitlines()
    assert "  grade: ordinal 1 < 2 < 3 < 4 < 5" in codec.describe().splitlines()


def test_a_snapped_search_point_is_a_whole_rank_inside_the_order():
    from ct_lightning.constraints import Constraints

    codec = fit(SPEC)
    x = torch.as_tensor(codec.encode(graded().drop(columns="approved").head(40)))
    noisy = x + 3.0 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    lower, upper = (torch.as_tensor(b) for b in codec.encoded_bounds())
    snapped = Constraints(torch.zeros(x.shape[1], dtype=torch.long), lower, upper, types=codec.feature_types()) \
        .snap(noisy.clamp(lower, upper), x)
    education = next(c for c in codec.columns if c.name == "education")
    ranks = snapped[:, codec.feature_names.index("education")].numpy() * education.scale + education.mean
    np.testing.assert_allclose(ranks, np.round(ranks), atol=1e-4)
    assert ranks.min() > -1e-4 and ranks.max() < 4 + 1e-4 and len(set(np.round(ranks))) > 2


def test_the_codec_travels_as_json_and_old_payloads_read_byte_identically():
    codec = fit(SPEC)
    payload = codec.to_dict()
    assert next(c for c in payload["columns"] if c["name"] == "education")["categories"] == ORDER
    again = TabularCodec.from_dict(json.loads(json.dumps(payload)))
    assert again == codec and again.feature_types().integers == codec.feature_types().integers
    old = TabularCodec.fit(pd.read_csv(LOANS), "approved").to_dict()  # a payload without ordinal columns
    assert json.dumps(TabularCodec.from_dict(json.loads(json.dumps(old))).to_dict()) == json.dumps(old)


def test_numbers_match_an_order_of_numbers_and_missing_values_take_the_median_rank():
    frame = graded()
    frame.loc[[3, 7, 11], "grade"] = np.nan  # a float column now: 2.0 is still the grade 2
    frame.loc[[5], "education"] = np.nan
    grades = {"kind": "ordinal", "order": [1, 2, 3, 4, 5]}
    data = TableDataModule(frame, target="approved", impute="median",
                           spec={"columns": {**SPEC["columns"], "grade": grades}})
    grade, education = (next(c for c in data.codec.columns if c.name == n) for n in ("grade", "education"))
    assert grade.categories == [1, 2, 3, 4, 5]
    ranks = sorted(graded()["education"].iloc[[r for r in data.rows["train"] if r != 5]].map(ORDER.index))
    assert education.fill == ORDER[ranks[(len(ranks) - 1) // 2]]  # a category of the order, not the most frequent
    assert any("education: missing in 1 row(s), filled with" in line and "median" in line for line in data.read_notes)
    assert data.codec.decode(data.codec.encode(frame.drop(columns="approved").fillna({"grade": 2}).iloc[[3]]))[
        "grade"].tolist() == [2]


@pytest.mark.parametrize("columns, said", [
    ({"income": {"kind": "continuous", "order": [1, 2]}},
     "data_spec: column 'income': order has no meaning for a continuous column; allowed: order with kind: ordinal"),
    ({"purpose": {"kind": "categorical", "order": ["car", "education"]}},
     "data_spec: column 'purpose': order has no meaning for a categorical column; allowed: order with kind: ordinal"),
    ({"education": {"order": ORDER}},
     "data_spec: column 'education': order has no meaning for a column without kind: ordinal column; allowed: "
     "order with kind: ordinal"),
    ({"education": {"kind": "ordinal"}},
     "data_spec: column 'education': kind ordinal of text needs order:, its categories from lowest to highest; "
     "allowed: order: [Bachelors, HS-grad, Masters, Some-college] put in the order they rank"),
    ({"education": {"kind": "ordinal", "order": ["HS-grad", "Bachelors", "HS-grad"]}},
     "data_spec: column 'education': order lists 'HS-grad' twice; allowed: each category once, from lowest to "
     "highest"),
    ({"grade": {"kind": "ordinal", "order": [1, "1", 2]}},
     "data_spec: column 'grade': order lists '1' twice; allowed: each category once, from lowest to highest"),
    ({"grade": {"kind": "ordinal", "order": [1, 2, 2.0]}},
     "data_spec: column 'grade': order lists 2.0 twice; allowed: each category once, from lowest to highest"),
    ({"education": {"kind": "ordinal", "order": "HS-grad < Masters"}},
     "data_spec: column 'education': order 'HS-grad < Masters'; allowed: a list of at least two categories from "
     "lowest to highest, such as order: [low, medium, high]"),
    ({"education": {"kind": "ordinal", "order": ORDER, "upper": 3}},
     "data_spec: column 'education': upper 3 has no meaning for an ordinal column (its order's first and last "
     "categories are its bounds); allowed: kind, mutability, order, step, max_change, label, values"),
    ({"education": {"kind": "ordinal", "order": ["HS-grad", "Some-college", "Bachelor", "Masters"]}},
     "data: column 'education': 'Bachelors' is not in its order (did you mean 'Bachelor'?); allowed: HS-grad, "
     "Some-college, Bachelor, Masters (or add it to order: in --data-spec where it ranks)"),
    ({"grade": {"kind": "ordinal", "order": [1, 2, 3, 4]}},
     "data: column 'grade': 5 is not in its order; allowed: 1, 2, 3, 4 (or add it to order: in --data-spec where it "
     "ranks)"),
])
def test_a_spec_that_cannot_rank_a_column_is_refused_in_one_line(columns, said):
    with pytest.raises(ValueError) as error:
        fit({"columns": columns})
    assert str(error.value) == said


def test_an_unquoted_no_yes_order_says_to_quote_it(tmp_path):
    frame = graded().assign(risk=lambda f: np.where(f["age"] > 50, "Yes", "No"))
    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  risk: {kind: ordinal, order: [No, Yes]}\n")
    with pytest.raises(ValueError, match=r"^data: column 'risk': '(No|Yes)' is not in its order \(YAML reads an "
                                         r"unquoted Yes, No, On or Off in order: as true or false: quote them\)"):
        fit(str(spec), frame)
    spec.write_text("columns:\n  risk: {kind: ordinal, order: ['No', 'Yes'], mutability: decrease}\n")
    assert fit(str(spec), frame).columns[-1].categories == ["No", "Yes"]


def test_increase_and_decrease_are_allowed_for_an_ordinal_column_and_still_refused_for_a_categorical_one():
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability

    for kind in ("increase", "decrease", "none", "both"):
        codec = fit({"columns": {"education": {"kind": "ordinal", "order": ORDER, "mutability": kind}}})
        assert codec.mutability() == ({} if kind == "both" else {"education": kind})
    assert requested_mutability(codec, {"mutability": "education=decrease"}) == {"education": "decrease"}
    with pytest.raises(MutabilityRefused, match=r"^params: mutability 'purpose=increase' \('purpose' is categorical\)"):
        requested_mutability(codec, {"mutability": "purpose=increase"})
    with pytest.raises(ValueError, match="mutability 'increase' has no meaning for a categorical column"):
        fit({"columns": {"education": {"kind": "categorical", "mutability": "increase"}}})


def test_served_rows_take_the_ordinal_column_as_its_categories():
    from ct_lightning.experiment.runs.request_checks import check_rows
    from ct_lightning.experiment.runs.served_model import input_columns

    codec = fit({"columns": {**SPEC["columns"], "grade": {"kind": "ordinal"}}})
    entry = next(c for c in input_columns(codec) if c["name"] == "education")
    assert entry == {"name": "education", "type": "string", "kind": "ordinal", "categories": ORDER}
    assert next(c for c in input_columns(codec) if c["name"] == "grade")["type"] == "long"
    rows = graded().drop(columns="approved").head(3)
    checked = check_rows(codec, rows.assign(education=["masters", "Doctorate", "HS-grad"]), 10)
    assert checked["education"].tolist() == ["Masters", "Doctorate", "HS-grad"]  # case aside, as a category
    for column, value, said in (("education", "PhD", "unseen category 'PhD' in row 1; allowed: HS-grad, Some-college, "
                                 "Bachelors, Masters, Doctorate"),
                                ("grade", 9, "unseen category 9 in row 1; allowed: 1, 2, 3, 4, 5"),
                                ("grade", "3", "unseen category '3' in row 1 (text; the categories are a number)")):
        with pytest.raises(ValueError) as refused:
            check_rows(codec, rows.assign(**{column: [value] * 3}), 10)
        assert str(refused.value).startswith(f"rows: column {column!r}: {said}"), str(refused.value)


def test_the_written_spec_keeps_the_order_and_hints_at_one_for_ranges_without_guessing(tmp_path):
    from recipes.train import main as train_main

    frame = graded()
    frame["emp_length"] = np.array(["< 1 year", "1-3 years", "4-9 years", "10+ years"], dtype=object)[
        frame["age"].to_numpy() % 4]
    frame.to_csv(tmp_path / "graded.csv", index=False)
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump(SPEC))
    spec = tmp_path / "spec.yaml"
    train_main(["--data", str(tmp_path / "graded.csv"), "--target", "approved", "--data-spec", str(given),
                "--write-data-spec", str(spec), "--tracking-uri", f"sqlite:///{tmp_path}/store/mlflow.db"])
    lines = spec.read_text().splitlines()
    education = next(line for line in lines if line.lstrip().startswith("education:"))
    assert education.startswith("  education: {kind: ordinal, mutability: increase, order: [HS-grad, Some-college, "
                                "Bachelors, Masters, Doctorate]}  # lowest to highest, 4 of the 5 in the file; never "
                                "in the file: Doctorate"), education
    emp = next(line for line in lines if line.lstrip().startswith("emp_length:"))
    assert "{kind: categorical, mutability: both}" in emp  # not guessed
    assert emp.endswith("; ordered? then kind: ordinal, order: [< 1 year, 1-3 years, 4-9 years, 10+ years]"), emp
    purpose = next(line for line in lines if line.lstrip().startswith("purpose:"))
    assert "ordered?" not in purpose
    age = next(line for line in lines if line.lstrip().startswith("age:"))
    assert "ordered?" not in age and "kind: ordinal where they rank" not in age
    grade = next(line for line in lines if line.lstrip().startswith("grade:"))  # 1-5: a code, or grades that rank
    assert grade.endswith("a code of categories? then kind: categorical (kind: ordinal where they rank)"), grade
    written = TableDataModule(tmp_path / "graded.csv", target="approved", spec=spec).codec.to_dict()
    assert written == TableDataModule(tmp_path / "graded.csv", target="approved", spec=given).codec.to_dict()
    # the hint pasted as it stands trains the column as ordinal
    order = yaml.safe_load("[" + emp.split("order: [", 1)[1])
    pasted = TableDataModule(tmp_path / "graded.csv", target="approved",
                             spec={"columns": {"emp_length": {"kind": "ordinal", "order": order}}}).codec
    assert next(c for c in pasted.columns if c.name == "emp_length").categories == order


def test_a_trained_model_explains_in_the_orders_words_and_never_lowers_an_increase_only_column(tmp_path, capsys):
    """A real tiny training with education ``mutability: increase``: its explanations (explain.py on the logged run
    and on the checkpoint, and the served predictor) change education only upwards, to categories of the order."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.lifecycle import CONSTRAINTS_TAG
    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri
    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main as explain_main

    frame = graded()
    frame.to_csv(tmp_path / "graded.csv", index=False)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(tmp_path / "graded.csv"), "target": "approved", "data_spec": str(tmp_path / "spec.yaml"),
                 "max_epochs": 3, "nce": 16, "tracking_uri": uri, "progress": False, "seed": 0,
                 "checkpoint_dir": str(tmp_path / "ck")})
    tags = MlflowClient(tracking_uri=uri).get_run(run["run_id"]).data.tags
    assert "increase only: education" in tags[CONSTRAINTS_TAG], tags[CONSTRAINTS_TAG]
    rows = frame.drop(columns="approved")
    rows[frame["approved"] == "no"].head(30).to_csv(tmp_path / "rows.csv", index=False)
    common = ["--rows", str(tmp_path / "rows.csv"), "--target", "yes", "--max-steps", "80", "--no-log"]
    records = explain_main(["--run-id", run["run_id"], "--tracking-uri", uri, *common])
    printed = capsys.readouterr().out
    moved = [c for record in records for c in record["changes"] if c["feature"] == "education"]
    assert moved, "the search raises some education (else this test could not fail)"
    for change in moved:
        assert change["to"] in ORDER and ORDER.index(change["to"]) > ORDER.index(change["from"]), change
        assert f"education: {change['from']} → {change['to']}" in printed
    assert all(record["counterfactual"]["education"] in ORDER for record in records)
    from_checkpoint = explain_main(["--checkpoint", str(tmp_path / "ck" / "last.ckpt"),
                                    "--tracking-uri", f"sqlite:///{tmp_path}/m.db", *common])
    assert [r["counterfactual"]["education"] for r in from_checkpoint] == \
        [r["counterfactual"]["education"] for r in records]
    # explain.py --mutability: a direction is accepted for the ordinal column (the data spec's, or none), the other
    # one refused (the spec's increase is a fact about the data), and any direction for a categorical one
    held = explain_main(["--run-id", run["run_id"], "--tracking-uri", uri, *common[:-3], "--target", "no",
                         "--max-steps", "80", "--no-log", "--mutability", "education=increase"])
    assert all(ORDER.index(c["to"]) > ORDER.index(c["from"]) for r in held for c in r["changes"]
               if c["feature"] == "education")
    with pytest.raises(CliExit) as refused:
        explain_main(["--run-id", run["run_id"], "--tracking-uri", uri, *common, "--mutability", "education=decrease"])
    assert str(refused.value).startswith("--mutability: got 'education=decrease' ('education' is increase in the "
                                         "model's data spec, a fact about the data")
    with pytest.raises(CliExit) as refused:
        explain_main(["--run-id", run["run_id"], "--tracking-uri", uri, *common, "--mutability", "purpose=increase"])
    assert str(refused.value).startswith("--mutability: got 'purpose=increase' ('purpose' is categorical); allowed: "
                                         "both or none")
    with _tracking_uri(uri):  # the served predictor: the column as text, explained in the order's words
        uri_model = f"models:/{run['models']['predictor']}"
        info = mlflow.models.get_model_info(uri_model)
        served = mlflow.pyfunc.load_model(uri_model).predict(rows.head(5), params={"explain": True, "target": "yes",
                                                                                    "max_steps": 80})
    column = next(c for c in info.metadata["input_columns"] if c["name"] == "education")
    assert column == {"name": "education", "type": "string", "kind": "ordinal", "categories": ORDER}
    for before, counterfactual in zip(rows.head(5)["education"], served["counterfactual"]):
        assert counterfactual["education"] in ORDER and ORDER.index(counterfactual["education"]) >= ORDER.index(before)


def test_a_users_pipeline_that_codes_the_order_reads_the_ordinal_input_and_one_hot_is_refused():
    """``--model-inputs``: an OrdinalEncoder's codes (or evenly spaced grades as numbers) are a straight line in the
    rank, the one input ct-lightning gives an ordinal column; a one-hot column of it is no such line."""
    from ct_lightning.model_inputs import affine_map

    frame = graded()
    codec = fit({"columns": {**SPEC["columns"], "grade": {"kind": "ordinal"}}}, frame)
    x = codec.encode(frame.drop(columns="approved"))
    entries = [{"feature": "education", "codes": {c: 2.0 * i - 1 for i, c in enumerate(ORDER)}},
               {"feature": "grade", "center": 3.0, "scale": 2.0}]
    weight, bias, _ = affine_map(entries, codec)
    inputs = x.astype(np.float64) @ np.array(weight).T + np.array(bias)
    np.testing.assert_allclose(inputs[:, 0], frame["education"].map(ORDER.index) * 2.0 - 1, atol=1e-5)
    np.testing.assert_allclose(inputs[:, 1], (frame["grade"] - 3.0) / 2.0, atol=1e-5)
    for entry, said in (({"feature": "education", "category": "Masters"}, "values HS-grad: 0, Some-college: 0, "
                         "Bachelors: 0, Masters: 1, Doctorate: 0 of the ordinal column 'education' are not evenly "
                         "spaced"),
                        ({"feature": "education", "codes": {"HS-grad": 0, "Some-college": 1, "Bachelors": 3,
                                                            "Masters": 4, "Doctorate": 5}}, "not evenly spaced")):
        with pytest.raises(ValueError, match=r"^model_inputs: got a list of 1 inputs \(input 1 of 1: .*" + said):
            affine_map([entry], codec)


def test_rows_to_explain_with_a_gap_in_a_column_of_grades_read_the_grade_as_the_number_it_is():
    """explain.py's row checks read a float column of grades (a gap makes pandas write 2 as 2.0) by number, as the
    codec encodes it and the served model reads it; a grade outside the order is refused as an unseen category."""
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows

    codec = fit({"columns": {"grade": {"kind": "ordinal"}}})
    rows = graded().drop(columns="approved").head(3).astype({"grade": float})
    explainable = Explainable(torch.nn.Identity(), codec, {}, None, True)
    checked, _, _ = check_rows(rows, explainable, "--rows")
    assert codec.decode(codec.encode(checked))["grade"].tolist() == rows["grade"].astype(int).tolist()
    with pytest.raises(Exception, match=r"grade=9\.0.*one of 1, 2, 3, 4, 5"):
        check_rows(rows.assign(grade=[9.0, 2.0, 3.0]), explainable, "--rows")


RATES = ["5%", "10%", "20%", "50%"]  # labels a reader would take for the numbers 5, 10, 20, 50
FEES = ["$500", "$1,000", "$2,500"]


def test_ordinal_labels_written_with_a_sign_keep_their_text_and_match_their_order_as_written(tmp_path):
    """A file writing an ordinal column's labels as 10% or $1,000: the table reader makes numbers of such a column,
    but one whose order lists text labels keeps them as written (training, explain.py --data with the model's codec
    and its rows to explain); a column the data spec does not declare ordinal is still read as numbers."""
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, read_rows

    frame = graded()
    frame["rate"] = np.array(RATES, dtype=object)[np.arange(len(frame)) % 4]
    frame["fee"] = np.array(FEES, dtype=object)[np.arange(len(frame)) % 3]
    frame["share"] = np.array(["12.5%", "30%", "7%"], dtype=object)[np.arange(len(frame)) % 3]
    frame.to_csv(tmp_path / "rated.csv", index=False)
    spec = {"columns": {"rate": {"kind": "ordinal", "order": RATES}, "fee": {"kind": "ordinal", "order": FEES}}}
    ranks = frame["rate"].map(RATES.index).to_numpy(float)
    for source in (tmp_path / "rated.csv", frame):
        data = TableDataModule(source, target="approved", spec=spec)
        rate, fee = (next(c for c in data.codec.columns if c.name == n) for n in ("rate", "fee"))
        assert rate.categories == RATES and fee.categories == FEES and rate.unit is None
        assert data.frame["rate"].tolist() == frame["rate"].tolist()
        x = data.codec.encode(data.frame.drop(columns="approved"))
        np.testing.assert_allclose(x[:, data.codec.feature_names.index("rate")] * rate.scale + rate.mean, ranks,
                                   atol=1e-5)
        assert not any(note.startswith(("rate:", "fee:")) for note in data.read_notes), data.read_notes
        assert any(note.startswith("share: numbers written as text") for note in data.read_notes)
        assert next(c for c in data.codec.columns if c.name == "share").kind == "continuous"
    again = TableDataModule(tmp_path / "rated.csv", target="approved", codec=data.codec.to_dict())  # --data
    assert again.frame["fee"].tolist() == frame["fee"].tolist()
    rows = read_rows(str(tmp_path / "rated.csv"))
    checked, _, _ = check_rows(rows, Explainable(torch.nn.Identity(), data.codec, {}, None, True), "--rows",
                               skip_bad_rows=True)  # a row or two outside the model's domain
    kept = checked.index - 1  # read_rows numbers the rows from 1
    assert len(checked) > 250 and checked["rate"].tolist() == frame.loc[kept, "rate"].tolist()
    assert checked["fee"].tolist() == frame.loc[kept, "fee"].tolist()
    frame.loc[3, "rate"] = "10.0%"  # one number as two labels: which one is meant cannot be said
    frame.to_csv(tmp_path / "twice.csv", index=False)
    with pytest.raises(ValueError) as error:
        TableDataModule(tmp_path / "twice.csv", target="approved", spec=spec)
    assert str(error.value) == "data: column 'rate' writes '10%' and '10.0%', one number as two labels of its order; " \
                               "allowed: each label written one way in the file", str(error.value)
    with pytest.raises(InputError, match=r"^--rows: got 'rate' \(column 'rate' writes '10%' and '10.0%'"):
        check_rows(read_rows(str(tmp_path / "twice.csv")), Explainable(torch.nn.Identity(), data.codec, {}, None,
                                                                        True), "--rows")


def test_a_trained_codecs_data_fills_an_ordinal_gap_with_the_median_rank_without_its_data_spec(tmp_path):
    """explain.py --data FILE with a model trained with --impute median (its codec, no data spec: a checkpoint copied
    without its config) fills an ordinal gap as training did: the category of the median rank, here not the most
    frequent one."""
    from ct_lightning.experiment.configuration.data import build_datamodule

    frame = graded()
    rank = np.array([0] * 4 + [2] * 3 + [4] * 3)[np.arange(len(frame)) % 10]  # most often HS-grad, median Bachelors
    frame["education"] = np.array(ORDER, dtype=object)[rank]
    frame.loc[[5, 17], "education"] = np.nan
    frame.to_csv(tmp_path / "gaps.csv", index=False)
    trained = TableDataModule(tmp_path / "gaps.csv", target="approved", impute="median", spec=SPEC)
    trained.setup("fit")
    education = next(c for c in trained.codec.columns if c.name == "education")
    assert education.fill == "Bachelors"
    data = build_datamodule({"data": str(tmp_path / "gaps.csv"), "target": "approved", "impute": "median"},
                            codec=trained.codec)
    assert data.frame.loc[[5, 17], "education"].tolist() == ["Bachelors", "Bachelors"]
    assert any(note.startswith("education: missing in 2 row(s), filled with 'Bachelors', as the model's preprocessing "
                               "fills it (the median of the rows it was trained on")
               for note in data.read_notes), data.read_notes
    np.testing.assert_array_equal(data.x_train, trained.x_train)
