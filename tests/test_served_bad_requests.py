"""Bad requests to a served predictor get a 4xx answer naming the column, never a 500 or a traceback.

The fast tests check the request checks and the predictor's answers in process; the slow ones send each bad
request to a real ``mlflow models serve`` of a real tiny training on the loans table (integer, categorical and
binary columns)."""

from __future__ import annotations

import json
import math
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from preloaded import run_script
from test_served_model import serve

from ct_lightning.experiment.runs.request_checks import (
    MAX_STEPS, check_params, check_rows, requested_target, row_limit, target_default)
from ct_lightning.experiment.runs.served_model import (
    PredictorFailed, RawRowsClassifier, RequestRefused, input_columns, predictor_signature)
from datamodules.codec import TabularCodec

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
APPLICANT = {"age": 40, "income": 40000, "debt": 5000, "years_employed": 5, "home_ownership": "own",
             "purpose": "car", "sex": "male"}


@pytest.fixture(scope="module")
def codec() -> TabularCodec:
    return TabularCodec.fit(pd.read_csv(LOANS), "approved")


def rows(**changes) -> pd.DataFrame:
    return pd.DataFrame([{**APPLICANT, **changes}])


# --- the checks, without a server ---------------------------------------------------------------------------

def test_good_rows_pass_in_the_models_column_order(codec):
    frame = rows()[list(reversed(list(APPLICANT)))]
    checked = check_rows(codec, frame, 10)
    assert list(checked.columns) == [c.name for c in codec.columns]


@pytest.mark.parametrize("frame, expected", [
    (rows(colour="red"), "rows: unknown column 'colour'; the model needs age, income, debt, years_employed, "
                         "home_ownership, purpose, sex and no other columns"),
    (rows(approved="yes", colour="red"), "rows: unknown column 'approved', 'colour'; the model needs age,"),
    (rows(incme=1).drop(columns="income"), "rows: missing column 'income'; unknown column 'incme'; the model needs"),
    (pd.concat([rows(), rows()[["age"]]], axis=1), "rows: repeated column 'age'; the model needs"),
])
def test_columns_the_model_does_not_know_are_refused_in_one_line_with_the_models_columns(codec, frame, expected):
    with pytest.raises(ValueError) as error:
        check_rows(codec, frame, 10)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value), str(error.value)
    predictor = RawRowsClassifier(torch.nn.Linear(len(codec.feature_names), 2), codec, {})
    with pytest.raises(RequestRefused, match="column"):  # in Python as served: the predictor itself refuses
        predictor.predict(None, frame)


@pytest.fixture(scope="module")
def typed():
    """A codec with each type a column can have: integer, continuous, text, number and true/false categories."""
    frame = pd.DataFrame({"age": [20, 30, 40, 50], "ratio": [0.5, 1.5, 2.5, 3.5], "home": ["own", "rent", "own", "rent"],
                          "grade": [1, 2, 3, 1], "member": [True, False, True, False], "y": ["a", "b", "a", "b"]})
    return TabularCodec.fit(frame, "y", spec={"columns": {"grade": {"kind": "categorical"}}})


def typed_row(**changes) -> pd.DataFrame:
    return pd.DataFrame([{"age": 30, "ratio": 1.5, "home": "own", "grade": 2, "member": True, **changes}])


def test_values_are_converted_to_their_columns_type_where_nothing_is_lost(typed):
    assert [(c["name"], c["type"]) for c in input_columns(typed)] == [
        ("age", "long"), ("ratio", "double"), ("home", "string"), ("grade", "long"), ("member", "boolean")]
    checked = check_rows(typed, typed_row(age=30.0, ratio=1, grade=2.0, member=np.bool_(False)), 1)
    assert checked.dtypes.astype(str).tolist() == ["int64", "float64", "object", "object", "object"]
    assert checked.iloc[0].tolist() == [30, 1.0, "own", 2, False]
    assert type(checked["grade"].iloc[0]) is int  # the category itself: encodes as 2 does
    np.testing.assert_array_equal(typed.encode(checked), typed.encode(typed_row(ratio=1.0, member=False)))
    mixed = pd.concat([typed_row(), typed_row(ratio=2.5)], ignore_index=True).astype(object)  # object columns
    assert check_rows(typed, mixed, 2)["ratio"].tolist() == [1.5, 2.5]


