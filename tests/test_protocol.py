"""The two readings of the evaluation protocol: presets, balanced factuals, per-run Table 1 arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ct_lightning.evaluation.compare import compare_evaluations, per_run_means, run_comparison
from ct_lightning.evaluation.protocol import EvaluationConfig, draw_balanced, evaluate_model, protocol_settings
from ct_lightning.experiment.configuration.protocol_options import reference_individuals
from ct_lightning.experiment.studies.reproduce import role_training_overrides
from ct_lightning.metrics.functional import mmd_implausibility


def test_run_comparison_by_hand():
    bl, ct = [2.0, 4.0, 5.0], [1.0, 3.0, 5.0]
    ratios = [0.5, 0.75, 1.0]
    out = run_comparison(bl, ct, confidence=0.5)
    assert out["reduction_pct"] == pytest.approx(-100 * (sum(ratios) / 3 - 1))  # 25%
    sd = math.sqrt(sum((r - 0.75) ** 2 for r in ratios) / 2)
    assert out["se"] == pytest.approx(100 * sd)
    assert out["se_mean"] == pytest.approx(100 * sd / math.sqrt(3))
    # deltas −1, −1, 0: the 25%–75% quantiles are −1 and −0.5, which exclude zero.
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((-1.0, -0.5))
    assert out["significant"]
    assert not run_comparison(bl, [1.0, 3.0, 6.0], confidence=0.99)["significant"]  # deltas −1, −1, +1
    dropped = run_comparison([2.0, float("nan"), 0.0], [1.0, 1.0, 1.0])
    assert dropped["n_runs"] == 1 and dropped["reduction_pct"] == pytest.approx(50.0)


def _result_with(values_by_run_lambda: dict, n_per_cell: int = 2):
    """A tiny EvaluationResult-like object whose per-sample ``ip`` holds the given cell values."""
    class Result:
        pass

    runs, lams, ips = [], [], []
    for (run, lam), value in values_by_run_lambda.items():
        runs += [run] * n_per_cell
        lams += [lam] * n_per_cell
        ips += [value] * n_per_cell
    result = Result()
    result.samples = {"run": np.array(runs), "lambda_energy": np.array(lams), "ip": np.array(ips, dtype=float)}
    result.groups = {"run": np.array([0, 0, 1, 1]), "lambda_energy": np.array([0.1, 1.0, 0.1, 1.0]),
                     "ip_star": np.array([-0.5, 0.4, 0.2, 0.6])}
    return result


def test_per_run_means_average_lambda_cells_then_runs():
    result = _result_with({(0, 0.1): 1.0, (0, 1.0): 3.0, (1, 0.1): 2.0, (1, 1.0): float("nan")})
    assert per_run_means(result, "ip") == pytest.approx([2.0, 2.0])
    # IP*: negative MMD² is clamped at 0 before averaging.
    assert per_run_means(result, "ip_star") == pytest.approx([0.2, 0.4])


def test_draw_balanced_is_balanced_over_predicted_classes_and_targets_differ():
    predicted = torch.tensor([0] * 90 + [1] * 10)
    index, targets = draw_balanced(predicted, 2, n_individuals=400, n_runs=3, seed=1)
    assert index.shape == targets.shape == (3, 400)
    classes = predicted[index]
    assert torch.equal(classes[0], classes[1]) and torch.equal(classes[1], classes[2])  # fixed per individual
    assert 0.4 < classes[0].float().mean() < 0.6  # about half, although class 1 is only 10% of the rows
    assert not (targets == classes).any()
    assert not torch.equal(index[0], index[1])  # each run draws its own rows
    only_zero = draw_balanced(torch.zeros(20, dtype=torch.long), 3, 50, 1, 0)
    assert (torch.zeros(20, dtype=torch.long)[only_zero[0]] == 0).all() and (only_zero[1] != 0).all()


def test_mmd_subsamples_counterfactuals_when_asked():
    torch.manual_seed(0)
    cf, ref = torch.randn(300, 2), torch.randn(500, 2) + 1
    targets, ref_y = torch.zeros(300, dtype=torch.long), torch.zeros(500, dtype=torch.long)
    rng = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    full = mmd_implausibility(cf, targets, ref, ref_y, 5.0, None, rng())
    sub = mmd_implausibility(cf, targets, ref, ref_y, 5.0, 100, rng(), max_counterfactuals=100)
    assert not torch.isclose(full, sub)  # a different (subsampled) estimate of the same quantity
    assert abs(float(full - sub)) < 0.1
    assert torch.equal(sub, mmd_implausibility(cf, targets, ref, ref_y, 5.0, 100, rng(), max_counterfactuals=100))


def test_protocol_presets_and_reference_training():
    reference, paper = protocol_settings("reference"), protocol_settings("paper")
    assert (reference["lr"], reference["ip_p"], reference["length_scale"], reference["tau"]) == (0.1, 1.0, 5.0, 0.95)
    assert protocol_settings("reference", cost_pair=True)["tau"] == 0.5
    assert (paper["lr"], paper["n_runs"], protocol_settings("paper", cost_pair=True)["tau"]) == (0.25, 5, 0.95)
    assert [reference_individuals(d) for d in ("moons", "adult", "mnist")] == [250, 100, 25]
    with pytest.raises(ValueError, match="protocol: unknown 'x'; allowed: reference, paper"):
        protocol_settings("x")
    assert role_training_overrides("reference", "moons", "ct_protected") == \
        {"search_lr": 0.1, "lambda_reg": 0.0, "lambda_adv": 0.0}
    assert role_training_overrides("reference", "adult", "ct_protected") == {"search_lr": 0.1}
    assert role_training_overrides("paper", "moons", "ct_protected") == {}


def test_reference_evaluation_end_to_end_with_run_statistics():
    torch.manual_seed(0)
    x = torch.randn(200, 2)
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    config = EvaluationConfig(**{**protocol_settings("reference"), "n_runs": 6, "n_individuals": 20},
                              lambda_energies=(0.5, 5.0), max_steps=10)
    bl = evaluate_model(model, x, y, 2, config)
    assert bl.samples["run"].max() == 5 and len(bl.groups["ip_star"]) == 12
    # Without the group metrics (a grid's evaluation): IP* is NaN, everything per counterfactual is the same.
    lean = evaluate_model(model, x, y, 2, config, group_metrics=False)
    assert np.isnan(lean.groups["ip_star"]).all() and np.isfinite(bl.groups["ip_star"]).any()
    for name in ("ip", "cost", "valid", "target"):
        np.testing.assert_allclose(lean.samples[name], bl.samples[name], rtol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(lean.groups["n_valid"], bl.groups["n_valid"])
    assert abs(bl.samples["prediction"][:20].mean() - 0.5) <= 0.3  # balanced over predicted classes
    same = compare_evaluations(bl, bl, ("ip", "ip_star"), statistic="runs")
    assert same["ip"]["reduction_pct"] == pytest.approx(0.0) and not same["ip"]["significant"]
    assert same["ip"]["statistic"] == "runs" and "n_boot" in same["ip"]["alternative"]
    with pytest.raises(ValueError, match="statistic"):
        compare_evaluations(bl, bl, ("ip",), statistic="median")


def test_verdicts_against_the_paper():
    from ct_lightning.evaluation.paper import agreement_counts, beside_paper_table, verdict

    assert verdict(10.0, True, 12.0, True) == "same"
    assert verdict(-3.0, False, 1.0, False) == "same"  # neither significant: no direction claimed
    assert verdict(10.0, False, 12.0, True) == "direction only"
    assert verdict(-10.0, True, 12.0, True) == "opposite"
    assert verdict(-10.0, False, 12.0, True) == "significance only"
    assert verdict(float("nan"), True, 12.0, True) == "n/a"
    row = {"data": "gmsc", "ip_reduction_pct": 12.4, "ip_se": 3.8, "ip_star_reduction_pct": 57.4, "ip_star_se": 9.9,
           "cost_reduction_pct": -5.0, "cost_se": 1.0, "significant": {"ip": True, "ip_star": True, "cost": True}}
    table = beside_paper_table([row])
    assert "| GMSC | 12.40 ± 3.80* | 23.44 ± 1.99* | same |" in table
    assert agreement_counts([row]) == {"same": 2, "opposite": 1}
