"""ct-lightning: counterfactual training (CT) for PyTorch Lightning."""

from ct_lightning.callbacks import BurnIn, CounterfactualEvaluation
from ct_lightning.constraints import MUTABILITY_KINDS, infer_domain, parse_mutability
from ct_lightning.generators import ECCo, Generic, SearchResult, make_generator, search_counterfactuals
from ct_lightning.models import build_mlp
from ct_lightning.module import CTModule
from ct_lightning.pool import random_targets

__all__ = ["BurnIn", "CTModule", "CounterfactualEvaluation", "ECCo", "Generic", "MUTABILITY_KINDS", "SearchResult",
           "build_mlp", "infer_domain", "make_generator", "parse_mutability", "random_targets",
           "search_counterfactuals"]
