"""The model that travels: a real tiny training's logged models, loaded, fine-tuned, registered and served over HTTP."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = {"data": "moons", "max_epochs": 2, "nce": 40, "progress": False, "seed": 3}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from ct_lightning.experiment.runs.train import train

    store = tmp_path_factory.mktemp("store")
    summary = train({**TINY, "tracking_uri": f"sqlite:///{store / 'mlflow.db'}"})
    return summary


def test_pytorch_flavour_is_a_module_that_evaluates_and_trains(trained):
    import mlflow.pytorch

    from ct_lightning.experiment.runs.loading import load_checkpoint

    mlflow.set_tracking_uri(trained["tracking_uri"])
    model = mlflow.pytorch.load_model(f"runs:/{trained['run_id']}/model")
    assert isinstance(model, torch.nn.Module) and not isinstance(model, torch.fx.GraphModule)
    x = torch.randn(9, 2)
    expected = load_checkpoint(trained["checkpoints"]["last"]).model(x)
    model.eval()
    torch.testing.assert_close(model(x), expected)
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    torch.nn.functional.cross_entropy(model(x), torch.zeros(9, dtype=torch.long)).backward()
    optimiser.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_predictor_takes_named_raw_columns_and_is_registered(trained):
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(trained["tracking_uri"])
    assert trained["models"]["registered"] == "ct-moons-ct"
    client = MlflowClient(trained["tracking_uri"])
    version = client.get_latest_versions("ct-moons-ct")[0]
    predictor = mlflow.pyfunc.load_model(f"models:/ct-moons-ct/{version.version}")
    assert predictor.metadata.signature.inputs is None  # the predictor checks the columns itself
    assert [p.name for p in predictor.metadata.signature.params.params] == ["explain", "target", "max_steps",
                                                                             "immutable", "mutability", "step", "max_change"]
    info = mlflow.models.get_model_info(f"models:/ct-moons-ct/{version.version}")
    assert info.metadata["input_columns"] == [{"name": "x1", "type": "double", "kind": "continuous"},
                                              {"name": "x2", "type": "double", "kind": "continuous"}]
    assert info.saved_input_example_info["type"] == "dataframe"
    rows = pd.DataFrame({"x1": [0.1, 1.2, -0.4], "x2": [0.3, -0.6, 0.9]})
    out = predictor.predict(rows)
    module = mlflow.pytorch.load_model(f"runs:/{trained['run_id']}/model").eval()
    with torch.no_grad():
        probabilities = torch.softmax(module(torch.tensor(rows.to_numpy(), dtype=torch.float32)), 1).numpy()
    np.testing.assert_allclose(out[["probability_0", "probability_1"]].to_numpy(), probabilities, rtol=1e-5)
    assert out["prediction"].tolist() == probabilities.argmax(1).tolist()
    with pytest.raises(Exception, match="rows: missing column 'x2'"):
        predictor.predict(pd.DataFrame({"x1": [0.1]}))
    with pytest.raises(Exception, match="rows: unknown column 'x3'; the model needs x1, x2 and no other columns"):
        predictor.predict(rows.assign(x3=1.0))
    explained = predictor.predict(rows, params={"explain": True})
    assert {"target", "target_probability", "valid", "counterfactual_prediction", "counterfactual",
            "changes"} <= set(explained.columns)
    assert ((explained["counterfactual_prediction"] == explained["target"]) == explained["valid"]).all()
    assert (explained["target"] != explained["prediction"]).all()


def test_model_pages_show_final_metrics_and_data_sets(trained):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(trained["tracking_uri"])
    last_epoch = int(trained["metrics"]["epochs"]) - 1
    for model_id in (trained["models"]["model"], trained["models"]["predictor"]):
        logged = client.get_logged_model(model_id)
        by_key = {(m.key, m.dataset_name): (m.value, m.step) for m in logged.metrics}
        assert by_key[("val/acc", None)] == (pytest.approx(trained["metrics"]["val/acc"]), last_epoch)
        assert by_key[("train/loss", None)][1] == last_epoch
        assert by_key[("test/acc", "moons-test")][0] == pytest.approx(trained["metrics"]["test/acc"])
        assert all(m.step >= last_epoch for m in logged.metrics), "no first-epoch values"
    history = client.get_metric_history(trained["run_id"], "test/acc")
    assert len(history) == 1, "linking adds no point to the run's own curve"


def test_fine_tuning_starts_from_either_logged_model(trained, tmp_path):
    from ct_lightning.experiment.runs.loading import load_checkpoint
    from ct_lightning.experiment.runs.train import train

    expected = load_checkpoint(trained["checkpoints"]["last"]).model.state_dict()
    for name in ("model", "predictor"):
        uri, store = f"runs:/{trained['run_id']}/{name}", {}
        tuned = train({**TINY, "max_epochs": 1, "tracking_uri": trained["tracking_uri"], "from_checkpoint": uri,
                       "seed": 4}, callbacks=[_FirstWeights(store)])
        assert tuned["config"]["hidden_sizes"] == [32]
        for key, value in expected.items():
            assert torch.equal(store["state"][key], value), (name, key)


class _FirstWeights(L.Callback):
    def __init__(self, store: dict):
        self.store = store

    def on_train_start(self, trainer, pl_module):
        self.store["state"] = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(model_uri: str, tracking_uri: str, cwd: Path, timeout: float = 180.0):
    """Start ``mlflow models serve`` (local environment) and wait until it answers ``/ping``; returns
    ``(process, port)``, or skips the test when the command cannot start here."""
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    if not mlflow_cli.is_file():
        pytest.skip(f"no mlflow command beside {sys.executable}")
    port = free_port()
    # the server runs uvicorn, installed beside this interpreter
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONPATH": str(ROOT),
           "PATH": f"{mlflow_cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(cwd / "serve.log", "w")
    process = subprocess.Popen([str(mlflow_cli), "models", "serve", "-m", model_uri, "--env-manager", "local",
                                "--host", "127.0.0.1", "-p", str(port), "-w", "1"], cwd=cwd, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = (cwd / "serve.log").read_text()[-2000:]
            pytest.skip(f"mlflow models serve could not start here (exit {process.returncode}): {text}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as answer:
                if answer.status == 200:
                    return process, port
        except OSError:
            time.sleep(1.0)
    process.terminate()
    raise AssertionError(f"mlflow models serve did not answer in {timeout} s:\n{(cwd / 'serve.log').read_text()[-3000:]}")


def post(port: int, payload: dict) -> dict:
    """POST ``payload`` as JSON to the server's ``/invocations``; the decoded answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def test_served_predictor_answers_raw_rows_over_http(trained, tmp_path):
    import mlflow.pyfunc

    uri = f"runs:/{trained['run_id']}/predictor"
    process, port = serve(uri, trained["tracking_uri"], tmp_path)
    try:
        rows = [{"x1": 0.1, "x2": 0.3}, {"x1": 1.2, "x2": -0.6}]
        answer = post(port, {"dataframe_records": rows})["predictions"]
        mlflow.set_tracking_uri(trained["tracking_uri"])
        local = mlflow.pyfunc.load_model(uri).predict(pd.DataFrame(rows))
        assert [a["prediction"] for a in answer] == local["prediction"].tolist()
        np.testing.assert_allclose([a["probability_1"] for a in answer], local["probability_1"], rtol=1e-5)
        explained = post(port, {"dataframe_records": rows[:1], "params": {"explain": True}})["predictions"][0]
        assert explained["target"] != explained["prediction"]
        assert {c["feature"] for c in explained["changes"]} <= {"x1", "x2"}
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(port, {"dataframe_records": [{**rows[0], "x3": 1.0}]})
        assert refused.value.code == 400
        assert json.loads(refused.value.read())["message"] == \
            "rows: unknown column 'x3'; the model needs x1, x2 and no other columns"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def test_both_models_require_ct_lightning_whose_classes_they_pickle(trained):
    """Both logged models unpickle ct-lightning's classes: an environment MLflow builds from their requirements
    (``--env-manager virtualenv``, ``build-docker``) lacked it and failed only at load, with ModuleNotFoundError."""
    from importlib.metadata import version

    import mlflow.artifacts

    for name in ("model", "predictor"):
        folder = mlflow.artifacts.download_artifacts(f"runs:/{trained['run_id']}/{name}",
                                                     tracking_uri=trained["tracking_uri"])
        requirements = (Path(folder) / "requirements.txt").read_text().split()
        assert f"ct-lightning=={version('ct-lightning')}" in requirements, (name, requirements)
        assert f"torch=={torch.__version__.split('+')[0]}" in requirements


def test_registered_model_names_the_registry_entry_or_none_registers_nothing(tmp_path):
    """Two models of one table (another target, another product) shared ``ct-DATA-ROLE``, so ``latest`` was whichever
    ran last: ``--registered-model`` names the entry, and ``none`` registers nothing."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import registered_lines, train

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    named = train({**TINY, "max_epochs": 1, "tracking_uri": store, "registered_model": "moons-product-a"})
    unregistered = train({**TINY, "max_epochs": 1, "tracking_uri": store, "registered_model": "None"})
    client = MlflowClient(store)
    assert [m.name for m in client.search_registered_models()] == ["moons-product-a"]
    [version] = client.search_model_versions("name = 'moons-product-a'")
    assert version.run_id == named["run_id"] and named["models"]["registered"] == "moons-product-a"
    assert registered_lines(named)[0].startswith("registered model moons-product-a version 1: ")
    assert unregistered["models"]["registered"] is None and registered_lines(unregistered) == []
    assert unregistered["models"]["predictor"]  # still logged: explain.py --run-id and a later registration use it
    assert client.get_run(named["run_id"]).data.params["registered_model"] == "moons-product-a"
