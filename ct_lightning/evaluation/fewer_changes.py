"""Fewer changes: give back every change an explanation's counterfactual does not need.

A gradient search moves every mutable feature a little (on credit, 16 of 23 columns for one client), while a person
can act on a few. So, as DiCE's post-hoc sparsity does, each changed column goes back to the row's own value,
smallest change first, wherever the model still predicts the target at least as surely as required: the
counterfactual stays valid, and only what flips the decision is left. All rows are handled as one tensor: one
forward pass per column, not per row. A one-hot group goes back as a whole (its category), immutable columns never
changed, and the row's own value always lies inside the domain, so every constraint of the search still holds.
"""

from __future__ import annotations

import torch
from torch import nn

CHANGED = 1e-6  # an encoded input that moved less than this did not change (float32 decoding noise)


def column_masks(feature_names: list[str], columns: list[str]) -> torch.Tensor | None:
    """``(n_columns, n_inputs)``: which model inputs encode each column (``age``; ``purpose=car``, ``purpose=tax``
    for a one-hot column ``purpose``); ``None`` where some input belongs to no column."""
    masks = torch.zeros(len(columns), len(feature_names), dtype=torch.bool)
    for i, column in enumerate(columns):
        for j, name in enumerate(feature_names):
            masks[i, j] = name == column or name.startswith(f"{column}=")
    return masks if bool((masks.sum(0) == 1).all()) else None


def revert_needless_changes(classifier: nn.Module, factual: torch.Tensor, counterfactual: torch.Tensor,
                            targets: torch.Tensor, floor: torch.Tensor, masks: torch.Tensor,
                            eligible: torch.Tensor, accepted: torch.Tensor | None = None) -> torch.Tensor:
    """``counterfactual`` (encoded, one row per factual) with each changed column set back to ``factual``'s value,
    smallest change first (the summed absolute change of its inputs), where the model still predicts the target with
    probability at least ``floor`` (per row); rows not ``eligible`` (no valid counterfactual) stay as they are.
    ``accepted`` (``(rows, classes)``, an ordered outcome's classes at or above each target): the predicted class
    must be one of them and their summed probability at least ``floor``."""
    masks = masks.to(counterfactual.device)
    size = (counterfactual - factual).abs() @ masks.T.float()  # (rows, columns): how far each column moved
    changed = (size > CHANGED) & eligible[:, None]
    order = torch.where(changed, size, torch.full_like(size, float("inf"))).argsort(dim=1)  # unchanged ones last
    count = changed.sum(1)
    rows = torch.arange(len(factual), device=factual.device)
    current = counterfactual.clone()
    with torch.no_grad():
        for k in range(int(count.max()) if len(count) else 0):
            trying = k < count
            back = masks[order[:, k]] & trying[:, None]
            trial = torch.where(back, factual, current)
            probabilities = torch.softmax(classifier(trial), dim=1)
            if accepted is None:
                kept = trying & (probabilities.argmax(1) == targets) & (probabilities[rows, targets] >= floor)
            else:
                kept = trying & accepted[rows, probabilities.argmax(1)] & ((probabilities * accepted).sum(1) >= floor)
            current = torch.where(kept[:, None], trial, current)
    return current
