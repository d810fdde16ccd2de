"""The pools of K stacked models searched as one (feature-space generators: Generic, ECCo).

Row block ``k`` of a ``[K·n, D]`` pool belongs to model ``k``, which has its own τ, step size η,
``λ_cst`` and ``λ_egy``: they become one value per row, and the library's own search
(:func:`~ct_lightning.generators.search.active_rows_search` with its :class:`FeatureSpace`) runs
unchanged on them. The search is the masked form (every row stays in place, converged rows are
frozen), which follows each row's path exactly as the packed form does, so every model gets the
counterfactuals its own search would give.
"""

from __future__ import annotations

import copy

import torch

from ct_lightning.constraints import Constraints
from ct_lightning.generators.base import SearchResult
from ct_lightning.generators.search import FeatureSpace, active_rows_search
from ct_lightning.training.stacked_model import RowStacked, StackedMLP

# Searches whose per-model settings can be per-row values with each row's arithmetic unchanged (not REVISE: see
# ct_lightning.stacked.STACKABLE_GENERATORS).
STACKED_SEARCH_GENERATORS = ("generic", "ecco")
ROW_SETTINGS = ("lambda_cost", "lr")  # generator attributes that may differ per model


def stacked_generator(generators: list, rows_per_model: int, device=None):
    """One generator standing for ``generators`` (one per model, of one class), its per-model settings
    expanded to one value per row (``lr`` as a column, which the constrained step multiplies row-wise).

    ECCo's weight ``λ_egy·φ_t`` is formed per model as a Python number, as a lone search forms it, and only then
    rounded to the rows' precision: rounding ``λ_egy`` first would change the last bit of some steps, and CT
    trainings amplify such differences over the epochs."""
    names = {getattr(g, "name", None) for g in generators}
    if len(names) != 1 or next(iter(names)) not in STACKED_SEARCH_GENERATORS:
        raise ValueError(f"generator: a stacked search takes one of {', '.join(STACKED_SEARCH_GENERATORS)} for all "
                         f"models, got {sorted(map(str, names))}")
    stacked = copy.copy(generators[0])
    for name in ROW_SETTINGS:
        values = torch.tensor([float(getattr(g, name)) for g in generators], device=device)
        per_row = values.repeat_interleave(rows_per_model)
        setattr(stacked, name, per_row[:, None] if name == "lr" else per_row)
    if hasattr(stacked, "energy_weight"):
        def energy_weight(step: int, max_steps: int) -> torch.Tensor:
            weights = [g.energy_weight(step, max_steps) for g in generators]
            return torch.tensor(weights, device=device).repeat_interleave(rows_per_model)

        stacked.energy_weight = energy_weight  # this instance's per-row weights (the class's are per model)
    return stacked


def stacked_search(model: StackedMLP, generators: list, x: torch.Tensor, target: torch.Tensor,
                   tau: list[float], max_steps: int, epsilon: float, limits: Constraints) -> SearchResult:
    """Counterfactuals of the ``[K·n, D]`` factuals ``x`` (block ``k``: model ``k``'s pool, searched with
    ``generators[k]`` and ``tau[k]``) for classes ``target``; one result row per factual."""
    rows_per_model = len(x) // model.n_models
    if rows_per_model * model.n_models != len(x) or len(generators) != model.n_models or len(tau) != model.n_models:
        raise ValueError(f"stacked search: {len(x)} rows, {len(generators)} generators and {len(tau)} τ values "
                         f"for {model.n_models} models")
    generator = stacked_generator(generators, rows_per_model, x.device)
    space = FeatureSpace(RowStacked(model), generator, limits, compiled_step=None)
    if not space.closed_form:
        raise ValueError(f"generator: {generator.name} has no closed-form penalty gradient to stack")
    tau_rows = torch.tensor(tau, dtype=x.dtype, device=x.device).repeat_interleave(rows_per_model)
    return active_rows_search(space, x, target, tau_rows, max_steps, epsilon, packed=False)
