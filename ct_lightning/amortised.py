"""Conditional generative counterfactuals (Van Looveren et al.; SPEC §6) and the ``amortised`` CT generator.

A generator network ``G(x, y_M, y_T, z)`` returns counterfactuals for a whole batch in one forward
pass. It is trained against a frozen classifier ``M`` (only its predictions are used, no labels) with

    L_G = w_M·CE(M(x_CF), y_T) + w_l1·‖x − x_CF‖₁ + w_χ·L_χ

where ``L_χ`` keeps ``x_CF`` in distribution:

- ``variant="mmd"`` (paper App. B): MMD² between the counterfactuals of target class ``c`` and the
  samples of the batch that ``M`` assigns to ``c`` (Gaussian kernel; median-distance bandwidth
  unless ``length_scale`` is given), averaged over classes weighted by counterfactual counts;
- ``variant="gan"`` (paper Sec. 3.4, tabular): a discriminator ``D(x, y)`` conditioned on the class,
  fed real samples with ``y_M`` and counterfactuals with ``y_T``; vanilla GAN losses
  ``L_D = −log D(x, y_M) − log(1 − D(x_CF, y_T))`` and ``L_χ = −log D(x_CF, y_T)`` (non-saturating).

Continuous features are generated as a perturbation ``x + δ`` (the last layer starts at zero, so an
untrained generator is the identity). One-hot groups (columns named ``feature=value``) are generated
directly, as in the paper's tabular model: per-group logits (biased towards the factual's category),
straight-through Gumbel-softmax while training and a hard arg-max at generation. Mutability and the
domain are enforced on every output with :func:`ct_lightning.constraints.enforce`.

:class:`GeneratorModule` is the LightningModule (manual optimisation, trained with a ``Trainer`` in
``recipes/train_generator.py``; :meth:`GeneratorModule.fit_epochs` is a plain loop for quick refits).
:class:`Amortised` plugs it into CT as the generator ``amortised``: it fits the network when CT
starts and re-fits it for ``refit_epochs`` epochs every ``refit_every`` epochs to follow the
changing classifier.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import enforce
from ct_lightning.generators import register_generator
from ct_lightning.search import SearchResult, random_targets

VARIANTS = ("mmd", "gan")


def one_hot_groups(feature_names: Sequence[str] | None) -> list[list[int]]:
    """Column indices of the one-hot groups: features named ``group=value`` sharing a prefix (≥ 2 columns)."""
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(feature_names or []):
        if "=" in str(name):
            groups.setdefault(str(name).split("=", 1)[0], []).append(index)
    return [columns for columns in groups.values() if len(columns) >= 2]


def _mlp(sizes: Sequence[int], slope: float = 0.2) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.LeakyReLU(slope))
    return nn.Sequential(*layers)


class ConditionalGenerator(nn.Module):
    """``G(x, y_M, y_T, z) → x_CF``: an MLP on ``[x, onehot(y_M), onehot(y_T), z]``.

    ``groups`` lists the column indices of one-hot groups, generated as categories (see module
    docstring); all other columns get ``x + δ``. Noise ``z`` is standard normal while training and
    zero at generation (deterministic counterfactuals) unless given.
    """

    def __init__(self, n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (64, 64), noise_dim: int = 4,
                 groups: Sequence[Sequence[int]] | None = None, keep_bias: float = 2.0):
        super().__init__()
        self.n_classes, self.noise_dim, self.keep_bias = n_classes, noise_dim, keep_bias
        self.body = _mlp([n_features + 2 * n_classes + noise_dim, *hidden_sizes, n_features])
        nn.init.zeros_(self.body[-1].weight)
        nn.init.zeros_(self.body[-1].bias)
        groups = [list(g) for g in (groups or []) if len(g) >= 2]
        columns = [c for g in groups for c in g]
        self.register_buffer("cat_columns", torch.tensor(columns, dtype=torch.long))
        self.register_buffer("cat_group", torch.tensor([i for i, g in enumerate(groups) for _ in g], dtype=torch.long))
        self.n_groups = len(groups)

    def _categories(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-group one-hot samples; straight-through Gumbel-softmax in training, arg-max otherwise."""
        n = logits.shape[0]
        group = self.cat_group.expand(n, -1)
        if self.training:
            u = torch.rand_like(logits).clamp_(1e-10, 1.0 - 1e-7)
            logits = logits - torch.log(-torch.log(u))
        top = torch.full((n, self.n_groups), -math.inf, device=logits.device, dtype=logits.dtype)
        top = top.scatter_reduce(1, group, logits, "amax").gather(1, group)
        weights = (logits - top).exp()
        total = torch.zeros(n, self.n_groups, device=logits.device, dtype=logits.dtype).index_add(1, self.cat_group, weights)
        soft = weights / total.gather(1, group)
        hard = (logits == top).to(logits.dtype)
        return hard - soft.detach() + soft

    def forward(self, x: torch.Tensor, y_model: torch.Tensor, y_target: torch.Tensor,
                noise: torch.Tensor | None = None) -> torch.Tensor:
        """Counterfactuals of ``x`` (predicted ``y_model``) for the classes ``y_target``."""
        if noise is None:
            noise = torch.randn(len(x), self.noise_dim, device=x.device) if self.training else \
                x.new_zeros(len(x), self.noise_dim)
        inputs = torch.cat([x, F.one_hot(y_model, self.n_classes).to(x.dtype),
                            F.one_hot(y_target, self.n_classes).to(x.dtype), noise], 1)
        out = self.body(inputs)
        x_cf = x + out
        if self.n_groups:
            logits = out[:, self.cat_columns] + self.keep_bias * x[:, self.cat_columns]
            x_cf = x_cf.index_copy(1, self.cat_columns, self._categories(logits))
        return x_cf


