"""REVISE (Joshi et al. 2019): counterfactual search in the latent space of a VAE (SPEC §2).

The search starts at ``z = enc_mean(x)`` and takes plain SGD steps on ``z`` for the objective
``CE(M(x'), y⁺) + λ·‖dec(z) − x‖₁`` with ``x' = enforce(dec(z))``: the decoded point is projected
onto the domain and the mutability constraints are restored exactly in the feature space after
every decoding (``none`` features are copied bit for bit from the factual, monotone features
cannot move the forbidden way). The ℓ1 term uses the raw decoding, as in the SPEC, so the latent
code is also pulled towards points that agree with the factual on its protected features.

The search runs in the one batched loop, :func:`ct_lightning.generators.search.active_rows_search`: every
row stops on its own when its target probability reaches ``τ`` (frozen rows get no more steps), the loop
ends when all rows are done, and the nascent counterfactual is the last decoded path point
within ``ε`` (ℓ∞) of the factual (the factual itself if none is).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import Constraints, FeatureTypes
from ct_lightning.generators.base import CounterfactualGenerator, FitContext, SearchResult
from ct_lightning.generators.registry import register_generator
from ct_lightning.generators.search import active_rows_search, target_reached


class LatentSpace:
    """REVISE's search variable for :func:`ct_lightning.generators.search.active_rows_search`: the latent code
    ``z``, decoded and projected to the counterfactual ``x' = enforce(dec(z))``; plain SGD steps on ``z``."""

    def __init__(self, model: nn.Module, vae: nn.Module, limits: Constraints, lambda_cost: float, lr: float):
        self.model, self.vae, self.limits, self.lambda_cost, self.lr = model, vae, limits, lambda_cost, lr
        self.modules = (model, vae)

    def start(self, x: torch.Tensor) -> torch.Tensor:
        """``enc_mean(x)``."""
        with torch.no_grad():
            return self.vae.encode_mean(x).clone()

    def gradient(self, z: torch.Tensor, rows_x: torch.Tensor, target: torch.Tensor, tau: float, step: int,
                 max_steps: int):
        """The decoded points, their τ-convergence and the gradient in ``z`` of
        ``CE(M(x'), y⁺) + λ·‖dec(z) − x‖₁`` (the ℓ1 term on the raw decoding)."""
        z = z.detach().requires_grad_(True)
        decoded = self.vae.decode(z)
        points = self.limits.project(decoded, rows_x)
        if self.limits.snaps:  # the model sees the valid point; the gradient passes straight through the snap
            points = points + (self.limits.snap(points.detach(), rows_x) - points).detach()
        logits = self.model(points)
        done = target_reached(logits.detach(), target, tau)
        loss = F.cross_entropy(logits, target, reduction="sum") + self.lambda_cost * (decoded - rows_x).abs().sum()
        (grad,) = torch.autograd.grad(loss, z)
        return points.detach(), done, grad, None

    def reached(self, z: torch.Tensor, rows_x: torch.Tensor, target: torch.Tensor, tau: float):
        """The decoded points and their τ-convergence, without a gradient (their distances: not at hand)."""
        with torch.no_grad():
            points = self.limits.snap(self.limits.project(self.vae.decode(z), rows_x), rows_x)
            return points, target_reached(self.model(points), target, tau), None

    def advance(self, z: torch.Tensor, grad: torch.Tensor, rows_x: torch.Tensor) -> torch.Tensor:
        """A plain SGD step on ``z`` (the constraints act on the decoded point)."""
        return z - self.lr * grad


