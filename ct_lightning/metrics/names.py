"""The one table of metric names: summary key → label, direction, logged name, functional and class.

Evaluation summaries use the keys; MLflow and Lightning log ``{prefix}/{logged}`` (``eval/robust_acc``,
``val/ip``); tables use ``label``. Every reader goes through this table, so a metric is renamed in
one place. A new metric is its functional twin, its torchmetrics class and one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchmetrics import Metric

from ct_lightning.metrics import classes, functional


@dataclass(frozen=True)
class MetricName:
    """How one metric is called everywhere."""

    key: str                      # key in evaluation summaries (EvaluationResult.summary())
    label: str                    # column header in tables
    higher_is_better: bool
    logged: str                   # name under a prefix in MLflow / Lightning logs
    functional: Callable | None   # the functional twin
    metric_class: type[Metric] | None  # the torchmetrics class
    description: str


METRICS: dict[str, MetricName] = {m.key: m for m in (
    MetricName("ip", "IP", False, "ip", functional.implausibility, classes.Implausibility,
               "implausibility (Eq. 5): mean distance to reference samples of the target class"),
    MetricName("ip_star", "IP*", False, "ip_star", functional.mmd_implausibility, classes.MMDImplausibility,
               "MMD implausibility (Eq. 6): unbiased MMD² to the reference samples of the target class"),
    MetricName("cost", "Cost", False, "cost", functional.counterfactual_cost, classes.CounterfactualCost,
               "ℓ1 distance between counterfactual and factual"),
    MetricName("validity", "Validity", True, "validity", functional.validity, classes.Validity,
               "share of counterfactuals predicted as their target"),
    MetricName("accuracy", "Acc", True, "acc", functional.validity, classes.Validity,
               "accuracy on clean inputs (the validity computation on labels)"),
    MetricName("robust_accuracy", "Acc*", True, "robust_acc", functional.robust_accuracy, classes.RobustAccuracy,
               "accuracy under FGSM at ε = 0.03"),
    MetricName("invalidation_rate", "IR", False, "ir", functional.invalidation_rate, classes.InvalidationRate,
               "share of counterfactuals whose predicted class changes on related models"),
    MetricName("sparsity", "ℓ0", False, "l0", functional.sparsity, classes.Sparsity,
               "changed features per counterfactual, a one-hot group counting as one"),
)}

# The protocol's metrics logged per evaluated model (eval/..., val/...), in table order.
EVALUATION_METRICS = ("ip", "ip_star", "cost", "validity", "accuracy", "robust_accuracy")
# The metrics of Table 1 (reductions of BL → CT).
TABLE_METRICS = ("ip", "ip_star", "cost")


def logged_name(key: str, prefix: str) -> str:
    """``{prefix}/{logged}`` of metric ``key``, e.g. ``logged_name("robust_accuracy", "eval") == "eval/robust_acc"``."""
    return f"{prefix}/{METRICS[key].logged}"


def logged_values(summary: dict, prefix: str, keys: tuple[str, ...] = EVALUATION_METRICS) -> dict[str, float]:
    """``{logged name: value}`` of the finite values of ``keys`` in an evaluation summary."""
    import math

    out = {}
    for key in keys:
        value = summary.get(key)
        if value is not None and math.isfinite(float(value)):
            out[logged_name(key, prefix)] = float(value)
    return out
