"""Counterfactual generators: the contract (``base``), the registry, the batched search and the catalogue.

Every generator of the catalogue is imported here explicitly, so ``GENERATORS`` is complete as soon
as this package is imported. A new generator is one new module with a ``@register_generator("name")``
class derived from :class:`CounterfactualGenerator`, plus one import line below.
"""

from ct_lightning.generators.base import CounterfactualGenerator, FitContext, SearchResult, prepare_standalone
from ct_lightning.generators.registry import GENERATORS, generator_class, make_generator, register_generator
from ct_lightning.generators.search import search_counterfactuals

# The catalogue (registration happens in the class decorators).
from ct_lightning.generators.feature_space import ECCo, Generic, energy_decay
from ct_lightning.generators.revise import Revise
from ct_lightning.generators.amortised import Amortised
from ct_lightning.generators.sns import SNSRefined, stable_neighbor_search

__all__ = ["GENERATORS", "Amortised", "CounterfactualGenerator", "ECCo", "FitContext", "Generic", "Revise",
           "SNSRefined", "SearchResult", "energy_decay", "generator_class", "make_generator", "prepare_standalone",
           "register_generator", "search_counterfactuals", "stable_neighbor_search"]
