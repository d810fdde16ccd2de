"""Where the MLflow tracking store is, and the checks that it can be used, before any work (no MLflow import).

The runs (``runs/tracking.py``) open and write the store; this module only names it and checks it, so that the
settings and the start-up checks need nothing from the run layer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ct_lightning.experiment.configuration.validation import EnvironmentProblem, InputError, check_writable_folder

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
DEFAULT_EXPERIMENT = "ct-lightning"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variable: a team points every command at its server once


def default_tracking_uri() -> str:
    """The store a command uses when no ``--tracking-uri`` (or config file) names one: ``$MLFLOW_TRACKING_URI``, as
    every MLflow client reads it, else the local default :data:`DEFAULT_TRACKING_URI`."""
    return os.environ.get(TRACKING_URI_ENV, "").strip() or DEFAULT_TRACKING_URI


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


# The schemes MLflow 3 opens a tracking store for (``mlflow.tracking._tracking_service.utils``), besides plugins';
# a database URI may name its driver (``postgresql+psycopg2://``).
MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks", "databricks-uc", "uc")
STORE_ALLOWED = ("http(s)://HOST:PORT (a tracking server), sqlite:///PATH/mlflow.db (a local store), or another "
                 "store MLflow opens")


def known_schemes() -> list[str]:
    """The URI schemes MLflow opens a tracking store for: its own and those of installed plugins (read from the
    packages' entry points, without importing MLflow)."""
    from importlib.metadata import entry_points

    return [*MLFLOW_SCHEMES, *(point.name for point in entry_points(group="mlflow.tracking_store"))]


def check_scheme(tracking_uri: str, option: str) -> None:
    """A URI of the form ``SCHEME://...`` names a scheme MLflow knows; a slip (``htp://``) is refused in one line."""
    if "://" not in tracking_uri:
        return
    scheme = tracking_uri.split("://", 1)[0]
    known = known_schemes()
    if scheme.split("+", 1)[0].lower() in known:
        return
    import difflib

    close = difflib.get_close_matches(scheme.lower(), known, n=1)
    hint = f"; did you mean {close[0]}://{tracking_uri.split('://', 1)[1]}?" if close else ""
    raise InputError(option, tracking_uri, f"{STORE_ALLOWED} ({', '.join(known)})", f"unknown scheme {scheme!r}{hint}")


def check_tracking_reachable(tracking_uri: str, option: str = "--tracking-uri", timeout: float = 3.0) -> None:
    """Fail fast, naming the URI, when the tracking store cannot be used (no MLflow import).

    A URI's scheme must be one MLflow knows. HTTP(S) servers get one short request, ``/health``, which an MLflow
    server answers ``OK`` (a login asked by a proxy in front of it counts too: MLflow's client sends the credentials);
    another answer is a server that is no MLflow server. A local SQLite store's folder must exist or be creatable,
    and be writable. Other schemes are left to MLflow.
    """
    check_scheme(tracking_uri, option)
    if tracking_uri.startswith(("http://", "https://")):
        check_server_answers(tracking_uri, option, timeout)
    elif tracking_uri.startswith("sqlite:///"):
        check_writable_folder(option, local_store_dir(tracking_uri))
    elif tracking_uri.startswith("sqlite:") or not tracking_uri.strip():
        raise EnvironmentProblem(f"{option}: {tracking_uri!r} is not a usable store; a local store is "
                                 f"sqlite:///PATH/mlflow.db")
    elif is_folder_store(tracking_uri) and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        folder = tracking_uri.removeprefix("file://").removeprefix("file:")
        slip = re.match(r"(https?):?/+(.+)", tracking_uri)  # http//HOST:PORT, http:/HOST:PORT
        if slip:
            raise InputError(option, tracking_uri, STORE_ALLOWED, f"did you mean {slip[1]}://{slip[2]}?")
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


def check_server_answers(tracking_uri: str, option: str, timeout: float) -> None:
    """The MLflow tracking server at ``tracking_uri`` answers its ``/health`` request; else one line: nothing answers
    (or a proxy says the server behind it is down: HTTP 5xx), or what answers is not an MLflow server."""
    import urllib.error
    import urllib.request

    url = tracking_uri.rstrip("/") + "/health"
    down = (f"{option}: no MLflow tracking server answers at {tracking_uri} within {timeout:g} s ({{}}); start it, or "
            f"use the local default {DEFAULT_TRACKING_URI}")
    other = (f"{option}: {tracking_uri} answers, but not as an MLflow tracking server (GET /health: {{}}); allowed: "
             "the address of an `mlflow server` (check the port)")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = answer.read(64)
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return  # a login in front of the server: MLflow's client sends MLFLOW_TRACKING_USERNAME/PASSWORD
        raise EnvironmentProblem((down if error.code >= 500 else other).format(f"HTTP {error.code}")) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise EnvironmentProblem(down.format(getattr(error, "reason", error))) from None
    if body.strip() != b"OK":
        raise EnvironmentProblem(other.format(f"HTTP 200 with {body[:40]!r}, where an MLflow server says 'OK'"))
