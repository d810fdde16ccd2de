"""Stable Neighbor Search (Black et al.; SPEC §6): refine counterfactuals towards stable regions.

Given counterfactuals ``x_c`` for classes ``y⁺``, SNS solves (Definition 5)

    argmax_{x' ∈ B(x_c, δ)}  ∫₀¹ p(y⁺ | t·x') dt

(the paper's Uniform(0 → x') distribution of interest: the path from the zero baseline to ``x'``),
with the integral approximated by the right Riemann sum ``(1/n) Σ_{k=1..n} p(y⁺ | (k/n)·x')`` over
``n_grid`` points (10 in the paper); ``p`` is the softmax probability of the target class, the
multi-class form of the paper's sigmoid output. Projected gradient ascent with ℓ2-normalised steps
of size ``lr``: after each step the point is projected onto the mutability constraints (relative to
``x_c``, so monotone features keep moving only the allowed way) and the domain, then back into the
ℓ2 ball of radius ``δ`` around ``x_c``.

Each row keeps the best admissible point seen: one where the model predicts ``y⁺`` (the paper's
constraint) and the target probability is at least that of the starting point, so SNS never lowers
it; a row with no better admissible point keeps ``x_c``. Rows whose start is not yet predicted
``y⁺`` may move to any point that raises the target probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ct_lightning.constraints import Constraints
from ct_lightning.training.eval_mode import frozen
from ct_lightning.generators.base import CounterfactualGenerator, FitContext, SearchResult, generate_counterfactuals
from ct_lightning.generators.registry import make_generator, register_generator
from ct_lightning.generators.search import gradient_scope, target_reached


@dataclass
class SNSResult:
    """Refined counterfactuals and their path-integral scores before and after."""

    counterfactual: torch.Tensor
    score: torch.Tensor        # Riemann sum of the target probability along 0 → x' (refined)
    start_score: torch.Tensor  # the same for the input counterfactuals
    improved: torch.Tensor     # bool: the row moved to a better admissible point


def path_probability(model: nn.Module, x: torch.Tensor, target: torch.Tensor, n_grid: int = 10,
                     baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(integral, end_probability)``: Riemann sum of ``p(target | b + t·(x − b))`` for ``t = k/n_grid``, k = 1..n.

    One forward pass over all ``n_grid`` points of all rows; differentiable in ``x``. The baseline
    ``b`` is zero unless given (the paper's DoI).
    """
    n = x.shape[0]
    base = torch.zeros_like(x) if baseline is None else baseline.expand_as(x)
    t = torch.arange(1, n_grid + 1, device=x.device, dtype=x.dtype) / n_grid
    points = base.unsqueeze(0) + t[:, None, None] * (x - base).unsqueeze(0)
    probs = model(points.reshape(n_grid * n, -1)).softmax(1)
    probs = probs.gather(1, target.repeat(n_grid)[:, None]).reshape(n_grid, n)
    return probs.mean(0), probs[-1]


def _project_ball(x: torch.Tensor, center: torch.Tensor, radius: float) -> torch.Tensor:
    offset = x - center
    norm = offset.norm(dim=1, keepdim=True)
    return center + offset * torch.clamp(radius / norm.clamp_min(1e-12), max=1.0)


