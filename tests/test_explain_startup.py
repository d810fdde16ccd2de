"""explain.py starts without Lightning and MLflow: practitioners run it once per applicant, so its imports are most of
its cost. A checkpoint is read with ``torch.load`` (``checkpoints.load_trained_classifier``) and gives the same model,
hyperparameters and explanations as ``CTModule.load_from_checkpoint``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
# What explaining a row from a checkpoint must not import: Lightning (seconds), MLflow (only for --run-id), and
# what the evaluation and the run's logging bring (torchmetrics with SciPy, Matplotlib), Ray, Captum.
HEAVY = ("lightning", "pytorch_lightning", "mlflow", "torchmetrics", "scipy", "matplotlib", "ray", "captum")
EXPLAIN = """
import json, sys
from recipes.explain import main
rows = main(["--checkpoint", sys.argv[1], "--rows", sys.argv[2], "--skip-bad-rows", "--target", "yes",
             "--max-steps", "60"])
row = main(["--checkpoint", sys.argv[1], "--row", sys.argv[3], "--target", "yes", "--max-steps", "60"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[4].split(","))
print(json.dumps({"heavy": heavy, "rows": rows, "row": row}))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A CTModule checkpoint of the loans table with the keys train.py writes and loaders read: the weights, the
    hyperparameters (age immutable) and the fitted preprocessing."""
    from ct_lightning.module import CTModule
    from datamodules.table import TableDataModule

    codec = TableDataModule(LOANS, target="approved").codec
    torch.manual_seed(0)
    module = CTModule(n_features=len(codec.feature_names), n_classes=2, feature_names=list(codec.feature_names),
                      hidden_sizes=[16], mutability={"age": "none"}, tau=0.6)
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": "2.0.0", "ct_preprocessing": codec.to_dict()}, path)
    return path


def test_explaining_a_row_from_a_checkpoint_imports_neither_lightning_nor_mlflow(checkpoint, tmp_path):
    """A fresh interpreter runs the explain recipe on a CSV (one row it cannot read) and on one JSON row: nothing
    heavy is imported, and the explanations are those of the model loaded by Lightning."""
    from ct_lightning.evaluation.explanation import codec_from_dict, explain, to_records
    from ct_lightning.experiment.runs.explanations import search_settings
    from ct_lightning.experiment.runs.loading import load_checkpoint

    loans = pd.read_csv(LOANS).head(4)
    loans.loc[2, "purpose"] = "yacht"  # an unseen category: left out with --skip-bad-rows
    loans.to_csv(tmp_path / "rows.csv", index=False)
    applicant = loans.drop(columns="approved").iloc[0].to_dict()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", EXPLAIN, str(checkpoint), str(tmp_path / "rows.csv"),
                           json.dumps(applicant), ",".join(HEAVY)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], f"explain.py imported {result['heavy'][:8]}"
    assert [(r["row"], r["explained"]) for r in result["rows"]] == [(1, True), (2, True), (3, False), (4, True)]

    module = load_checkpoint(checkpoint)  # CTModule.load_from_checkpoint: Lightning's own reading of the file
    codec = codec_from_dict(torch.load(checkpoint, weights_only=True)["ct_preprocessing"])
    rows = loans.drop(columns="approved").drop(index=2)
    expected = to_records(explain(module, rows, target="yes", codec=codec,
                                  **search_settings(module, {"max_steps": 60})))
    explained = [{k: v for k, v in r.items() if k not in ("row", "explained")} for r in result["rows"] if r["explained"]]
    assert json.loads(json.dumps(expected)) == explained
    assert [{k: v for k, v in r.items() if k not in ("row", "explained")} for r in result["row"]] == explained[:1]
    assert all(r["immutable"] == ["age"] for r in explained)


def test_explaining_a_run_imports_mlflow_but_not_lightning(checkpoint, tmp_path):
    """--run-id downloads the run's checkpoint with MLflow and reads it as a checkpoint file is read."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("ct-lightning")).info.run_id
    (tmp_path / "config.json").write_text(json.dumps({"data": str(LOANS), "target": "approved"}))
    client.log_artifact(run_id, str(checkpoint), "checkpoints")
    client.log_artifact(run_id, str(tmp_path / "config.json"))
    applicant = pd.read_csv(LOANS).drop(columns="approved").iloc[0].to_dict()
    code = ("import json, sys; from recipes.explain import main; "
            f"main(['--run-id', {run_id!r}, '--tracking-uri', {uri!r}, '--row', sys.argv[1], '--no-log']); "
            "print(json.dumps(sorted(m for m in ('lightning', 'torchmetrics', 'mlflow') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(applicant)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "row 1: predicted" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["mlflow"]


def test_a_checkpoint_reads_as_lightning_loads_it(checkpoint, tmp_path):
    """The same weights, outputs and hyperparameters as ``CTModule.load_from_checkpoint``, also for a checkpoint
    from before a setting existed (Lightning fills in CTModule's default), and the fitted preprocessing."""
    from ct_lightning.experiment.runs.checkpoints import load_trained_classifier
    from ct_lightning.experiment.runs.loading import load_checkpoint

    payload = torch.load(checkpoint, weights_only=True)
    del payload["hyper_parameters"]["domain_std"], payload["hyper_parameters"]["generator_options"]
    older = tmp_path / "older.ckpt"
    torch.save(payload, older)
    for path in (checkpoint, older):
        lightning, light = load_checkpoint(path), load_trained_classifier(path)
        assert dict(light.hparams) == dict(lightning.hparams)
        assert light.hparams.tau == 0.6 and light.hparams.domain_std == 3.0
        assert light.model.state_dict().keys() == lightning.model.state_dict().keys()
        assert all(torch.equal(light.model.state_dict()[k], v) for k, v in lightning.model.state_dict().items())
        x = torch.randn(5, light.hparams.n_features)
        assert torch.equal(light(x), lightning(x)) and not light.training
        assert light.preprocessing == payload["ct_preprocessing"] == lightning.preprocessing
