"""A training epoch handed to Lightning as one block, so that Lightning's per-step machinery runs once per epoch.

Lightning dispatches some forty hooks and an optimisation closure around every ``training_step``.
On the paper's small MLPs (a 32-unit layer, batch 30) that costs several times the step's own
arithmetic. :class:`EpochBlockLoader` wraps a training ``DataLoader`` over tensors and yields one
:class:`EpochBlock` per epoch: the epoch's row order and batch sizes, with the data tensors.
``CTModule`` then runs the epoch's optimisation steps itself (manual optimisation), one per batch,
with the same batches, in the same order and with the same arithmetic as Lightning's
automatic loop: the trained weights and every logged metric are identical (``tests/test_epoch_block.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import BatchSampler


@dataclass
class EpochBlock:
    """One epoch of training batches: batch ``i`` is ``x[index[a:b]], y[index[a:b]]``, the ``i``-th of the
    slices of ``index`` (the epoch's row order) given by ``batch_sizes``."""

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor
    batch_sizes: list[int]
    # Device copies of x and y, shared by the blocks of one loader: (id, device) -> (source, its version, copy).
    copies: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.batch_sizes)

    def to(self, device, non_blocking: bool = False) -> "EpochBlock":
        """This block on ``device`` (Lightning's batch transfer calls it). ``x`` and ``y`` (the whole training set)
        are copied once and reused by the loader's later blocks while unchanged (an MNIST epoch would copy 188 MB
        again); the row order is sent without a blocking copy, which would wait for the GPU."""
        return EpochBlock(self._copy(self.x, device), self._copy(self.y, device),
                          self.index.to(device, non_blocking=True), self.batch_sizes, self.copies)

    def _copy(self, tensor: torch.Tensor, device) -> torch.Tensor:
        key = (id(tensor), str(device))
        kept = self.copies.get(key)
        if kept is None or kept[0] is not tensor or kept[1] != tensor._version:
            kept = self.copies[key] = (tensor, tensor._version, tensor.to(device))
        return kept[2]

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's ``(x, y)`` batches, in order, each gathered when it is needed (as a hand-written loop does)."""
        for rows in self.index.split(self.batch_sizes):
            yield self.x[rows], self.y[rows]


def can_fuse(loader) -> bool:
    """Whether ``loader`` can be handed over as epoch blocks: a map-style loader over (x, y, ...) tensors."""
    dataset = getattr(loader, "dataset", None)
    tensors = getattr(dataset, "tensors", None)
    return (getattr(loader, "batch_sampler", None) is not None and isinstance(tensors, (tuple, list))
            and len(tensors) >= 2 and all(isinstance(t, torch.Tensor) for t in tensors))


class EpochBlockLoader:
    """Yields one :class:`EpochBlock` per epoch, holding exactly the batches ``loader`` would yield.

    ``sampler``, ``batch_sampler`` and ``dataset`` are the wrapped loader's, so Lightning's
    ``set_epoch`` reaches an epoch-seeded sampler and the data order stays a function of the epoch.
    """

    def __init__(self, loader):
        if not can_fuse(loader):
            raise ValueError("epoch_loop: fused needs a map-style DataLoader over tensors (a TensorDataset); "
                             f"got a {type(loader).__name__} over {type(getattr(loader, 'dataset', None)).__name__}")
        self.loader = loader
        self.dataset, self.sampler, self.batch_sampler = loader.dataset, loader.sampler, loader.batch_sampler
        self.copies: dict = {}  # the data's device copies, shared by this loader's blocks (EpochBlock.to)

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[EpochBlock]:
        index, batch_sizes = _tensor_order(self.batch_sampler)
        if index is None:  # any other sampler: its batches, as the DataLoader would draw them
            batches = [list(batch) for batch in self.batch_sampler]
            index = torch.as_tensor([i for batch in batches for i in batch], dtype=torch.long)
            batch_sizes = [len(batch) for batch in batches]
        yield EpochBlock(self.dataset.tensors[0], self.dataset.tensors[1], index, batch_sizes, self.copies)


def _tensor_order(batch_sampler) -> tuple[torch.Tensor | None, list[int]]:
    """The epoch's row order and batch sizes without a Python list per row, where the batches come from a torch
    ``BatchSampler`` over a sampler that hands its order over as a tensor (``order()``, as
    ``datamodules.base.EpochSeededSampler`` does): 26 000 rows as Python ints cost ~5 ms per epoch, a third of
    an Adult epoch of the paper's MLP. ``(None, [])`` otherwise."""
    sampler, size = getattr(batch_sampler, "sampler", None), getattr(batch_sampler, "batch_size", None)
    if type(batch_sampler) is not BatchSampler or not callable(getattr(sampler, "order", None)) or not size:
        return None, []
    index = sampler.order().long()
    full, rest = divmod(len(index), size)
    if batch_sampler.drop_last:
        return index[:full * size], [size] * full
    return index, [size] * full + ([rest] if rest else [])
