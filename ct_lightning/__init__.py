"""ct-lightning: counterfactual training (CT) for PyTorch Lightning.

The public names below are imported on first use (PEP 562), so that ``import ct_lightning.experiment.X``
in a command line does not pay for torch and Lightning before its arguments are checked.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BurnIn": "ct_lightning.callbacks", "CounterfactualEvaluation": "ct_lightning.callbacks",
    "MUTABILITY_KINDS": "ct_lightning.constraints", "infer_domain": "ct_lightning.constraints",
    "parse_mutability": "ct_lightning.constraints",
    "ECCo": "ct_lightning.generators", "Generic": "ct_lightning.generators", "SearchResult": "ct_lightning.generators",
    "make_generator": "ct_lightning.generators", "search_counterfactuals": "ct_lightning.generators",
    "build_mlp": "ct_lightning.models", "CTModule": "ct_lightning.module", "random_targets": "ct_lightning.training.pool",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ct_lightning' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
