"""Tests of the evaluation protocol, the bootstrap comparison, plots, the evaluation callback and the recipes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ct_lightning.evaluation.compare import bootstrap_comparison, format_cell, markdown_table, reduction_pct, table_row  # noqa: E402
from ct_lightning.constraints import parse_mutability  # noqa: E402
from ct_lightning.evaluation import EvaluationConfig, counterfactuals_per_class, evaluate_model  # noqa: E402
from ct_lightning.callbacks import VAL_METRICS, CounterfactualEvaluation  # noqa: E402
from ct_lightning.module import CTModule  # noqa: E402
from ct_lightning.evaluation.plots import evaluation_figures, integrated_gradients_by_class  # noqa: E402
from ct_lightning.evaluation import evaluation_constraints  # noqa: E402
from ct_lightning.experiment.runs.loading import load_run  # noqa: E402
from ct_lightning.experiment.configuration.data import build_datamodule  # noqa: E402
from ct_lightning.experiment.runs.train import train  # noqa: E402

TINY = EvaluationConfig(n_individuals=20, n_runs=2, lambda_energies=(1.0, 5.0), robust_epsilons=(0.0, 0.03, 0.1))


# --------------------------------------------------------------------------------------------- bootstrap
def test_reduction_formula_by_hand():
    assert reduction_pct(10.0, 7.0) == pytest.approx(30.0)
    assert reduction_pct(4.0, 5.0) == pytest.approx(-25.0)
    assert math.isnan(reduction_pct(0.0, 1.0))
    out = bootstrap_comparison([2.0, 4.0], [1.0, 2.0], n_boot=50)
    assert out["bl_mean"] == 3.0 and out["ct_mean"] == 1.5
    assert out["reduction_pct"] == pytest.approx(50.0)
    assert out["diff"] == pytest.approx(-1.5)


def test_bootstrap_identical_constant_samples_have_zero_se_and_are_not_significant():
    out = bootstrap_comparison(np.full(40, 2.5), np.full(40, 2.5), n_boot=100)
    assert out["reduction_pct"] == 0.0
    assert out["se"] == 0.0
    assert out["ci_low"] == 0.0 and out["ci_high"] == 0.0
    assert out["significant"] is False


def test_bootstrap_clear_shift_is_significant_and_same_distribution_is_not():
    rng = np.random.default_rng(0)
    bl, ct = 1.0 + 0.05 * rng.standard_normal(200), 0.5 + 0.05 * rng.standard_normal(200)
    out = bootstrap_comparison(bl, ct, n_boot=100, seed=1)
    assert out["significant"] is True
    assert out["ci_high"] < 0  # CT − BL is negative: CT lower
    assert -0.55 < out["ci_low"] < out["ci_high"] < -0.45
    assert out["reduction_pct"] == pytest.approx(50.0, abs=2.0)
    assert 0 < out["se"] < 1.0
    same = bootstrap_comparison(rng.standard_normal(200) + 5, rng.standard_normal(200) + 5, n_boot=100, seed=2)
    assert same["significant"] is False and same["ci_low"] < 0 < same["ci_high"]


def test_bootstrap_drops_nan_and_handles_empty_sides():
    out = bootstrap_comparison([1.0, np.nan, 3.0], [np.nan, 1.0], n_boot=20)
    assert out["n_bl"] == 2 and out["n_ct"] == 1 and out["bl_mean"] == 2.0
    empty = bootstrap_comparison([], [1.0, 2.0])
    assert math.isnan(empty["reduction_pct"]) and empty["significant"] is False


def test_table_row_and_markdown_asterisk():
    stats = {"ip": bootstrap_comparison([2.0, 2.2, 1.8] * 20, [1.0, 1.1, 0.9] * 20),
             "ip_star": bootstrap_comparison([0.1, 0.2], [0.1, 0.2])}
    cost = {"cost": bootstrap_comparison([3.0] * 5, [3.0] * 5)}
    summary = {"ip": 2.0, "ip_star": 0.15, "cost": 4.0, "validity": 1.0, "accuracy": 0.9, "robust_accuracy": 0.8}
    row = table_row("toy", stats, cost, summary, summary, summary, summary)
    assert row["significant"] == {"ip": True, "ip_star": False, "cost": False}
    assert format_cell(row, "ip").endswith("*") and "*" not in format_cell(row, "cost")
    assert "†" in format_cell(row, "cost") and "†" not in format_cell(row, "ip")  # 5 vs 60 samples
    assert row["bl"]["cost"] == 4.0 and row["bl"]["accuracy"] == 0.9
    table = markdown_table([row])
    assert table.startswith("| Data | IP (−%)") and "| toy | 50.00 ± " in table


# ------------------------------------------------------------------------------------- trained fixtures
@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny models run fastest on one thread, above all on a shared 2-core machine; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="module")
def trained(store):
    """A tiny CT run on circles, trained with the evaluation callback on (eval_every=1)."""
    summary = train({"data": "circles", "objective": "full", "max_epochs": 2, "limit_train_batches": 15,
                     "nce": 100, "progress": False, "eval_every": 1, "seed": 0,
                     "tracking_uri": f"sqlite:///{store}/mlflow.db"})
    loaded = load_run(summary["run_id"], summary["tracking_uri"])
    datamodule = build_datamodule(loaded.config)
    return SimpleNamespace(summary=summary, loaded=loaded, datamodule=datamodule)


def test_run_checkpoint_is_the_final_model(trained):
    # val/acc saturates on circles, so Lightning's own last.ckpt would stay at an early epoch.
    checkpoint = torch.load(trained.loaded.checkpoint, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 2 * 15


def test_train_with_eval_every_logs_val_metrics(trained):
    from mlflow.tracking import MlflowClient

    run = MlflowClient(trained.summary["tracking_uri"]).get_run(trained.summary["run_id"])
    for name in VAL_METRICS:
        assert f"val/{name}" in run.data.metrics
    assert 0.0 <= run.data.metrics["val/validity"] <= 1.0


def test_protocol_on_trained_model(trained):
    dm, module = trained.datamodule, trained.loaded.module
    c = evaluation_constraints(module, dm)
    result = evaluate_model(module, dm.x_test, dm.y_test, dm.n_classes, TINY, c.mutability, c.lower, c.upper)
    s = result.samples
    n = TINY.n_individuals * TINY.n_runs * len(TINY.lambda_energies)
    assert all(len(v) == n for v in s.values())
    assert len(result.groups["ip_star"]) == TINY.n_runs * len(TINY.lambda_energies)
    summary = result.summary()
    assert 0.0 <= summary["validity"] <= 1.0 and 0.0 <= summary["accuracy"] <= 1.0
    assert np.isfinite(s["ip"][s["valid"]]).all() and np.isfinite(s["cost"][s["valid"]]).all()
    assert np.isnan(s["ip"][~s["valid"]]).all() and np.isnan(s["cost"][~s["valid"]]).all()
    assert len(result.metric_samples("ip")) == int(s["valid"].sum()) == summary["n_valid"]
    # Targets differ from the model's prediction; factuals come from the test split.
    assert (s["target"] != s["prediction"]).all()
    assert s["factual_index"].max() < len(dm.x_test)
    assert torch.equal(result.factuals[0], dm.x_test[s["factual_index"][0]])
    assert len(result.robust_curve["accuracy"]) == 3 and result.robust_curve["accuracy"][0] == summary["accuracy"]
    # Seeded: the same configuration gives the same counterfactuals.
    again = evaluate_model(module, dm.x_test, dm.y_test, dm.n_classes, TINY, c.mutability, c.lower, c.upper,
                           robust=False)
    assert torch.equal(again.counterfactuals, result.counterfactuals)
    json.dumps(result.to_dict())


def test_protocol_counts_only_valid_counterfactuals(trained):
    dm, module = trained.datamodule, trained.loaded.module
    config = EvaluationConfig(n_individuals=40, n_runs=1, lambda_energies=(0.1,), max_steps=1, lr=0.01,
                              robust_epsilons=(0.03,))
    result = evaluate_model(module, dm.x_test, dm.y_test, 2, config)
    valid = result.samples["valid"]
    assert (~valid).any()  # one tiny step cannot cross the boundary for most factuals
    ip_valid = result.samples["ip"][valid]
    expected = float(ip_valid.mean()) if valid.any() else None
    assert result.summary()["ip"] == (pytest.approx(expected) if expected is not None else None)
    assert result.summary()["validity"] == pytest.approx(valid.mean())


def test_protocol_respects_mutability(trained):
    dm, module = trained.datamodule, trained.loaded.module
    codes = parse_mutability({"x1": "none"}, 2, ["x1", "x2"])
    result = evaluate_model(module, dm.x_test, dm.y_test, 2, TINY, mutability=codes, robust=False)
    assert torch.equal(result.counterfactuals[:, 0], result.factuals[:, 0])


# ---------------------------------------------------------------------------------------- callback
def test_evaluation_callback_in_a_real_trainer_without_datamodule():
    torch.manual_seed(0)
    x = torch.randn(200, 2)
    y = (x[:, 0] + x[:, 1] > 0).long()
    train_loader = DataLoader(TensorDataset(x[:150], y[:150]), batch_size=50)
    val_loader = DataLoader(TensorDataset(x[150:], y[150:]), batch_size=50)
    module = CTModule(n_features=2, n_classes=2, objective="vanilla", nce=20)
    # CTModule.on_fit_start reads trainer.train_dataloader, which Lightning has not loaded yet
    # when no datamodule is given (reported to the lead); hand the training data over directly.
    module.prepare_counterfactual_data(x[:150], y[:150])
    callback = CounterfactualEvaluation(every_n_epochs=1, n_individuals=20)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback], num_sanity_val_steps=1)
    trainer.fit(module, train_loader, val_loader)
    for name in VAL_METRICS:
        assert f"val/{name}" in trainer.callback_metrics
    assert 0.0 <= float(trainer.callback_metrics["val/validity"]) <= 1.0
    assert callback.last is not None and set(callback.last) == set(VAL_METRICS)


# ------------------------------------------------------------------------------------- plots (images)
def test_image_plots_with_fake_784_feature_model(tmp_path):
    torch.manual_seed(0)
    n_classes, d = 3, 784
    model = nn.Sequential(nn.Linear(d, 8), nn.ReLU(), nn.Linear(8, n_classes))
    x = torch.rand(30, d) * 2 - 1
    y = torch.arange(30) % n_classes
    names = [f"pixel_{i}" for i in range(d)]
    protected = names[:28 * 5] + names[-28 * 5:]
    dm = SimpleNamespace(name="fake_mnist", n_features=d, n_classes=n_classes, feature_names=names,
                         protected=protected, x_train=x, y_train=y, x_test=x, y_test=y,
                         domain=lambda n_std=3.0: (torch.full((d,), -1.0), torch.full((d,), 1.0)))
    ig = integrated_gradients_by_class(model, x, y, n_classes, n_steps=8)
    assert ig.shape == (n_classes, d) and torch.isfinite(ig).all()
    config = EvaluationConfig(n_individuals=6, n_runs=1, lambda_energies=(1.0,), max_steps=5,
                              robust_epsilons=(0.0, 0.05))
    codes = parse_mutability({f: "none" for f in protected}, d, names)
    grid = counterfactuals_per_class(model, x[:2], n_classes, config, mutability=codes)
    assert grid.shape == (2, n_classes, d)
    assert torch.equal(grid[:, :, :140], x[:2, None, :140].expand(2, n_classes, 140))  # protected rows fixed
    result = evaluate_model(model, x, y, n_classes, config, mutability=codes)
    constraints = SimpleNamespace(mutability=codes, lower=None, upper=None, immutable=protected,
                                  protected_mask=codes == 3)
    paths = evaluation_figures({"BL": {"module": model, "result": result, "constraints": constraints},
                                "CT": {"module": model, "result": result, "constraints": constraints}},
                               dm, tmp_path, prefix="fake_")
    names_written = {p.name for p in paths}
    assert {"fake_counterfactuals.png", "fake_integrated_gradients.png", "fake_robust_accuracy.png"} <= names_written
    assert all(p.stat().st_size > 1000 for p in paths)


# ------------------------------------------------------------------------------------------- recipes
def test_evaluate_recipe_end_to_end(trained, tmp_path):
    from mlflow.tracking import MlflowClient

    from recipes.evaluate import main

    out = tmp_path / "eval.json"
    payload = main(["--run-id", trained.summary["run_id"], "--tracking-uri", trained.summary["tracking_uri"],
                    "--n-individuals", "15", "--n-runs", "1", "--lambda-energy", "1,5", "--summary-json", str(out),
                    "--out-dir", str(tmp_path / "plots")])
    saved = json.loads(out.read_text())
    assert saved["run_id"] == trained.summary["run_id"] and saved["data"] == "circles"
    assert 0.0 <= saved["summary"]["validity"] <= 1.0
    assert len(saved["samples"]["valid"]) == 30
    client = MlflowClient(trained.summary["tracking_uri"])
    metrics = client.get_run(trained.summary["run_id"]).data.metrics
    for name in ("ip", "ip_star", "cost", "validity", "acc", "robust_acc"):
        assert f"eval/{name}" in metrics
    assert metrics["eval/validity"] == pytest.approx(saved["summary"]["validity"])
    # how they were made: a quick check and a full evaluation read alike in the UI otherwise
    tag = client.get_run(trained.summary["run_id"]).data.tags["ct.evaluated_with"]
    assert tag.startswith("reference protocol, 1 run x 15 individuals, test split; "), tag
    plots = {Path(a.path).name for a in client.list_artifacts(trained.summary["run_id"], "plots")}
    assert {"decision_boundary.png", "robust_accuracy.png", "convergence.png"} <= plots
    assert payload["logged"]


@pytest.mark.slow
def test_compare_recipe_end_to_end(store, tmp_path):
    from mlflow.tracking import MlflowClient

    from recipes.compare import main

    uri = f"sqlite:///{store}/mlflow.db"
    out_dir = tmp_path / "compare"
    main(["--data", "circles", "--max-epochs", "1", "--limit-train-batches", "10", "--nce", "60",
          "--n-individuals", "15", "--n-runs", "2", "--lambda-energy", "1,5", "--tracking-uri", uri,
          "--out-dir", str(out_dir), "--summary-json", str(tmp_path / "summary.json")])
    summary = json.loads((tmp_path / "summary.json").read_text())
    (row,) = summary["rows"]
    assert row["data"] == "circles"
    for metric in ("ip", "ip_star", "cost"):
        for suffix in ("reduction_pct", "se", "ci_low", "ci_high"):
            assert f"{metric}_{suffix}" in row
        assert isinstance(row["significant"][metric], bool)
    for side in ("bl", "ct"):
        for key in ("ip", "ip_star", "cost", "validity", "accuracy", "robust_accuracy"):
            assert key in row[side]
        assert 0.0 <= row[side]["accuracy"] <= 1.0
    assert (out_dir / "table.md").read_text().startswith("| Data |")
    assert (out_dir / "table.csv").is_file()
    client = MlflowClient(uri)
    parent = summary["parent_run_id"]
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"table.md", "table.csv", "summary.json", "plots"} <= artifacts
    plots = {Path(a.path).name for a in client.list_artifacts(parent, "plots")}
    assert {"circles_decision_boundary.png", "circles_robust_accuracy.png", "circles_convergence.png"} <= plots
    for role, run_id in row["runs"].items():
        child = client.get_run(run_id)
        assert child.data.tags["mlflow.parentRunId"] == parent
        assert "eval/validity" in child.data.metrics
    assert len(row["runs"]) == 4


def test_protocol_with_a_generator_that_learns_from_data(tmp_path, monkeypatch):
    """`--generator revise` at test time: the VAE is fitted on the training split, mutability holds."""
    from ct_lightning.constraints import parse_mutability
    from ct_lightning.evaluation import EvaluationConfig, evaluate_model

    monkeypatch.setenv("CT_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    x_train = torch.cat([torch.randn(150, 2) * 0.4 + 1.5, torch.randn(150, 2) * 0.4 - 1.5])
    y_train = torch.cat([torch.zeros(150), torch.ones(150)]).long()
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
        model.bias.zero_()
    codes = parse_mutability({0: "none"}, 2)
    config = EvaluationConfig(n_individuals=20, n_runs=1, generator="revise", tau=0.6, max_steps=40)
    with pytest.raises(ValueError, match="pass x_train"):
        evaluate_model(model, x_train, y_train, 2, config, codes, robust=False)
    result = evaluate_model(model, x_train, y_train, 2, config, codes, robust=False, x_train=x_train)
    assert 0.0 <= result.summary()["validity"] <= 1.0
    assert torch.equal(result.counterfactuals[:, 0], result.factuals[:, 0])
