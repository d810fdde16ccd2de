"""CT evaluation metrics (SPEC §3): functional forms (what the evaluation computes), torchmetrics classes (the same
quantities for your own Lightning loop) and, in :mod:`ct_lightning.metrics.names`, the one table of metrics."""

from .classes import (CounterfactualCost, Implausibility, InvalidationRate, MMDImplausibility, RobustAccuracy, Sparsity,
                      Validity)
from .functional import (
    counterfactual_cost,
    implausibility,
    invalidation_rate,
    mmd2_biased,
    mmd2_unbiased,
    mmd_implausibility,
    robust_accuracy,
    sparsity,
    validity,
)

__all__ = [
    "Implausibility",
    "MMDImplausibility",
    "CounterfactualCost",
    "Validity",
    "RobustAccuracy",
    "InvalidationRate",
    "Sparsity",
    "implausibility",
    "invalidation_rate",
    "mmd2_biased",
    "mmd2_unbiased",
    "mmd_implausibility",
    "counterfactual_cost",
    "sparsity",
    "validity",
    "robust_accuracy",
]
