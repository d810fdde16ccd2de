"""LightningDataModules for the paper's data sets and for a user's own table, found by name through the registry.

A new data set is one new module with one ``@register("name")`` class derived from :class:`TensorDataModule`
(its facts are class attributes): the registry imports every module of this package the first time a name is
looked up, and ``ct_lightning.experiment.configuration.catalogue`` reads the names from the same files without importing them.
A class registered at run time (``register("loans")(LoanData)``) is seen by the command lines too. Importing
this package alone loads nothing heavy (the core's searches import :mod:`datamodules.feature_types` from it
without pandas or scikit-learn).
"""

from datamodules.registry import available, canonical_name, get_datamodule, get_datamodule_class, register


def __getattr__(name: str):
    if name == "TensorDataModule":  # imported on first use: it needs Lightning
        from datamodules.base import TensorDataModule

        return TensorDataModule
    raise AttributeError(f"module 'datamodules' has no attribute {name!r}")


__all__ = ["TensorDataModule", "available", "canonical_name", "get_datamodule", "get_datamodule_class", "register"]
