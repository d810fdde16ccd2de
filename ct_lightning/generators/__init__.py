"""Counterfactual generators: the contract (``base``), the registry, the batched search and the catalogue.

Every module and subpackage of this package is imported here (a subpackage's ``__init__`` imports its
generator), so ``GENERATORS`` is complete as soon as this package is imported: a new generator is one new module
with a ``@register_generator("name")`` class derived from :class:`CounterfactualGenerator`, and nothing else.
``ct_lightning.experiment.configuration.catalogue`` reads the names from the same files without importing them.
The Lightning modules that train a learned generator's networks (``amortised.training``, ``revise.vae``) load
when such a generator is built or fitted, not here: explaining a decision with a search needs no Lightning.
"""

import importlib
import pkgutil

from ct_lightning.generators.base import (CounterfactualGenerator, FitContext, SearchResult, generate_counterfactuals,
                                         prepare_standalone)
from ct_lightning.generators.registry import GENERATORS, generator_class, make_generator, register_generator
from ct_lightning.generators.search import search_counterfactuals

# The infrastructure above; every other module is (or holds) part of the catalogue.
INFRASTRUCTURE = ("base", "registry", "search")


def _import_catalogue() -> None:
    """Import every module and subpackage of this package but the infrastructure (registration happens in the
    decorators)."""
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        if module.name.removeprefix(f"{__name__}.") not in INFRASTRUCTURE:
            importlib.import_module(module.name)


_import_catalogue()

# The public names of the catalogue's modules.
from ct_lightning.generators.amortised import Amortised  # noqa: E402
from ct_lightning.generators.feature_space import ECCo, Generic, energy_decay  # noqa: E402
from ct_lightning.generators.revise import Revise  # noqa: E402
from ct_lightning.generators.sns import SNSRefined, stable_neighbor_search  # noqa: E402

__all__ = ["GENERATORS", "Amortised", "CounterfactualGenerator", "ECCo", "FitContext", "Generic", "Revise",
           "SNSRefined", "SearchResult", "energy_decay", "generate_counterfactuals", "generator_class",
           "make_generator", "prepare_standalone", "register_generator", "search_counterfactuals",
           "stable_neighbor_search"]
