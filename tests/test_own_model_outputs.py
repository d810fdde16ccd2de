"""A network of your own (``--model module:factory``) whose outputs are not one per class of the table.

Found by an HR analyst fine-tuning a plain PyTorch MLP of one output unit (``BCEWithLogitsLoss``) with
``--model hr_net:make --from-checkpoint hr_model.pt``: the weights loaded (its inputs happened to be as many as
ct-lightning's encoding), the model "as loaded" scored below the majority class, and the training ended in a
traceback, ``IndexError: Target 1 is out of bounds`` in cross-entropy, after the MLflow run had been created. The
guide promises a one-line refusal naming ``--model-inputs``' ``"outputs"`` for a model of one output unit; it only
came where the weights did not fit the default MLP.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from ct_lightning.experiment.runs.train import train

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
NET = ("from torch import nn\n"
       "class OneLogit(nn.Module):\n"
       "    def __init__(self, n_inputs, width=1):\n"
       "        super().__init__()\n"
       "        self.fc1, self.out = nn.Linear(n_inputs, 8), nn.Linear(8, width)\n"
       "    def forward(self, x):\n"
       "        return self.out(self.fc1(x).relu())\n"
       "def make(n_features):\n"
       "    return OneLogit(n_features)\n"
       "def three(n_features):\n"
       "    return OneLogit(n_features, 3)\n")
INPUTS = [{"feature": "age", "center": 45, "scale": 15}, {"feature": "income", "center": 50000, "scale": 20000},
          {"feature": "debt", "center": 20000, "scale": 15000}, {"feature": "sex", "category": "female"}]


@pytest.fixture
def own_net(tmp_path, monkeypatch):
    """``one_logit_net.py`` in ``tmp_path``, importable; the settings of a tiny training of it on loans.csv."""
    (tmp_path / "one_logit_net.py").write_text(NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "one_logit_net", raising=False)
    return {"data": str(LOANS), "target": "approved", "model": "one_logit_net:make", "max_epochs": 1, "nce": 16,
            "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False, "seed": 0,
            "checkpoint_dir": str(tmp_path / "ckpt")}


def lines_of(settings: dict) -> tuple[list[str], Exception | None]:
    """The console lines of ``train(settings)`` and the error it ended with (``None``: it trained)."""
    lines: list[str] = []
    try:
        train(settings, echo=lambda *parts, **_: lines.append(" ".join(map(str, parts))))
    except Exception as error:  # noqa: BLE001 - the test asserts which
        return lines, error
    return lines, None


@pytest.mark.parametrize("weights", [False, True], ids=["from scratch", "from its state_dict"])
def test_a_network_of_one_output_unit_without_outputs_is_refused_in_one_line_before_the_run(own_net, tmp_path,
                                                                                            weights):
    if weights:  # a state_dict of 13 inputs: as wide as ct-lightning's encoding of loans.csv, so the weights load
        from one_logit_net import make

        torch.save(make(13).state_dict(), tmp_path / "hr_model.pt")
        own_net["from_checkpoint"] = str(tmp_path / "hr_model.pt")
    lines, error = lines_of(own_net)
    assert isinstance(error, ValueError), error
    message = str(error)
    assert message.startswith("model: got 'one_logit_net:make' (its network gives 1 output per row, a single logit, "
                              "for the 2 classes (no, yes) of loans.csv); allowed: describe the model with "
                              '--model-inputs FILE, the object {"inputs": [...], "outputs": ["no", "yes"]}'), message
    assert "\n" not in message
    assert not [line for line in lines if line.startswith("MLflow run") or "as loaded" in line], lines


def test_a_network_of_one_output_unit_with_inputs_but_no_outputs_names_outputs(own_net, tmp_path):
    (tmp_path / "inputs.json").write_text(json.dumps(INPUTS))
    lines, error = lines_of({**own_net, "model_inputs": str(tmp_path / "inputs.json")})
    assert isinstance(error, ValueError), error
    assert 'the model has one output unit and no "outputs" says which class it scores' in str(error), error
    assert not [line for line in lines if line.startswith("MLflow run")], lines


def test_a_network_of_one_output_unit_with_its_outputs_trains_from_scratch(own_net, tmp_path):
    """Its width is read from the network the factory returns (no weights tell it): one unit, the log-odds of yes."""
    (tmp_path / "inputs.json").write_text(json.dumps({"inputs": INPUTS, "outputs": ["no", "yes"]}))
    summary = train({**own_net, "model_inputs": str(tmp_path / "inputs.json")})
    assert summary["metrics"]["epochs"] == 1
    assert 0 <= summary["metrics"]["val/acc"] <= 1
    weights = torch.load(tmp_path / "ckpt" / "model-weights.pt")
    assert weights["out.weight"].shape == (1, 8), "the user's own network, one output unit, goes back"


def test_a_network_of_more_outputs_than_classes_is_refused_naming_the_classes(own_net):
    """Three outputs on two classes trained silently: softmax over a class the table does not have."""
    lines, error = lines_of({**own_net, "model": "one_logit_net:three"})
    assert isinstance(error, ValueError), error
    assert str(error).startswith("model: got 'one_logit_net:three' (its network gives 3 outputs per row; the data has "
                                 "2 classes (no, yes)); allowed: a network of 2 outputs, one per class in this order"), \
        error
    assert not [line for line in lines if line.startswith("MLflow run")], lines


def test_a_fine_tuning_of_ones_own_model_is_tagged_by_its_model_and_weights(own_net, tmp_path):
    """A fine-tuned ``hr_net:make`` from ``hr_model.pt`` and a default MLP trained from scratch on the same table were
    both named ``loans-full-ecco-s0-...`` with the same tags; the runs list now tells them apart."""
    from mlflow.tracking import MlflowClient

    from one_logit_net import make

    torch.save(make(4).state_dict(), tmp_path / "hr_model.pt")
    (tmp_path / "inputs.json").write_text(json.dumps({"inputs": INPUTS, "outputs": ["no", "yes"]}))
    tuned = train({**own_net, "from_checkpoint": str(tmp_path / "hr_model.pt"),
                   "model_inputs": str(tmp_path / "inputs.json")})
    scratch = train({**own_net, "model": "mlp", "checkpoint_dir": str(tmp_path / "scratch")})
    client = MlflowClient(tracking_uri=own_net["tracking_uri"])
    tags = {key: client.get_run(run["run_id"]).data.tags for key, run in (("tuned", tuned), ("scratch", scratch))}
    assert (tags["tuned"]["model"], tags["tuned"]["from_checkpoint"]) == ("one_logit_net:make", "hr_model.pt")
    assert "model" not in tags["scratch"] and "from_checkpoint" not in tags["scratch"]
