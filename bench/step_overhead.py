"""Per-step costs behind two choices in ``CTModule`` (issue 22 §4), on a fused vanilla epoch of the paper's MLP.

1. The optimiser step: the direct path (``zero_grad``, ``backward``, ``_on_before_step``, ``step``,
   ``_on_after_step``) against the public ``LightningOptimizer.step()`` (``manual_backward``, strategy,
   precision plugin, hooks); the two alternate by epoch in one process and train the same weights.
2. The epoch metrics: keeping the step's references (``CTModule._accumulate``) against six torchmetrics
   updates (five ``MeanMetric``, one ``Validity``) and against six ``self.log(..., on_epoch=True)`` calls.

Usage: ``python bench/step_overhead.py`` (prints medians in µs; one thread, CPU).
"""

from __future__ import annotations

import statistics
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

from ct_lightning.metrics.classes import Validity
from ct_lightning.module import CTModule
from ct_lightning.training.epoch_block import EpochBlockLoader

TERMS = ("loss", "clf", "div", "ridge", "adv")


class Timed(CTModule):
    """A fused vanilla epoch that times its parts: even epochs step directly, odd epochs publicly."""

    def __init__(self, *args, log_epoch: int = -1, **kwargs):
        super().__init__(*args, **kwargs)
        self.costs = {"step": [], "direct": [], "public": [], "self.log x6": []}
        self.log_epoch = log_epoch

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        public = self.current_epoch % 2 == 1
        for index, (x, y) in enumerate(batch.batches()):
            started = time.perf_counter()
            loss = self._step_loss(x, y, index, len(batch))[0]
            if self.current_epoch == self.log_epoch:
                t = time.perf_counter()
                for name in TERMS:
                    self.log(f"bench/{name}", loss.detach(), on_step=False, on_epoch=True, batch_size=len(y))
                self.log("bench/acc", loss.detach(), on_step=False, on_epoch=True, batch_size=len(y))
                self.costs["self.log x6"].append(time.perf_counter() - t)
                started += time.perf_counter() - t
            t = time.perf_counter()
            if public:
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            else:
                optimizer.optimizer.zero_grad()
                loss.backward()
                optimizer._on_before_step()
                optimizer.optimizer.step()
                optimizer._on_after_step()
            self.costs["public" if public else "direct"].append(time.perf_counter() - t)
            if not public:
                self.costs["step"].append(time.perf_counter() - started)


def per_call(function, n: int = 3000) -> float:
    """Mean seconds per call of ``function`` over ``n`` calls (after one warm-up call)."""
    function()
    started = time.perf_counter()
    for _ in range(n):
        function()
    return (time.perf_counter() - started) / n


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(3000, 2)
    y = (x.norm(dim=1) > 1.2).long()
    module = Timed(n_features=2, n_classes=2, objective="vanilla", log_epoch=20)
    module.prepare_counterfactual_data(x, y)
    module.fuse_epochs(True)
    trainer = L.Trainer(max_epochs=21, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, EpochBlockLoader(DataLoader(TensorDataset(x, y), batch_size=30)))
    assert trainer.global_step == 21 * 100
    for name, values in module.costs.items():
        print(f"{name}: median {statistics.median(values) * 1e6:.0f} µs over {len(values)} steps")

    values, logits, labels = [torch.rand(()) for _ in TERMS], torch.randn(30, 2), torch.randint(2, (30,))
    means, accuracy, kept = [MeanMetric(nan_strategy="disable") for _ in TERMS], Validity(), []
    torchmetrics = per_call(lambda: ([m.update(v, 30) for m, v in zip(means, values)], accuracy.update(logits, labels)))
    references = per_call(lambda: kept.append((tuple(values), logits, labels)))
    print(f"torchmetrics x6 updates: {torchmetrics * 1e6:.0f} µs; keeping the references: {references * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