@pytest.mark.parametrize("changes, expected", [
    ({"age": "30"}, "rows: column 'age': '30' in row 1 is text; allowed: a number (in JSON without quotes)"),
    ({"ratio": "1.5"}, "rows: column 'ratio': '1.5' in row 1 is text; allowed: a number"),
    # as the training file wrote it (and explain.py reads it): "is not a number" did not say what to send
    ({"ratio": "$1,234.5"}, "rows: column 'ratio': '$1,234.5' in row 1 is text; allowed: a number (in JSON without "
                            "quotes), here 1234.5"),
    ({"ratio": "7.5%"}, "rows: column 'ratio': '7.5%' in row 1 is text; allowed: a number (in JSON without quotes), "
                        "here 7.5"),
    ({"age": 30.5}, "rows: column 'age': 30.5 in row 1 is not a whole number; allowed: whole numbers"),
    ({"age": True}, "rows: column 'age': True in row 1 is true/false; allowed: a number"),
    ({"ratio": [1.5]}, "rows: column 'ratio': [1.5] in row 1 is not a number"),
    ({"home": 1}, "rows: column 'home': unseen category 1 in row 1 (a number; the categories are text); allowed: own, rent"),
    ({"grade": "2"}, "rows: column 'grade': unseen category '2' in row 1 (text; the categories are a number); "
                     "allowed: 1, 2, 3"),
    ({"grade": True}, "rows: column 'grade': unseen category True in row 1 (true/false;"),
    ({"grade": 4}, "rows: column 'grade': unseen category 4 in row 1; allowed: 1, 2, 3"),
    ({"member": 1}, "rows: column 'member': unseen category 1 in row 1 (a number; the categories are true/false); "
                    "allowed: False, True"),
    ({"member": "false"}, "rows: column 'member': unseen category 'false' in row 1 (text;"),
])
def test_values_of_the_wrong_type_are_refused_not_converted(typed, changes, expected):
    with pytest.raises(ValueError) as error:
        check_rows(typed, typed_row(**changes), 1)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value), str(error.value)


def test_a_text_category_in_another_case_is_that_category_as_explain_py_reads_it(typed):
    """'Own' for the category 'own': explain.py read it with a note and the served model refused the same applicant
    as an unseen category. Only text matches text this way; 'false' is still not the category False."""
    assert check_rows(typed, typed_row(home="OWN"), 1)["home"].tolist() == ["own"]


def test_a_json_inputs_body_of_records_is_read_as_its_values(typed):
    """MLflow hands a body's ``{"inputs": [{"age": 30, ...}]}`` over as records of 0-d arrays; they were refused as
    "array(30) in row 0 is not a number"."""
    from mlflow.pyfunc.scoring_server import infer_and_parse_data

    from ct_lightning.experiment.runs.request_checks import as_rows

    schema = predictor_signature(typed).inputs  # the served predictor's own
    body = json.loads('{"inputs": [{"age": 30, "ratio": 1.5, "home": "own", "grade": 2, "member": true}]}')
    parsed = infer_and_parse_data(body, schema)
    assert isinstance(parsed, list) and isinstance(parsed[0]["age"], np.ndarray)  # as MLflow 3 hands it over
    checked = check_rows(typed, as_rows(parsed), 1)
    pd.testing.assert_frame_equal(checked, check_rows(typed, typed_row(), 1))


def test_in_a_text_column_the_value_that_is_no_number_at_all_is_named_first(typed):
    frame = pd.concat([typed_row(), typed_row()], ignore_index=True).astype({"age": object})
    frame["age"] = ["30", "lots"]  # as a CSV body reads when one value is not a number
    with pytest.raises(ValueError, match=r"^rows: column 'age': 'lots' in row 2 is not a number$"):
        check_rows(typed, frame, 2)


