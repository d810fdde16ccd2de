"""A tracking server (``http(s)://HOST:PORT``): its own run links, whether it answers, and what counts as an outage."""

from __future__ import annotations

# The texts MLflow's REST client and ``requests`` put in the errors of a server that is down, restarting or
# unreachable, once MLflow's own retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES, ..._TIMEOUT) are spent.
OUTAGE_TEXTS = ("Max retries exceeded", "Connection refused", "Failed to establish a new connection",
                "Connection aborted", "Connection reset", "RemoteDisconnected", "Read timed out", "ConnectTimeout",
                "timed out", "too many 500 error", "too many 502 error", "too many 503 error",
                "too many 504 error", "Temporary failure in name resolution")


def is_server_uri(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` names a tracking server (``http://`` or ``https://``), not a local store."""
    return str(tracking_uri).startswith(("http://", "https://"))


def server_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page in the server's own UI (the same model-training view as the local links)."""
    from ct_lightning.experiment.runs.tracking import ML_VIEW_QUERY

    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW_QUERY}"


def run_links(tracking_uri: str, experiment_id: str, run_id: str) -> list[str]:
    """The console lines that open a run: its page on a tracking server, or for a local store the command that
    starts the MLflow UI on it and the run's page there."""
    from ct_lightning.experiment.runs.tracking import run_url, ui_command

    if is_server_uri(tracking_uri):
        return [f"Open the run in the server's UI:  {server_run_url(tracking_uri, experiment_id, run_id)}"]
    return [f"Open the MLflow UI:  {ui_command(tracking_uri)}", f"then browse to {run_url(experiment_id, run_id)}"]


def server_answers(tracking_uri: str, timeout: float = 2.0) -> bool:
    """Whether the server answers its ``/health`` request within ``timeout`` seconds (any HTTP answer counts)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the server could not be reached (not that it refused the request)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (ConnectionError, TimeoutError)):
            return True
        try:
            import requests

            if isinstance(error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
                return True
        except ImportError:  # pragma: no cover - MLflow depends on requests
            pass
        if any(text in str(error) for text in OUTAGE_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


WRITE_PROBE_TAG = "ct.write-probe"  # never set: deleting it is refused (no permission) or finds no such tag


def is_permission_denied(error: BaseException) -> bool:
    """Whether ``error`` is a server's refusal of a request for want of permission (HTTP 403, ``PERMISSION_DENIED``:
    ``mlflow server --app-name basic-auth`` gives a user READ permission on a teammate's experiment)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "error_code", None) == "PERMISSION_DENIED" or "PERMISSION_DENIED" in str(error) \
                or getattr(getattr(error, "response", None), "status_code", None) == 403:
            return True
        error = error.__cause__ or error.__context__
    return False


def run_write_refused(tracking_uri: str, run_id: str) -> str | None:
    """Why the tracking server refuses this user's writes to run ``run_id`` (one clause: who may only read it and
    whose run it is), ``None`` where it takes them or the store is local. Asked without changing the run: the
    server checks the permission before it looks for the (never set) tag :data:`WRITE_PROBE_TAG` to delete."""
    if not is_server_uri(tracking_uri):
        return None
    import os

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.delete_tag(run_id, WRITE_PROBE_TAG)
    except Exception as error:  # noqa: BLE001 - no such tag (the write is allowed) or a refusal
        if not is_permission_denied(error):
            return None
    else:
        return None
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    owner = client.get_run(run_id).data.tags.get("mlflow.user")
    whose = f", {owner}'s run" if owner and owner != user else ""
    return f"{tracking_uri} lets {repr(user) if user else 'this user'} only read run {run_id}{whose} (PERMISSION_DENIED)"


def write_refused_now(tracking_uri: str, run_id: str) -> str:
    """The reason :func:`run_write_refused` gives, for a write the server refused when it was made."""
    return f"{tracking_uri} refused the write to run {run_id} (PERMISSION_DENIED)"
