"""The counterfactual-training terms of Eq. 2, as plain functions of logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ct_lightning.constraints import protect_positive

OBJECTIVES = {
    # objective: (uses contrastive divergence + ridge, uses adversarial loss)
    "full": (True, True),
    "vanilla": (False, False),
    "energy": (True, False),
    "adversarial": (False, True),
}


def check_objective(objective: str) -> tuple[bool, bool]:
    """Which CT terms ``objective`` uses: ``(energy terms, adversarial term)``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: unknown {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[objective]


def target_energy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Energy ``E(x, y⁺) = −M(x)[y⁺]`` per row."""
    return -logits.gather(1, target[:, None]).squeeze(1)


def energy_terms(logits_pos: torch.Tensor, logits_cf: torch.Tensor,
                 target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3's contrastive divergence and the energy ridge, averaged over rows, from one gather of each
    energy (a training step needs both): ``E(x⁺, y⁺) − E(x'_T, y⁺)`` and ``M(x⁺)[y⁺]² + M(x'_T)[y⁺]²``."""
    if target.numel() == 0:
        zero = logits_pos.sum() * 0.0
        return zero, zero
    energy_pos, energy_cf = target_energy(logits_pos, target), target_energy(logits_cf, target)
    return (energy_pos - energy_cf).mean(), (energy_pos.square() + energy_cf.square()).mean()


def contrastive_divergence(logits_pos: torch.Tensor, logits_cf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. 3 averaged over rows: ``E(x⁺, y⁺) − E(x'_T, y⁺)`` (see :func:`energy_terms`)."""
    return energy_terms(logits_pos, logits_cf, target)[0]


def energy_ridge(logits_pos: torch.Tensor, logits_cf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Ridge on the energies: ``M(x⁺)[y⁺]² + M(x'_T)[y⁺]²`` averaged over rows (see :func:`energy_terms`)."""
    return energy_terms(logits_pos, logits_cf, target)[1]


def adversarial_loss(logits_nascent: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Eq. 4: cross-entropy of nascent counterfactuals against the factuals' true labels."""
    if labels.numel() == 0:
        return logits_nascent.sum() * 0.0
    return F.cross_entropy(logits_nascent, labels)


def contrast_pairs(x_pos: torch.Tensor, x_cf: torch.Tensor, converged: torch.Tensor,
                   mutability: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive and negative samples for the divergence.

    ``x⁺`` is protected against mutability (Sec. 3.4); a counterfactual that did not converge
    is replaced by its ``x⁺`` so that it carries no divergence penalty (reference
    implementation).
    """
    x_pos = protect_positive(x_pos, x_cf, mutability.to(x_pos.device))
    x_neg = torch.where(converged[:, None], x_cf, x_pos)
    return x_pos, x_neg
