"""A warning when training's own counterfactual search stops reaching tau (issue 23 §4)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import lightning as L

# Every --option named here is one of recipes/train.py's (tests/test_convergence_watch.py checks it).
ADVICE = ("try a lower --tau, more search steps (--max-steps), a smaller --lambda-reg or --lambda-energy, "
          "a larger search step size (--search-lr), or a longer --burnin")


def convergence_message(key: str, share: float, threshold: float, low_epochs: int, epoch: int,
                        lower_tau: bool = True) -> str:
    """The warning's text: the share converged stayed below ``threshold`` for ``low_epochs`` epochs up to ``epoch``,
    counted from 1 as the progress lines count (``epoch 3/3: ...``, :mod:`ct_lightning.callbacks.epoch_lines`).
    ``lower_tau=False`` leaves "a lower --tau" out of the advice: on two classes at tau 0.5 a lower one would count
    counterfactuals that the model still predicts as the factual's class."""
    advice = ADVICE if lower_tau else ADVICE.replace("a lower --tau, ", "")
    return (f"training's counterfactual search stopped converging: {key} = {share:.3f} < {threshold} for "
            f"{low_epochs} epochs (epoch {epoch}); {advice}")


def tau_may_be_lowered(module) -> bool:
    """Whether "a lower --tau" is advice for ``module`` (its ``hparams``' ``tau`` and ``n_classes``): not on two
    classes at tau 0.5 or below, where a counterfactual below tau is not predicted as its target."""
    hp = getattr(module, "hparams", None)
    tau, n_classes = getattr(hp, "tau", None), getattr(hp, "n_classes", None)
    return not (tau is not None and n_classes == 2 and float(tau) <= 0.5)


def convergence_warning(shares: list[tuple[int, float]], threshold: float = 0.1, patience: int = 3,
                        key: str = "train/cf_converged") -> str | None:
    """What :class:`ConvergenceWatch` warns for these ``(epoch, share converged)`` of CT epochs, in order (a stacked
    training's history), or ``None``: the first time the share stays below ``threshold`` for ``patience`` epochs.
    ``epoch`` counts from 0, as Lightning's ``current_epoch`` and the history's ``"epoch"`` do; the message says
    ``epoch + 1``, as the progress lines do."""
    return next((text for kind, text in convergence_notes(shares, threshold, patience, key) if kind == "warning"), None)


def convergence_notes(shares: list[tuple[int, float]], threshold: float = 0.1, patience: int = 3,
                      key: str = "train/cf_converged", lower_tau: bool = True) -> list[tuple[str, str]]:
    """What :class:`ConvergenceWatch` with ``echo`` says for these ``(epoch, share converged)`` of CT epochs, in order
    (a stacked or appendix training's history, read after training), as ``(kind, text)``: ``("warning", ...)`` the
    first time the share stays below ``threshold`` for ``patience`` epochs, then ``("note", ...)`` once it is back at
    or above it for ``patience`` epochs (:func:`recovery_message`); ``[]`` when it never stopped converging. Epochs
    count from 0, as :func:`convergence_warning`'s."""
    said: list[tuple[str, str]] = []
    low = high = warned = 0
    for epoch, share in shares:
        low = low + 1 if share < threshold else 0
        high = 0 if share < threshold else high + 1
        if warned and high >= patience:
            said.append(("note", recovery_message(key, share, threshold, high, int(epoch) + 1, warned)))
            break
        if low >= patience and not warned:
            warned = int(epoch) + 1
            said.append(("warning", convergence_message(key, share, threshold, low, warned, lower_tau)))
    return said


class ConvergenceWarning(UserWarning):
    """Training's counterfactual search no longer converges."""


def recovery_message(key: str, share: float, threshold: float, high_epochs: int, epoch: int, warned: int) -> str:
    """The note that the search converges again after the warning of epoch ``warned``: ``share`` has stayed at or
    above ``threshold`` for ``high_epochs`` epochs up to ``epoch`` (both counted from 1, as the progress lines)."""
    return (f"training's counterfactual search converges again: {key} = {share:.3f} >= {threshold} for {high_epochs} "
            f"epochs (epoch {epoch}); the warning of epoch {warned} no longer holds")


class ConvergenceWatch(L.Callback):
    """Warn once when ``train/cf_converged`` stays below ``threshold`` for ``patience`` CT epochs in a row.

    The warning is a :class:`ConvergenceWarning`, or, with ``echo`` (a recipe's console), one ``warning: ...`` line
    given to ``echo`` instead; with ``echo``, a ``note: ...`` line follows once the share is back at or above
    ``threshold`` for ``patience`` epochs (a model that is still poor in its first CT epochs, whose search recovers
    as it learns, was otherwise left with the warning alone). Reads the epoch's logged value at epoch end only (one
    host read per epoch, none per step).
    """

    def __init__(self, threshold: float = 0.1, patience: int = 3, key: str = "train/cf_converged",
                 echo: Callable[[str], None] | None = None):
        if not 0.0 < threshold <= 1.0 or patience < 1:
            raise ValueError(f"ConvergenceWatch: threshold in (0, 1] and patience >= 1, got {threshold}, {patience}")
        self.threshold, self.patience, self.key = threshold, patience, key
        self.low_epochs = self.high_epochs = 0
        self.warned = False
        self.warned_epoch = 0  # the epoch (from 1) of the warning, once given
        self.recovered = False
        self.echo = echo

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.key)
        if value is None or not getattr(pl_module, "ct_active", True):
            return
        share = float(value)
        self.low_epochs = self.low_epochs + 1 if share < self.threshold else 0
        self.high_epochs = 0 if share < self.threshold else self.high_epochs + 1
        if self.warned and not self.recovered and self.high_epochs >= self.patience and self.echo is not None:
            self.recovered = True
            self.echo("note: " + recovery_message(self.key, share, self.threshold, self.high_epochs,
                                                  trainer.current_epoch + 1, self.warned_epoch))
        if self.low_epochs >= self.patience and not self.warned:
            self.warned = True
            self.warned_epoch = trainer.current_epoch + 1
            # current_epoch counts from 0; the progress lines (EpochLines) and the message count from 1
            message = convergence_message(self.key, share, self.threshold, self.low_epochs, trainer.current_epoch + 1,
                                          tau_may_be_lowered(pl_module))
            if self.echo is not None:
                self.echo(f"warning: {message}")
            else:
                warnings.warn(message, ConvergenceWarning, stacklevel=2)