@pytest.mark.parametrize("frame, expected", [
    (rows().drop(columns="income"), "rows: missing column 'income'; the model needs age, income,"),
    (rows(debt=None), "rows: column 'debt': missing value in row 1"),
    (rows(purpose="yacht"), "rows: column 'purpose': unseen category 'yacht' in row 1; allowed: "),
    (rows(sex="unknown"), "rows: column 'sex': unseen category 'unknown' in row 1; allowed: female, male"),
    (rows(age=400), "rows: column 'age': 400 in row 1 is outside the model's domain; allowed: "),
    (rows(income=float("inf")), "rows: column 'income': inf in row 1 is not a finite number"),
    (pd.concat([rows(), rows(income="lots")], ignore_index=True), "rows: column 'income': 'lots' in row 2 is not a number"),
    (rows().iloc[:0], "rows: the request holds no rows"),
    (pd.concat([rows()] * 11, ignore_index=True), "rows: 11 rows in one request; allowed: at most 10"),
])
def test_bad_rows_get_one_line_naming_the_column_and_what_is_allowed(codec, frame, expected):
    with pytest.raises(ValueError) as error:
        check_rows(codec, frame, 10)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


def test_the_domain_is_the_training_range_widened_or_the_declared_bounds(codec):
    age = next(c for c in codec.columns if c.name == "age")
    low, high = age.domain()
    assert low == pytest.approx(min(age.mean - 3 * age.scale, age.train_min)) and high >= age.train_max
    check_rows(codec, rows(age=int(high)), 1)  # the edge is inside
    assert low != int(low), "the fixture's age domain starts at a fraction"
    with pytest.raises(ValueError, match=f"allowed: {math.ceil(low)} to {math.floor(high)} \\(the training rows' range widened to "
                                         r"mean \+/- 3 sd; to accept more, declare lower/upper in --data-spec and "
                                         r"train again\)$"):
        check_rows(codec, rows(age=int(high) + 1), 1)  # a whole number: age is an integer column
    declared = TabularCodec.fit(pd.read_csv(LOANS), "approved", spec={"columns": {"age": {"lower": 18, "upper": 70}}})
    refusal = r"'age': 71 in row 1 is outside the model's domain; allowed: 18 to 70 \(the data spec's bounds\)$"
    with pytest.raises(ValueError, match=refusal):
        check_rows(declared, rows(age=71), 1)
    lower, upper = declared.encoded_bounds()  # the search keeps to the same domain
    age = declared.columns[0]
    assert lower[0] * age.scale + age.mean == pytest.approx(18) and upper[0] * age.scale + age.mean == pytest.approx(70)


def test_a_column_without_negative_training_values_is_not_widened_below_zero(codec):
    debt = next(c for c in codec.columns if c.name == "debt")
    assert debt.train_min >= 0 and debt.mean - 3 * debt.scale < 0, "the fixture's debt is widened below 0 by 3 sd"
    low, high = debt.domain()
    assert low == 0 and high == pytest.approx(max(debt.mean + 3 * debt.scale, debt.train_max))
    check_rows(codec, rows(debt=0), 1)
    with pytest.raises(ValueError, match=r"'debt': -1 in row 1 is outside the model's domain; allowed: 0 to .*not "
                                         r"below 0: no training value is negative; to accept more, declare lower/upper in --data-spec and train "
                                         r"again\)$"):
        check_rows(codec, rows(debt=-1), 1)
    lower, _ = codec.encoded_bounds()  # the search keeps to the same domain
    assert 0 <= float(lower[codec.feature_names.index("debt")]) * debt.scale + debt.mean < 1e-2  # one float32 step
    frame = pd.read_csv(LOANS).assign(debt=lambda f: f["debt"] - f["debt"].min() - 1)  # one negative value
    shifted = next(c for c in TabularCodec.fit(frame, "approved").columns if c.name == "debt")
    assert not shifted.floored_at_zero and shifted.domain()[0] == pytest.approx(shifted.mean - 3 * shifted.scale)


def test_a_column_named_in_another_case_is_refused_with_the_models_spelling(codec):
    """explain.py --immutable Age said only "(no such column)", where train.py's --immutable Age says "did you mean
    'age'? names are case-sensitive"; explain.py and a served request's params share this check."""
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability

    with pytest.raises(MutabilityRefused) as refused:
        requested_mutability(codec, {"immutable": "Age,sex"})
    assert str(refused.value).startswith("params: immutable 'Age' (no such column; did you mean 'age'? names are "
                                         "case-sensitive); allowed: the model's columns: age, "), str(refused.value)
    with pytest.raises(MutabilityRefused, match=r"\(no such column; did you mean 'age'\?\); allowed"):
        requested_mutability(codec, {"mutability": "agee=none"})  # a misspelling is hinted as in a data spec
    with pytest.raises(MutabilityRefused, match=r"\(no such column\); allowed"):
        requested_mutability(codec, {"mutability": "zzz=none"})


