"""The table checks before any work (``preflight.check_table_columns``) on a fine-tuning (``--from-checkpoint``).

They were skipped for every ``--from-checkpoint``: a plain ``state_dict`` or TorchScript fine-tuning on a table with
a column of dates got its refusal only after torch, the threads line and the checkpoint's notes. Now they are skipped
only where the checkpoint carries its model's table preprocessing (which reads the file its own way: a column the
model does not read may hold anything), told without torch (``checkpoint_peek``). Real checkpoints, real recipe
processes, a real tiny fine-tuning.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from preloaded import run_script  # noqa: E402

from ct_lightning.experiment.configuration.checkpoint_peek import carries_table_preprocessing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
TINY = ["--max-epochs", "1", "--nce", "16", "--limit-train-batches", "2", "--no-progress"]


def _dated(folder: Path) -> Path:
    frame = pd.read_csv(LOANS)
    frame["applied_on"] = pd.date_range("2024-01-01", periods=len(frame)).strftime("%Y-%m-%d")
    frame.to_csv(folder / "dated.csv", index=False)
    return folder / "dated.csv"


def _plain_weights(folder: Path) -> dict[str, Path]:
    """A plain state_dict and a TorchScript MLP of the loans table's 17 encoded inputs (no preprocessing)."""
    network = nn.Sequential(nn.Linear(17, 8), nn.ReLU(), nn.Linear(8, 2))
    torch.save(network.state_dict(), folder / "state.pt")
    torch.jit.script(network).save(str(folder / "scripted.pt"))
    return {"state_dict": folder / "state.pt", "TorchScript": folder / "scripted.pt"}


@pytest.mark.parametrize("kind", ["state_dict", "TorchScript"])
def test_plain_weights_on_a_bad_table_get_a_fresh_trainings_refusal_before_any_work(tmp_path, kind):
    dated, weights = _dated(tmp_path), _plain_weights(tmp_path)[kind]
    assert carries_table_preprocessing(weights) is False
    common = ["--data", str(dated), *TINY, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    fresh = run_script(ROOT / "recipes" / "train.py", [*common, "--target", "approved"], cwd=tmp_path)
    tuned = run_script(ROOT / "recipes" / "train.py", [*common, "--target", "approved", "--from-checkpoint",
                                                       str(weights)], cwd=tmp_path)
    assert fresh.returncode == tuned.returncode == 2, tuned.stdout + tuned.stderr
    refusal = fresh.stderr.strip().splitlines()[-1]
    assert refusal.startswith("error: --data: column 'applied_on' of ") and "holds dates" in refusal, refusal
    assert tuned.stderr.strip().splitlines() == [refusal]  # the same one line, nothing before it
    assert "torch threads" not in tuned.stdout and "does not say which activation" not in tuned.stdout, tuned.stdout
    misspelt = run_script(ROOT / "recipes" / "train.py", [*common, "--target", "aproved", "--from-checkpoint",
                                                          str(weights)], cwd=tmp_path)
    assert misspelt.returncode == 2 and misspelt.stderr.strip().splitlines()[-1].startswith(
        f"error: --target: column 'aproved' not found in {dated} (did you mean 'approved'?)"), misspelt.stderr


def test_a_checkpoint_with_its_preprocessing_reads_the_table_its_own_way(tmp_path):
    """A model of this project trained on the loans table fine-tunes on a file with a column of dates it does not
    read: left out with a note, as before (a fresh training would refuse the column)."""
    from ct_lightning.experiment.runs.train import train

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "limit_train_batches": 2,
                 "progress": False, "accelerator": "cpu", "tracking_uri": store,
                 "checkpoint_dir": str(tmp_path / "first")})
    checkpoint = run["checkpoints"]["last"]
    assert carries_table_preprocessing(checkpoint) is True
    dated = _dated(tmp_path)
    tuned = run_script(ROOT / "recipes" / "train.py", ["--data", str(dated), "--target", "approved", *TINY,
                                                       "--from-checkpoint", checkpoint, "--tracking-uri", store],
                       cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    assert "dated.csv: columns the model does not read left out: applied_on" in tuned.stdout, tuned.stdout[-3000:]


def test_the_peek_reads_both_formats_and_leaves_model_uris_to_the_store(tmp_path):
    """torch.save's zip and legacy formats, with and without a table's preprocessing (as a dict or its JSON text),
    read without running anything in the file; an MLflow model URI cannot be told before its store is asked."""
    weights = nn.Linear(3, 2).state_dict()
    codec = {"kind": "tabular", "columns": [], "target": "approved"}
    for legacy in (False, True):
        for payload, carries in ((weights, False), ({"state_dict": weights, "ct_preprocessing": codec}, True),
                                 ({"state_dict": weights, "preprocessing": '{"kind": "tabular"}'}, True),
                                 ({"state_dict": weights, "ct_preprocessing": {"kind": "image"}}, False)):
            path = tmp_path / f"w{legacy}{carries}.pt"
            torch.save(payload, path, _use_new_zipfile_serialization=not legacy)
            assert carries_table_preprocessing(path) is carries, (legacy, payload.keys())
    assert carries_table_preprocessing("runs:/0123/model") is None
    assert carries_table_preprocessing(tmp_path / "missing.pt") is None
