"""``CTModule``: a LightningModule that trains any classifier with counterfactual training."""

from __future__ import annotations

import math
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from ct_lightning.constraints import parse_mutability, resolve_domain
from ct_lightning.eval_mode import eval_mode
from ct_lightning.generators import FitContext, make_generator
from ct_lightning.losses import (adversarial_loss, check_objective, contrast_pairs, contrastive_divergence,
                                 energy_ridge)
from ct_lightning.models import build_model
from ct_lightning.pool import ClassSampler, CounterfactualPool, random_targets
from ct_lightning.trainer_data import trainer_tensors

POOL_MODES = ("epoch", "step")


class CTModule(L.LightningModule):
    """Counterfactual training (Eq. 2) around any classifier that returns logits.

    Pass ``model`` to wrap your own ``nn.Module`` (then also give ``n_classes``), or leave it out
    and give ``n_features``/``n_classes`` to build ``architecture``: ``mlp`` (the paper's MLP,
    ``hidden_sizes``/``activation``), ``cnn`` (LeNet-style, for images) or
    ``package.module:factory`` (rebuilt from the name, so ``load_from_checkpoint`` works). The training data (for
    factuals and ``x⁺``) is taken from the datamodule's ``train_tensors`` or from the training
    dataloader's ``TensorDataset``.

    Objectives: ``full`` (all terms), ``vanilla`` (cross-entropy only), ``energy``
    (clf + div + ridge), ``adversarial`` (clf + adv). ``pool="epoch"`` searches ``nce``
    counterfactuals once per epoch and spreads them over the epoch's steps (Algorithm 1,
    the fast default); ``pool="step"`` searches a share of them inside every step.
    ``mutability`` maps feature names (or indices) to ``both|increase|decrease|none``;
    ``domain`` is ``"infer"`` (SPEC §2), ``None`` or ``[lower, upper]`` (scalars or per-feature lists).
    """

    def __init__(self, model: nn.Module | None = None, n_features: int | None = None, n_classes: int = 2,
                 hidden_sizes: tuple[int, ...] | list[int] = (32,), activation: str = "relu",
                 architecture: str = "mlp",
                 objective: str = "full", lambda_clf: float = 1.0, lambda_div: float = 0.5,
                 lambda_reg: float = 0.1, lambda_adv: float = 0.25, generator: str = "ecco",
                 lambda_cost: float = 0.001, lambda_energy: float = 5.0, search_lr: float = 0.25,
                 max_steps: int = 30, tau: float = 0.75, epsilon: float = 0.3, nce: int = 1000,
                 pool: str = "epoch", generator_options: dict | None = None,
                 mutability: dict | str | None = None,
                 feature_names: list[str] | None = None, domain="infer", domain_std: float = 3.0,
                 lr: float = 1e-3, seed: int = 0):
        super().__init__()
        self.uses_energy, self.uses_adversarial = check_objective(objective)
        if pool not in POOL_MODES:
            raise ValueError(f"pool: unknown {pool!r}; allowed: {', '.join(POOL_MODES)}")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {tau}")
        if isinstance(domain, str) and domain != "infer":
            raise ValueError(f"domain: allowed 'infer', None or [lower, upper], got {domain!r}")
        hidden_sizes = list(hidden_sizes)
        self.save_hyperparameters(ignore=["model"])
        if model is None:
            if n_features is None:
                raise ValueError("n_features: required when no model is given (to build the default MLP)")
            model = build_model(architecture, n_features, n_classes, hidden_sizes, activation)
        self.model = model
        self.generator = make_generator(generator, lambda_cost, lambda_energy, search_lr, **(generator_options or {}))
        self.ct_active = True  # switched off by the BurnIn callback during burn-in epochs
        self.pool: CounterfactualPool | None = None
        self.train_acc = MulticlassAccuracy(n_classes, average="micro")
        self.val_acc = MulticlassAccuracy(n_classes, average="micro")
        self.test_acc = MulticlassAccuracy(n_classes, average="micro")
        self._data_ready = False
        self._generator_fitted = False

    @property
    def uses_counterfactuals(self) -> bool:
        """Whether the current epoch searches counterfactuals at all."""
        return self.ct_active and (self.uses_energy or self.uses_adversarial)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # ----------------------------------------------------------------- training data
    def _datamodule(self):
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def prepare_counterfactual_data(self, x_train: torch.Tensor, y_train: torch.Tensor) -> None:
        """Store the training data for factuals and ``x⁺``; resolve mutability and the domain."""
        hp = self.hparams
        self.x_train, self.y_train = x_train.to(self.device).float(), y_train.to(self.device).long()
        datamodule = self._datamodule()
        self.feature_names = hp.feature_names
        if self.feature_names is None and datamodule is not None:
            self.feature_names = getattr(datamodule, "feature_names", None) or None
        n_features = self.x_train.shape[1]
        self.mutability = parse_mutability(hp.mutability, n_features, self.feature_names).to(self.device)
        self.lower, self.upper = resolve_domain(hp.domain, self.x_train, hp.domain_std, datamodule)
        if self.lower is not None:
            self.lower, self.upper = self.lower.to(self.device), self.upper.to(self.device)
        self.sampler = ClassSampler(self.y_train, hp.n_classes)
        self._data_ready = True

    def fit_context(self) -> FitContext:
        """What the generator learns from: this model, the training data, feature names and constraints."""
        datamodule = self._datamodule()
        return FitContext(model=self.model, x_train=self.x_train, y_train=self.y_train, n_classes=self.hparams.n_classes,
                          feature_names=self.feature_names, mutability=self.mutability, lower=self.lower,
                          upper=self.upper, name=str(getattr(datamodule, "name", None) or "data"))

    def on_train_start(self) -> None:
        # Not on_fit_start: Lightning sets trainer.train_dataloader only once training starts.
        if not self._data_ready:
            self.prepare_counterfactual_data(*trainer_tensors(self.trainer, "train"))
        if self.uses_energy or self.uses_adversarial:
            self.generator.fit(self.fit_context())
            self._generator_fitted = True

    # ----------------------------------------------------------- counterfactual pool
    def _rng(self, salt: int) -> torch.Generator:
        # Seeded by (seed, epoch, step, rank): reproducible, resumable, and different on each DDP rank.
        key = (self.hparams.seed, self.current_epoch, salt, self.global_rank)
        return torch.Generator().manual_seed(hash(key) % (2**63))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # A learning generator's state (e.g. the amortised network) is part of an exact resume.
        state = getattr(self.generator, "state_dict", None)
        if callable(state):
            checkpoint["ct_generator_state"] = state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        load = getattr(self.generator, "load_state_dict", None)
        if callable(load) and checkpoint.get("ct_generator_state"):
            load(checkpoint["ct_generator_state"])

    def generate_pool(self, n: int, rng: torch.Generator) -> tuple[CounterfactualPool, dict]:
        """Draw ``n`` factuals, random targets and ``x⁺``, and search their counterfactuals at once."""
        hp = self.hparams
        n_train = len(self.y_train)
        index = torch.randperm(n_train, generator=rng)[:n] if n <= n_train else \
            torch.randint(n_train, (n,), generator=rng)
        index = index.to(self.device)
        x, labels = self.x_train[index], self.y_train[index]
        with eval_mode(self.model), torch.no_grad():
            predicted = self.model(x).argmax(1)
        target = random_targets(predicted, hp.n_classes, rng)
        x_pos = self.x_train[self.sampler.sample(target, rng).to(self.device)]
        started = time.perf_counter()
        result = self.generator.generate(self.model, x, target, hp.tau, hp.max_steps, hp.epsilon,
                                         self.mutability, self.lower, self.upper)
        stats = {**result.stats(), "search_seconds": time.perf_counter() - started}
        x_pos, x_neg = contrast_pairs(x_pos, result.counterfactual, result.converged, self.mutability)
        return CounterfactualPool(x_pos, x_neg, result.nascent, labels, target), stats

    def _log_search(self, stats: dict) -> None:
        for key, value in stats.items():
            self.log(f"train/cf_{key}", value, on_step=False, on_epoch=True)

    def on_train_epoch_start(self) -> None:
        self.pool = None
        if self.uses_counterfactuals:
            if not self._generator_fitted:
                self.generator.fit(self.fit_context())
                self._generator_fitted = True
            self.generator.update(self.fit_context(), int(self.current_epoch))
        if self.uses_counterfactuals and self.hparams.pool == "epoch":
            self.pool, stats = self.generate_pool(self.hparams.nce, self._rng(0))
            self._log_search(stats)

    def _pool_for_step(self, batch_idx: int) -> CounterfactualPool:
        n_batches = self.trainer.num_training_batches
        n_batches = n_batches if math.isfinite(n_batches) and n_batches > 0 else 1
        if self.hparams.pool == "epoch":
            return self.pool.chunk(batch_idx, int(n_batches))
        pool, stats = self.generate_pool(math.ceil(self.hparams.nce / n_batches), self._rng(batch_idx + 1))
        self._log_search(stats)
        return pool

    # ------------------------------------------------------------------------ steps
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        hp = self.hparams
        x, y = batch[0], batch[1]
        if not self.uses_counterfactuals:
            logits = self.model(x)
            clf = F.cross_entropy(logits, y)
            zero = clf.detach() * 0.0
            terms = {"clf": clf, "div": zero, "ridge": zero, "adv": zero}
            loss = hp.lambda_clf * clf
        else:
            pool = self._pool_for_step(batch_idx)
            m = len(pool)
            # One forward pass over [x, x⁺, x', x'_tε] instead of four.
            logits = self.model(torch.cat([x, pool.x_pos, pool.x_neg, pool.nascent]))
            logits, logits_pos, logits_neg, logits_adv = logits.split([len(x), m, m, m])
            clf = F.cross_entropy(logits, y)
            div = contrastive_divergence(logits_pos, logits_neg, pool.target)
            ridge = energy_ridge(logits_pos, logits_neg, pool.target)
            adv = adversarial_loss(logits_adv, pool.labels)
            if not self.uses_energy:
                div, ridge = div.detach() * 0.0, ridge.detach() * 0.0
            if not self.uses_adversarial:
                adv = adv.detach() * 0.0
            terms = {"clf": clf, "div": div, "ridge": ridge, "adv": adv}
            loss = hp.lambda_clf * clf + hp.lambda_div * div + hp.lambda_reg * ridge + hp.lambda_adv * adv
        self.train_acc(logits.detach(), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
        for name, value in terms.items():
            self.log(f"train/{name}", value, on_step=False, on_epoch=True, batch_size=len(y))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        self.log("train/ct_active", float(self.uses_counterfactuals), on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, batch, stage: str, metric: MulticlassAccuracy) -> None:
        x, y = batch[0], batch[1]
        logits = self.model(x)
        self.log(f"{stage}/loss", F.cross_entropy(logits, y), prog_bar=stage == "val", batch_size=len(y))
        metric(logits, y)
        self.log(f"{stage}/acc", metric, prog_bar=stage == "val")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_acc)

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.hparams.lr)
