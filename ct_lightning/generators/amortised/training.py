"""Training the amortised generator network against a frozen classifier (LightningModule or plain loop)."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import enforce
from ct_lightning.training.eval_mode import eval_mode, frozen
from ct_lightning.generators.amortised.losses import class_conditional_mmd
from ct_lightning.generators.amortised.network import ConditionalDiscriminator, CounterfactualNetwork
from ct_lightning.metrics.functional import median_length_scale
from ct_lightning.training.pool import random_targets

VARIANTS = ("mmd", "gan")


class CounterfactualNetworkModule(L.LightningModule):
    """LightningModule training a :class:`CounterfactualNetwork` against a frozen ``classifier``.

    The classifier is held without registering it as a submodule, so it is neither saved in this
    module's checkpoints nor moved or trained by its ``Trainer``; pass it to the constructor or
    :meth:`set_classifier`. ``mutability`` (codes), ``lower``/``upper`` are enforced on every output.
    Logs ``gen/loss``, ``gen/pred``, ``gen/l1``, ``gen/chi`` (and ``gen/d_loss`` for the GAN) per
    epoch, and ``val/validity``, ``val/l1`` on validation batches.
    """

    def __init__(self, n_features: int, n_classes: int, classifier: nn.Module | None = None, variant: str = "mmd",
                 hidden_sizes: Sequence[int] = (64, 64), noise_dim: int = 4,
                 groups: Sequence[Sequence[int]] | None = None, w_m: float = 1.0, w_l1: float = 0.1,
                 w_chi: float = 1.0, length_scale: float | None = None, lr: float = 1e-3, lr_d: float = 1e-3,
                 d_hidden_sizes: Sequence[int] = (64, 64), mutability: Sequence[int] | torch.Tensor | None = None,
                 lower: Sequence[float] | torch.Tensor | None = None, upper: Sequence[float] | torch.Tensor | None = None):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant: unknown {variant!r}; allowed: {', '.join(VARIANTS)}")
        as_list = (lambda v: None if v is None else [float(t) for t in torch.as_tensor(v).reshape(-1).tolist()])
        mutability = None if mutability is None else [int(v) for v in torch.as_tensor(mutability).tolist()]
        lower, upper = as_list(lower), as_list(upper)
        groups = [list(map(int, g)) for g in (groups or [])]
        self.save_hyperparameters(ignore=["classifier"])
        self.automatic_optimization = False
        self.network = CounterfactualNetwork(n_features, n_classes, hidden_sizes, noise_dim, groups)
        self.discriminator = ConditionalDiscriminator(n_features, n_classes, d_hidden_sizes) if variant == "gan" else None
        self.register_buffer("codes", torch.tensor(mutability if mutability is not None else [0] * n_features,
                                                   dtype=torch.long))
        self.register_buffer("lower", None if lower is None else torch.tensor(lower).expand(n_features).clone())
        self.register_buffer("upper", None if upper is None else torch.tensor(upper).expand(n_features).clone())
        self._classifier = [classifier] if classifier is not None else []
        self._plain_optimizers: list[torch.optim.Optimizer] | None = None
        self._bandwidth: float | None = None  # MMD kernel bandwidth: length_scale, else the first batch's median distance

    # ---------------------------------------------------------------- classifier
    @property
    def classifier(self) -> nn.Module:
        """The frozen classifier the generator explains."""
        if not self._classifier:
            raise RuntimeError("CounterfactualNetworkModule: no classifier; pass classifier= or call set_classifier()")
        return self._classifier[0]

    def set_classifier(self, classifier: nn.Module) -> None:
        """Explain ``classifier`` from now on (it is not registered as a submodule)."""
        self._classifier = [classifier]

    def on_fit_start(self) -> None:
        """Move the (unregistered) classifier to this module's device."""
        self.classifier.to(self.device)

    # ---------------------------------------------------------------- generation
    def counterfactuals(self, x: torch.Tensor, y_model: torch.Tensor, y_target: torch.Tensor,
                        noise: torch.Tensor | None = None) -> torch.Tensor:
        """``G``'s output with mutability and domain enforced (differentiable)."""
        return enforce(self.network(x, y_model, y_target, noise), x, self.codes, self.lower, self.upper)

    @torch.no_grad()
    def generate(self, x: torch.Tensor, y_target: torch.Tensor, y_model: torch.Tensor | None = None) -> torch.Tensor:
        """Counterfactuals of a whole batch in one forward pass (generator in eval mode, zero noise)."""
        with eval_mode(self.network):
            if y_model is None:
                with frozen(self.classifier):
                    y_model = self.classifier(x).argmax(1)
            return self.counterfactuals(x, y_model, y_target)

    # ------------------------------------------------------------------ training
    def optimise(self, x: torch.Tensor, opt_g, opt_d=None, backward=None) -> dict[str, float]:
        """One training step on the batch ``x``: a discriminator step (GAN) then a generator step."""
        hp = self.hparams
        backward = backward or (lambda loss: loss.backward())
        with frozen(self.classifier) as classifier:
            with torch.no_grad():
                y_model = classifier(x).argmax(1)
            y_target = random_targets(y_model, hp.n_classes)
            x_cf = self.counterfactuals(x, y_model, y_target)
            terms: dict[str, float] = {}
            if self.discriminator is not None:
                d_real = self.discriminator(x, y_model)
                d_fake = self.discriminator(x_cf.detach(), y_target)
                d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
                    F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
                opt_d.zero_grad()
                backward(d_loss)
                opt_d.step()
                terms["d_loss"] = float(d_loss.detach())
                d_cf = self.discriminator(x_cf, y_target)
                chi = F.binary_cross_entropy_with_logits(d_cf, torch.ones_like(d_cf))
            else:
                if self._bandwidth is None:
                    self._bandwidth = hp.length_scale or median_length_scale(x.detach(), 256)
                chi = class_conditional_mmd(x_cf, y_target, x, y_model, hp.n_classes, self._bandwidth)
            pred = F.cross_entropy(classifier(x_cf), y_target)
            l1 = (x_cf - x).abs().sum(1).mean()
            loss = hp.w_m * pred + hp.w_l1 * l1 + hp.w_chi * chi
            opt_g.zero_grad()
            backward(loss)
            opt_g.step()
        terms.update(loss=float(loss.detach()), pred=float(pred.detach()), l1=float(l1.detach()), chi=float(chi.detach()))
        return terms

    def training_step(self, batch, batch_idx: int) -> None:
        """Manual optimisation of ``G`` (and ``D``); logs the loss terms under ``gen/``."""
        optimizers = self.optimizers()
        opt_g, opt_d = (optimizers if isinstance(optimizers, (list, tuple)) else [optimizers, None])[:2]
        terms = self.optimise(batch[0], opt_g, opt_d, self.manual_backward)
        for name, value in terms.items():
            self.log(f"gen/{name}", value, on_step=False, on_epoch=True, prog_bar=name == "loss", batch_size=len(batch[0]))

    def validation_step(self, batch, batch_idx: int) -> None:
        """Validity and ℓ1 of one-pass counterfactuals for random targets."""
        x = batch[0]
        with frozen(self.classifier) as classifier:
            y_model = classifier(x).argmax(1)
            y_target = random_targets(y_model, self.hparams.n_classes)
            x_cf = self.generate(x, y_target, y_model)
            valid = (classifier(x_cf).argmax(1) == y_target).float().mean()
        self.log("val/validity", valid, prog_bar=True, batch_size=len(x))
        self.log("val/l1", (x_cf - x).abs().sum(1).mean(), batch_size=len(x))

    def configure_optimizers(self):
        """Adam for the generator (and the discriminator in the GAN variant)."""
        opt_g = torch.optim.Adam(self.network.parameters(), lr=self.hparams.lr)
        if self.discriminator is None:
            return opt_g
        return [opt_g, torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr_d)]

    def fit_epochs(self, x_train: torch.Tensor, epochs: int = 1, batch_size: int = 256,
                   rng: torch.Generator | None = None) -> dict[str, float]:
        """Train for ``epochs`` passes over ``x_train`` with a plain loop (no ``Trainer``); returns mean terms.

        The optimisers persist between calls, so repeated short refits continue where the last one
        stopped. Used by :class:`Amortised` to follow a classifier that changes during CT.
        """
        if self._plain_optimizers is None:
            optimizers = self.configure_optimizers()
            self._plain_optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers, None]
        opt_g, opt_d = self._plain_optimizers[:2]
        self.train()
        sums: dict[str, float] = {}
        count = 0
        with torch.inference_mode(False), torch.enable_grad():
            x_train = x_train.detach().clone()
            for _ in range(epochs):
                order = torch.randperm(len(x_train), generator=rng).to(x_train.device)
                for start in range(0, len(x_train), batch_size):
                    terms = self.optimise(x_train[order[start:start + batch_size]], opt_g, opt_d)
                    for key, value in terms.items():
                        sums[key] = sums.get(key, 0.0) + value
                    count += 1
        self.eval()
        return {key: value / max(count, 1) for key, value in sums.items()}
