"""REVISE (Joshi et al. 2019): counterfactual search in the latent space of a VAE (SPEC §2).

The search starts at ``z = enc_mean(x)`` and takes plain SGD steps on ``z`` for the objective
``CE(M(x'), y⁺) + λ·‖dec(z) − x‖₁`` with ``x' = enforce(dec(z))``: the decoded point is projected
onto the domain and the mutability constraints are restored exactly in the feature space after
every decoding (``none`` features are copied bit for bit from the factual, monotone features
cannot move the forbidden way). The ℓ1 term uses the raw decoding, as in the SPEC, so the latent
code is also pulled towards points that agree with the factual on its protected features.

The search is batched like :func:`ct_lightning.generators.search.search_counterfactuals`: every row stops
on its own when its target probability reaches ``τ`` (frozen rows get no more steps), the loop
ends when all rows are done, and the nascent counterfactual is the last decoded path point
within ``ε`` (ℓ∞) of the factual (the factual itself if none is).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import Constraints
from ct_lightning.generators.base import CounterfactualGenerator, FitContext, SearchResult
from ct_lightning.generators.registry import register_generator
from ct_lightning.generators.revise.vae import VAESettings, load_or_train_vae
from ct_lightning.generators.search import gradient_scope, target_reached


def latent_search(model: nn.Module, vae: nn.Module, x: torch.Tensor, target: torch.Tensor,
                  lambda_cost: float = 0.001, lr: float = 0.25, tau: float = 0.75, max_steps: int = 30,
                  epsilon: float = 0.3, mutability: torch.Tensor | None = None,
                  lower: torch.Tensor | None = None, upper: torch.Tensor | None = None) -> SearchResult:
    """Batched REVISE search of counterfactuals of ``x`` for classes ``target`` through ``vae``.

    ``vae`` needs ``encode_mean`` and ``decode``. Neither the model nor the VAE receives gradients;
    works inside Lightning's inference mode. Returns a :class:`SearchResult` whose
    ``counterfactual`` rows are decoded, projected points.
    """
    n, n_features = x.shape
    device = x.device
    codes = torch.zeros(n_features, dtype=torch.long, device=device) if mutability is None else mutability.to(device)
    with gradient_scope(model, vae):
        x = x.detach().clone()
        target = target.detach().clone()
        with torch.no_grad():
            z = vae.encode_mean(x).clone()
        x_cf, nascent = x.clone(), x.clone()
        steps = torch.zeros(n, dtype=torch.long, device=device)
        nascent_steps = torch.zeros(n, dtype=torch.long, device=device)
        converged = torch.zeros(n, dtype=torch.bool, device=device)
        active = torch.arange(n, device=device)
        limits = Constraints(codes, lower, upper, device)
        for step in range(max_steps + 1):
            if active.numel() == 0:
                break
            rows_z = z[active].requires_grad_(step < max_steps)
            rows_x, rows_target = x[active], target[active]
            decoded = vae.decode(rows_z)
            rows_cf = limits.project(decoded, rows_x)
            logits = model(rows_cf)
            x_cf[active] = rows_cf.detach()
            inside = (rows_cf.detach() - rows_x).abs().amax(1) <= epsilon
            nascent[active[inside]] = rows_cf.detach()[inside]
            nascent_steps[active[inside]] = steps[active[inside]]
            done = target_reached(logits.detach(), rows_target, tau)
            converged[active[done]] = True
            if step == max_steps:
                break
            loss = F.cross_entropy(logits, rows_target, reduction="sum") + \
                lambda_cost * (decoded - rows_x).abs().sum()
            (grad,) = torch.autograd.grad(loss, rows_z)
            keep = ~done
            active = active[keep]
            z[active] = rows_z.detach()[keep] - lr * grad[keep]
            steps[active] += 1
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)


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
                 lower=None, upper=None) -> SearchResult:
        """Batched latent-space search (SPEC §2, REVISE)."""
        if self.vae is None:
            raise RuntimeError("revise: no VAE yet; call fit(context) first")
        self.vae.to(x.device)
        return latent_search(model, self.vae, x, target, self.lambda_cost, self.lr, tau, max_steps, epsilon,
                             mutability, lower, upper)
