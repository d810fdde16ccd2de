"""The CT generator ``amortised`` (Van Looveren et al.; SPEC §6): counterfactuals in one forward pass.

It fits a :class:`~ct_lightning.generators.amortised.training.CounterfactualNetworkModule` when CT starts
and re-fits it for ``refit_epochs`` epochs every ``refit_every`` epochs to follow the changing classifier.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from ct_lightning.constraints import Constraints
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.generators.amortised.network import one_hot_groups
from ct_lightning.generators.base import CounterfactualGenerator, FitContext, SearchResult
from ct_lightning.generators.registry import register_generator
from ct_lightning.generators.search import target_reached

if TYPE_CHECKING:
    from ct_lightning.generators.amortised.training import CounterfactualNetworkModule


@register_generator("amortised")
class Amortised(CounterfactualGenerator):
    """CT generator ``amortised``: one forward pass of a conditional generator per counterfactual pool.

    The network is fitted for ``initial_epochs`` epochs at the first CT epoch (after any burn-in)
    and re-fitted for ``refit_epochs`` epochs whenever ``refit_every`` epochs have passed since the
    last fit, on up to ``max_fit_samples`` training samples. ``variant``, ``hidden_sizes``,
    ``noise_dim``, ``w_m``, ``w_l1``, ``w_chi``, ``length_scale``, ``gen_lr`` and ``batch_size`` set the
    the :class:`CounterfactualNetworkModule`. A search-free generator has no path: ``steps`` is 1 for every row and
    the nascent counterfactual is the point of the segment from ``x`` to ``x_CF`` at ℓ∞ distance
    ``min(ε, ‖x_CF − x‖∞)``. ``fit_seconds`` accumulates the time spent fitting.
    """

    needs_fit = True
    reads_classes = True  # its network is conditioned on the model's classes

    def __init__(self, lambda_cost: float = 0.001, lr: float = 0.25, variant: str = "mmd", refit_every: int = 5,
                 refit_epochs: int = 1, initial_epochs: int = 10, hidden_sizes: Sequence[int] = (64, 64),
                 noise_dim: int = 4, w_m: float = 1.0, w_l1: float = 0.1, w_chi: float = 1.0,
                 length_scale: float | None = None, gen_lr: float = 1e-3, batch_size: int = 256,
                 max_fit_samples: int | None = 5000, seed: int = 0):
        # training holds a LightningModule: imported when an amortised generator is built, not with the catalogue
        from ct_lightning.generators.amortised.training import VARIANTS  # noqa: PLC0415

        if variant not in VARIANTS:
            raise ValueError(f"variant: unknown {variant!r}; allowed: {', '.join(VARIANTS)}")
        if refit_every < 1 or initial_epochs < 1 or refit_epochs < 0:
            raise ValueError("amortised: refit_every and initial_epochs must be ≥ 1, refit_epochs ≥ 0")
        self.lambda_cost, self.lr = lambda_cost, lr
        self.options = dict(variant=variant, hidden_sizes=list(hidden_sizes), noise_dim=noise_dim, w_m=w_m, w_l1=w_l1,
                            w_chi=w_chi, length_scale=length_scale, lr=gen_lr)
        self.refit_every, self.refit_epochs, self.initial_epochs = refit_every, refit_epochs, initial_epochs
        self.batch_size, self.max_fit_samples, self.seed = batch_size, max_fit_samples, seed
        self.net: CounterfactualNetworkModule | None = None
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
              upper: torch.Tensor | None = None, groups: Sequence[Sequence[int]] | None = None
              ) -> CounterfactualNetworkModule:
        """Create the (untrained) network for ``classifier`` and the constraints; one-hot ``groups`` default to the
        ``feature=value`` names' groups."""
        from ct_lightning.generators.amortised.training import CounterfactualNetworkModule  # noqa: PLC0415 - see __init__

        groups = one_hot_groups(feature_names) if groups is None else [list(g) for g in groups if len(g) >= 2]
        self.net = CounterfactualNetworkModule(n_features, n_classes, classifier, groups=groups,
                                               mutability=mutability, lower=lower, upper=upper, **self.options)
        self.fitted_epoch = None
        return self.net

    def train_network(self, x_train: torch.Tensor, epochs: int) -> dict[str, float]:
        """Train the network for ``epochs`` epochs on (a random subset of) ``x_train``."""
        if self.net is None:
            raise RuntimeError("amortised: call fit(context) or build() before train_network()")
        started = time.perf_counter()
        rng = torch.Generator().manual_seed(self.seed + self.n_fits)
        if self.max_fit_samples is not None and len(x_train) > self.max_fit_samples:
            x_train = x_train[torch.randperm(len(x_train), generator=rng)[:self.max_fit_samples].to(x_train.device)]
        self.net.to(x_train.device)
        terms = self.net.fit_epochs(x_train, epochs, self.batch_size, rng)
        self.fit_seconds += time.perf_counter() - started
        self.n_fits += 1
        return terms

    def fit(self, context: FitContext) -> None:
        """Build the network for the context's classifier, one-hot groups and constraints (trained in ``update``)."""
        types = context.feature_types
        self.build(context.model, context.x_train.shape[1], context.n_classes, context.feature_names,
                   context.mutability, context.lower, context.upper, None if types is None else types.groups)
        pending, self._pending_state = getattr(self, "_pending_state", None), None
        if pending:
            self._restore(pending)

    def state_dict(self) -> dict:
        """What a resumed training needs to continue exactly: network, its optimisers and the fit schedule."""
        if self.net is None:
            return {}
        optimizers = self.net._plain_optimizers
        return {"net": self.net.state_dict(), "fitted_epoch": self.fitted_epoch, "n_fits": self.n_fits,
                "bandwidth": self.net._bandwidth,
                "optimizers": None if optimizers is None else [o.state_dict() if o is not None else None
                                                               for o in optimizers]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (applied when ``fit`` builds the network, if it is not built yet)."""
        if self.net is None:
            self._pending_state = state
        elif state:
            self._restore(state)

    def _restore(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.fitted_epoch, self.n_fits = state["fitted_epoch"], state["n_fits"]
        self.net._bandwidth = state.get("bandwidth")
        if state["optimizers"] is not None:
            optimizers = self.net.configure_optimizers()
            optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers, None]
            for optimizer, saved in zip(optimizers, state["optimizers"]):
                if optimizer is not None and saved is not None:
                    optimizer.load_state_dict(saved)
            self.net._plain_optimizers = optimizers

    def update(self, context: FitContext, epoch: int) -> None:
        """Train for ``initial_epochs`` at the first call, then re-fit every ``refit_every`` epochs."""
        if self.net is None:
            self.fit(context)
        self.net.set_classifier(context.model)
        if self.fitted_epoch is None:
            self.train_network(context.x_train, self.initial_epochs)
        elif epoch - self.fitted_epoch >= self.refit_every and self.refit_epochs > 0:
            self.train_network(context.x_train, self.refit_epochs)
        else:
            return
        self.fitted_epoch = epoch

    def shared_state(self):
        """The network's weights (the classifier is not part of them) and the fitting schedule."""
        if self.net is None:
            return None
        weights = {k: v.detach().cpu() for k, v in self.net.state_dict().items()}
        return {"weights": weights, "fitted_epoch": self.fitted_epoch, "n_fits": self.n_fits,
                "fit_seconds": self.fit_seconds, "bandwidth": self.net._bandwidth}

    def load_shared_state(self, state, context: FitContext) -> None:
        """Take over the network fitted on another rank (built here first for this rank's classifier)."""
        if state is None:
            return
        if self.net is None:
            self.fit(context)
        self.net.load_state_dict(state["weights"])
        self.net.to(context.device)
        self.net.set_classifier(context.model)
        self.net._bandwidth = state["bandwidth"]
        self.fitted_epoch, self.n_fits, self.fit_seconds = state["fitted_epoch"], state["n_fits"], state["fit_seconds"]

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None,
                 lower=None, upper=None, feature_types=None) -> SearchResult:
        """Counterfactuals in one forward pass; ``max_steps`` is unused, constraints are enforced and, with
        ``feature_types``, the counterfactual and the nascent point are snapped to valid categories/integers."""
        if self.net is None:
            raise RuntimeError("amortised: the network is not built; call fit(context) and update(context, epoch)")
        n, n_features = x.shape
        codes = torch.zeros(n_features, dtype=torch.long, device=x.device) if mutability is None else mutability.to(x.device)
        self.net.to(x.device)
        limits = Constraints(codes, lower, upper, x.device, feature_types)
        with eval_mode(model), torch.no_grad():
            y_model = model(x).argmax(1)
            x_cf = limits.snap(limits.project(self.net.generate(x, target, y_model), x), x)
            converged = target_reached(model(x_cf), target, tau)
        distance = (x_cf - x).abs().amax(1, keepdim=True)
        scale = torch.where(distance > epsilon, epsilon / distance.clamp_min(1e-12), torch.ones_like(distance))
        nascent = limits.snap(x + scale * (x_cf - x), x)
        moved = (distance.squeeze(1) > 0) & (scale.squeeze(1) > 0)
        steps = torch.ones(n, dtype=torch.long, device=x.device)
        return SearchResult(x_cf, nascent, converged, steps, moved.long())
