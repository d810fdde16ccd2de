"""The one table of metrics: per metric its key, label, direction, logged name, functional, class, and what
the evaluation does with it.

Evaluation summaries use the keys; MLflow and Lightning log ``{prefix}/{logged}`` (``eval/robust_acc``,
``val/ip``); Table 1 uses ``label``. A row with a ``scope`` is computed by the evaluation protocol
(:func:`ct_lightning.evaluation.evaluate_model`) from its ``functional``, reported in the summary, logged as
``eval/...`` and, with ``validation``, by the ``CounterfactualEvaluation`` callback as ``val/...``; a row
with ``table1`` is a column of Table 1. So a new metric that the evaluation reports is its functional, its
torchmetrics class and one row here (``register_metric`` adds a row at run time).

The ``functional`` is what the evaluation calls: the protocol keeps one value per counterfactual, per
``(run, λ_egy)`` group or per model, which Table 1's bootstrap resamples and the stored evaluations keep.
The ``metric_class`` is the same quantity in torchmetrics form, for a user's own Lightning loop
(``self.log("val/ip", metric)``); it accumulates over batches and ``compute()`` gives the mean over every
counterfactual it saw, which ``tests/test_metric_contract.py`` holds equal to the functional's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchmetrics import Metric

from ct_lightning.metrics import classes, functional

# What one value of a metric describes in the evaluation (the arguments each scope offers: ct_lightning.evaluation.protocol).
SCOPES = ("counterfactual", "group", "model")
# Where a metric sits in Table 1: a reduction column (BL → CT) from the all-mutable or the protected pair of
# models, or a level column (the BL and CT values side by side, all-mutable pair).
TABLE1_PLACES = ("all_mutable", "protected", "level")


@dataclass(frozen=True)
class MetricName:
    """One metric: how it is called everywhere and what the evaluation does with it.

    ``scope``: ``counterfactual`` (one value per valid counterfactual; the summary pools them), ``group``
    (one value per ``(run, λ_egy)`` group of valid counterfactuals; the summary averages the groups),
    ``model`` (one value per evaluated model) or ``None`` (not computed by the evaluation protocol).
    ``inputs``: the functional's arguments, each ``name`` or ``parameter=name`` with ``name`` one the scope
    offers (``ct_lightning.evaluation.protocol.SCOPE_INPUTS``); ``options``: keyword arguments made from the
    ``EvaluationConfig``. A per-counterfactual functional returns one value per row, the others a scalar.
    ``column``: the evaluation column that holds it (default ``key``); ``attack``: needs an adversarial
    attack (skipped by ``evaluate_model(robust=False)``); ``validation``: logged under ``val/`` by the
    evaluation callback; ``table1``: its place in Table 1 (``TABLE1_PLACES``) or ``None``.
    """

    key: str                      # key in evaluation summaries (EvaluationResult.summary())
    label: str                    # column header in tables
    higher_is_better: bool
    logged: str                   # name under a prefix in MLflow / Lightning logs
    functional: Callable | None   # the functional form (what the evaluation computes)
    metric_class: type[Metric] | None  # the torchmetrics class (for a user's own Lightning loop)
    description: str
    scope: str | None = None
    inputs: tuple[str, ...] = ()
    options: Callable[[Any], dict] | None = None
    column: str | None = None
    attack: bool = False
    validation: bool = True
    table1: str | None = None

    def __post_init__(self):
        if self.scope is not None and self.scope not in SCOPES:
            raise ValueError(f"scope: unknown {self.scope!r} for metric {self.key!r}; allowed: {', '.join(SCOPES)}, None")
        if self.table1 is not None and self.table1 not in TABLE1_PLACES:
            raise ValueError(f"table1: unknown {self.table1!r} for metric {self.key!r}; allowed: "
                             f"{', '.join(TABLE1_PLACES)}, None")
        if self.scope is not None and self.functional is None:
            raise ValueError(f"functional: metric {self.key!r} has scope {self.scope!r} but no functional")

    @property
    def evaluated(self) -> bool:
        """Whether the evaluation protocol computes it."""
        return self.scope is not None

    def source(self) -> str:
        """The evaluation column (``samples``/``groups``) or per-model entry that holds its values."""
        return self.column or self.key


METRICS: dict[str, MetricName] = {m.key: m for m in (
    MetricName("ip", "IP", False, "ip", functional.implausibility, classes.Implausibility,
               "implausibility (Eq. 5): mean distance to reference samples of the target class",
               scope="counterfactual", inputs=("counterfactuals", "targets", "reference_x", "reference_y"),
               options=lambda config: {"p": config.ip_p}, table1="all_mutable"),
    MetricName("ip_star", "IP*", False, "ip_star", functional.mmd_implausibility, classes.MMDImplausibility,
               "MMD implausibility (Eq. 6): unbiased MMD² to the reference samples of the target class",
               scope="group", inputs=("counterfactuals", "targets", "reference_x", "reference_y", "generator"),
               options=lambda config: {"length_scale": config.length_scale, "max_samples": config.mmd_max_samples,
                                       "max_counterfactuals": config.mmd_max_counterfactuals},
               table1="all_mutable"),
    MetricName("cost", "Cost", False, "cost", functional.counterfactual_cost, classes.CounterfactualCost,
               "ℓ1 distance between counterfactual and factual",
               scope="counterfactual", inputs=("counterfactuals", "factuals"), table1="protected"),
    # Validity decides which counterfactuals the other metrics see, so the protocol computes it first (column
    # ``valid``, one 0/1 per counterfactual, every counterfactual counted); the functional is its mean.
    MetricName("validity", "Val", True, "validity", functional.validity, classes.Validity,
               "share of counterfactuals predicted as their target",
               scope="counterfactual", inputs=("logits", "targets"), column="valid", table1="level"),
    # Not under val/ from the callback: CTModule logs val/acc itself, every epoch.
    MetricName("accuracy", "Acc", True, "acc", functional.validity, classes.Validity,
               "accuracy on clean inputs (the validity computation on labels)",
               scope="model", inputs=("logits", "targets=y"), validation=False, table1="level"),
    MetricName("robust_accuracy", "Acc*", True, "robust_acc", functional.robust_accuracy, classes.RobustAccuracy,
               "accuracy under FGSM at ε = 0.03",
               scope="model", inputs=("model", "x", "y", "domain"),
               options=lambda config: {"epsilon": config.robust_epsilon, "attack": config.attack},
               attack=True, table1="level"),
    MetricName("invalidation_rate", "IR", False, "ir", functional.invalidation_rate, classes.InvalidationRate,
               "share of counterfactuals whose predicted class changes on related models"),
    MetricName("sparsity", "ℓ0", False, "l0", functional.sparsity, classes.Sparsity,
               "changed features per counterfactual, a one-hot group counting as one"),
)}


def register_metric(row: MetricName, replace: bool = False) -> MetricName:
    """Add ``row`` to :data:`METRICS` (after the others); the evaluation, the callback and Table 1 read it from there.

    A key or logged name already taken is an error unless ``replace``. Returns the row.
    """
    taken = {m.logged: m.key for m in METRICS.values() if m.key != row.key}
    if row.key in METRICS and not replace:
        raise ValueError(f"metric: key {row.key!r} is already in the table; pass replace=True to replace it")
    if row.logged in taken:
        raise ValueError(f"metric: logged name {row.logged!r} is already used by {taken[row.logged]!r}")
    METRICS[row.key] = row
    return row


def evaluation_metrics(scope: str | None = None) -> tuple[str, ...]:
    """Keys of the metrics the evaluation protocol computes (of one ``scope``), in table order."""
    return tuple(k for k, m in METRICS.items() if m.evaluated and (scope is None or m.scope == scope))


def validation_metrics() -> tuple[str, ...]:
    """Keys of the metrics the ``CounterfactualEvaluation`` callback logs under ``val/``, in table order."""
    return tuple(k for k, m in METRICS.items() if m.evaluated and m.validation)


def table_metrics(*places: str) -> tuple[str, ...]:
    """Keys of the Table 1 metrics at ``places`` (default: the reduction columns), in table order."""
    places = places or ("all_mutable", "protected")
    return tuple(k for k, m in METRICS.items() if m.table1 in places)


def table_label(key: str) -> str:
    """The Table 1 header of a reduction column, e.g. ``IP* (−%)``."""
    return f"{METRICS[key].label} (−%)"


def __getattr__(name: str):
    # Derived afresh on every access, so that a registered row shows up in them.
    if name == "EVALUATION_METRICS":  # the protocol's metrics logged per evaluated model (eval/..., val/...)
        return evaluation_metrics()
    if name == "TABLE_METRICS":  # the metrics of Table 1 (reductions of BL → CT)
        return table_metrics()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def logged_name(key: str, prefix: str) -> str:
    """``{prefix}/{logged}`` of metric ``key``, e.g. ``logged_name("robust_accuracy", "eval") == "eval/robust_acc"``."""
    return f"{prefix}/{METRICS[key].logged}"


def logged_values(summary: dict, prefix: str, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """``{logged name: value}`` of the finite values of ``keys`` (default: every evaluated metric) in a summary."""
    out = {}
    for key in evaluation_metrics() if keys is None else keys:
        value = summary.get(key)
        if value is not None and math.isfinite(float(value)):
            out[logged_name(key, prefix)] = float(value)
    return out