def stable_neighbor_search(model: nn.Module, x_cf: torch.Tensor, target: torch.Tensor, delta: float = 0.5,
                           steps: int = 50, lr: float | None = None, n_grid: int = 10,
                           mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                           upper: torch.Tensor | None = None, baseline: torch.Tensor | None = None,
                           return_result: bool = False, feature_types=None):
    """Refine a batch of counterfactuals with SNS; returns the refined tensor (or an :class:`SNSResult`).

    ``delta``: ℓ2 radius of the ball around each counterfactual; ``steps``: ascent steps;
    ``lr``: step length (default ``2·δ/steps``, as in the paper's setup); ``n_grid``: Riemann-sum
    points; ``mutability`` codes and ``lower``/``upper`` as in the search. Vectorised over rows;
    works inside Lightning's inference mode and leaves the model's parameters without gradients.
    With ``feature_types`` every ascent step ends at a valid point (:meth:`Constraints.snap`), so
    admissibility and the score are judged on real categories and integers.
    """
    if delta < 0 or steps < 0 or n_grid < 1:
        raise ValueError("sns: delta and steps must be ≥ 0 and n_grid ≥ 1")
    lr = 2.0 * delta / max(steps, 1) if lr is None else lr
    n_features = x_cf.shape[1]
    device = x_cf.device
    codes = torch.zeros(n_features, dtype=torch.long, device=device) if mutability is None else mutability.to(device)
    with gradient_scope(model), frozen(model):
        center = x_cf.detach().clone()
        target = target.detach().clone()
        with torch.no_grad():
            start_score, start_prob = path_probability(model, center, target, n_grid, baseline)
            start_valid = model(center).argmax(1) == target
        best, best_score = center.clone(), start_score.clone()
        x = center.clone()
        limits = Constraints(codes, lower, upper, device, feature_types)
        for _ in range(steps):
            x.requires_grad_(True)
            score, _ = path_probability(model, x, target, n_grid, baseline)
            (grad,) = torch.autograd.grad(score.sum(), x)
            ascent = -limits.mask_gradient(-grad)
            norm = ascent.norm(dim=1, keepdim=True)
            x = x.detach() + lr * ascent / norm.clamp_min(1e-12)
            x = limits.snap(_project_ball(limits.project(x, center), center, delta), center)
            with torch.no_grad():
                score, prob = path_probability(model, x, target, n_grid, baseline)
                on_target = model(x).argmax(1) == target
            admissible = (prob >= start_prob) & (on_target | ~start_valid) & (score > best_score)
            best[admissible] = x[admissible]
            best_score[admissible] = score[admissible]
    if return_result:
        return SNSResult(best, best_score, start_score, best_score > start_score)
    return best


class SNSRefined(CounterfactualGenerator):
    """Wrap any generator so that its counterfactuals are refined by :func:`stable_neighbor_search`.

    The wrapped generator's ``fit``/``update`` hooks are forwarded; ``converged`` is recomputed
    on the refined points (target probability ≥ τ). The nascent counterfactuals are kept.
    Registered as ``sns`` (options ``base``, ``delta``, ``steps``, ``sns_lr``, ``n_grid``).
    """

    def __init__(self, generator: CounterfactualGenerator, delta: float = 0.5, steps: int = 50,
                 lr: float | None = None, n_grid: int = 10):
        self.generator, self.delta, self.steps, self.lr, self.n_grid = generator, delta, steps, lr, n_grid
        self.name = f"{getattr(generator, 'name', 'generator')}+sns"
        self.energy_weighted = getattr(generator, "energy_weighted", False)
        self.needs_fit = getattr(generator, "needs_fit", False)
        self.reads_classes = getattr(generator, "reads_classes", False)

    def config(self) -> dict:
        """The wrapped generator's settings plus SNS's."""
        return {**self.generator.config(), "generator": self.name, "sns_delta": self.delta, "sns_steps": self.steps,
                "sns_lr": self.lr, "sns_n_grid": self.n_grid}

    def fit(self, context: FitContext) -> None:
        """Forwarded to the wrapped generator."""
        self.generator.fit(context)

    def update(self, context: FitContext, epoch: int) -> None:
        """Forwarded to the wrapped generator."""
        self.generator.update(context, epoch)

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None,
                 lower=None, upper=None, feature_types=None) -> SearchResult:
        """The wrapped generator's search, then SNS on its counterfactuals."""
        result = generate_counterfactuals(self.generator, model, x, target, tau, max_steps, epsilon, mutability,
                                          lower, upper, feature_types)
        refined = stable_neighbor_search(model, result.counterfactual, target, self.delta, self.steps, self.lr,
                                         self.n_grid, mutability, lower, upper, feature_types=feature_types)
        with torch.no_grad():
            converged = target_reached(model(refined), target, tau)
        result.counterfactual, result.converged = refined, converged
        return result


@register_generator("sns")
def sns_refined(lambda_cost: float = 0.001, lambda_energy: float = 5.0, lr: float = 0.25, base: str = "ecco",
                delta: float = 0.5, steps: int = 50, sns_lr: float | None = None, n_grid: int = 10,
                **base_options) -> SNSRefined:
    """The generator ``sns``: the registered generator ``base`` (with ``base_options``) refined by SNS."""
    if base.lower() == "sns":
        raise ValueError("generator_options: sns: base cannot be sns itself")
    inner = make_generator(base, lambda_cost, lambda_energy, lr, **base_options)
    return SNSRefined(inner, delta, steps, sns_lr, n_grid)
