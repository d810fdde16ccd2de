"""A new data set is one class: one new module in ``datamodules/`` makes it trainable by name, and its facts
(synthetic or real, paper label, individuals per evaluation run, protected features, cost hint, Table 2 values)
reach the settings, the evaluation protocol and the reproduction without an edit anywhere else."""

import pytest

from package_copy import copy_datamodules, run_with_copy

TOY = '''
import numpy as np

from datamodules.base import TensorDataModule
from datamodules.registry import register


@register("toy", "toy_alias")
class Toy(TensorDataModule):
    synthetic, paper_label, eval_individuals, cost_hint = True, "Toy", 40, 0.5
    default_batch_size, ct_defaults = 16, {"tau": 0.6, "nce": 24, "lambda_reg": 0.1}
    protected_features = ("b",)

    def load_splits(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(120, 2)).astype("float32")
        y = (x[:, 0] > 0).astype("int64")
        return {"x_train": x[:80], "y_train": y[:80], "x_val": x[80:100], "y_val": y[80:100],
                "x_test": x[100:], "y_test": y[100:], "feature_names": ["a", "b"], "n_classes": 2}
'''

CHECK = '''
import json
from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.configuration.settings import resolve_config
from ct_lightning.experiment.configuration.protocol_options import reference_individuals
from ct_lightning.experiment.studies.reproduce import cost_hint, is_synthetic, role_training_overrides
from ct_lightning.evaluation.paper import paper_label
from ct_lightning.experiment.runs.train import train

static = catalogue.canonical_dataset("toy_alias")
config = resolve_config({"data": "toy"})
summary = train({"data": "toy", "max_epochs": 1, "protect": True, "nce": 8, "max_steps": 2,
                 "tracking_uri": "sqlite:///" + __import__("os").path.abspath("mlruns.db"), "progress": False})
print(json.dumps({"static": static, "tau": config["tau"], "batch": config["batch_size"],
                  "synthetic": is_synthetic("toy"), "cost": cost_hint("toy"), "individuals": reference_individuals("toy"),
                  "label": paper_label("toy"), "overrides": role_training_overrides("reference", "toy", "ct_protected"),
                  "protected": summary.get("protected", summary.get("data_summary", {}).get("protected")),
                  "test_acc": summary.get("test_acc", summary.get("metrics", {}).get("test/acc"))}))
'''


@pytest.mark.slow
def test_a_new_data_set_is_one_class(tmp_path):
    (copy_datamodules(tmp_path) / "toy.py").write_text(TOY)
    result = run_with_copy(tmp_path, CHECK)
    assert result["static"] == "toy"  # found from the source, without importing torch
    assert (result["tau"], result["batch"]) == (0.6, 16)
    assert result["synthetic"] and result["cost"] == 0.5 and result["individuals"] == 40 and result["label"] == "Toy"
    assert result["overrides"] == {"search_lr": 0.1, "lambda_reg": 0.0, "lambda_adv": 0.0}  # the synthetic rule
    assert result["test_acc"] is not None
