"""A new metric that the evaluation reports is its functional, its torchmetrics class and one row of the metric table.

The metrics below are defined here and only registered (``register_metric``): no other file changes. The real
evaluation protocol, the real evaluation callback in a real Lightning Trainer, the eval/ logging and Table 1
then report them.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import Metric

from ct_lightning.callbacks import CounterfactualEvaluation
from ct_lightning.evaluation import EvaluationConfig, evaluate_model
from ct_lightning.evaluation.compare import compare_evaluations, markdown_table, table_row
from ct_lightning.metrics.names import (METRICS, MetricName, evaluation_metrics, logged_values, register_metric,
                                        table_metrics, validation_metrics)
from ct_lightning.module import CTModule


# ------------------------------------------------------------------ three new metrics: functional + class each
def proximity(counterfactuals: Tensor, factuals: Tensor) -> Tensor:
    """ℓ2 distance of each counterfactual to its factual (one value per counterfactual)."""
    return (counterfactuals - factuals).norm(dim=1)


class Proximity(Metric):
    """Mean ℓ2 distance of the counterfactuals seen to their factuals."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, counterfactuals: Tensor, factuals: Tensor) -> None:
        value = proximity(counterfactuals, factuals)
        self.total += value.sum().double()
        self.count += value.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count).float()


def target_one_share(targets: Tensor) -> Tensor:
    """Share of counterfactuals that aim at class 1 (one value per group)."""
    return (targets == 1).float().mean()


