"""One 2-process CPU DDP (gloo) training of ``CTModule``, run as a script by ``tests/test_ddp.py``.

``python tests/helpers/ddp_worker.py OUT_DIR GENERATOR``: Lightning's ``ddp`` strategy starts the second
process by running this script again. Each rank writes ``OUT_DIR/rank<R>.json`` with what it saw
locally (per epoch: its factual indices, its pool size, its batch-weighted loss sums) and the epoch
metrics Lightning logged (which should be the global values); rank 0 also writes ``last.ckpt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ct_lightning.module import CTModule

N_TRAIN, NCE, SEED = 200, 61, 3
GENERATOR_OPTIONS = {"revise": {"vae_epochs": 2, "use_cache": False, "latent_dim": 2},
                     "amortised": {"initial_epochs": 1, "refit_every": 1, "refit_epochs": 1, "hidden_sizes": [8]}}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """Two Gaussian blobs, the same in every process."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(N_TRAIN) % 2
    x = torch.randn(N_TRAIN, 2, generator=g) * 0.6 + (y.float()[:, None] * 2 - 1)
    return x, y


class Record(L.Callback):
    """Per-rank local values of every epoch."""

    def __init__(self):
        self.epochs: list[dict] = []

    def on_train_epoch_start(self, trainer, module):
        self.current = {"loss_sum": 0.0, "clf_sum": 0.0, "n": 0}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        n = len(batch[1])
        self.current["loss_sum"] += float(outputs["loss"]) * n
        self.current["n"] += n

    def on_train_epoch_end(self, trainer, module):
        self.current["factuals"] = module.last_factual_index.tolist()
        state = module.generator.shared_state()
        if state is not None:  # a fingerprint of what the generator learned
            weights = state["vae"].state_dict() if "vae" in state else state["weights"]
            self.current["generator_fingerprint"] = float(sum(v.double().sum() for v in weights.values()
                                                              if v.is_floating_point()))
            # Wall time of the fits: equal on both ranks only if rank 1 took over rank 0's fit.
            self.current["generator_fit_seconds"] = state.get("fit_seconds")
        self.epochs.append(self.current)


def main(out_dir: str, generator: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(SEED, verbose=False)
    x, y = data()
    module = CTModule(n_features=2, n_classes=2, nce=NCE, generator=generator, seed=SEED, max_steps=5,
                      generator_options=GENERATOR_OPTIONS.get(generator))
    record = Record()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        callbacks=[record, ModelCheckpoint(dirpath=out_dir, filename="last")],
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    payload = {"rank": trainer.global_rank, "world": trainer.world_size, "epochs": record.epochs, "metrics": metrics}
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(payload))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
