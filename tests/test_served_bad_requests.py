"""Bad requests to a served predictor get a 4xx answer naming the column, never a 500 or a traceback.

The fast tests check the request checks and the predictor's answers in process; the slow ones send each bad
request to a real ``mlflow models serve`` of a real tiny training on the loans table (integer, categorical and
binary columns)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_served_model import serve

from ct_lightning.experiment.runs.request_checks import (
    MAX_STEPS, PredictorFailed, RequestRefused, check_params, check_rows, row_limit)
from ct_lightning.experiment.runs.served_model import RawRowsClassifier
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

def test_good_rows_pass_in_the_models_column_order_without_unknown_columns(codec):
    frame = rows(colour="red")[["colour", *reversed(list(APPLICANT))]]
    checked = check_rows(codec, frame, 10)
    assert list(checked.columns) == [c.name for c in codec.columns]


@pytest.mark.parametrize("frame, expected", [
    (rows().drop(columns="income"), "rows: missing column 'income'; the model needs age, income,"),
    (rows(debt=None), "rows: column 'debt': missing value in row 0"),
    (rows(purpose="yacht"), "rows: column 'purpose': unseen category 'yacht' in row 0; allowed: "),
    (rows(sex="unknown"), "rows: column 'sex': unseen category 'unknown' in row 0; allowed: female, male"),
    (rows(age=400), "rows: column 'age': 400 in row 0 is outside the model's domain; allowed: "),
    (rows(income=float("inf")), "rows: column 'income': inf in row 0 is not a finite number"),
    (pd.concat([rows(), rows(income="lots")], ignore_index=True), "rows: column 'income': 'lots' in row 1 is not a finite"),
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
    with pytest.raises(ValueError, match=f"allowed: {low:.6g} to {high:.6g} \\(the training rows' range widened"):
        check_rows(codec, rows(age=high + 1), 1)
    declared = TabularCodec.fit(pd.read_csv(LOANS), "approved", spec={"columns": {"age": {"lower": 18, "upper": 70}}})
    refusal = r"'age': 71 in row 0 is outside the model's domain; allowed: 18 to 70 \(the data spec's bounds\)$"
    with pytest.raises(ValueError, match=refusal):
        check_rows(declared, rows(age=71), 1)
    lower, upper = declared.encoded_bounds()  # the search keeps to the same domain
    age = declared.columns[0]
    assert lower[0] * age.scale + age.mean == pytest.approx(18) and upper[0] * age.scale + age.mean == pytest.approx(70)


def test_params_target_and_max_steps(codec):
    check_params(codec, {"explain": True, "target": "yes", "max_steps": 50})
    check_params(codec, {"target": "", "max_steps": 0})
    with pytest.raises(ValueError, match="params: target 'maybe'; allowed: no, yes"):
        check_params(codec, {"explain": True, "target": "maybe"})
    with pytest.raises(ValueError, match=f"params: max_steps {MAX_STEPS + 1}; allowed: 0 .* to {MAX_STEPS}"):
        check_params(codec, {"max_steps": MAX_STEPS + 1})


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
def served(tmp_path_factory):
    """A tiny training on the loans table, its predictor served by ``mlflow models serve``: ``(port, log)``."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("served")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    summary = train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "tracking_uri": uri,
                     "progress": False, "seed": 3, "checkpoint_dir": str(folder / "ckpt")})
    process, port = serve(f"runs:/{summary['run_id']}/predictor", uri, folder)
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
    "missing column": (records(WITHOUT_INCOME), ["missing inputs ['income']"], False),
    "wrong type": (records({**APPLICANT, "income": "lots"}), ["income", "lots"], False),
    "number for a category": (records({**APPLICANT, "purpose": 3}), ["'purpose'", "unseen category 3 ", "car"], True),
    "unseen category": (records({**APPLICANT, "purpose": "yacht"}), ["'purpose'", "'yacht'", "allowed: car"], True),
    "out-of-domain value": (records({**APPLICANT, "age": 400}), ["'age'", "400", "outside the model's domain",
                                                                  "allowed:"], True),
    "missing number": (records({**APPLICANT, "age": None}), ["age"], False),
    "missing category": (records({**APPLICANT, "purpose": None}), ["'purpose'", "missing value in row 0"], True),
    "empty body": (b"", ["valid JSON"], False),
    "no rows": (records(), ["missing inputs", "'age'"], False),
    "oversized body": (records(*[APPLICANT] * 10_001), ["10001 rows", "at most 10000"], True),
    "oversized explain": (records(*[APPLICANT] * 101, explain=True), ["101 rows", "at most 100"], True),
    "unknown target class": (records(APPLICANT, explain=True, target="maybe"), ["target 'maybe'", "no, yes"], True),
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
def test_extra_columns_are_dropped_with_a_warning_in_the_servers_log(served):
    port, log = served
    plain = send(port, records(APPLICANT))
    extra = send(port, records({**APPLICANT, "colour": "red"}))
    assert plain[0] == extra[0] == 200
    np.testing.assert_allclose(json.loads(extra[1])["predictions"][0]["probability"],
                               json.loads(plain[1])["predictions"][0]["probability"], rtol=1e-6)
    assert "['colour']" in log.read_text() and "will be ignored" in log.read_text()