def test_a_column_given_two_kinds_is_refused(codec):
    """A request (as explain.py) naming a column immutable and increasing, or twice with two kinds, was answered with
    the last one's explanation (income moved though it was named immutable): neither can be told to be meant."""
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability

    with pytest.raises(MutabilityRefused) as refused:
        requested_mutability(codec, {"immutable": "income,sex", "mutability": "income=increase"})
    assert str(refused.value) == ("params: mutability 'income=increase' ('income' is also given as immutable); "
                                  "allowed: income=none, or 'income' in only one of them")
    with pytest.raises(MutabilityRefused, match=r"^params: mutability 'debt=decrease,debt=both' \('debt' given two "
                                                r"kinds, decrease and both\); allowed: one kind per feature$"):
        requested_mutability(codec, {"mutability": "debt=decrease,debt=both"})
    assert requested_mutability(codec, {"immutable": "age", "mutability": "age=none,age=none,debt=decrease"}) == \
        {"age": "none", "debt": "decrease"}  # the same kind twice says one thing


def test_a_request_may_hold_a_data_spec_kind_fixed_but_never_loosen_it():
    """The training's data spec states facts about the data (age only increases, sex never changes): an explanation
    asking ``sex=both`` used to be answered with sex changed."""
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability

    facts = TabularCodec.fit(pd.read_csv(LOANS), "approved", spec={"columns": {"age": {"mutability": "increase"},
                                                                              "sex": {"mutability": "none"}}})
    with pytest.raises(MutabilityRefused) as refused:
        requested_mutability(facts, {"mutability": "sex=both"})
    assert str(refused.value) == ("params: mutability 'sex=both' ('sex' is none in the model's data spec, a fact about "
                                  "the data that holds in every training and evaluation); allowed: sex=none, or "
                                  "a model trained with another data spec")
    with pytest.raises(MutabilityRefused, match=r"'age=decrease' \('age' is increase in the model's data spec"):
        requested_mutability(facts, {"mutability": "debt=decrease,age=decrease"})
    assert requested_mutability(facts, {"immutable": "age", "mutability": "sex=none,debt=increase"}) == \
        {"age": "none", "sex": "none", "debt": "increase"}


def test_params_target_and_max_steps(codec):
    check_params(codec, {"explain": True, "target": "yes", "max_steps": 50})
    check_params(codec, {"target": "", "max_steps": 0})
    with pytest.raises(ValueError, match="params: target 'maybe'; allowed: no, yes"):
        check_params(codec, {"explain": True, "target": "maybe"})
    with pytest.raises(ValueError, match=f"params: max_steps {MAX_STEPS + 1}; allowed: 0 .* to {MAX_STEPS}"):
        check_params(codec, {"max_steps": MAX_STEPS + 1})


def test_the_target_params_default_names_the_classes_and_means_none(codec):
    """MLflow refuses a target of another type (a JSON number) before the predictor runs, showing the param's
    default: that default names the classes, and the predictor reads it as no target (the most likely other)."""
    spec = next(p for p in predictor_signature(codec).params.params if p.name == "target")
    assert spec.dtype.name == "string" and spec.default == target_default(codec)
    assert "allowed: no, yes" in repr(spec)
    check_params(codec, {"explain": True, "target": spec.default})
    assert requested_target(codec, {"target": spec.default}) is None and requested_target(codec, {"target": ""}) is None
    assert requested_target(codec, {"target": "yes"}) == "yes"
    with pytest.raises(ValueError, match="params: target '0'; allowed: no, yes"):  # the label, not the class's index
        check_params(codec, {"explain": True, "target": "0"})


