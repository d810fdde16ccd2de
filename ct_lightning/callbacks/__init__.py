"""Lightning callbacks: the burn-in switch, the counterfactual evaluation during training, a clean stop on signals."""

from ct_lightning.callbacks.burn_in import BurnIn
from ct_lightning.callbacks.epoch_seed import EpochSeed, epoch_seed
from ct_lightning.callbacks.evaluation import VAL_METRICS, CounterfactualEvaluation
from ct_lightning.callbacks.stop_on_signal import StopOnSignal

__all__ = ["VAL_METRICS", "BurnIn", "CounterfactualEvaluation", "EpochSeed", "StopOnSignal", "epoch_seed"]
