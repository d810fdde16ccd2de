"""A warning when training's own counterfactual search stops reaching tau (issue 23 §4)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import lightning as L
import torch

from ct_lightning.training.eval_mode import eval_mode

# Every --option named here is one of recipes/train.py's (tests/test_convergence_watch.py checks it).
ADVICE = ("try a lower --tau, more search steps (--max-steps), a smaller --lambda-reg or --lambda-energy, "
          "a larger search step size (--search-lr), or a longer --burnin")


def convergence_message(key: str, share: float, threshold: float, low_epochs: int, epoch: int,
                        lower_tau: bool = True) -> str:
    """The warning's text: the share converged stayed below ``threshold`` for ``low_epochs`` epochs up to ``epoch``,
    counted from 1 as the progress lines count (``epoch 3/3: ...``, :mod:`ct_lightning.callbacks.epoch_lines`).
    ``lower_tau=False`` leaves "a lower --tau" out of the advice: on two classes at tau 0.5 a lower one would count
    counterfactuals that the model still predicts as the factual's class."""
    return stopped_head(key, share, threshold, low_epochs, epoch) + general_advice(lower_tau)


def stopped_head(key: str, share: float, threshold: float, low_epochs: int, epoch: int) -> str:
    """The warning's text before its advice (ending in "; ")."""
    return (f"training's counterfactual search stopped converging: {key} = {share:.3f} < {threshold} for "
            f"{low_epochs} epochs (epoch {epoch}); ")


def general_advice(lower_tau: bool = True) -> str:
    """What to try when the search converges too seldom; without "a lower --tau" where ``lower_tau`` is false."""
    return ADVICE if lower_tau else ADVICE.replace("a lower --tau, ", "")


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


RARE = 0.01  # a share of training rows below which the model "seldom" predicts a class or gives it tau


def class_names(trainer, n_classes: int) -> list[str]:
    """The classes' names in the model's output order: a table's classes, else their indices."""
    classes = getattr(getattr(getattr(trainer, "datamodule", None), "codec", None), "classes", None)
    return [str(c) for c in classes] if classes is not None and len(classes) == n_classes else \
        [str(k) for k in range(n_classes)]


def tau_reach(module) -> torch.Tensor | None:
    """Per class, over the training rows: the share the model predicts as that class, the share to which it gives
    the class a probability of at least ``tau``, and the highest probability it gives it; a ``3 × classes`` tensor
    (one forward pass of ``module.model`` over ``module.x_train``), or ``None`` without them."""
    x, tau = getattr(module, "x_train", None), getattr(getattr(module, "hparams", None), "tau", None)
    if x is None or tau is None:
        return None
    with eval_mode(module.model), torch.no_grad():
        p = module.model(x).float().softmax(1)
    predicted = torch.bincount(p.argmax(1), minlength=p.shape[1]).float() / len(p)
    return torch.stack([predicted, (p >= float(tau)).float().mean(0), p.amax(0)]).cpu()


def target_message(names: list[str], by_target: dict[int, tuple[int, float]], low: list[int],
                   reach: torch.Tensor | None, tau: float, table: bool, lower_tau: bool,
                   one_way: list[str] | None = None) -> tuple[str, bool]:
    """The per-target part of the warnings: each target class's share converged (of how many counterfactuals), for
    the ``low`` ones how the model treats them on the training rows (:func:`tau_reach`); then what to try where the
    model seldom gives them ``tau`` (the second item is then true). Two causes: the model does not predict the
    class (yet: rare classes, early epochs), or predicts it with less than ``tau`` (with three or more classes, a
    class between others, as 'interview' between 'rejected' and 'offer', may never get 0.5). A third where the
    model gives a low class ``tau`` on many rows and ``one_way`` (:func:`one_way_columns`) names columns that may
    change in one direction only: every move they allow may lead away from it (income: increase and debt: decrease
    lead away from a refusal), which no search setting changes; the general advice follows as the alternative."""
    parts = []
    for k, (count, share) in by_target.items():
        why = f" (predicted for {reach[0, k]:.0%} of training rows, p >= tau for {reach[1, k]:.0%}, max p " \
            f"{reach[2, k]:.2f})" if reach is not None and k in low else ""
        parts.append(f"{names[k]} {share:.2f} of {count}{why}")
    texts = ["converged per target class: " + ", ".join(parts)]
    seldom = [k for k in low if reach is not None and float(reach[1, k]) < RARE]
    unpredicted = [k for k in seldom if float(reach[0, k]) < RARE]
    capped = [k for k in seldom if k not in unpredicted]

    def listed(classes: list[int]) -> str:
        return ", ".join(repr(names[k]) for k in classes)

    if unpredicted:
        advice = ["a longer --burnin", "more search steps (--max-steps)"] + \
            (["--balance undersample"] if table else [])
        texts.append(f"the model does not predict {listed(unpredicted)}, so CT adds little for "
                     f"{'it' if len(unpredicted) == 1 else 'them'}: try {', '.join(advice)}")
    if capped:
        texts.append(f"the model predicts {listed(capped)} but seldom with probability >= tau {tau:g}, so CT adds "
                     f"little for {'it' if len(capped) == 1 else 'them'}" +
                     (": try a lower --tau (then some counterfactuals count that the model predicts as another "
                      "class), or a longer --burnin while the model still learns" if lower_tau else ""))
    blocked = [k for k in low if reach is not None and k not in seldom] if one_way else []
    if blocked:
        it = "it" if len(blocked) == 1 else "them"
        texts.append(f"the model gives {listed(blocked)} probability >= tau on many training rows, yet the search "
                     f"seldom reaches {it}: the mutability lets {', '.join(one_way)} change one way only, and where "
                     f"every move it allows leads away from {it}, no counterfactual can get there and no search "
                     "setting changes that (as meant: CT then adds nothing for that target); "
                     "if a move would lead there, "
                     + general_advice(lower_tau))
    # (SPEC section 1: a counterfactual that does not converge adds no penalty.)
    return "; ".join(texts), bool(unpredicted or (capped and lower_tau) or blocked)


