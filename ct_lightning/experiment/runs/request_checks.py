"""Requests to a served ``predictor`` checked before the model runs: each refusal is one line naming the column.

MLflow's scoring server (``mlflow models serve``) parses the JSON body and enforces the logged signature before
the predictor sees the rows: it refuses a body that is not JSON, a missing column, and a value that cannot take
its column's type (``"income": "lots"``) with a 400 of its own, and it drops columns the signature does not
name (with a warning in the server's log). What a signature cannot say is checked here, against the fitted
preprocessing: how many rows one request may hold, missing values, categories never seen in training, numbers
outside the model's domain, and the ``target``/``max_steps`` parameters.

:func:`check_rows` and :func:`check_params` raise a one-line ``ValueError``; the predictor answers it as
:class:`RequestRefused` (HTTP 400, the message as it is).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

MAX_ROWS = ("CT_SERVE_MAX_ROWS", 10_000)  # rows in one prediction request
MAX_EXPLAIN_ROWS = ("CT_SERVE_MAX_EXPLAIN_ROWS", 100)  # rows in one request with explain=true (a search per row)
MAX_STEPS = 10_000  # the most search steps a request may ask for (params max_steps)


class OneLineError(MlflowException):
    """An MLflow error whose message the scoring server sends exactly as given.

    The server rewrites the message of an ``MlflowException`` raised in ``predict`` to
    ``Failed to predict data '<the whole input, printed>'. Error: ...``; this message stays as first set, so
    the answer is one line and does not echo the request."""

    @property
    def message(self) -> str:  # noqa: D102 - the message given
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_message"):
            self._message = value


class RequestRefused(OneLineError):
    """A bad request: HTTP 400 with a one-line message."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


class PredictorFailed(OneLineError):
    """The predictor failed on a request it accepted: HTTP 500 with a one-line message (the traceback is logged
    by the server, never sent)."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INTERNAL_ERROR)


def serving() -> bool:
    """Whether this process is MLflow's scoring server (``mlflow models serve`` marks its environment)."""
    return os.environ.get("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "").strip().lower() in ("true", "1")


def row_limit(explain: bool = False) -> float:
    """The most rows one served request may hold: ``$CT_SERVE_MAX_ROWS`` (default 10000), with ``explain``
    ``$CT_SERVE_MAX_EXPLAIN_ROWS`` (default 100), as set where the server runs. No limit outside the scoring
    server: ``mlflow.pyfunc.load_model(URI).predict(rows)`` in Python scores a table of any size."""
    if not serving():
        return math.inf
    name, default = MAX_EXPLAIN_ROWS if explain else MAX_ROWS
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise RuntimeError(f"{name}: {raw!r} on the server; allowed: a whole number of rows, at least 1")
    return value


def _number(value) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def _shown(value) -> str:
    """A request's value as the client wrote it (numpy scalars as plain Python values)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _first(mask: pd.Series) -> int:
    return int(mask.to_numpy().nonzero()[0][0])


def check_rows(codec, frame: pd.DataFrame, max_rows: int) -> pd.DataFrame:
    """The model's columns of ``frame``, in the codec's order, once every row is one the model can answer;
    else a one-line ``ValueError`` naming the column, the row (0-based), the value and what is allowed.

    Refused: no rows or more than ``max_rows``, a missing column, a missing value, a category the training rows
    did not have, a number that is not finite or lies outside the column's domain (declared bounds, else the
    training range widened to mean ± 3 sd: the domain the counterfactual search keeps to). Columns the model does
    not know are left out, as MLflow's signature enforcement leaves them out when served."""
    names = [c.name for c in codec.columns]
    if len(frame) == 0:
        raise ValueError(f"rows: the request holds no rows; send at least one row with the columns {', '.join(names)}")
    if len(frame) > max_rows:
        raise ValueError(f"rows: {len(frame)} rows in one request; allowed: at most {max_rows} "
                         f"(split the request, or raise the limit where the server runs)")
    missing = [n for n in names if n not in frame.columns]
    if missing:
        raise ValueError(f"rows: missing column {', '.join(map(repr, missing))}; the model needs {', '.join(names)}")
    for column in codec.columns:
        values = frame[column.name]
        if values.isna().any():
            raise ValueError(f"rows: column {column.name!r}: missing value in row {_first(values.isna())}")
        if column.kind in ("categorical", "binary") and getattr(column, "categories", None):
            known = {str(c) for c in column.categories}
            unseen = ~values.map(lambda v: str(v) in known)
            if unseen.any():
                row = _first(unseen)
                raise ValueError(f"rows: column {column.name!r}: unseen category {_shown(values.iloc[row])} in row {row}; "
                                 f"allowed: {', '.join(map(str, column.categories))}")
            continue
        numeric = pd.to_numeric(values, errors="coerce").astype(float)
        bad = ~np.isfinite(numeric.to_numpy())  # not a number (NaN after the conversion) or infinite
        if bad.any():
            row = int(bad.nonzero()[0][0])
            raise ValueError(f"rows: column {column.name!r}: {_shown(values.iloc[row])} in row {row} is not a finite number")
        domain = getattr(column, "domain", None)  # a hand-made codec's columns may know no domain
        low, high = (domain() if domain else None) or (-math.inf, math.inf)
        outside = (numeric < low) | (numeric > high)
        if outside.any():
            row = _first(outside)
            declared = (getattr(column, "lower", None) is not None) + (getattr(column, "upper", None) is not None)
            source = ("the data spec's bounds", "the data spec's bound and the training rows' range widened to "
                      "mean +/- 3 sd", "the training rows' range widened to mean +/- 3 sd")[2 - declared]
            raise ValueError(f"rows: column {column.name!r}: {_number(numeric.iloc[row])} in row {row} is outside the "
                             f"model's domain; allowed: {_number(low)} to {_number(high)} ({source})")
    return frame[names]


def check_params(codec, params: dict) -> None:
    """Refuse a ``target`` that is not one of the model's classes and a ``max_steps`` outside 0 … 10000
    (one-line ``ValueError``)."""
    target = params.get("target")
    if target not in (None, "") and str(target) not in {str(c) for c in codec.classes}:
        raise ValueError(f"params: target {target!r}; allowed: {', '.join(map(str, codec.classes))}")
    steps = params.get("max_steps")
    if steps not in (None, "") and not 0 <= int(steps) <= MAX_STEPS:
        raise ValueError(f"params: max_steps {steps}; allowed: 0 (the run's own setting) to {MAX_STEPS}")
