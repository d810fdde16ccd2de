"""A fused epoch's block on its way to an accelerator: the training set is copied to the device once and reused
while it is unchanged, and the epoch's row order travels each epoch. Checked without a GPU on PyTorch's ``meta``
device (tensors with shapes and no data), through Lightning's own batch transfer."""

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from ct_lightning.training.epoch_block import EpochBlock, EpochBlockLoader
from datamodules import get_datamodule


def blocks_of_two_epochs():
    data = get_datamodule("circles", batch_size=70)
    data.setup()
    blocks = EpochBlockLoader(data.train_dataloader())
    epochs = []
    for epoch in (0, 1):
        blocks.sampler.set_epoch(epoch)
        epochs.append(next(iter(blocks)))
    return epochs


def test_the_training_set_goes_to_the_device_once_and_the_row_order_every_epoch():
    first, second = blocks_of_two_epochs()
    assert first.x is second.x and not torch.equal(first.index, second.index)
    meta = torch.device("meta")
    moved = [move_data_to_device(block, meta) for block in (first, second)]
    for block, source in zip(moved, (first, second)):
        assert isinstance(block, EpochBlock) and block.batch_sizes == source.batch_sizes
        assert block.x.is_meta and block.y.is_meta and block.index.is_meta
        assert block.x.shape == source.x.shape and block.index.shape == source.index.shape
    assert moved[0].x is moved[1].x and moved[0].y is moved[1].y  # one copy of the data for both epochs
    assert moved[0].index is not moved[1].index
    first.x.add_(0.0)  # changed in place (its version moves on): copied again
    assert move_data_to_device(first, meta).x is not moved[0].x


def test_on_the_cpu_the_block_keeps_its_tensors():
    first, _ = blocks_of_two_epochs()
    moved = move_data_to_device(first, torch.device("cpu"))
    assert moved.x is first.x and moved.y is first.y and moved.index is first.index
