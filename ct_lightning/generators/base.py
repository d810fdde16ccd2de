"""The contract every counterfactual generator fulfils, and what it is given to learn from data.

A generator is a class derived from :class:`CounterfactualGenerator`, registered by name with
:func:`ct_lightning.generators.registry.register_generator`. ``CTModule`` and the evaluation call it
the same way:

- ``fit(context)``: once before first use, with the training data in a :class:`FitContext`
  (a VAE is trained here, a generator network is built); nothing for feature-space searches;
- ``update(context, epoch)``: at the start of every CT epoch, and once before standalone use,
  to follow the classifier (an amortised network is (re)fitted here);
- ``generate(model, x, target, tau, max_steps, epsilon, mutability, lower, upper, feature_types=None)`` →
  :class:`SearchResult`, every counterfactual valid for ``feature_types`` (one category per one-hot group,
  integers on their grid) and its convergence judged there; callers go through
  :func:`generate_counterfactuals`, which also makes a generator without ``feature_types`` comply;
- ``config()``: primitive settings for logging;
- ``shared_state()`` / ``load_shared_state(state, context)``: what ``fit``/``update`` learned, so that
  under DDP it is learned once on rank 0 and copied to the other ranks (nothing by default).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ct_lightning.constraints import Constraints, FeatureTypes


SEARCH_STATS = ("converged", "steps", "nascent")  # the keys of SearchResult.stats(), logged as train/cf_<key>


@dataclass
class SearchResult:
    """Outcome of a batched search; one row per factual."""

    counterfactual: torch.Tensor  # mature x'_T
    nascent: torch.Tensor         # x'_{tε}: last path point within ε (ℓ∞) of the factual
    converged: torch.Tensor       # bool: target probability reached τ
    steps: torch.Tensor           # gradient steps taken
    nascent_steps: torch.Tensor   # t_ε: step index of the nascent counterfactual (0 = factual)

    def stats(self) -> dict[str, float]:
        """Share converged, mean steps and share of rows with a nascent counterfactual past t = 0."""
        stats = {
            "converged": self.converged.float().mean().item(),
            "steps": self.steps.float().mean().item(),
            "nascent": (self.nascent_steps > 0).float().mean().item(),
        }
        return stats


@dataclass
class FitContext:
    """Everything a generator may learn from: the classifier, the training data and the constraints.

    ``feature_names`` has no default on purpose: one-hot groups (``feature=value`` columns) are
    found from it, and every call site must say what it knows (``None`` when there are no names).
    """

    model: nn.Module
    x_train: torch.Tensor
    y_train: torch.Tensor | None
    n_classes: int
    feature_names: Sequence[str] | None
    mutability: torch.Tensor | None = None
    lower: torch.Tensor | None = None
    upper: torch.Tensor | None = None
    name: str = "data"
    feature_types: FeatureTypes | None = None  # one-hot groups and integers (default: groups from feature_names)

    @property
    def device(self) -> torch.device:
        """Where the training data (and so the generator's networks) live."""
        return self.x_train.device

    @property
    def accelerator(self) -> str:
        """The Lightning accelerator matching :attr:`device`."""
        return "gpu" if self.device.type == "cuda" else "cpu"


class CounterfactualGenerator(ABC):
    """Base of all counterfactual generators; see the module docstring for the call order.

    Class attributes: ``name`` (the registry key, set by ``register_generator``) and
    ``energy_weighted`` (``True`` if ``lambda_energy`` changes its search, so the evaluation
    protocol searches its grid of energy weights) and ``needs_fit`` (``True`` if ``fit`` must see
    training data before ``generate`` works) and ``reads_classes`` (``True`` if it reads the model's classes
    themselves, not only its loss: an amortised network conditioned on them; an ordered outcome's search then aims
    at exactly the target, :mod:`ct_lightning.evaluation.ordered_outcomes`).
    """

    name: ClassVar[str] = "generator"
    energy_weighted: ClassVar[bool] = False
    needs_fit: ClassVar[bool] = False
    reads_classes: ClassVar[bool] = False

    @abstractmethod
    def generate(self, model: nn.Module, x: torch.Tensor, target: torch.Tensor, tau: float = 0.75,
                 max_steps: int = 30, epsilon: float = 0.3, mutability: torch.Tensor | None = None,
                 lower: torch.Tensor | None = None, upper: torch.Tensor | None = None,
                 feature_types: FeatureTypes | None = None) -> SearchResult:
        """Counterfactuals of ``x`` for classes ``target``, valid for ``feature_types``; must work under
        ``torch.inference_mode``."""

    @abstractmethod
    def config(self) -> dict:
        """Primitive settings, for logging and checkpoints."""

    def fit(self, context: FitContext) -> None:
        """Learn from the training data once before first use; nothing by default."""

    def update(self, context: FitContext, epoch: int) -> None:
        """Follow the classifier at the start of a CT epoch (and before standalone use); nothing by default."""

    def shared_state(self):
        """What ``fit``/``update`` learned, picklable, for copying to other DDP ranks; ``None``: nothing learned."""
        return None

    def load_shared_state(self, state, context: FitContext) -> None:
        """Take over ``state`` from :meth:`shared_state` of the same generator on another rank."""


def generate_counterfactuals(generator: CounterfactualGenerator, model: nn.Module, x: torch.Tensor,
                             target: torch.Tensor, tau: float = 0.75, max_steps: int = 30, epsilon: float = 0.3,
                             mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                             upper: torch.Tensor | None = None,
                             feature_types: FeatureTypes | None = None) -> SearchResult:
    """``generator.generate(...)`` with ``feature_types`` where it takes them; a generator that does not gets
    its counterfactual and nascent points snapped afterwards (:meth:`Constraints.snap`) and its convergence
    judged again at the snapped points, so every generator's output is valid."""
    if feature_types is None or feature_types.empty:
        return generator.generate(model, x, target, tau, max_steps, epsilon, mutability, lower, upper)
    if "feature_types" in inspect.signature(generator.generate).parameters:
        return generator.generate(model, x, target, tau, max_steps, epsilon, mutability, lower, upper,
                                  feature_types=feature_types)
    result = generator.generate(model, x, target, tau, max_steps, epsilon, mutability, lower, upper)
    limits = Constraints(mutability, lower, upper, x.device, feature_types)
    with torch.no_grad():
        result.counterfactual = limits.snap(result.counterfactual, x)
        result.nascent = limits.snap(result.nascent, x)
        from ct_lightning.generators.search import target_reached  # noqa: PLC0415 - the search imports this module

        result.converged = target_reached(model(result.counterfactual), target, tau)
    return result


def prepare_standalone(generator: CounterfactualGenerator, context: FitContext) -> CounterfactualGenerator:
    """Make ``generator`` usable outside CT (evaluation, consistency): ``fit`` then one ``update``."""
    generator.fit(context)
    generator.update(context, 0)
    return generator
