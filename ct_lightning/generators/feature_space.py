"""Feature-space counterfactual generators: Generic (Wachter et al.) and ECCo.

They return, per counterfactual row, the regularisation term of Eq. 1; the batched search adds the cross-entropy towards the target
and takes SGD steps of size ``lr``. The loss is summed over rows, so each row gets exactly
the gradient it would get if it were searched alone.
"""

from __future__ import annotations

import math

import torch

from ct_lightning.generators.base import CounterfactualGenerator, SearchResult
from ct_lightning.generators.registry import register_generator
from ct_lightning.generators.search import search_counterfactuals


@register_generator("generic")
class Generic(CounterfactualGenerator):
    """Wachter et al. (2017): ``reg = λ_cst·‖x' − x‖₁``."""

    def __init__(self, lambda_cost: float = 0.001, lr: float = 0.25):
        self.lambda_cost = lambda_cost
        self.lr = lr

    def penalty(self, x_cf: torch.Tensor, x: torch.Tensor, logits: torch.Tensor,
                target: torch.Tensor, step: int, max_steps: int) -> torch.Tensor:
        """Per-row regularisation of the search objective."""
        return self.lambda_cost * (x_cf - x).abs().sum(1)

    def penalty_gradient(self, logits: torch.Tensor, target: torch.Tensor, step: int,
                         max_steps: int) -> tuple[torch.Tensor | None, float]:
        """The penalty's gradient in closed form: ``∂penalty/∂logit[target]`` per row (``None``: zero) and
        the weight ``λ_cst`` of ``‖x' − x‖₁``, whose input gradient is ``λ_cst·sign(x' − x)``."""
        return None, self.lambda_cost

    def has_closed_form(self) -> bool:
        """Whether :meth:`penalty_gradient` describes :meth:`penalty`: both come from the same class (a
        subclass that overrides only ``penalty`` is searched with autograd)."""
        def owner(name):
            return next(c for c in type(self).__mro__ if name in c.__dict__)
        return owner("penalty") is owner("penalty_gradient")

    def config(self) -> dict:
        """Primitive settings, for logging and checkpoints."""
        return {"generator": self.name, "lambda_cost": self.lambda_cost, "lr": self.lr}

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None,
                 lower=None, upper=None, feature_types=None) -> SearchResult:
        """Batched gradient search in the feature space (Eq. 1)."""
        return search_counterfactuals(model, x, target, self, tau, max_steps, epsilon, mutability, lower, upper,
                                      feature_types=feature_types)


def energy_decay(step: int, max_steps: int) -> float:
    """ECCo's energy weight ``φ_t = a·(b + t)^(−0.9)`` with ``b = max(1, round(T/25))``, ``a = b/10``."""
    b = max(1, round(max_steps / 25))
    return (b / 10) * math.pow(b + step, -0.9)


@register_generator("ecco")
class ECCo(Generic):
    """ECCo without the conformal term: ``λ_cst·‖x' − x‖₁ + λ_egy·φ_t·(E + 1e-3·E²)``, ``E = −M(x')[y⁺]``."""

    energy_weighted = True

    def __init__(self, lambda_cost: float = 0.001, lambda_energy: float = 5.0, lr: float = 0.25):
        super().__init__(lambda_cost, lr)
        self.lambda_energy = lambda_energy

    def energy_weight(self, step: int, max_steps: int):
        """``λ_egy·φ_t`` at search step ``step`` (the reference counts steps from 1, so step 0 has t = 1)."""
        return self.lambda_energy * energy_decay(step + 1, max_steps)

    def penalty(self, x_cf, x, logits, target, step, max_steps):
        energy = -logits.gather(1, target[:, None]).squeeze(1)
        return super().penalty(x_cf, x, logits, target, step, max_steps) + \
            self.energy_weight(step, max_steps) * (energy + 1e-3 * energy.square())

    def energy_gradient(self, step: int, max_steps: int) -> tuple[float, float]:
        """``(a, b)`` with ``∂penalty/∂logit[target] = a·(1 + b·E)`` per row: d/dE [λ_egy·φ·(E + 1e-3·E²)] =
        λ_egy·φ·(1 + 2e-3·E), and dE/dlogit[target] = −1. :meth:`penalty_gradient` evaluates it, and so does the
        native search loop (``native_search.c``), in the same order of operations."""
        return -self.energy_weight(step, max_steps), 2e-3

    def penalty_gradient(self, logits, target, step, max_steps):
        scale, slope = self.energy_gradient(step, max_steps)
        energy = -logits.gather(1, target[:, None]).squeeze(1)
        return scale * (1.0 + slope * energy), self.lambda_cost

    def config(self) -> dict:
        return {**super().config(), "lambda_energy": self.lambda_energy}
