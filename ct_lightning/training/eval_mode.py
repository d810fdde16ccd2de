"""Save-and-restore of train/eval mode (and of parameter gradients) around a block of code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Put ``modules`` in eval mode inside the block; restore every submodule's own mode afterwards."""
    modes = [(m, m.training) for module in modules for m in module.modules()]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and no parameter gradients for ``model`` inside the block; both restored afterwards."""
    flags = [p.requires_grad for p in model.parameters()]
    with eval_mode(model):
        for p in model.parameters():
            p.requires_grad_(False)
        try:
            yield model
        finally:
            for p, flag in zip(model.parameters(), flags):
                p.requires_grad_(flag)
