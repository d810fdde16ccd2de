"""Where the MLflow tracking store is, and the checks that it can be used, before any work (no MLflow import).

The runs (``runs/tracking.py``) open and write the store; this module only names it and checks it, so that the
settings and the start-up checks need nothing from the run layer.
"""

from __future__ import annotations

import os
from pathlib import Path

from ct_lightning.experiment.configuration.validation import EnvironmentProblem, check_writable_folder

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
DEFAULT_EXPERIMENT = "ct-lightning"


def local_store_dir(tracking_uri: str) -> Path:
    """Folder of a local SQLite store (where checkpoints go by default); ``mlruns`` otherwise."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri[len("sqlite:///"):]).parent
    return Path("mlruns")


def anchor_tracking_uri(tracking_uri: str) -> str:
    """A local SQLite URI with an absolute path (``sqlite:///mlruns/mlflow.db`` → ``sqlite:////cwd/mlruns/mlflow.db``).

    The default store is relative to the folder a command runs from; anchoring it at start means every
    later step, and every printed command, names the same store wherever it is run.
    """
    if tracking_uri.startswith("sqlite:///") and not tracking_uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(tracking_uri[len("sqlite:///"):]).absolute())
    return tracking_uri


def store_location(tracking_uri: str) -> str:
    """What to print as "the store": the absolute database file of a local store, else the URI."""
    if tracking_uri.startswith("sqlite:///"):
        return str(Path(tracking_uri[len("sqlite:///"):]).absolute())
    return tracking_uri


def check_tracking_reachable(tracking_uri: str, option: str = "--tracking-uri", timeout: float = 3.0) -> None:
    """Fail fast, naming the URI, when the tracking store cannot be used (no MLflow import).

    HTTP(S) servers get one short request (any HTTP answer counts as reachable); a local SQLite
    store's folder must exist or be creatable, and be writable. Other schemes are left to MLflow.
    """
    if tracking_uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            return  # the server answered
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise EnvironmentProblem(f"{option}: no MLflow tracking server answers at {tracking_uri} "
                                     f"within {timeout:g} s ({reason}); start it, or use the local default "
                                     f"sqlite:///mlruns/mlflow.db") from None
    elif tracking_uri.startswith("sqlite:///"):
        check_writable_folder(option, local_store_dir(tracking_uri))
    elif tracking_uri.startswith("sqlite:") or not tracking_uri.strip():
        raise EnvironmentProblem(f"{option}: {tracking_uri!r} is not a usable store; a local store is "
                                 f"sqlite:///PATH/mlflow.db")
    elif is_folder_store(tracking_uri) and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        folder = tracking_uri.removeprefix("file://").removeprefix("file:")
        raise EnvironmentProblem(f"{option}: got {tracking_uri!r}, a folder store, which MLflow 3 refuses; allowed: "
                                 f"sqlite:///{folder.rstrip('/')}/mlflow.db (a local store), http(s)://HOST, or that "
                                 "folder with MLFLOW_ALLOW_FILE_STORE=true")


def is_folder_store(tracking_uri: str) -> bool:
    """Whether a tracking URI names MLflow's old folder store: a path, or a ``file:`` URI."""
    if tracking_uri.startswith("file:"):
        return True
    return bool(tracking_uri.strip()) and "://" not in tracking_uri and not tracking_uri.startswith(("sqlite:",
                                                                                                    "databricks"))


def check_store_exists(option: str, tracking_uri: str, wanted: str) -> None:
    """A store read from (to load ``wanted``) must exist: a local SQLite file is not created by reading."""
    check_tracking_reachable(tracking_uri, option)
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri[len("sqlite:///"):])
        if not database.is_file():
            raise EnvironmentProblem(f"{option}: no MLflow store at {database.absolute()} to find {wanted} in "
                                     f"(pass the --tracking-uri the run was tracked in)")
