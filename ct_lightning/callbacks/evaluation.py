"""A lighter version of the evaluation protocol, run on the validation split during training."""

from __future__ import annotations

import math

import lightning as L

from ct_lightning.evaluation.protocol import EvaluationConfig, evaluate_model
from ct_lightning.metrics.names import METRICS, validation_metrics
from ct_lightning.training.trainer_data import trainer_tensors


def __getattr__(name: str):
    # Read from the metric table on every access, so that a registered row shows up.
    if name == "VAL_KEYS":  # metric keys the callback logs
        return validation_metrics()
    if name == "VAL_METRICS":  # their names under val/
        return tuple(METRICS[key].logged for key in validation_metrics())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CounterfactualEvaluation(L.Callback):
    """Every ``every_n_epochs`` epochs, log the evaluated metrics of the metric table that have ``validation``:
    ``val/ip``, ``val/ip_star``, ``val/cost``, ``val/validity``, ``val/robust_acc``.

    Factuals and the IP/IP* reference come from the validation split (the datamodule's
    ``x_val``/``y_val``, else the validation dataloader). The search uses the module's own
    mutability constraints and domain. Defaults are the paper's protocol made lighter: one run
    of ``n_individuals`` factuals, all ``λ_egy`` of ``config``. Runs in
    ``on_validation_epoch_end``, i.e. under Lightning's inference mode: the search and FGSM
    switch gradients on locally.
    """

    def __init__(self, every_n_epochs: int = 1, config: EvaluationConfig | None = None,
                 n_individuals: int = 100, n_runs: int = 1):
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs: must be at least 1, got {every_n_epochs}")
        self.every_n_epochs = every_n_epochs
        self.config = config or EvaluationConfig(n_individuals=n_individuals, n_runs=n_runs, robust_epsilons=(0.03,))
        self.last: dict | None = None

    def _due(self, trainer: L.Trainer) -> bool:
        return not trainer.sanity_checking and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate on the validation split when due and log the table's ``val/`` metrics."""
        if not self._due(trainer):
            return
        x, y = trainer_tensors(trainer, "val")
        n_classes = getattr(pl_module.hparams, "n_classes", None) if hasattr(pl_module, "hparams") else None
        config = EvaluationConfig(**{**self.config.__dict__, "seed": self.config.seed + trainer.current_epoch})
        result = evaluate_model(pl_module, x, y, n_classes=n_classes, config=config,
                                mutability=getattr(pl_module, "mutability", None),
                                lower=getattr(pl_module, "lower", None), upper=getattr(pl_module, "upper", None),
                                feature_types=getattr(pl_module, "feature_types", None))
        summary = result.summary()
        self.last = {METRICS[key].logged: (math.nan if summary.get(key) is None else float(summary[key]))
                     for key in validation_metrics()}
        for name, value in self.last.items():
            pl_module.log(f"val/{name}", value, on_step=False, on_epoch=True)
