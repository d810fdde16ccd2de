"""CT evaluation metrics: functional forms and torchmetrics classes (SPEC §3), and the table of their names."""

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