def test_row_limits_come_from_the_servers_environment(monkeypatch, codec):
    monkeypatch.delenv("CT_SERVE_MAX_ROWS", raising=False)
    monkeypatch.delenv("CT_SERVE_MAX_EXPLAIN_ROWS", raising=False)
    monkeypatch.delenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", raising=False)
    assert row_limit() == row_limit(explain=True) == float("inf")  # batch scoring in Python: any size
    predictor = RawRowsClassifier(torch.nn.Linear(len(codec.feature_names), 2), codec, {})
    assert len(predictor.predict(None, pd.concat([rows()] * 10_001, ignore_index=True))) == 10_001
    monkeypatch.setenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "true")  # as mlflow models serve sets it
    assert (row_limit(), row_limit(explain=True)) == (10_000, 100)
    monkeypatch.setenv("CT_SERVE_MAX_ROWS", "25")
    assert row_limit() == 25
    monkeypatch.setenv("CT_SERVE_MAX_EXPLAIN_ROWS", "none")
    with pytest.raises(RuntimeError, match="CT_SERVE_MAX_EXPLAIN_ROWS: 'none' on the server; allowed: a whole number"):
        row_limit(explain=True)


class _Broken(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("weights on a lost device\nsecond line")


def test_the_predictor_refuses_with_400_and_fails_with_500_in_one_line(codec):
    model = torch.nn.Linear(len(codec.feature_names), 2)
    predictor = RawRowsClassifier(model, codec, {"max_steps": 10})
    assert list(predictor.predict(None, rows())["prediction"]) in (["no"], ["yes"])
    with pytest.raises(RequestRefused) as refused:
        predictor.predict(None, rows(purpose="yacht"))
    assert refused.value.get_http_status_code() == 400
    refused.value.message = f"Failed to predict data '{rows()}'. \nError: {refused.value.message}"  # as the server does
    answer = json.loads(refused.value.serialize_as_json())
    assert answer["message"].startswith("rows: column 'purpose': unseen category 'yacht'") and "\n" not in answer["message"]
    with pytest.raises(RequestRefused, match="params: target 'maybe'"):
        predictor.predict(None, rows(), params={"explain": True, "target": "maybe"})
    with pytest.raises(PredictorFailed) as failed:
        RawRowsClassifier(_Broken(), codec, {}).predict(None, rows())
    assert failed.value.get_http_status_code() == 500
    assert failed.value.message == ("the predictor failed on this request (RuntimeError: weights on a lost device); "
                                    "the server's log has the details")


# --- the same requests to a real served model ---------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny training on the loans table: ``(run id, tracking URI, folder)``."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("served")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    summary = train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "tracking_uri": uri,
                     "progress": False, "seed": 3, "checkpoint_dir": str(folder / "ckpt")})
    return summary["run_id"], uri, folder


