"""LightningDataModules for the paper's data sets, found by name through the registry.

Every module of this package is imported here, so a new data set is one new module with one
``@register("name")`` class derived from :class:`TensorDataModule` (its facts are class attributes);
``ct_lightning.experiment.catalogue`` reads the names from the same files without importing them.
A class registered at run time (``register("loans")(LoanData)``) is seen by the command lines too.
"""

import importlib
import pkgutil

from datamodules.base import TensorDataModule
from datamodules.registry import available, canonical_name, get_datamodule, get_datamodule_class, register


def _import_data_sets() -> None:
    """Import every module of this package (registration happens in the decorators)."""
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        importlib.import_module(module.name)


_import_data_sets()

__all__ = ["TensorDataModule", "available", "canonical_name", "get_datamodule", "get_datamodule_class", "register"]
