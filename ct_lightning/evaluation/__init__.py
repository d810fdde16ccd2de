"""The paper's evaluation protocol, the BL-vs-CT comparison (bootstrap, tables) and the plots."""

from ct_lightning.evaluation.eval_constraints import EvaluationConstraints, evaluation_constraints
from ct_lightning.evaluation.protocol import (LAMBDA_ENERGIES, EvaluationConfig, EvaluationResult,
                                              counterfactuals_per_class, evaluate_model)

__all__ = ["LAMBDA_ENERGIES", "EvaluationConfig", "EvaluationConstraints", "EvaluationResult",
           "counterfactuals_per_class", "evaluate_model", "evaluation_constraints"]
