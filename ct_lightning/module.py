"""``CTModule``: a LightningModule that trains any classifier with counterfactual training."""

from __future__ import annotations

import json

import math
import time
from typing import Annotated

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import (Constraints, one_hot_groups, parse_mutability, resolve_domain,
                                      resolve_feature_types)
from ct_lightning.training.epoch_block import EpochBlock
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.training.flat_adam import FlatAdam
from ct_lightning.training.mlp_step import conventional_step, counterfactual_step
from ct_lightning.generators import FitContext, generate_counterfactuals, make_generator
from ct_lightning.generators.input_gradient import by_hand, plain_mlp_layers
from ct_lightning.losses import adversarial_loss, check_objective, contrast_pairs, energy_terms
from ct_lightning.models import describe_model, model_from_hparams
from ct_lightning.training.pool import ClassSampler, CounterfactualPool, random_targets, target_tally
from ct_lightning.training.trainer_data import trainer_tensors

POOL_MODES = ("epoch", "step")
TERMS = ("clf", "div", "ridge", "adv")  # logged as train/<term>, in this order
STEPS_PER_SUM = 64  # training steps whose logits are kept before they are summed (see CTModule._accumulate)


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(1)`` (ties go to the first class), computed faster on a CPU, where ``argmax`` over a short
    dimension runs a scalar loop and the epoch's accuracy takes one over all its rows: with two classes one
    comparison (Adult's 26 049 training rows: ~0.4 ms → ~0.03 ms, one thread), otherwise ``max``'s indices,
    documented as the first maximal ones (MNIST's 11 000 × 10: ~0.6 → ~0.4 ms)."""
    if logits.shape[1] == 2:
        return (logits[:, 1] > logits[:, 0]).long()
    return logits.max(1).indices


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
    ``input_map`` (the entries of ``--model-inputs``, :mod:`ct_lightning.model_inputs`): the built network takes
    that many inputs, behind a frozen :class:`~ct_lightning.models.InputAdapter` from the ``n_features`` of
    ct-lightning's encoding, whose matrix is set by the caller (``set_map``) or loaded with a checkpoint.
    ``output_order`` (with ``input_map``; :func:`ct_lightning.model_inputs.output_order`): the class index of each
    output of that network, which has that many outputs, before a frozen
    :class:`~ct_lightning.models.OutputAdapter` to ct-lightning's class order (one index: a single logit).
    """

    # An argument annotated ``Annotated[type, {"help": ..., "group": ..., bounds}]`` is a training setting: its
    # default and this option make DEFAULTS, the command-line option, the YAML key and its validation
    # (ct_lightning.experiment.configuration.settings; "choices" names a function of ct_lightning.experiment.configuration.catalogue).
    def __init__(
        self, model: nn.Module | None = None, n_features: int | None = None, n_classes: int = 2,
        hidden_sizes: Annotated[tuple[int, ...] | list[int], {"help": "MLP hidden layer sizes, e.g. 64,64 (default {DFLT})",
                                                              "group": "model and optimiser", "low": 1}] = (32,),
        activation: Annotated[str, {"help": "MLP activation (default {DFLT})", "group": "model and optimiser",
                                    "choices": "activations"}] = "relu",
        architecture: str = "mlp",
        objective: Annotated[str, {
            "help": "full: all terms; vanilla: baseline; energy: clf+div+ridge; adversarial: clf+adv (default {DFLT})",
            "group": "counterfactual training", "choices": "objectives"}] = "full",
        lambda_clf: Annotated[float, {"help": "weight of the classification loss (default {DFLT})",
                                      "group": "counterfactual training", "low": 0.0}] = 1.0,
        lambda_div: Annotated[float, {"help": "weight of the contrastive divergence (default {DFLT})",
                                      "group": "counterfactual training", "low": 0.0}] = 0.5,
        lambda_reg: Annotated[float, {"help": "weight of the energy ridge penalty [Table 2] (SPEC default {DFLT})",
                                      "group": "counterfactual training", "table2": True, "low": 0.0}] = 0.1,
        lambda_adv: Annotated[float, {"help": "weight of the adversarial loss (default {DFLT})",
                                      "group": "counterfactual training", "low": 0.0}] = 0.25,
        generator: Annotated[str, {"help": "counterfactual generator (default {DFLT})", "group": "counterfactual search",
                                   "choices": "generators"}] = "ecco",
        lambda_cost: Annotated[float, {"help": "ℓ1 distance penalty λ_cst (default {DFLT})",
                                       "group": "counterfactual search", "low": 0.0}] = 0.001,
        lambda_energy: Annotated[float, {"help": "ECCo energy penalty λ_egy (default {DFLT})",
                                         "group": "counterfactual search", "low": 0.0}] = 5.0,
        search_lr: Annotated[float, {"help": "SGD step size η of the search (default {DFLT})",
                                     "group": "counterfactual search", "low": 0.0, "low_open": True}] = 0.25,
        max_steps: Annotated[int, {"help": "maximum search steps T (default {DFLT})", "group": "counterfactual search",
                                   "low": 0}] = 30,
        tau: Annotated[float, {
            "help": "target-probability threshold for convergence [Table 2] (SPEC default {DFLT})",
            "group": "counterfactual search", "table2": True, "low": 0.0, "high": 1.0, "low_open": True}] = 0.75,
        epsilon: Annotated[float, {"help": "ℓ∞ radius for nascent counterfactuals (default {DFLT})",
                                   "group": "counterfactual training", "low": 0.0}] = 0.3,
        nce: Annotated[int, {"help": "counterfactuals searched per epoch [Table 2]", "group": "counterfactual training",
                             "table2": True, "low": 1}] = 1000,
        pool: Annotated[str, {"help": "epoch: search all nce counterfactuals once per epoch (fast); step: search "
                                      "inside each step (default {DFLT})", "group": "counterfactual training",
                              "choices": "pool_modes"}] = "epoch",
        generator_options: Annotated[dict | None, {
            "help": "generator settings as KEY=VALUE,... or a JSON object, e.g. variant=gan,refit_every=5 "
                    "(amortised) or latent_dim=4 (revise)", "group": "counterfactual search",
            "metavar": "OPTIONS"}] = None,
        mutability: dict | str | None = None,
        feature_names: list[str] | None = None, domain="infer", input_map: list[dict] | None = None,
        output_order: list[int] | None = None,
        domain_std: Annotated[float, {"help": "n in the inferred domain μ ± nσ (default {DFLT})",
                                      "group": "counterfactual search", "low": 0.0}] = 3.0,
        lr: Annotated[float, {"help": "Adam learning rate (default {DFLT})", "group": "model and optimiser",
                              "low": 0.0, "low_open": True}] = 1e-3,
        seed: Annotated[int, {"help": "seed of every random draw: model weights, shuffling, searches (default {DFLT})",
                              "group": "data", "low": 0,
                              "high": 4294967295}] = 0,
    ):
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
            model = model_from_hparams(self.hparams)
        else:  # a given network: record what it is, not the defaults of the arguments not used
            described = describe_model(model)
            if described["architecture"] == "mlp" or architecture == "mlp":
                self.hparams.update(described)
        self.model = model
        self.generator = make_generator(generator, lambda_cost, lambda_energy, search_lr, **(generator_options or {}))
        self.ct_active = True  # switched off by the BurnIn callback during burn-in epochs
        # The fitted preprocessing of the inputs (``TabularCodec.to_dict()``), saved in checkpoints; not a
        # hyperparameter, so that MLflow's parameters stay the training settings.
        self.preprocessing: dict | None = None
        self.pool: CounterfactualPool | None = None
        self._data_ready = False
        self._generator_fitted = False
        # Per stage and epoch: the latest steps' detached loss terms, logits and labels, and the sums of the
        # steps before them: Σ batch_size·[loss, *terms] (float64), Σ batch_size, Σ correctly classified.
        self._epoch_steps: dict[str, list[tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]]] = {}
        self._epoch_sums: dict[str, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._direct_logging = False  # see log_epochs_directly

    @property
    def uses_counterfactuals(self) -> bool:
        """Whether the current epoch searches counterfactuals at all."""
        return self.ct_active and (self.uses_energy or self.uses_adversarial)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # ----------------------------------------------------------------- training data
    def _datamodule(self):
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def prepare_counterfactual_data(self, x_train: torch.Tensor, y_train: torch.Tensor, datamodule=None) -> None:
        """Store the training data for factuals and ``x⁺``; resolve mutability and the domain (from ``datamodule``,
        by default the running Trainer's)."""
        hp = self.hparams
        self.x_train, self.y_train = x_train.to(self.device).float(), y_train.to(self.device).long()
        datamodule = datamodule if datamodule is not None else self._datamodule()
        self._pool_datamodule = datamodule
        self.feature_names = hp.feature_names
        if self.feature_names is None and datamodule is not None:
            self.feature_names = getattr(datamodule, "feature_names", None) or None
        n_features = self.x_train.shape[1]
        self.mutability = parse_mutability(hp.mutability, n_features, self.feature_names,
                                           groups=one_hot_groups(datamodule)).to(self.device)
        self.lower, self.upper = resolve_domain(hp.domain, self.x_train, hp.domain_std, datamodule)
        if self.lower is not None:
            self.lower, self.upper = self.lower.to(self.device), self.upper.to(self.device)
        self.feature_types = resolve_feature_types(datamodule, self.feature_names, n_features)
        Constraints(self.mutability, types=self.feature_types)  # a one-line error for 'increase' on a category
        self.sampler = ClassSampler(self.y_train, hp.n_classes)
        self._data_ready = True

    def fit_context(self) -> FitContext:
        """What the generator learns from: this model, the training data, feature names and constraints."""
        datamodule = self._datamodule()
        if datamodule is None:  # prepared without a Trainer (a stacked training)
            datamodule = getattr(self, "_pool_datamodule", None)
        return FitContext(model=self.model, x_train=self.x_train, y_train=self.y_train, n_classes=self.hparams.n_classes,
                          feature_names=self.feature_names, mutability=self.mutability, lower=self.lower,
                          upper=self.upper, name=str(getattr(datamodule, "name", None) or "data"),
                          feature_types=self.feature_types)

    def on_train_start(self) -> None:
        # Not on_fit_start: Lightning sets trainer.train_dataloader only once training starts.
        if not self._data_ready:
            self.prepare_counterfactual_data(*trainer_tensors(self.trainer, "train"))
        if self.uses_energy or self.uses_adversarial:
            self._shared_generator_step(lambda: self.generator.fit(self.fit_context()))
            self._generator_fitted = True

    # --------------------------------------------------------------- distributed runs
    def _world(self) -> tuple[int, int]:
        """``(world size, global rank)`` of the running Trainer; ``(1, 0)`` outside one."""
        if self._trainer is None:
            return 1, 0
        return int(self.trainer.world_size), int(self.trainer.global_rank)

    def _shared_generator_step(self, action) -> None:
        """Run a generator's ``fit``/``update`` once: on rank 0 under DDP, then copy what it learned to all ranks."""
        world, rank = self._world()
        if world <= 1:
            action()
            return
        if rank == 0:
            action()
        state = self.trainer.strategy.broadcast(self.generator.shared_state() if rank == 0 else None, src=0)
        if rank != 0:
            self.generator.load_shared_state(state, self.fit_context())

    @staticmethod
    def rank_slice(n: int, world: int, rank: int) -> slice:
        """The ``rank``-th of ``world`` near-equal, disjoint slices of ``range(n)``."""
        return slice(n * rank // world, n * (rank + 1) // world)

    # ----------------------------------------------------------- counterfactual pool
    def _rng(self, salt: int, shared: bool = False, epoch: int | None = None) -> torch.Generator:
        # Seeded by (seed, epoch, step[, rank]): reproducible and resumable; ``shared`` streams are the same
        # on every DDP rank (one global draw of factuals), the others differ per rank. ``epoch``: the Trainer's
        # current epoch unless given (a stacked training has no Trainer).
        epoch = self.current_epoch if epoch is None else epoch
        key = (self.hparams.seed, epoch, salt) + (() if shared else (self.global_rank,))
        return torch.Generator().manual_seed(hash(key) % (2**63))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # A learning generator's state (e.g. the amortised network) is part of an exact resume.
        state = getattr(self.generator, "state_dict", None)
        if callable(state):
            checkpoint["ct_generator_state"] = state()
        if self.preprocessing is not None:  # the fitted preprocessing of a table travels with the weights
            # as JSON text: one object to pickle at every save instead of a few hundred (a codec's columns)
            if getattr(self, "_preprocessing_text", (None,))[0] is not self.preprocessing:
                self._preprocessing_text = (self.preprocessing, json.dumps(self.preprocessing))
            checkpoint["ct_preprocessing"] = self._preprocessing_text[1]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        stored = checkpoint.get("ct_preprocessing", self.preprocessing)
        self.preprocessing = json.loads(stored) if isinstance(stored, str) else stored  # a dict: written before 11/27
        load = getattr(self.generator, "load_state_dict", None)
        if callable(load) and checkpoint.get("ct_generator_state"):
            load(checkpoint["ct_generator_state"])

    def generate_pool(self, n: int, rng: torch.Generator,
                      shared_rng: torch.Generator | None = None) -> tuple[CounterfactualPool, dict]:
        """Draw this rank's share of ``n`` factuals, random targets and ``x⁺``, and search their counterfactuals.

        ``n`` is the global count: the factuals are one draw of ``n`` training indices, and under DDP
        each rank takes its own disjoint slice of it (the draw then comes from ``shared_rng``, the
        same on every rank). Targets and ``x⁺`` (from the whole training set) come from ``rng``.
        """
        hp = self.hparams
        index, x, labels, target, x_pos = self.draw_pool_inputs(n, rng, shared_rng)
        started = time.perf_counter()
        result = generate_counterfactuals(self.generator, self.model, x, target, hp.tau, hp.max_steps, hp.epsilon,
                                          self.mutability, self.lower, self.upper, self.feature_types)
        stats = {**result.stats(), "search_seconds": time.perf_counter() - started}
        self.last_factual_index = index.detach().cpu()  # this rank's factuals of the latest pool (for checks)
        tally = target_tally(result.converged, target, hp.n_classes)  # the epoch's share converged per target class
        self._target_tally = tally if getattr(self, "_target_tally", None) is None else self._target_tally + tally
        x_pos, x_neg = contrast_pairs(x_pos, result.counterfactual, result.converged, self.mutability)
        return CounterfactualPool(x_pos, x_neg, result.nascent, labels, target), stats

    def draw_pool_inputs(self, n: int, rng: torch.Generator, shared_rng: torch.Generator | None = None
                         ) -> tuple[torch.Tensor, ...]:
        """This rank's share of a pool before its search: ``(index, x, labels, target, x_pos)`` (see
        :meth:`generate_pool`); the targets follow this model's current predictions."""
        n_train = len(self.y_train)
        world, rank = self._world()
        # On one process everything comes from ``rng``, as it always has (same results as before DDP support).
        draw = shared_rng if shared_rng is not None and world > 1 else rng
        index = torch.randperm(n_train, generator=draw)[:n] if n <= n_train else \
            torch.randint(n_train, (n,), generator=draw)
        index = index[self.rank_slice(n, world, rank)].to(self.device)
        x, labels = self.x_train[index], self.y_train[index]
        with eval_mode(self.model), torch.no_grad():
            predicted = self.model(x).argmax(1)
        target = random_targets(predicted, self.hparams.n_classes, rng)
        x_pos = self.x_train[self.sampler.sample(target, rng).to(self.device)]
        return index, x, labels, target, x_pos

    def _log_search(self, stats: dict, count: int, direct: bool = False) -> None:
        """Log the search statistics of this rank's ``count`` counterfactuals as global values; ``direct``: the
        epoch's only search (``pool="epoch"``), whose values can go out as they are (:meth:`_log_epoch_values`).

        Under DDP the rates are weighted by each rank's pool size (gathered here: Lightning's own
        weighted sync rounds uneven integer weights) and ``search_seconds`` is the slowest rank's.
        """
        world, _ = self._world()
        if world > 1:
            local = torch.tensor([float(count), *map(float, stats.values())], dtype=torch.float64, device=self.device)
            gathered = self.all_gather(local).reshape(world, -1).cpu()
            counts, total = gathered[:, 0], gathered[:, 0].sum().clamp_min(1.0)
            stats = {key: (gathered[:, i + 1].max() if key == "search_seconds" else
                           (gathered[:, i + 1] * counts).sum() / total).item() for i, key in enumerate(stats)}
        # With pool="step" an epoch's searches are averaged weighted by their pool sizes (equal within an epoch),
        # the same in Lightning's per-batch loop and in a fused epoch (where the batch is the whole epoch).
        if direct and self._logs_directly():
            self._log_epoch_values({**{f"train/cf_{key}": value for key, value in stats.items()},
                                    "train/cf_count": float(count)})
            return
        for key, value in stats.items():  # identical on every rank now; sync_dist keeps them so
            self.log(f"train/cf_{key}", value, on_step=False, on_epoch=True, sync_dist=True, batch_size=max(count, 1))
        self.log("train/cf_count", float(count), on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True,
                 batch_size=max(count, 1))

    def on_train_epoch_start(self) -> None:
        self.pool = None
        self._target_tally = None
        if self.uses_counterfactuals:
            if not self._generator_fitted:
                self._shared_generator_step(lambda: self.generator.fit(self.fit_context()))
                self._generator_fitted = True
            epoch = int(self.current_epoch)
            self._shared_generator_step(lambda: self.generator.update(self.fit_context(), epoch))
        if self.uses_counterfactuals and self.hparams.pool == "epoch":
            self.pool, stats = self.generate_pool(self.hparams.nce, self._rng(0), self._rng(0, shared=True))
            self._log_search(stats, len(self.pool), direct=True)

    def _batches_per_epoch(self) -> int:
        """The training batches per epoch that Lightning's loop runs (1 when unknown)."""
        n_batches = self.trainer.num_training_batches
        return int(n_batches) if math.isfinite(n_batches) and n_batches > 0 else 1

    def _pool_for_step(self, batch_idx: int, n_batches: int) -> CounterfactualPool:
        if self.hparams.pool == "epoch":
            return self.pool.chunk(batch_idx, n_batches)
        # n_batches is per rank, so each synchronous step searches nce / n_batches globally, split over ranks.
        pool, stats = self.generate_pool(math.ceil(self.hparams.nce / n_batches), self._rng(batch_idx + 1),
                                         self._rng(batch_idx + 1, shared=True))
        self._log_search(stats, len(pool))
        return pool

    # ------------------------------------------------------------------------ steps
    def fuse_epochs(self, enabled: bool = True) -> None:
        """Run each epoch's optimisation steps inside one Lightning step (manual optimisation).

        Hand the module :class:`~ct_lightning.training.epoch_block.EpochBlock` batches (wrap the training loader in
        :class:`~ct_lightning.training.epoch_block.EpochBlockLoader`); results are identical to Lightning's automatic
        loop, without its per-step hooks. Single-process runs only (DDP synchronises per backward pass).
        """
        self.automatic_optimization = not enabled

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if self.automatic_optimization:
            return self._step_loss(batch[0], batch[1], batch_idx, self._batches_per_epoch())[0]
        # Manual optimisation: the same order as Lightning's automatic closure (step, zero_grad, backward, step).
        if isinstance(batch, EpochBlock):
            steps, n_batches = enumerate(batch.batches()), len(batch)
        else:
            steps, n_batches = [(batch_idx, (batch[0], batch[1]))], self._batches_per_epoch()
        optimizer = self.optimizers()
        # The public way is the `else` branch: LightningOptimizer.step() runs the strategy's optimizer_step, the
        # precision plugin's closure and every callback's on_before_optimizer_step. Full precision on one process
        # needs none of it, and it costs about 0.12 ms more per step (optimiser part: median 0.70 vs 0.58 ms in a
        # fused vanilla epoch of the paper's MLP, batch 30, one CPU thread; bench/step_overhead.py). There is
        # no public call that only counts a step: Lightning's global_step (checkpoints, loggers) advances through
        # LightningOptimizer's _on_before_step/_on_after_step (the manual loop's optim_step_progress), so the
        # direct path calls those two itself. tests/test_epoch_block.py checks the count and the weights.
        direct = str(self.trainer.precision) in ("32-true", "32", "64-true", "64") and \
            hasattr(optimizer, "_on_before_step") and self._world()[0] == 1
        layers = self._layers_by_hand(optimizer.optimizer) if direct else None
        for index, (x, y) in steps:
            # By hand (training.mlp_step) the step writes the gradients itself; else autograd's backward.
            grads = optimizer.optimizer.gradient_views() if layers is not None else None
            loss, grads_written = self._step_loss(x, y, index, n_batches, layers, grads)
            if direct:
                if not grads_written:
                    optimizer.optimizer.zero_grad()
                    loss.backward()
                optimizer._on_before_step()
                getattr(optimizer.optimizer, "step_unlabelled", optimizer.optimizer.step)()
                optimizer._on_after_step()
            else:
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
        return None

    def _layers_by_hand(self, optimizer) -> list[nn.Module] | None:
        """The model's layers where a training step may run by hand (``training.mlp_step``): a plain MLP on a CPU
        whose optimiser takes flat gradients, outside autocast and ``input_gradient.autograd_only``; else ``None``."""
        if not by_hand() or not callable(getattr(optimizer, "gradient_views", None)) \
                or torch.is_autocast_enabled("cpu"):
            return None
        layers = plain_mlp_layers(self.model)
        if layers is None or any(p.device.type != "cpu" or not p.requires_grad for p in self.model.parameters()):
            return None
        return layers

    def _step_loss(self, x: torch.Tensor, y: torch.Tensor, batch_idx: int, n_batches: int,
                   layers: list[nn.Module] | None = None, grads: dict | None = None) -> tuple[torch.Tensor, bool]:
        """The loss of one optimisation step on batch ``batch_idx`` of ``n_batches`` (Eq. 2), accumulated for logging,
        and whether the parameters' gradients are written: by hand into ``grads`` (the optimiser's
        :meth:`~ct_lightning.training.flat_adam.FlatAdam.gradient_views`) when given, with the MLP's ``layers``
        (``training.mlp_step``; the same loss and gradients as autograd's), else left to the caller's backward pass."""
        hp = self.hparams
        if not self.uses_counterfactuals:
            if grads is not None:
                loss, clf, logits = conventional_step(layers, x, y, hp.lambda_clf, grads)
            else:
                logits = self.model(x)
                clf = F.cross_entropy(logits, y)
                loss = clf if hp.lambda_clf == 1.0 else hp.lambda_clf * clf  # the same value, one kernel fewer
            # [loss, clf] only: the other terms are 0 and are filled in once per epoch (on_train_epoch_end).
            self._accumulate("train", (loss.detach(), clf.detach()), logits, y)
            return loss, grads is not None
        pool = self._pool_for_step(batch_idx, n_batches)
        m = len(pool)
        if grads is not None and m:
            loss, terms, logits = counterfactual_step(
                layers, x, y, pool, (hp.lambda_clf, hp.lambda_div, hp.lambda_reg, hp.lambda_adv),
                self.uses_energy, self.uses_adversarial, grads)
            self._accumulate("train", (loss, *terms), logits, y)
            return loss, True
        # One forward pass over [x, x⁺, x', x'_tε] instead of four.
        logits = self.model(torch.cat([x, pool.x_pos, pool.x_neg, pool.nascent]))
        logits, logits_pos, logits_neg, logits_adv = logits.split([len(x), m, m, m])
        clf = F.cross_entropy(logits, y)
        div, ridge = energy_terms(logits_pos, logits_neg, pool.target)
        adv = adversarial_loss(logits_adv, pool.labels)
        if not self.uses_energy:
            div, ridge = div.detach() * 0.0, ridge.detach() * 0.0
        if not self.uses_adversarial:
            adv = adv.detach() * 0.0
        terms = {"clf": clf, "div": div, "ridge": ridge, "adv": adv}
        loss = hp.lambda_clf * clf + hp.lambda_div * div + hp.lambda_reg * ridge + hp.lambda_adv * adv
        self._accumulate("train", (loss.detach(), *(terms[name].detach() for name in TERMS)), logits, y)
        return loss, False

    # ---------------------------------------------------------------------- logging
    def _accumulate(self, stage: str, values: tuple[torch.Tensor, ...], logits: torch.Tensor, y: torch.Tensor) -> None:
        # Kept as they are (no kernel, no host sync per step) and summed every STEPS_PER_SUM steps, which bounds
        # the logits held. The sums reduce the epoch as ``self.log(..., on_epoch=True, batch_size=len(y))``
        # and a micro accuracy metric would. Those are the public ways, and both cost more than the step itself
        # on the paper's MLPs: per step, six torchmetrics updates (five MeanMetric, one Validity) take about
        # 0.3 ms and six self.log(on_epoch=True) calls several ms (each runs a torchmetrics forward), against
        # 1.3 µs for keeping the references and under 1 ms for the whole fused vanilla step (batch 30, CPU;
        # bench/step_overhead.py). tests/test_epoch_logging.py holds the logged values equal to self.log's.
        steps = self._epoch_steps.setdefault(stage, [])
        steps.append((values, logits.detach(), y))
        if len(steps) >= STEPS_PER_SUM:
            self._sum_steps(stage)

    def _sum_steps(self, stage: str) -> None:
        """Add the kept steps of ``stage`` to its sums."""
        steps = self._epoch_steps.pop(stage, [])
        if not steps:
            return
        values = torch.stack([torch.stack(terms) for terms, _, _ in steps]).double()  # steps × terms
        sizes = [len(y) for _, _, y in steps]
        # Built on the host and sent without a blocking copy (one would synchronise with the GPU every 64 steps).
        weights = torch.tensor(sizes, dtype=torch.float64).to(values.device, non_blocking=True)
        sums, rows = (values * weights[:, None]).sum(0), sum(sizes)
        logits = torch.cat([logits for _, logits, _ in steps])
        correct = (predicted_classes(logits) == torch.cat([y for _, _, y in steps])).sum()
        if stage in self._epoch_sums:
            sums_before, rows_before, correct_before = self._epoch_sums[stage]
            sums, rows, correct = sums + sums_before, rows + rows_before, correct + correct_before
        self._epoch_sums[stage] = (sums, rows, correct)

    def _epoch_means(self, stage: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The epoch's batch-size-weighted means of the accumulated terms and its accuracy, and a fresh start;
        ``None`` without steps."""
        self._sum_steps(stage)
        if stage not in self._epoch_sums:
            return None
        sums, rows, correct = self._epoch_sums.pop(stage)
        return (sums / rows).float(), correct.float() / rows

    def on_train_epoch_end(self) -> None:
        """Log the epoch's training loss, loss terms, accuracy and ``ct_active`` once."""
        reduced = self._epoch_means("train")
        if reduced is None:
            return
        means, accuracy = reduced
        if len(means) < 1 + len(TERMS):  # a conventional epoch accumulates [loss, clf]
            means = torch.cat([means, means.new_zeros(1 + len(TERMS) - len(means))])
        self._log_epoch_values({"train/loss": means[0], **{f"train/{name}": means[i] for i, name in
                                                           enumerate(TERMS, start=1)},
                                "train/acc": accuracy, "train/ct_active": float(self.uses_counterfactuals),
                                **{f"train/cf_converged_target_{k}": share for k, (_, share) in
                                   self.converged_by_target(gather=True).items()}},
                               prog_bar=("train/loss",))

    def converged_by_target(self, gather: bool = False) -> dict[int, tuple[int, float]]:
        """This epoch's counterfactual search per target class: ``{class index: (counterfactuals, share
        converged)}`` for each class that was a target (empty without CT this epoch). ``gather``: summed over DDP
        ranks (a collective: every rank must call it); else this rank's own. Logged as
        ``train/cf_converged_target_K`` at the epoch's end."""
        tally = getattr(self, "_target_tally", None)
        if tally is None or not self.uses_counterfactuals:
            return {}
        if gather and self._world()[0] > 1:
            tally = self.all_gather(tally).reshape(-1, *tally.shape).sum(0)
        searched, reached = tally.cpu().tolist()
        return {k: (int(n), r / n) for k, (n, r) in enumerate(zip(searched, reached)) if n > 0}

    def log_epochs_directly(self, enabled: bool = True) -> None:
        """Hand each epoch's values (already reduced here) straight to the trainer's metrics and to its loggers,
        instead of one ``self.log`` each.

        ``self.log`` costs 0.5–0.8 ms per call on a CPU, whatever the value (Lightning walks its result object's
        state at every call), and an epoch logs 9 to 16 values: 5–10 ms per epoch against a whole plain epoch of
        the paper's MLP of 30–80 ms (``bench/epoch_anatomy.py``). The values reach ``trainer.callback_metrics``
        (checkpoint monitors, early stopping), ``logged_metrics``, ``progress_bar_metrics`` and the loggers as
        ``self.log`` would send them. Only where that holds: while fitting on one process, outside the sanity
        check, and with loggers that file metrics under their ``epoch`` value (``steps_by_epoch``, as
        :class:`~ct_lightning.experiment.runs.run_artifacts.EpochStepMLFlowLogger`); elsewhere ``self.log``.
        ``train()`` turns it on; ``tests/test_epoch_logging.py`` checks both give the same values.
        """
        self._direct_logging = bool(enabled)

    def _logs_directly(self) -> bool:
        trainer = self._trainer
        return (self._direct_logging and trainer is not None and trainer.state.fn == "fit"
                and not trainer.sanity_checking and self._world()[0] == 1
                and all(getattr(logger, "steps_by_epoch", False) for logger in trainer.loggers))

    def _log_epoch_values(self, values: dict, prog_bar: tuple = ()) -> None:
        """Log one value per name for this epoch (see :meth:`log_epochs_directly`)."""
        if not self._logs_directly():
            for name, value in values.items():
                self.log(name, value, on_step=False, on_epoch=True, prog_bar=name in prog_bar, sync_dist=True)
            return
        tensors = {name: value.detach().float() if isinstance(value, torch.Tensor) else
                   torch.tensor(float(value), device=self.device) for name, value in values.items()}
        scalars = dict(zip(tensors, torch.stack(list(tensors.values())).tolist()))  # one host sync
        trainer = self.trainer
        trainer.callback_metrics.update(tensors)
        trainer.logged_metrics.update(tensors)
        trainer.progress_bar_metrics.update({name: scalars[name] for name in prog_bar})
        for logger in trainer.loggers:
            logger.log_metrics({**scalars, "epoch": trainer.current_epoch})

    def _eval_step(self, batch, stage: str) -> None:
        x, y = batch[0], batch[1]
        logits = self.model(x)
        self._accumulate(stage, (F.cross_entropy(logits, y).detach(),), logits, y)

    def _log_eval_epoch(self, stage: str) -> None:
        reduced = self._epoch_means(stage)
        if reduced is not None:
            means, accuracy = reduced
            values = {f"{stage}/loss": means[0], f"{stage}/acc": accuracy}
            if stage == "val":
                self._log_epoch_values(values, prog_bar=tuple(values))
                return
            for name, value in values.items():
                self.log(name, value, sync_dist=True)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_eval_epoch("val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_eval_epoch("test")

    def configure_optimizers(self):
        # Adam, with a flat step on a CPU (the same arithmetic; training.flat_adam).
        return FlatAdam(self.model.parameters(), lr=self.hparams.lr)