def one_way_columns(module, most: int = 4) -> list[str]:
    """The columns ``module``'s mutability lets change in one direction only, as ``name: increase``
    (``module.mutability``: codes 1 increase, 2 decrease; ``module.feature_names``), at most ``most`` and then
    ``…``; ``[]`` without any."""
    codes, names = getattr(module, "mutability", None), getattr(module, "feature_names", None)
    if codes is None:
        return []
    kinds = {1: "increase", 2: "decrease"}
    found = [f"{names[i] if names is not None else i}: {kinds[int(c)]}" for i, c in enumerate(codes.tolist())
             if int(c) in kinds]
    return found[:most] + (["…"] if len(found) > most else [])


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
    as it learns, was otherwise left with the warning alone). Reads the epoch's logged value and the module's
    per-target tally at epoch end only (two host reads per epoch, none per step).

    With a :class:`~ct_lightning.module.CTModule`, the warning also gives the share converged per target class
    (``converged_by_target``) and, for the low ones, on how many training rows the model gives that class ``tau``
    (:func:`tau_reach`, one forward pass when it warns); and a class whose share stays below ``threshold`` for
    ``patience`` epochs while the share over all targets does not is named in a warning of its own (once): three
    classes of which one is rare or lies between the others can leave CT with nothing to do for that target.
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
        self.target_low: dict[int, int] = {}  # per target class index: its low epochs in a row
        self.target_warned: set[int] = set()  # the target classes a per-target warning has named
        self.echo = echo

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.key)
        if value is None or not getattr(pl_module, "ct_active", True):
            return
        share = float(value)
        epoch = trainer.current_epoch + 1  # current_epoch counts from 0; the progress lines (EpochLines) from 1
        by_target = pl_module.converged_by_target() if callable(getattr(pl_module, "converged_by_target", None)) \
            else {}
        for k, (_, target_share) in by_target.items():
            self.target_low[k] = self.target_low.get(k, 0) + 1 if target_share < self.threshold else 0
        low_targets = [k for k, n in self.target_low.items() if n >= self.patience and k in by_target]
        self.low_epochs = self.low_epochs + 1 if share < self.threshold else 0
        self.high_epochs = 0 if share < self.threshold else self.high_epochs + 1
        if self.warned and not self.recovered and self.high_epochs >= self.patience and self.echo is not None:
            self.recovered = True
            note = recovery_message(self.key, share, self.threshold, self.high_epochs, epoch, self.warned_epoch)
            if low_targets:
                names = class_names(trainer, int(pl_module.hparams.n_classes))
                note += (f", except for target {'class' if len(low_targets) == 1 else 'classes'} "
                         f"{', '.join(repr(names[k]) for k in low_targets)}")
            self.echo("note: " + note)
        if self.low_epochs >= self.patience and not self.warned:
            self.warned = True
            self.warned_epoch = epoch
            if by_target:
                low = [k for k in by_target if by_target[k][1] < self.threshold]
                message = self._with_targets(stopped_head(self.key, share, self.threshold, self.low_epochs, epoch),
                                             trainer, pl_module, by_target, low)
            else:
                message = convergence_message(self.key, share, self.threshold, self.low_epochs, epoch,
                                              tau_may_be_lowered(pl_module))
            self._say(message)
        elif share >= self.threshold and set(low_targets) - self.target_warned:
            # the share over all targets hides classes for which CT's search (nearly) never converges
            self.target_warned.update(low_targets)
            names = class_names(trainer, int(pl_module.hparams.n_classes))
            head = (f"training's counterfactual search converges for few counterfactuals of target "
                    f"{'class' if len(low_targets) == 1 else 'classes'} {', '.join(repr(names[k]) for k in low_targets)}"
                    f" (< {self.threshold} for {min(self.target_low[k] for k in low_targets)} epochs, epoch {epoch}; "
                    f"{self.key} = {share:.3f} over all targets); ")
            self._say(self._with_targets(head, trainer, pl_module, by_target, low_targets))

    def _with_targets(self, head: str, trainer, pl_module, by_target: dict, low: list[int]) -> str:
        """``head`` (ending in "; "), then :func:`target_message`, then the general advice where that names none."""
        hp = pl_module.hparams
        lower_tau = tau_may_be_lowered(pl_module)
        targets, advised = target_message(class_names(trainer, int(hp.n_classes)), by_target, low,
                                          tau_reach(pl_module), float(hp.tau),
                                          hasattr(getattr(trainer, "datamodule", None), "codec"), lower_tau,
                                          one_way_columns(pl_module))
        return head + targets + ("" if advised else "; " + general_advice(lower_tau))

    def _say(self, message: str) -> None:
        if self.echo is not None:
            self.echo(f"warning: {message}")
        else:
            warnings.warn(message, ConvergenceWarning, stacklevel=3)
