"""The accelerator section of ``docs/performance.md`` (issue 27): ``bench/run.py --accelerator gpu``.

Every data set's vanilla and CT (``full``) training epoch, through Lightning's ``Trainer`` with the fused epoch
loop as ``train()`` sets it up (no tracking, validation on), with the search step compiled or not
(``search_compile`` on/off) and float32 matrix products in full precision or TF32
(``torch.set_float32_matmul_precision("highest"/"high")``). Each variant trains from the same seed; its final
training loss and validation accuracy are compared with the variant with neither (compile off, TF32 off): they
must agree within :data:`LOSS_RTOL` / :data:`ACC_ATOL` (TF32 rounds products to 10-bit mantissas, so
trajectories drift apart a little; bit-identity is not expected).

The section is written between two markers and replaces only its own earlier version, so the CPU report
(``bench/report.py``) and the accelerator section live in one file; a CPU run keeps the section too.
"""

from __future__ import annotations

import statistics
import time

import lightning as L
import torch

ACC_ATOL = 0.02   # validation accuracy: absolute difference allowed between variants
LOSS_RTOL = 0.05  # final training loss: relative difference allowed between variants
START, END = "<!-- accelerator-section: start -->", "<!-- accelerator-section: end -->"
# (objective, search_compile, TF32); the first of each objective is the reference the others are compared with
VARIANTS = (("vanilla", "off", False), ("vanilla", "off", True),
            ("full", "off", False), ("full", "on", False), ("full", "off", True), ("full", "on", True))


class EpochClock(L.Callback):
    """Wall seconds of each training epoch and of each validation pass, synchronised with the device."""

    def __init__(self):
        self.train, self.val = [], []
        self._t = self._v = 0.0

    @staticmethod
    def _now(pl_module) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module):
        self._t = self._now(pl_module)

    def on_train_epoch_end(self, trainer, pl_module):
        self.train.append(self._now(pl_module) - self._t)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._v = self._now(pl_module)

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val.append(self._now(pl_module) - self._v)


def fit_variant(datamodule, objective: str, compile_mode: str, tf32: bool, epochs: int, accelerator: str) -> dict:
    """Train one variant from seed 0 for ``epochs`` epochs (fused loop); its epoch times and final metrics."""
    from bench.epoch_bench import build
    from ct_lightning.training.epoch_block import EpochBlockLoader
    from ct_lightning.generators.compiled_step import search_compile, set_search_compile

    before_mode, before_precision = search_compile(), torch.get_float32_matmul_precision()
    set_search_compile(compile_mode)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    make_loader = datamodule.train_dataloader
    try:
        module, config = build(datamodule, objective)
        module.fuse_epochs(True)
        datamodule.train_dataloader = lambda: EpochBlockLoader(make_loader())
        clock = EpochClock()
        trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator=accelerator, devices=1, num_sanity_val_steps=0,
                            callbacks=[clock])
        started = time.perf_counter()
        trainer.fit(module, datamodule=datamodule)
        wall = time.perf_counter() - started
    finally:
        datamodule.train_dataloader = make_loader
        set_search_compile(before_mode)
        torch.set_float32_matmul_precision(before_precision)
    metrics = trainer.callback_metrics
    return {"objective": objective, "search_compile": compile_mode, "tf32": tf32, "epochs": epochs,
            "train_s": clock.train, "val_s": clock.val, "wall_s": wall,
            "first_epoch_s": clock.train[0] if clock.train else float("nan"),
            "epoch_s": statistics.median(clock.train[1:]) if len(clock.train) > 1 else float("nan"),
            "val_pass_s": statistics.median(clock.val[1:]) if len(clock.val) > 1 else float("nan"),
            "train_loss": float(metrics["train/loss"]), "val_acc": float(metrics["val/acc"]),
            "batches": int(trainer.num_training_batches), "nce": int(config["nce"]),
            "n_values": int(config["nce"]) * int(datamodule.n_features)}


