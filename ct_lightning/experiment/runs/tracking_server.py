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
