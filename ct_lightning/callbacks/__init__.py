"""Lightning callbacks: the burn-in switch and the counterfactual evaluation during training."""

from ct_lightning.callbacks.burn_in import BurnIn
from ct_lightning.callbacks.convergence import ConvergenceWarning, ConvergenceWatch
from ct_lightning.callbacks.epoch_seed import EpochSeed, epoch_seed
from ct_lightning.callbacks.evaluation import CounterfactualEvaluation


def __getattr__(name: str):
    if name == "VAL_METRICS":  # the names the evaluation callback logs under val/, from the metric table
        from ct_lightning.callbacks import evaluation

        return evaluation.VAL_METRICS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["VAL_METRICS", "BurnIn", "ConvergenceWarning", "ConvergenceWatch", "CounterfactualEvaluation", "EpochSeed", "epoch_seed"]
