"""Lightning callbacks: the burn-in switch and the counterfactual evaluation during training."""

from ct_lightning.callbacks.burn_in import BurnIn
from ct_lightning.callbacks.convergence import ConvergenceWarning, ConvergenceWatch
from ct_lightning.callbacks.epoch_seed import EpochSeed, epoch_seed
from ct_lightning.callbacks.evaluation import VAL_METRICS, CounterfactualEvaluation

__all__ = ["VAL_METRICS", "BurnIn", "ConvergenceWarning", "ConvergenceWatch", "CounterfactualEvaluation", "EpochSeed", "epoch_seed"]