class ConditionalDiscriminator(nn.Module):
    """``D(x, y)``: an MLP on ``[x, onehot(y)]`` returning one logit (real vs generated)."""

    def __init__(self, n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (64, 64)):
        super().__init__()
        self.n_classes = n_classes
        self.body = _mlp([n_features + n_classes, *hidden_sizes, 1])

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Logit that ``x`` is a real sample of class ``y``."""
        return self.body(torch.cat([x, F.one_hot(y, self.n_classes).to(x.dtype)], 1)).squeeze(1)


def median_length_scale(x: torch.Tensor, max_samples: int = 1000) -> float:
    """Median pairwise Euclidean distance of (up to ``max_samples`` rows of) ``x``: a Gaussian-kernel bandwidth."""
    sample = x[:max_samples]
    distances = torch.cdist(sample, sample)
    positive = distances[distances > 0]
    return float(positive.median()) if positive.numel() else 1.0


def gaussian_mmd2(a: torch.Tensor, b: torch.Tensor, length_scale: float | torch.Tensor) -> torch.Tensor:
    """Biased (V-statistic) MMD² between samples ``a`` and ``b`` with a Gaussian kernel; differentiable in ``a``."""
    gamma = 1.0 / (2.0 * length_scale ** 2)
    kaa = torch.exp(-gamma * _squared_distances(a, a)).mean()
    with torch.no_grad():
        kbb = torch.exp(-gamma * _squared_distances(b, b)).mean()
    kab = torch.exp(-gamma * _squared_distances(a, b)).mean()
    return kaa + kbb - 2.0 * kab


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise squared Euclidean distances via one matrix product (cheaper to differentiate than cdist)."""
    return (a.square().sum(1, keepdim=True) + b.square().sum(1)[None, :] - 2.0 * a @ b.T).clamp_min(0.0)


def class_conditional_mmd(x_cf: torch.Tensor, y_target: torch.Tensor, reference: torch.Tensor,
                          y_reference: torch.Tensor, n_classes: int, length_scale: float | None = None) -> torch.Tensor:
    """Per target class ``c``: MMD² between ``x_cf[y_target == c]`` and ``reference[y_reference == c]``.

    Averaged over classes weighted by the number of counterfactuals; classes with no counterfactual
    or fewer than two reference samples are skipped (zero if none remain). ``length_scale=None``
    takes the median pairwise distance of the reference samples (:func:`median_length_scale`).
    """
    if length_scale is None:
        length_scale = median_length_scale(reference.detach())
    total, weight = x_cf.new_zeros(()), 0
    for c in range(n_classes):
        cf_c, ref_c = x_cf[y_target == c], reference[y_reference == c]
        if len(cf_c) == 0 or len(ref_c) < 2:
            continue
        total = total + len(cf_c) * gaussian_mmd2(cf_c, ref_c, length_scale)
        weight += len(cf_c)
    return total / max(weight, 1)


