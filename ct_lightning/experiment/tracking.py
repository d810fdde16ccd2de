"""MLflow tracking: the default local SQLite store and atomic result files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
DEFAULT_EXPERIMENT = "ct-lightning"


def prepare_store(tracking_uri: str) -> str | None:
    """Create the folder of a local SQLite store; return the artifact location to use with it.

    MLflow 3 rejects the old file store, so local runs track in SQLite and keep artifacts as
    files in ``artifacts/`` next to the database.
    """
    if tracking_uri.startswith("sqlite:///"):
        store = local_store_dir(tracking_uri)
        store.mkdir(parents=True, exist_ok=True)
        return (store / "artifacts").resolve().as_uri()
    return None


def local_store_dir(tracking_uri: str) -> Path:
    """Folder of a local SQLite store (where checkpoints go by default); ``mlruns`` otherwise."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri[len("sqlite:///"):]).parent
    return Path("mlruns")


def ui_command(tracking_uri: str) -> str:
    """The shell command that opens the MLflow UI on ``tracking_uri``."""
    return f"mlflow ui --backend-store-uri {tracking_uri} --port 5000"


def run_url(experiment_id: str, run_id: str, port: int = 5000) -> str:
    """Address of a run in a local MLflow UI."""
    return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}"


def write_json_atomic(path: str | os.PathLike, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
