"""Evaluation loaders hand out contiguous slices of the split (views, no copy); other samplers keep index lists."""

import torch
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from datamodules.base import ContiguousBatchSampler, IndexedTensorDataset
from datamodules.registry import get_datamodule


def test_validation_batches_are_views_of_the_split_in_order():
    datamodule = get_datamodule("circles")
    datamodule.prepare_data()
    datamodule.setup("fit")
    batches = list(datamodule.val_dataloader())
    assert len(batches) == 1
    x, y = batches[0]
    assert torch.equal(x, datamodule.x_val) and torch.equal(y, datamodule.y_val)
    # A view shares the split's memory; the old loader gathered a copy of every row each epoch.
    assert x.data_ptr() == datamodule.x_val.data_ptr() and y.data_ptr() == datamodule.y_val.data_ptr()


def test_contiguous_batches_match_the_default_batch_sampler():
    dataset = IndexedTensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    for batch_size, drop_last in ((3, False), (3, True), (5, False), (16, False)):
        ours = list(ContiguousBatchSampler(SequentialSampler(dataset), batch_size, drop_last))
        default = list(BatchSampler(SequentialSampler(dataset), batch_size, drop_last))
        assert [list(batch) for batch in ours] == default, (batch_size, drop_last)
        assert all(isinstance(batch, range) for batch in ours)
        for batch, indices in zip(ours, default):
            sliced, gathered = dataset.__getitems__(batch), dataset.__getitems__(indices)
            assert all(torch.equal(a, b) for a, b in zip(sliced, gathered))


def test_other_samplers_get_index_lists():
    dataset = IndexedTensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)  # what Lightning swaps in on DDP
    ours = list(ContiguousBatchSampler(sampler, 2, False))
    assert ours == list(BatchSampler(sampler, 2, False)) == [[1, 3], [5, 7], [9]]
