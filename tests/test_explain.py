"""explain(): one explanation per row in original units, the target's probability recomputed on the decoded row."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ct_lightning.evaluation.explanation import FeatureCodec, describe, explain, format_value, to_records
from ct_lightning.models import build_mlp

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Column:
    name: str
    kind: str
    mutability: str = "both"
    categories: list = field(default_factory=list)


class SmallCodec:
    """A hand-made codec for the test: income standardised, home one-hot (decoded to the largest entry)."""

    def __init__(self, immutable_home: bool = False):
        self.columns = [Column("income", "continuous"), Column("home", "categorical",
                                                               "none" if immutable_home else "both",
                                                               ["rent", "own", "mortgage"])]
        self.feature_names = ["income", "home=rent", "home=own", "home=mortgage"]
        self.classes, self.target = ["no", "yes"], "approved"
        self.mean, self.std = 50_000.0, 10_000.0

    def encode(self, frame):
        home = np.stack([(frame["home"] == c).to_numpy() for c in self.columns[1].categories], 1)
        return np.concatenate([((frame["income"].to_numpy(float) - self.mean) / self.std)[:, None], home], 1) \
            .astype(np.float32)

    def decode(self, x):
        x = np.asarray(x)
        return pd.DataFrame({"income": x[:, 0] * self.std + self.mean,
                             "home": [self.columns[1].categories[i] for i in x[:, 1:].argmax(1)]})

    def decode_target(self, codes):
        return [self.classes[int(c)] for c in np.asarray(codes)]

    def mutability(self):
        return {c.name: c.mutability for c in self.columns if c.mutability != "both"}


def model_of_income_and_home() -> torch.nn.Module:
    """Logits rising with income and with owning a home (class 1 = yes)."""
    model = build_mlp(4, 2, [])
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[-2.0, 0.5, -1.0, 0.0], [2.0, -0.5, 1.0, 0.0]]))
        model[0].bias.zero_()
    return model


ROWS = pd.DataFrame({"income": [42_000.0, 38_500.0], "home": ["rent", "mortgage"]})


def test_probability_is_recomputed_on_the_decoded_counterfactual():
    codec, model = SmallCodec(), model_of_income_and_home()
    result = explain(model, ROWS, target="yes", codec=codec, generator="generic", tau=0.9, max_steps=200)
    assert len(result) == 2 and list(result["target"]) == ["yes", "yes"]
    for _, row in result.iterrows():
        decoded = pd.DataFrame([row["counterfactual"]])
        assert decoded["home"].iloc[0] in codec.columns[1].categories  # a real category
        with torch.no_grad():  # independent computation: encode the decoded row, softmax, target class
            expected = torch.softmax(model(torch.from_numpy(codec.encode(decoded))), 1)[0, 1].item()
        assert row["probability"] == pytest.approx(expected, rel=1e-5)
        assert row["valid"] == (expected > 0.5)
        changed = {c["feature"] for c in row["changes"]}
        assert changed == {k for k in row["factual"] if row["factual"][k] != row["counterfactual"][k]}
        assert row["prediction"] == "no" and row["prediction_probability"] > 0.5


def test_immutable_columns_never_change():
    codec, model = SmallCodec(immutable_home=True), model_of_income_and_home()
    result = explain(model, ROWS, target="yes", codec=codec, generator="ecco", max_steps=200)
    for _, row in result.iterrows():
        assert row["counterfactual"]["home"] == row["factual"]["home"]
        assert "home" not in {c["feature"] for c in row["changes"]}
    also = explain(model, ROWS, target="yes", codec=SmallCodec(), mutability={"income": "none"}, max_steps=50)
    assert all(r["income"] == f["income"] for r, f in zip(also["counterfactual"], also["factual"]))


def test_bad_rows_and_targets_are_refused():
    codec, model = SmallCodec(), model_of_income_and_home()
    with pytest.raises(ValueError, match="missing column 'home'"):
        explain(model, ROWS[["income"]], codec=codec)
    with pytest.raises(ValueError, match="unknown column 'age'"):
        explain(model, ROWS.assign(age=3), codec=codec)
    with pytest.raises(ValueError, match="target: got 'maybe'; allowed: no, yes"):
        explain(model, ROWS, target="maybe", codec=codec)
    with pytest.raises(ValueError, match="rows: got no rows"):
        explain(model, ROWS.iloc[:0], codec=codec)


def test_default_target_is_the_most_likely_other_class_and_feature_codec_names_inputs():
    torch.manual_seed(0)
    model = build_mlp(3, 4, [8])
    codec = FeatureCodec(n_features=3, n_classes=4)
    assert codec.feature_names == ["x1", "x2", "x3"]
    rows = pd.DataFrame(np.random.default_rng(0).normal(size=(5, 3)), columns=codec.feature_names)
    result = explain(model, rows, codec=codec, max_steps=5)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor(rows.to_numpy(), dtype=torch.float32)), 1)
    p[torch.arange(5), p.argmax(1)] = -1
    assert result["target"].tolist() == p.argmax(1).tolist()


def test_text_and_json_forms():
    assert format_value(54600.0) == "54,600" and format_value(0.25) == "0.25" and format_value("rent") == "rent"
    result = explain(model_of_income_and_home(), ROWS, target="yes", codec=SmallCodec(), max_steps=200)
    text = describe(result)
    assert "row 0: predicted no" in text and "income: 42,000 → " in text
    records = json.loads(json.dumps(to_records(result)))
    assert {"factual", "counterfactual", "changes", "target", "probability", "valid"} <= set(records[0])
    assert all({"feature", "from", "to"} == set(c) for c in records[0]["changes"])


def test_ct_explain_on_a_logged_run_prints_writes_json_and_logs(tmp_path):
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": "moons", "max_epochs": 1, "nce": 20, "progress": False, "tracking_uri": uri,
                 "immutable": ["x2"]})
    out = tmp_path / "explained.json"
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "explain.py"), "--run-id", run["run_id"],
                           "--tracking-uri", uri, "--row", '{"x1": 0.2, "x2": 0.4}', "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "row 0: predicted" in done.stdout
    records = json.loads(out.read_text())
    assert len(records) == 1 and records[0]["counterfactual"]["x2"] == pytest.approx(0.4)  # immutable, as trained
    folders = [a.path for a in MlflowClient(uri).list_artifacts(run["run_id"], "explanations")]
    files = {a.path.rsplit("/", 1)[1] for a in MlflowClient(uri).list_artifacts(run["run_id"], folders[0])}
    assert files == {"explanations.json", "explanations.csv", "explanations.png"}