class TargetOneShare(Metric):
    """Share of the targets seen that are class 1."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("ones", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, targets: Tensor) -> None:
        self.ones += (targets == 1).sum()
        self.count += targets.numel()

    def compute(self) -> Tensor:
        return self.ones.float() / self.count


def confidence(logits: Tensor, scale: float = 1.0) -> Tensor:
    """``scale`` × the mean top softmax probability of the model on the split (one value per model)."""
    return scale * logits.softmax(-1).max(-1).values.mean()


class Confidence(Metric):
    """``scale`` × the mean top softmax probability over the logits seen."""

    full_state_update = False

    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, logits: Tensor) -> None:
        self.total += logits.softmax(-1).max(-1).values.sum().double()
        self.count += len(logits)

    def compute(self) -> Tensor:
        return (self.scale * self.total / self.count).float()


ROWS = (
    MetricName("proximity", "Prox", False, "prox", proximity, Proximity, "ℓ2 distance to the factual",
               scope="counterfactual", inputs=("counterfactuals", "factuals"), table1="all_mutable"),
    MetricName("target_one", "T1", True, "target_one", target_one_share, TargetOneShare, "share of targets 1",
               scope="group", inputs=("targets",)),
    MetricName("confidence", "Conf", True, "conf", confidence, Confidence, "mean top softmax probability",
               scope="model", inputs=("logits",), options=lambda config: {"scale": 1.0 + config.seed}),
)
NEW = tuple(row.key for row in ROWS)


@pytest.fixture
def new_metrics():
    """The three rows registered, and the table as it was afterwards."""
    before = dict(METRICS)
    for row in ROWS:
        register_metric(row)
    yield ROWS
    METRICS.clear()
    METRICS.update(before)


@pytest.fixture(scope="module")
def model():
    """A small classifier of circles, fitted in a second."""
    torch.manual_seed(0)
    x = torch.randn(300, 2)
    y = ((x ** 2).sum(1) > 1.0).long()
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    optimiser = torch.optim.Adam(net.parameters(), 0.05)
    for _ in range(150):
        optimiser.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        optimiser.step()
    return net, x, y


TINY = EvaluationConfig(n_individuals=20, n_runs=2, lambda_energies=(1.0, 5.0), robust_epsilons=(0.0, 0.03))


# ------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("row", ROWS, ids=NEW)
def test_each_new_class_equals_its_functional_over_one_and_two_batches(row):
    torch.manual_seed(1)
    cf, factuals = torch.randn(30, 2), torch.randn(30, 2)
    targets, logits = torch.randint(2, (30,)), torch.randn(30, 2)
    arguments = {"proximity": (cf, factuals), "target_one": (targets,), "confidence": (logits,)}[row.key]
    value = row.functional(*arguments)
    expected = float(value.mean())  # per counterfactual: the mean of the values; else the value itself
    one, two = row.metric_class(), row.metric_class()
    one.update(*arguments)
    for half in (slice(0, 13), slice(13, None)):  # batches of different sizes
        two.update(*(a[half] for a in arguments))
    assert float(one.compute()) == pytest.approx(expected, rel=1e-6)
    assert float(two.compute()) == pytest.approx(expected, rel=1e-6)


def test_a_registered_metric_is_reported_by_the_evaluation_and_table_1(new_metrics, model):
    net, x, y = model
    assert set(NEW) <= set(evaluation_metrics()) and "proximity" in table_metrics()
    result = evaluate_model(net, x, y, 2, TINY)
    valid = result.samples["valid"]
    assert valid.sum() >= 5  # enough valid counterfactuals for the check to mean something
    # Per counterfactual: one value per valid counterfactual, NaN for the others, pooled in the summary.
    distances = (result.counterfactuals - result.factuals).norm(dim=1).double().numpy()
    np.testing.assert_allclose(result.samples["proximity"][valid], distances[valid], rtol=1e-5)
    assert np.isnan(result.samples["proximity"][~valid]).all()
    summary = result.summary()
    assert summary["proximity"] == pytest.approx(distances[valid].mean(), rel=1e-5)
    # Per group: one value per (run, λ) of its valid counterfactuals; the summary averages the groups.
    expected_groups = []
    for run, lam in zip(result.groups["run"], result.groups["lambda_energy"]):
        rows = (result.samples["run"] == run) & (result.samples["lambda_energy"] == lam) & valid
        expected_groups.append((result.samples["target"][rows] == 1).mean() if rows.any() else math.nan)
    np.testing.assert_allclose(result.groups["target_one"], expected_groups, rtol=1e-6)
    assert summary["target_one"] == pytest.approx(np.nanmean(expected_groups), rel=1e-6)
    assert set(summary["per_lambda"]["5"]) >= {"proximity", "target_one"}
    # Per model: its options come from the EvaluationConfig (scale = 1 + seed).
    with torch.no_grad():
        expected_confidence = float(net(x).softmax(-1).max(-1).values.mean())
    assert summary["confidence"] == pytest.approx(expected_confidence, rel=1e-6)
    again = evaluate_model(net, x, y, 2, EvaluationConfig(**{**TINY.__dict__, "seed": 2}), robust=False)
    assert again.summary()["confidence"] == pytest.approx(3 * expected_confidence, rel=1e-6)
    # The built-in metrics are still there, and everything is logged as eval/...
    assert 0.0 <= summary["validity"] <= 1.0 and summary["ip"] is not None and summary["accuracy"] > 0.5
    logged = logged_values(summary, "eval")
    assert {"eval/prox", "eval/target_one", "eval/conf", "eval/ip", "eval/robust_acc"} <= set(logged)
    # Table 1: a reduction column with the new label, computed from the pair's samples.
    stats = compare_evaluations(result, again, n_boot=20)
    assert set(stats) == set(table_metrics()) and stats["proximity"]["n_bl"] == int(valid.sum())
    row = table_row("toy", stats, {}, summary, again.summary())
    table = markdown_table([row])
    assert table.splitlines()[0].startswith("| Data | IP (−%) | IP* (−%) | Cost (−%) | Prox (−%) | Val BL |")
    assert row["proximity_reduction_pct"] == pytest.approx(stats["proximity"]["reduction_pct"])
    assert row["bl"]["confidence"] == summary["confidence"]


def test_a_registered_metric_is_logged_by_the_evaluation_callback(new_metrics):
    torch.manual_seed(0)
    x = torch.randn(200, 2)
    y = (x[:, 0] + x[:, 1] > 0).long()
    module = CTModule(n_features=2, n_classes=2, objective="vanilla", nce=20)
    module.prepare_counterfactual_data(x[:150], y[:150])
    callback = CounterfactualEvaluation(every_n_epochs=1, n_individuals=20)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback], num_sanity_val_steps=0)
    trainer.fit(module, DataLoader(TensorDataset(x[:150], y[:150]), batch_size=50),
                DataLoader(TensorDataset(x[150:], y[150:]), batch_size=50))
    assert set(NEW) <= set(validation_metrics())
    for name in ("val/prox", "val/target_one", "val/conf", "val/ip", "val/robust_acc"):
        assert name in trainer.callback_metrics, name
    assert 0.5 <= float(trainer.callback_metrics["val/conf"]) <= 1.0
    assert set(callback.last) == {METRICS[key].logged for key in validation_metrics()}


def test_the_table_is_as_it_was_after_a_test_registered_rows():
    assert not set(NEW) & set(METRICS)
    assert evaluation_metrics() == ("ip", "ip_star", "cost", "validity", "accuracy", "robust_accuracy")
    assert validation_metrics() == ("ip", "ip_star", "cost", "validity", "robust_accuracy")
    assert table_metrics() == ("ip", "ip_star", "cost")
    assert table_metrics("level") == ("validity", "accuracy", "robust_accuracy")


def test_every_evaluated_row_names_inputs_its_scope_offers():
    from ct_lightning.evaluation.protocol import SCOPE_INPUTS

    for row in [*METRICS.values(), *ROWS]:
        if row.evaluated:
            names = {entry.partition("=")[2] or entry for entry in row.inputs}
            assert names <= set(SCOPE_INPUTS[row.scope]), row.key


def test_bad_rows_are_one_line_errors(new_metrics, model):
    with pytest.raises(ValueError, match="scope: unknown 'per_row' for metric 'x'; allowed: counterfactual, group, model"):
        MetricName("x", "X", False, "x", proximity, Proximity, "", scope="per_row")
    with pytest.raises(ValueError, match="table1: unknown 'main'"):
        MetricName("x", "X", False, "x", proximity, Proximity, "", table1="main")
    with pytest.raises(ValueError, match="key 'proximity' is already in the table"):
        register_metric(ROWS[0])
    with pytest.raises(ValueError, match="logged name 'prox' is already used by 'proximity'"):
        register_metric(MetricName("prox2", "P2", False, "prox", proximity, Proximity, ""))
    register_metric(MetricName("bad", "B", False, "bad", proximity, Proximity, "", scope="model",
                               inputs=("counterfactuals", "factuals")))
    net, x, y = model
    with pytest.raises(ValueError, match="metric 'bad': input 'counterfactuals' is not offered per model; "
                                         "allowed: model, x, y, logits, domain"):
        evaluate_model(net, x, y, 2, TINY, robust=False)


def test_a_stored_evaluation_keeps_the_new_metrics_and_older_files_still_load(new_metrics, model, tmp_path):
    from ct_lightning.experiment.studies.reproduce import load_evaluation, save_evaluation

    net, x, y = model
    result = evaluate_model(net, x, y, 2, TINY)
    loaded = load_evaluation(save_evaluation(result, tmp_path / "new.pt"))
    assert loaded.per_model == result.per_model
    for key in evaluation_metrics():  # the new ones and the built-in ones
        assert loaded.summary()[key] == pytest.approx(result.summary()[key], rel=1e-12), key
    # A file written before per_model existed: accuracy and robust accuracy only, the new per-model metric None.
    payload = torch.load(tmp_path / "new.pt", weights_only=True)
    del payload["per_model"]
    torch.save(payload, tmp_path / "old.pt")
    old = load_evaluation(tmp_path / "old.pt").summary()
    assert old["accuracy"] == result.accuracy and old["robust_accuracy"] == result.robust_accuracy
    assert old["confidence"] is None and old["proximity"] == pytest.approx(result.summary()["proximity"])
