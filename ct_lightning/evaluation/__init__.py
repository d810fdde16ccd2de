"""The paper's evaluation protocol, the BL-vs-CT comparison (bootstrap, tables) and the plots.

The public names below are imported on first use (PEP 562), as in ``ct_lightning``: the protocol loads the metric
classes (torchmetrics, and with it SciPy and Matplotlib), which explaining a decision
(:mod:`ct_lightning.evaluation.explanation`) does not need.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EvaluationConstraints": "ct_lightning.evaluation.eval_constraints",
    "evaluation_constraints": "ct_lightning.evaluation.eval_constraints",
    **{name: "ct_lightning.evaluation.protocol" for name in ("LAMBDA_ENERGIES", "EvaluationConfig", "EvaluationResult",
                                                            "counterfactuals_per_class", "evaluate_model")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ct_lightning.evaluation' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
