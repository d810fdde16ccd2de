"""The paper's evaluation protocol, the BL-vs-CT comparison (bootstrap, tables) and the plots.

The public names below are imported on first use (PEP 562), as in ``ct_lightning``: the protocol loads the metric
classes (torchmetrics, and with it SciPy and Matplotlib), which explaining a decision
(:mod:`ct_lightning.evaluation.explanation`) does not need.
"""

from __future__ import annotations

from ct_lightning.lazy_exports import lazy_exports

_EXPORTS = {
    "EvaluationConstraints": "ct_lightning.evaluation.eval_constraints",
    "evaluation_constraints": "ct_lightning.evaluation.eval_constraints",
    **{name: "ct_lightning.evaluation.protocol" for name in ("LAMBDA_ENERGIES", "EvaluationConfig", "EvaluationResult",
                                                            "counterfactuals_per_class", "evaluate_model")},
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
