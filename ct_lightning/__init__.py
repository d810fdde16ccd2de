"""ct-lightning: counterfactual training (CT) for PyTorch Lightning.

The public names below are imported on first use (PEP 562), so that ``import ct_lightning.experiment.X``
in a command line does not pay for torch and Lightning before its arguments are checked.
"""

from __future__ import annotations

from ct_lightning.lazy_exports import lazy_exports

_EXPORTS = {
    "BurnIn": "ct_lightning.callbacks", "CounterfactualEvaluation": "ct_lightning.callbacks",
    "MUTABILITY_KINDS": "ct_lightning.constraints", "infer_domain": "ct_lightning.constraints",
    "parse_mutability": "ct_lightning.constraints",
    "ECCo": "ct_lightning.generators", "Generic": "ct_lightning.generators", "SearchResult": "ct_lightning.generators",
    "make_generator": "ct_lightning.generators", "search_counterfactuals": "ct_lightning.generators",
    "build_mlp": "ct_lightning.models", "CTModule": "ct_lightning.module", "random_targets": "ct_lightning.training.pool",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