@contextlib.contextmanager
def frozen(model: nn.Module):
    """Eval mode and no parameter gradients for ``model`` inside the block; restored afterwards."""
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)


class GeneratorModule(L.LightningModule):
    """LightningModule training a :class:`ConditionalGenerator` against a frozen ``classifier``.

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
        self.generator = ConditionalGenerator(n_features, n_classes, hidden_sizes, noise_dim, groups)
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
            raise RuntimeError("GeneratorModule: no classifier; pass classifier= or call set_classifier()")
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
        return enforce(self.generator(x, y_model, y_target, noise), x, self.codes, self.lower, self.upper)

    @torch.no_grad()
    def generate(self, x: torch.Tensor, y_target: torch.Tensor, y_model: torch.Tensor | None = None) -> torch.Tensor:
        """Counterfactuals of a whole batch in one forward pass (generator in eval mode, zero noise)."""
        was_training = self.generator.training
        self.generator.eval()
        try:
            if y_model is None:
                with frozen(self.classifier):
                    y_model = self.classifier(x).argmax(1)
            return self.counterfactuals(x, y_model, y_target)
        finally:
            self.generator.train(was_training)

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
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr)
        if self.discriminator is None:
            return opt_g
        return [opt_g, torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr_d)]

    def fit_epochs(self, x_train: torch.Tensor, epochs: int = 1, batch_size: int = 256,
                   generator: torch.Generator | None = None) -> dict[str, float]:
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
                order = torch.randperm(len(x_train), generator=generator).to(x_train.device)
                for start in range(0, len(x_train), batch_size):
                    terms = self.optimise(x_train[order[start:start + batch_size]], opt_g, opt_d)
                    for key, value in terms.items():
                        sums[key] = sums.get(key, 0.0) + value
                    count += 1
        self.eval()
        return {key: value / max(count, 1) for key, value in sums.items()}


def _feature_names(module) -> list[str] | None:
    names = module.hparams.get("feature_names") if hasattr(module, "hparams") else None
    trainer = getattr(module, "_trainer", None)
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    return names or (list(getattr(datamodule, "feature_names", None) or []) or None)


class Amortised:
    """CT generator ``amortised``: one forward pass of a conditional generator per counterfactual pool.

    The network is fitted for ``initial_epochs`` epochs at the first CT epoch (after any burn-in)
    and re-fitted for ``refit_epochs`` epochs whenever ``refit_every`` epochs have passed since the
    last fit, on up to ``max_fit_samples`` training samples. ``variant``, ``hidden_sizes``,
    ``noise_dim``, ``w_m``, ``w_l1``, ``w_chi``, ``length_scale``, ``gen_lr`` and ``batch_size`` set the
    :class:`GeneratorModule`. A search-free generator has no path: ``steps`` is 1 for every row and
    the nascent counterfactual is the point of the segment from ``x`` to ``x_CF`` at ℓ∞ distance
    ``min(ε, ‖x_CF − x‖∞)``. ``fit_seconds`` accumulates the time spent fitting.
    """

    name = "amortised"

    def __init__(self, lambda_cost: float = 0.001, lr: float = 0.25, variant: str = "mmd", refit_every: int = 5,
                 refit_epochs: int = 1, initial_epochs: int = 10, hidden_sizes: Sequence[int] = (64, 64),
                 noise_dim: int = 4, w_m: float = 1.0, w_l1: float = 0.1, w_chi: float = 1.0,
                 length_scale: float | None = None, gen_lr: float = 1e-3, batch_size: int = 256,
                 max_fit_samples: int | None = 5000, seed: int = 0):
        if variant not in VARIANTS:
            raise ValueError(f"variant: unknown {variant!r}; allowed: {', '.join(VARIANTS)}")
        if refit_every < 1 or initial_epochs < 1 or refit_epochs < 0:
            raise ValueError("amortised: refit_every and initial_epochs must be ≥ 1, refit_epochs ≥ 0")
        self.lambda_cost, self.lr = lambda_cost, lr
        self.options = dict(variant=variant, hidden_sizes=list(hidden_sizes), noise_dim=noise_dim, w_m=w_m, w_l1=w_l1,
                            w_chi=w_chi, length_scale=length_scale, lr=gen_lr)
        self.refit_every, self.refit_epochs, self.initial_epochs = refit_every, refit_epochs, initial_epochs
        self.batch_size, self.max_fit_samples, self.seed = batch_size, max_fit_samples, seed
        self.net: GeneratorModule | None = None
        self.fitted_epoch: int | None = None
        self.fit_seconds = 0.0
        self.n_fits = 0

    def config(self) -> dict:
        """Primitive settings, for logging and checkpoints."""
        return {"generator": self.name, **self.options, "refit_every": self.refit_every,
                "refit_epochs": self.refit_epochs, "initial_epochs": self.initial_epochs,
                "batch_size": self.batch_size, "max_fit_samples": self.max_fit_samples}

    def build(self, classifier: nn.Module, n_features: int, n_classes: int, feature_names: Sequence[str] | None = None,
              mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
              upper: torch.Tensor | None = None) -> GeneratorModule:
        """Create the (untrained) network for ``classifier`` and the constraints."""
        self.net = GeneratorModule(n_features, n_classes, classifier, groups=one_hot_groups(feature_names),
                                   mutability=mutability, lower=lower, upper=upper, **self.options)
        self.fitted_epoch = None
        return self.net

    def fit(self, x_train: torch.Tensor, epochs: int) -> dict[str, float]:
        """Train the network for ``epochs`` epochs on (a random subset of) ``x_train``."""
        if self.net is None:
            raise RuntimeError("amortised: call build() or prepare(module) before fit()")
        started = time.perf_counter()
        rng = torch.Generator().manual_seed(self.seed + self.n_fits)
        if self.max_fit_samples is not None and len(x_train) > self.max_fit_samples:
            x_train = x_train[torch.randperm(len(x_train), generator=rng)[:self.max_fit_samples].to(x_train.device)]
        self.net.to(x_train.device)
        terms = self.net.fit_epochs(x_train, epochs, self.batch_size, rng)
        self.fit_seconds += time.perf_counter() - started
        self.n_fits += 1
        return terms

    def prepare_standalone(self, model: nn.Module, x_train: torch.Tensor, feature_names: Sequence[str] | None = None,
                           mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                           upper: torch.Tensor | None = None, **_) -> None:
        """Outside CT (evaluation): build the network for ``model`` and fit it for ``initial_epochs`` on ``x_train``."""
        with torch.no_grad():
            n_classes = int(model(x_train[:1]).shape[1])
        self.build(model, x_train.shape[1], n_classes, feature_names, mutability, lower, upper)
        self.fit(x_train, self.initial_epochs)

    def prepare(self, module) -> None:
        """Build the network for ``module.model`` and its constraints (skipped without CT terms)."""
        if not (module.uses_energy or module.uses_adversarial):
            return
        self.build(module.model, module.x_train.shape[1], module.hparams.n_classes, _feature_names(module),
                   module.mutability, module.lower, module.upper)

    def update(self, module) -> None:
        """Fit at the first CT epoch, then re-fit every ``refit_every`` epochs."""
        if self.net is None:
            self.prepare(module)
        if self.net is None:
            return
        self.net.set_classifier(module.model)
        epoch = int(module.current_epoch)
        if self.fitted_epoch is None:
            self.fit(module.x_train, self.initial_epochs)
        elif epoch - self.fitted_epoch >= self.refit_every and self.refit_epochs > 0:
            self.fit(module.x_train, self.refit_epochs)
        else:
            return
        self.fitted_epoch = epoch

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None,
                 lower=None, upper=None) -> SearchResult:
        """Counterfactuals in one forward pass; ``max_steps`` is unused, constraints are enforced."""
        if self.net is None:
            raise RuntimeError("amortised: the generator is not built; call prepare(module) or build() and fit()")
        n, n_features = x.shape
        codes = torch.zeros(n_features, dtype=torch.long, device=x.device) if mutability is None else mutability.to(x.device)
        self.net.to(x.device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                y_model = model(x).argmax(1)
                x_cf = enforce(self.net.generate(x, target, y_model), x, codes, lower, upper)
                converged = model(x_cf).softmax(1).gather(1, target[:, None]).squeeze(1) >= tau
        finally:
            model.train(was_training)
        distance = (x_cf - x).abs().amax(1, keepdim=True)
        scale = torch.where(distance > epsilon, epsilon / distance.clamp_min(1e-12), torch.ones_like(distance))
        nascent = x + scale * (x_cf - x)
        moved = (distance.squeeze(1) > 0) & (scale.squeeze(1) > 0)
        steps = torch.ones(n, dtype=torch.long, device=x.device)
        return SearchResult(x_cf, nascent, converged, steps, moved.long())


register_generator("amortised", Amortised)


def sparsity(x_cf: torch.Tensor, x: torch.Tensor, groups: Sequence[Sequence[int]] = (), tol: float = 1e-4) -> dict[str, torch.Tensor]:
    """Per-row ``l1`` (all columns), ``l1_numeric`` (columns outside one-hot groups), ``l0`` (changed features,
    a one-hot group counting as one) and ``l0_categorical`` (changed groups); a change is ``|Δ| > tol``."""
    delta = (x_cf - x).abs()
    numeric = torch.ones(x.shape[1], dtype=torch.bool, device=x.device)
    changed_groups = torch.zeros(len(x), device=x.device)
    for columns in groups:
        numeric[list(columns)] = False
        changed_groups += (delta[:, list(columns)] > tol).any(1).float()
    changed_numeric = (delta[:, numeric] > tol).sum(1).float()
    return {"l1": delta.sum(1), "l1_numeric": delta[:, numeric].sum(1),
            "l0": changed_numeric + changed_groups, "l0_categorical": changed_groups}


def counterfactual_quality(classifier: nn.Module, x: torch.Tensor, x_cf: torch.Tensor, y_target: torch.Tensor,
                           groups: Sequence[Sequence[int]] = (), n_classes: int | None = None,
                           length_scale: float | None = None) -> dict[str, float]:
    """The paper's evaluation (Van Looveren et al., Tables 2-3) of counterfactuals ``x_cf`` of ``x``.

    ``mmd2``: unbiased MMD² between all counterfactuals and all factuals; ``mmd2_class_c``: between the
    counterfactuals ``M`` assigns to ``c`` and the factuals ``M`` assigns to ``c``; ``mmd2_class_mean``
    their mean; ``l1``, ``l1_numeric``, ``l0``, ``l0_categorical`` (means, see :func:`sparsity`);
    ``validity``: share with ``M(x_cf) = y_target``. The Gaussian kernel's bandwidth defaults to the
    median pairwise distance of ``x`` (the paper's MMD tooling does the same).
    """
    from ct_lightning.metrics.functional import mmd2_unbiased

    with frozen(classifier), torch.no_grad():
        y_model = classifier(x).argmax(1)
        y_cf = classifier(x_cf).argmax(1)
    n_classes = n_classes or int(torch.cat([y_model, y_cf, y_target]).max()) + 1
    scale = length_scale or median_length_scale(x)
    out = {"validity": float((y_cf == y_target).float().mean()), "length_scale": scale,
           "mmd2": float(mmd2_unbiased(x_cf, x, length_scale=scale))}
    per_class = []
    for c in range(n_classes):
        cf_c, x_c = x_cf[y_cf == c], x[y_model == c]
        value = float(mmd2_unbiased(cf_c, x_c, length_scale=scale)) if len(cf_c) >= 2 and len(x_c) >= 2 else math.nan
        out[f"mmd2_class_{c}"] = value
        per_class.append(value)
    finite = [v for v in per_class if math.isfinite(v)]
    out["mmd2_class_mean"] = float(sum(finite) / len(finite)) if finite else math.nan
    out.update({k: float(v.mean()) for k, v in sparsity(x_cf, x, groups).items()})
    return out
