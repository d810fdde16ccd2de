"""ct-lightning: counterfactual training (CT) for PyTorch Lightning."""

from ct_lightning.callbacks import BurnIn
from ct_lightning.constraints import MUTABILITY_KINDS, infer_domain, parse_mutability
from ct_lightning.generators import ECCo, Generic, make_generator
from ct_lightning.models import build_mlp
from ct_lightning.module import CTModule
from ct_lightning.search import SearchResult, random_targets, search_counterfactuals

__all__ = ["BurnIn", "CTModule", "ECCo", "Generic", "MUTABILITY_KINDS", "SearchResult", "build_mlp",
           "infer_domain", "make_generator", "parse_mutability", "random_targets", "search_counterfactuals"]
from ct_lightning import amortised, revise  # noqa: F401,E402  (register the revise and amortised generators)
