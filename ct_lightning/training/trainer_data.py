"""The one place that pulls a split's tensors out of a running Lightning ``Trainer``."""

from __future__ import annotations

import torch

# split -> (datamodule attribute holding (x, y) or the x/y attribute names, the trainer's dataloader attribute)
_SPLITS = {"train": (("train_tensors",), "train_dataloader"), "val": (("x_val", "y_val"), "val_dataloaders")}


def trainer_tensors(trainer, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of ``split`` (``train`` or ``val``): from the datamodule, else the dataloader's tensors.

    A datamodule with ``train_tensors`` (or ``x_val``/``y_val``) is used as is; otherwise the
    dataloader's ``TensorDataset`` tensors, else the concatenation of its batches.
    """
    attributes, loader_attribute = _SPLITS[split]
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, attributes[0]):
        values = [getattr(datamodule, name) for name in attributes]
        return tuple(values[0]) if len(values) == 1 else (values[0], values[1])
    loader = getattr(trainer, loader_attribute)
    loader = loader[0] if isinstance(loader, (list, tuple)) else loader
    dataset = loader.dataset
    if hasattr(dataset, "tensors"):
        return dataset.tensors[0], dataset.tensors[1]
    xs, ys = zip(*((batch[0], batch[1]) for batch in loader))
    return torch.cat(xs), torch.cat(ys)
