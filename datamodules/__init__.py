"""LightningDataModules for the paper's data sets, found by name through the registry."""

from datamodules import synthetic  # noqa: F401  (registers the synthetic sets)
from datamodules import real  # noqa: F401  (registers adult, california_housing, credit, gmsc, mnist)
from datamodules.base import TensorDataModule
from datamodules.registry import available, canonical_name, get_datamodule, get_datamodule_class, register

__all__ = ["TensorDataModule", "available", "canonical_name", "get_datamodule", "get_datamodule_class", "register"]