def latent_search(model: nn.Module, vae: nn.Module, x: torch.Tensor, target: torch.Tensor,
                  lambda_cost: float = 0.001, lr: float = 0.25, tau: float = 0.75, max_steps: int = 30,
                  epsilon: float = 0.3, mutability: torch.Tensor | None = None,
                  lower: torch.Tensor | None = None, upper: torch.Tensor | None = None,
                  packed: bool = True, feature_types: FeatureTypes | None = None) -> SearchResult:
    """Batched REVISE search of counterfactuals of ``x`` for classes ``target`` through ``vae``.

    ``vae`` needs ``encode_mean`` and ``decode``. Neither the model nor the VAE receives gradients;
    works inside Lightning's inference mode. Returns a :class:`SearchResult` whose
    ``counterfactual`` rows are decoded, projected points. ``packed``: see
    :func:`ct_lightning.generators.search.active_rows_search` (packed on every device by default).
    ``feature_types``: decoded points are snapped to valid categories and integers (straight-through gradient).
    """
    with torch.inference_mode(False):  # the masks take part in autograd (through the projection): no inference tensors
        limits = Constraints(mutability, lower, upper, x.device, feature_types)
    space = LatentSpace(model, vae, limits, lambda_cost, lr)
    return active_rows_search(space, x, target, tau, max_steps, epsilon, packed)


@register_generator("revise")
class Revise(CounterfactualGenerator):
    """The REVISE generator: latent search through a VAE trained (or loaded from the cache) in ``fit``.

    ``vae_*`` options set the VAE (see :class:`ct_lightning.generators.revise.vae.VAESettings`);
    ``cache_dir`` overrides the cache folder and ``use_cache=False`` trains a fresh VAE every time.
    Pass ``vae=`` to use a VAE you already have. ``vae_info`` tells after ``fit`` whether the VAE was loaded.
    """

    needs_fit = True

    def __init__(self, lambda_cost: float = 0.001, lr: float = 0.25, vae: nn.Module | None = None,
                 latent_dim: int = 8, vae_hidden_sizes: tuple[int, ...] | list[int] = (64, 64),
                 vae_epochs: int = 30, vae_batch_size: int = 128, vae_lr: float = 1e-3, vae_beta: float = 0.1,
                 vae_seed: int = 0, cache_dir: str | None = None, use_cache: bool = True):
        # vae holds a LightningModule: imported when a REVISE generator is built, not with the catalogue
        from ct_lightning.generators.revise.vae import VAESettings  # noqa: PLC0415

        self.lambda_cost = lambda_cost
        self.lr = lr
        self.settings = VAESettings(latent_dim=latent_dim, hidden_sizes=list(vae_hidden_sizes), beta=vae_beta,
                                    lr=vae_lr, epochs=vae_epochs, batch_size=vae_batch_size, seed=vae_seed)
        self.cache_dir = cache_dir
        self.use_cache = use_cache
        self.vae = vae
        self.vae_info: dict = {"loaded": vae is not None, "path": None}

    def config(self) -> dict:
        """Primitive settings, for logging and checkpoints."""
        return {"generator": self.name, "lambda_cost": self.lambda_cost, "lr": self.lr,
                **{f"vae_{k}": v for k, v in vars(self.settings).items()}}

    def fit_vae(self, x_train: torch.Tensor, name: str = "data", accelerator: str = "cpu") -> dict:
        """Load the VAE for ``x_train`` from the cache or train it; returns ``vae_info``."""
        from ct_lightning.generators.revise.vae import load_or_train_vae  # noqa: PLC0415 - see __init__

        self.vae, self.vae_info = load_or_train_vae(x_train, name, self.settings, self.cache_dir, self.use_cache,
                                                    accelerator)
        return self.vae_info

    def fit(self, context: FitContext) -> None:
        """Train or load the VAE on the context's training data (unless a VAE was given)."""
        if self.vae is None:
            self.fit_vae(context.x_train, context.name, context.accelerator)

    def shared_state(self):
        """The fitted VAE (on the CPU) and where it came from."""
        return None if self.vae is None else {"vae": self.vae.cpu(), "vae_info": dict(self.vae_info)}

    def load_shared_state(self, state, context: FitContext) -> None:
        """Use the VAE fitted on another rank."""
        if state is not None:
            self.vae, self.vae_info = state["vae"].eval(), state["vae_info"]

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None,
                 lower=None, upper=None, feature_types=None) -> SearchResult:
        """Batched latent-space search (SPEC §2, REVISE)."""
        if self.vae is None:
            raise RuntimeError("revise: no VAE yet; call fit(context) first")
        self.vae.to(x.device)
        return latent_search(model, self.vae, x, target, self.lambda_cost, self.lr, tau, max_steps, epsilon,
                             mutability, lower, upper, feature_types=feature_types)