def compare(rows: list[dict]) -> None:
    """Mark each row ``unchanged`` (within tolerance of its objective's reference variant, the first row)."""
    reference = {}
    for row in rows:
        ref = reference.setdefault(row["objective"], row)
        row["loss_rel_diff"] = abs(row["train_loss"] - ref["train_loss"]) / max(abs(ref["train_loss"]), 1e-12)
        row["acc_diff"] = abs(row["val_acc"] - ref["val_acc"])
        row["unchanged"] = row["loss_rel_diff"] <= LOSS_RTOL and row["acc_diff"] <= ACC_ATOL


def run_accelerator_section(datamodules: dict, epochs: int, accelerator: str, variants=VARIANTS,
                            log=print) -> dict:
    """Every variant on every data set, one after another; the rows grouped by data set."""
    out = {}
    for name, datamodule in datamodules.items():
        rows = []
        for objective, compile_mode, tf32 in variants:
            row = fit_variant(datamodule, objective, compile_mode, tf32, epochs, accelerator)
            rows.append(row)
            log(f"[accelerator] {name} {objective} compile {compile_mode} tf32 {'on' if tf32 else 'off'}: "
                f"epoch {row['epoch_s']:.3f} s (first {row['first_epoch_s']:.2f} s), val pass "
                f"{row['val_pass_s']:.3f} s, loss {row['train_loss']:.4f}, val acc {row['val_acc']:.4f}")
        compare(rows)
        out[name] = rows
    return out


def render_section(results: dict, command: str) -> str:
    """The Markdown section, between its markers."""
    from ct_lightning.generators.compiled_step import compile_pays

    m = results["machine"]
    gpu = m.get("gpu") or m.get("device", "?")
    lines = [START, f"## Accelerator: {gpu}", "",
             f"Generated by `{command}` (issue 27) in {results.get('elapsed_s', 0) / 60:.1f} min "
             f"on {m.get('date', '?')}"
             f" (torch {m.get('torch', '?')}, Lightning {m.get('lightning', '?')}). Lightning's `Trainer` with the "
             "fused epoch loop as `train()` sets it up, validation each epoch, no tracking; seed 0; "
             f"{results['epochs']} epochs per fit, times are medians over the epochs after the first. "
             "*compile*: `search_compile` on/off; *TF32*: `torch.set_float32_matmul_precision('high')` "
             "against `'highest'`. *unchanged*: final training loss within "
             f"{LOSS_RTOL:.0%} and validation accuracy within {ACC_ATOL} of the row with neither.", ""]
    rows = []
    for name, variants in results["accelerator"].items():
        for r in variants:
            auto = "n/a" if r["objective"] == "vanilla" else \
                ("compiles" if compile_pays(r["n_values"], "cuda", 100) else "eager")
            rows.append([name, r["objective"], r["search_compile"], "on" if r["tf32"] else "off",
                         f"{r['epoch_s']:.3f}", f"{r['first_epoch_s']:.2f}", f"{r['val_pass_s']:.3f}",
                         f"{r['train_loss']:.4f}", f"{r['val_acc']:.4f}", "yes" if r["unchanged"] else "**no**", auto])
    header = ["data", "objective", "compile", "TF32", "train s/epoch", "first epoch s", "val pass s",
              "final loss", "val acc", "unchanged", "auto, 100 epochs"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "*auto, 100 epochs*: what `search_compile=auto` chooses on this device for a 100-epoch run "
              "(`compile_pays` in `ct_lightning/generators/compiled_step.py`).", END]
    return "\n".join(lines) + "\n"


def splice(document: str, section: str) -> str:
    """``document`` with its accelerator section replaced by ``section`` (appended when it has none)."""
    start, end = document.find(START), document.find(END)
    if start != -1 and end > start:
        return document[:start] + section.rstrip("\n") + document[end + len(END):]
    return document.rstrip("\n") + "\n\n" + section


def keep_section(old_document: str, new_document: str) -> str:
    """``new_document`` with ``old_document``'s accelerator section, if it had one (a CPU run keeps it)."""
    start, end = old_document.find(START), old_document.find(END)
    if start == -1 or end < start:
        return new_document
    return splice(new_document, old_document[start:end + len(END)] + "\n")