@pytest.fixture(scope="module")
def served(trained):
    """The predictor of ``trained``, served by ``mlflow models serve``: ``(port, log)``."""
    run_id, uri, folder = trained
    process, port = serve(f"runs:/{run_id}/predictor", uri, folder)
    yield port, folder / "serve.log"
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def send(port: int, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
    """POST ``body`` to ``/invocations``: the status and the body of the answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def records(*rows_, **params) -> bytes:
    return json.dumps({"dataframe_records": list(rows_), **({"params": params} if params else {})}).encode()


WITHOUT_INCOME = {k: v for k, v in APPLICANT.items() if k != "income"}
# (body, words the message must hold, whether the message is ours: one line, no echo of the request)
BAD_REQUESTS = {
    "missing column": (records(WITHOUT_INCOME), ["rows: missing column 'income'; the model needs age, income"], True),
    "extra column": (records({**APPLICANT, "colour": "red"}), ["rows: unknown column 'colour'; the model needs age, "
                                                              "income", "sex and no other columns"], True),
    "target column": (records({**APPLICANT, "approved": "yes"}), ["unknown column 'approved'"], True),
    "wrong type": (records({**APPLICANT, "income": "lots"}), ["'income'", "'lots' in row 1 is not a number"], True),
    "number as text": (records({**APPLICANT, "income": "40000"}), ["'income'", "'40000' in row 1 is text"], True),
    "fraction in an integer column": (records({**APPLICANT, "age": 40.5}), ["'age'", "40.5", "not a whole number"], True),
    "true/false for a number": (records({**APPLICANT, "age": True}), ["'age'", "True", "is true/false"], True),
    "number for a category": (records({**APPLICANT, "purpose": 3}), ["'purpose'", "unseen category 3 ", "car"], True),
    "unseen category": (records({**APPLICANT, "purpose": "yacht"}), ["'purpose'", "'yacht'", "allowed: car"], True),
    "out-of-domain value": (records({**APPLICANT, "age": 400}), ["'age'", "400", "outside the model's domain",
                                                                  "allowed:"], True),
    "missing number": (records({**APPLICANT, "age": None}), ["'age'", "missing value in row 1"], True),
    "missing category": (records({**APPLICANT, "purpose": None}), ["'purpose'", "missing value in row 1"], True),
    "empty body": (b"", ["valid JSON"], False),
    "no rows": (records(), ["the request holds no rows", "age"], True),
    "oversized body": (records(*[APPLICANT] * 10_001), ["10001 rows", "at most 10000"], True),
    "oversized explain": (records(*[APPLICANT] * 101, explain=True), ["101 rows", "at most 100"], True),
    "unknown target class": (records(APPLICANT, explain=True, target="maybe"), ["target 'maybe'", "no, yes"], True),
    # the class's index is not the class (as with explain.py --target 0); as a JSON number MLflow refuses it first
    "target class as its index": (records(APPLICANT, explain=True, target="0"), ["target '0'; allowed: no, yes"], True),
    "target as a JSON number": (records(APPLICANT, explain=True, target=0), ["target", "Can not safely convert",
                                                                              "allowed: no, yes, as text"], False),
    "unknown immutable column": (records(APPLICANT, explain=True, immutable="age,agee"),
                                 ["params: immutable 'agee' (no such column; did you mean 'age'?); allowed: the model's columns: age"], True),
    "direction on a category": (records(APPLICANT, explain=True, mutability="purpose=increase"),
                                ["params: mutability 'purpose=increase' ('purpose' is categorical); allowed: both or "
                                 "none"], True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_a_4xx_naming_the_column(served, case):
    port, _ = served
    body, words, ours = BAD_REQUESTS[case]
    status, text = send(port, body)
    assert 400 <= status < 500, (status, text[:2000])
    assert "Traceback" not in text and "stack_trace" not in text, text[:2000]
    message = json.loads(text)["message"]
    for word in words:
        assert word in message, (word, message[:2000])
    if ours:
        assert "\n" not in message and not message.startswith("Failed to predict"), message[:2000]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["0", "1"])
def test_explain_cli_and_server_agree_on_a_class_given_by_its_index(trained, served, target, tmp_path):
    """explain.py --target 0 and a served request's target 0 (text or number) are refused alike, naming the
    classes; the class's label is answered by both."""
    run_id, uri, _ = trained
    port, _ = served
    argv = ["--run-id", run_id, "--tracking-uri", uri, "--row", json.dumps(APPLICANT), "--max-steps", "5", "--no-log"]
    done = run_script(ROOT / "recipes" / "explain.py", [*argv, "--target", target], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == f"error: --target: got '{target}'; allowed: no, yes"
    for sent in (target, int(target)):
        status, text = send(port, records(APPLICANT, explain=True, target=sent))
        assert status == 400 and "allowed: no, yes" in json.loads(text)["message"], text[:2000]
    assert run_script(ROOT / "recipes" / "explain.py", [*argv, "--target", "yes"], cwd=tmp_path).returncode == 0
    status, text = send(port, records(APPLICANT, explain=True, target="yes", max_steps=5))
    assert status == 200 and json.loads(text)["predictions"][0]["target"] == "yes"


@pytest.mark.slow
def test_a_csv_body_is_checked_as_a_json_one(served):
    port, _ = served
    header = ",".join(APPLICANT)
    good = "\n".join([header, ",".join(map(str, APPLICANT.values()))]).encode()
    assert send(port, good, "text/csv")[0] == 200
    bad = "\n".join([header, ",".join(map(str, APPLICANT.values())),
                     ",".join(map(str, {**APPLICANT, "income": "lots"}.values()))]).encode()
    status, text = send(port, bad, "text/csv")
    assert status == 400 and json.loads(text)["message"] == "rows: column 'income': 'lots' in row 2 is not a number"


@pytest.mark.slow
def test_values_mlflow_used_to_convert_are_answered_as_the_plain_ones(served):
    port, log = served
    plain = send(port, records(APPLICANT))
    floats = send(port, records({**APPLICANT, "age": 40.0, "income": 40000.0}))  # whole numbers sent as JSON floats
    assert plain[0] == floats[0] == 200
    np.testing.assert_allclose(json.loads(floats[1])["predictions"][0]["probability"],
                               json.loads(plain[1])["predictions"][0]["probability"], rtol=1e-6)
    assert "will be ignored" not in log.read_text()  # MLflow drops nothing: no input schema to drop by


@pytest.mark.slow
def test_a_request_holds_columns_in_its_explanations_on_top_of_the_runs_constraints(trained):
    """The params immutable and mutability (as explain.py's options) hold in the served model's explanations of a
    run trained without constraints; unknown columns and kinds are refused before any search."""
    import mlflow.pyfunc

    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri

    run_id, uri, _ = trained
    with _tracking_uri(uri):
        predictor = mlflow.pyfunc.load_model(f"runs:/{run_id}/predictor")
    frame = pd.read_csv(LOANS).drop(columns="approved").head(30)
    free = predictor.predict(frame, params={"explain": True, "target": "yes", "max_steps": 60})
    moved = [c for changes in free["changes"] for c in changes]
    assert any(c["feature"] == "age" for c in moved) and any(c["feature"] == "debt" and c["to"] > c["from"]
                                                             for c in moved), "unconstrained, age and debt move up"
    held = predictor.predict(frame, params={"explain": True, "target": "yes", "max_steps": 60, "immutable": "age,sex",
                                            "mutability": "debt=decrease"})
    assert any(len(changes) for changes in held["changes"]), "the search moved some column"
    for changes, counterfactual, row in zip(held["changes"], held["counterfactual"], frame.to_dict("records")):
        named = {c["feature"]: c for c in changes}
        assert not {"age", "sex"} & set(named) and counterfactual["age"] == row["age"], changes
        assert "debt" not in named or named["debt"]["to"] <= named["debt"]["from"], changes
    for params, words in (({"immutable": "agee"}, "params: immutable 'agee' (no such column; did you mean 'age'?)"),
                          ({"mutability": "debt=up"}, "params: mutability 'debt=up' (no such kind); allowed: both,"),
                          ({"mutability": "debt"}, "params: mutability: expected FEATURE=KIND, got 'debt'")):
        with pytest.raises(RequestRefused) as refused:
            predictor.predict(frame.head(1), params={"explain": True, **params})
        assert refused.value.message.startswith(words), refused.value.message


@pytest.mark.slow
def test_a_request_asks_for_changes_in_whole_steps_and_within_a_largest_change(trained):
    """The param step (as explain.py's --step) makes the served model's explanations change income and debt only by
    whole steps from each row's value, and max_change (as --max-change) by at most that much, where without them they
    do not; a bad step or largest change is a 400 before any search."""
    import mlflow.pyfunc

    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri

    run_id, uri, _ = trained
    with _tracking_uri(uri):
        predictor = mlflow.pyfunc.load_model(f"runs:/{run_id}/predictor")
    frame = pd.read_csv(LOANS).drop(columns="approved").head(30)
    steps = {"income": 1000, "debt": 500}

    def stepped_changes(**params) -> list[dict]:
        answer = predictor.predict(frame, params={"explain": True, "target": "yes", "max_steps": 60, **params})
        return [c for changes in answer["changes"] for c in changes if c["feature"] in steps]

    free, asked = stepped_changes(), stepped_changes(step="income=1000, debt=500")
    assert any((c["to"] - c["from"]) % steps[c["feature"]] for c in free), "without steps, some change is not whole"
    assert asked and all((c["to"] - c["from"]) % steps[c["feature"]] == 0 for c in asked), asked
    limited = stepped_changes(max_change="income=2000,debt=1000")
    assert limited and all(abs(c["to"] - c["from"]) <= steps[c["feature"]] * 2 for c in limited), limited
    assert any(abs(c["to"] - c["from"]) > steps[c["feature"]] * 2 for c in free), "without it, some move further"
    with pytest.raises(RequestRefused) as refused:
        predictor.predict(frame.head(1), params={"explain": True, "max_change": "age=1.5"})
    assert refused.value.message == "params: max_change 'age=1.5' ('age' is integer); allowed: a whole number such as " \
                                    "1 or 5", refused.value.message
    with pytest.raises(RequestRefused) as refused:
        predictor.predict(frame.head(1), params={"explain": True, "step": "purpose=2"})
    assert refused.value.message.startswith("params: step 'purpose=2' ('purpose' is categorical); allowed: "
                                            "COLUMN=NUMBER for the model's number columns: age, income"), \
        refused.value.message
