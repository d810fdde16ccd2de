"""MLflow tracking: the default local SQLite store and its experiments (result files: ``atomic_files``)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; creation then relies on the retries alone
    fcntl = None

from ct_lightning.experiment.configuration.store import local_store_dir
from ct_lightning.experiment.runs.store_template import copy_template, keep_template


# Errors MLflow raises when several processes create the same store or experiment at once.
RACE_ERRORS = ("already exists", "database is locked", "UNIQUE constraint failed", "duplicate key")


@contextlib.contextmanager
def store_lock(store: Path):
    """An inter-process lock (``flock`` on ``store/.create.lock``) held while the store is created."""
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".create.lock", "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def retry_race(action, attempts: int = 8, delay: float = 0.25):
    """``action()``, tried again (with growing pauses) while it fails with a known store-creation race error."""
    for attempt in range(attempts):
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - MLflow and SQLAlchemy raise several types for the same race
            if attempt == attempts - 1 or not any(text in str(error) for text in RACE_ERRORS):
                raise
            time.sleep(delay * (attempt + 1))
    return None


def new_run(client, experiment_id: str, run_name: str | None = None, tags: dict | None = None):
    """``client.create_run`` with the tags MLflow's own ``mlflow.start_run`` adds under ``tags`` (its run context
    providers): ``mlflow.user`` (``MLFLOW_TRACKING_USERNAME``, as a server behind a password knows the user, else the
    login name), ``mlflow.source.name`` and ``.type``, and the script's git commit where it has one; the UI's User
    column and a search by user read them. The created run."""
    from mlflow.tracking.context.registry import resolve_tags  # noqa: PLC0415

    return client.create_run(experiment_id, run_name=run_name, tags=resolve_tags(dict(tags or {})))


def current_user() -> str:
    """The user :func:`new_run` names in a run's ``mlflow.user`` tag, as MLflow determines it."""
    from mlflow.tracking.context.registry import resolve_tags  # noqa: PLC0415

    return resolve_tags({}).get("mlflow.user", "unknown")


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"   # read by the MLflow 3 UI to choose its view
MODEL_TRAINING_KIND = "custom_model_development"  # the model-training view (not GenAI)


def ensure_experiment(client, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name`` in ``client``'s store: created if missing (once, even with many concurrent
    callers: the known races are retried) and marked so the UI opens its model-training view."""

    def get_or_create() -> str:
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(
            name, artifact_location=artifact_location)
        if found is None or found.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING_KIND:
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        return experiment_id

    return retry_race(get_or_create)


def prepare_store(tracking_uri: str, experiment: str | None = None) -> str | None:
    """Create a local SQLite store (and ``experiment``, if given: :func:`ensure_experiment`); return the artifact
    location to use with it.

    MLflow 3 rejects the old file store, so local runs track in SQLite and keep artifacts as
    files in ``artifacts/`` next to the database. Many processes may start at once on a fresh
    store: the database and the experiment are created under an inter-process lock, so none of
    them fails with ``table experiments already exists``. A new database starts as a copy of the
    empty store MLflow created before (:mod:`~ct_lightning.experiment.runs.store_template`), else
    MLflow creates it (and it becomes that template). A server store (``http://...``) creates
    its own tables; there only the experiment is created, with retries.
    """
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///"):
        store = local_store_dir(tracking_uri)
        database = Path(tracking_uri[len("sqlite:///"):])
        artifacts = (store / "artifacts").resolve().as_uri()
        with store_lock(store):
            new = "?" not in tracking_uri and database.name != ":memory:" and not database.exists()
            copied = new and copy_template(database)  # MLflow's migrations ran once, for the template
            client = MlflowClient(tracking_uri=tracking_uri)
            retry_race(lambda: client.search_experiments(max_results=1))  # MLflow creates or opens the store
            if new and not copied:
                keep_template(database)  # before anything is written to it
            if experiment is not None:
                ensure_experiment(client, experiment, artifacts)
        return artifacts
    if experiment is not None:
        ensure_experiment(MlflowClient(tracking_uri=tracking_uri), experiment)
    return None


# MLflow 3.17's UI chooses the GenAI or the model-training view from its workflow type, not from the
# experiment's mlflow.experimentKind tag: the URL's ``workflowType`` parameter, else the browser's stored choice
# (the sidebar's GenAI / Machine learning switch; GenAI until switched). Links carry the parameter.
ML_VIEW_QUERY = "workflowType=machine_learning"


def ui_command(tracking_uri: str) -> str:
    """The shell command that opens the MLflow UI on ``tracking_uri``."""
    return f"{mlflow_executable()} ui --backend-store-uri {tracking_uri} --port 5000"


def serve_command(tracking_uri: str, model_uri: str) -> str:
    """The shell command that serves ``model_uri`` of the store at ``tracking_uri`` over HTTP with this environment's
    packages (``mlflow models serve --env-manager local``)."""
    import shlex
    import shutil
    import sys

    # MLflow starts its web server by name (exec uvicorn): name this environment's programs unless PATH finds them.
    programs = Path(sys.executable).parent
    found = [shutil.which(name) for name in ("mlflow", "uvicorn")]
    on_path = all(path and Path(path).resolve().parent == programs.resolve() for path in found)
    prefix = "" if on_path else f"PATH={shlex.quote(str(programs))}:$PATH "
    return (f"{prefix}MLFLOW_TRACKING_URI={shlex.quote(tracking_uri)} mlflow models serve -m {model_uri} "
            "--env-manager local")


def run_url(experiment_id: str, run_id: str, port: int = 5000) -> str:
    """Address of a run in a local MLflow UI."""
    return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW_QUERY}"


def mlflow_executable() -> str:
    """The ``mlflow`` command of this Python environment (absolute), so printed commands work as written."""
    import sys

    candidate = Path(sys.executable).parent / "mlflow"
    return str(candidate) if candidate.is_file() else "mlflow"
