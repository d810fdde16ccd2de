"""The tracking server behind a password, as docs/scaling.md starts it: MLflow's basic-auth app answers 401 to a
request without credentials or with a wrong password, and takes a run with a metric and an artifact from a user it
knows, who gives the credentials as a training does (MLFLOW_TRACKING_USERNAME/PASSWORD). A whole tiny ``train()``
through it passed too, but takes two minutes here: the run's calls are the same REST calls."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode

import pytest
from test_served_model import free_port


def status(url: str, user: str | None = None, password: str | None = None) -> int:
    """The status of a search for experiments, with basic-auth credentials when given."""
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search", data=b'{"max_results": 1}',
                                     headers={"Content-Type": "application/json"})
    if user:
        request.add_header("Authorization", "Basic " + b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture
def auth_server(tmp_path):
    """``mlflow server --app-name basic-auth`` on a free local port: ``(url, admin password)``."""
    pytest.importorskip("flask_wtf", reason='the basic-auth app needs Flask-WTF: pip install "mlflow[auth]"')
    config = tmp_path / "basic_auth.ini"
    config.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_path / 'basic_auth.db'}\n"
                      "admin_username = admin\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                      "auth_cache_ttl_seconds = 60\n")  # one password hash per user a minute, not one a request
    admin_password, port = secrets.token_urlsafe(12), free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
    log = open(tmp_path / "server.log", "w")
    process = subprocess.Popen([str(os.path.join(os.path.dirname(sys.executable), "mlflow")), "server", "--app-name",
                                "basic-auth", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                                "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1",
                                "--port", str(port), "--workers", "1"],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
    try:
        while True:
            assert process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                time.sleep(1.0)
        yield url, admin_password
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.slow
def test_basic_auth_refuses_strangers_and_takes_a_users_run(auth_server, monkeypatch, tmp_path):
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    url, admin_password = auth_server
    assert status(url) == 401
    assert status(url, "admin", "wrong") == 401
    assert status(url, "admin", admin_password) == 200
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin_password)
    get_app_client("basic-auth", tracking_uri=url).create_user("alice", "alice-password-1")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "alice-password-1")
    client = MlflowClient(url)
    experiment = client.create_experiment("ct-lightning")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "test/acc", 0.9)
    client.log_text(run.info.run_id, "rows", "preprocessing.json")  # through the server's artifact proxy
    client.set_terminated(run.info.run_id)
    assert client.get_run(run.info.run_id).data.metrics["test/acc"] == 0.9
    fetched = client.download_artifacts(run.info.run_id, "preprocessing.json", str(tmp_path))
    assert open(fetched).read() == "rows"
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-hers")
    with pytest.raises(MlflowException, match="401"):
        client.get_run(run.info.run_id)
