"""The fused epoch loop (one Lightning step per epoch, ``epoch_loop="fused"``) trains exactly as Lightning's
per-batch loop: the same batches, the same weights and the same logged metrics."""

import pytest
import torch
from mlflow.tracking import MlflowClient

from ct_lightning.generators.input_gradient import autograd_only
from ct_lightning.training.epoch_block import EpochBlock, EpochBlockLoader, can_fuse
from ct_lightning.experiment.runs.checkpoints import read_checkpoint
from ct_lightning.experiment.runs.train import train
from datamodules import get_datamodule


def test_block_holds_exactly_the_loaders_batches_of_each_epoch():
    data = get_datamodule("circles", batch_size=70)
    data.setup()
    loader = data.train_dataloader()
    blocks = EpochBlockLoader(data.train_dataloader())
    assert can_fuse(loader) and len(blocks) == 1
    for epoch in (0, 3):
        loader.sampler.set_epoch(epoch)
        blocks.sampler.set_epoch(epoch)
        expected = list(loader)
        (block,) = list(blocks)
        assert isinstance(block, EpochBlock) and len(block) == len(expected)
        assert block.batch_sizes[-1] == (len(data.y_train) % 70 or 70)
        for (x, y), (x_ref, y_ref) in zip(block.batches(), expected):
            assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    # Different epochs give different orders (the sampler's epoch reaches the wrapped loader).
    blocks.sampler.set_epoch(0)
    first = next(iter(blocks)).index.clone()
    blocks.sampler.set_epoch(1)
    assert not torch.equal(first, next(iter(blocks)).index)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [7, 50, 200])
def test_an_epoch_seeded_order_is_taken_as_one_tensor_with_the_loaders_batches(drop_last, batch_size):
    from torch.utils.data import BatchSampler, SequentialSampler

    from ct_lightning.training.epoch_block import _tensor_order
    from datamodules.base import EpochSeededSampler

    sampler = EpochSeededSampler(range(100), seed=3)
    sampler.set_epoch(2)
    batches = BatchSampler(sampler, batch_size, drop_last)
    index, sizes = _tensor_order(batches)
    expected = list(batches)
    assert sizes == [len(batch) for batch in expected]
    assert index.tolist() == [i for batch in expected for i in batch]
    # A sampler without a tensor order takes the DataLoader's own path.
    assert _tensor_order(BatchSampler(SequentialSampler(range(10)), 3, drop_last)) == (None, [])


def test_only_tensor_loaders_can_be_fused():
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=3)
    assert not can_fuse(loader)
    with pytest.raises(ValueError, match="epoch_loop: fused needs a map-style DataLoader over tensors"):
        EpochBlockLoader(loader)


def _train(tmp_path, loop: str, **overrides):
    summary = train({"data": "circles", "max_epochs": 2, "nce": 200, "progress": False, "epoch_loop": loop,
                     "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": f"loop-{loop}",
                     "checkpoint_dir": str(tmp_path / f"ckpt-{loop}-{len(overrides)}"), **overrides})
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    metrics = client.get_run(summary["run_id"]).data.metrics
    history = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(summary["run_id"], key),
                                                         key=lambda m: m.step)]
               for key in metrics if key.startswith(("train/", "val/")) and not key.endswith("_seconds")}
    weights, _ = read_checkpoint(summary["checkpoints"]["last"])
    return summary, history, weights


@pytest.mark.slow  # two real Trainer fits per case (5-6 s each)
@pytest.mark.parametrize("overrides", [{"objective": "vanilla"}, {"objective": "full"},
                                       {"objective": "full", "pool": "step", "burnin": 0.5}],
                         ids=["vanilla", "full", "step-pool-burnin"])
def test_fused_epochs_train_and_log_exactly_as_lightnings_loop(tmp_path, overrides):
    # Both loops under autograd: the fused loop's own step by hand (training.mlp_step) writes its gradients into
    # views of one buffer, whose product kernels may round differently on another CPU; tests/test_mlp_step.py
    # compares it with autograd within a tolerance.
    with autograd_only():
        fused, fused_history, fused_weights = _train(tmp_path, "fused", **overrides)
        plain, plain_history, plain_weights = _train(tmp_path, "lightning", **overrides)
    assert fused_weights.keys() == plain_weights.keys()
    # Bit for bit is right here: the fused epoch runs the same per-batch operations on the same batch shapes.
    for key in plain_weights:
        assert torch.equal(fused_weights[key], plain_weights[key]), key
    assert fused_history == plain_history
    assert {"train/loss", "train/clf", "train/div", "train/ridge", "train/adv", "train/acc", "val/acc"} <= \
        set(plain_history)
    assert len(plain_history["train/loss"]) == 2
    for key in ("test/acc", "test/loss"):
        assert fused["metrics"][key] == plain["metrics"][key]


def test_fused_runs_count_every_optimiser_step(tmp_path):
    summary, _, _ = _train(tmp_path, "fused", objective="vanilla")
    checkpoint = torch.load(summary["checkpoints"]["last"], map_location="cpu", weights_only=True)
    batches = -(-summary["data"]["n_train"] // summary["data"]["batch_size"])
    assert checkpoint["global_step"] == 2 * batches


def test_auto_falls_back_to_lightnings_loop_for_partial_epochs(tmp_path):
    summary, history, _ = _train(tmp_path, "auto", objective="vanilla", limit_train_batches=3)
    checkpoint = torch.load(summary["checkpoints"]["last"], map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2 * 3
