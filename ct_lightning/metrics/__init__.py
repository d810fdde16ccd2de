"""CT evaluation metrics: functional forms and torchmetrics classes (SPEC §3)."""

from .classes import CounterfactualCost, Implausibility, MMDImplausibility, RobustAccuracy, Validity
from .functional import (
    counterfactual_cost,
    implausibility,
    mmd2_unbiased,
    mmd_implausibility,
    robust_accuracy,
    validity,
)

__all__ = [
    "Implausibility",
    "MMDImplausibility",
    "CounterfactualCost",
    "Validity",
    "RobustAccuracy",
    "implausibility",
    "mmd2_unbiased",
    "mmd_implausibility",
    "counterfactual_cost",
    "validity",
    "robust_accuracy",
]
