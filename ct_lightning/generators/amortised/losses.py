"""The amortised generator's in-distribution loss ``L_χ`` for the MMD variant (paper App. B)."""

from __future__ import annotations

import torch

from ct_lightning.metrics.functional import median_length_scale, mmd2_biased


def class_conditional_mmd(x_cf: torch.Tensor, y_target: torch.Tensor, reference: torch.Tensor,
                          y_reference: torch.Tensor, n_classes: int, length_scale: float | None = None) -> torch.Tensor:
    """Per target class ``c``: MMD² between ``x_cf[y_target == c]`` and ``reference[y_reference == c]``.

    Averaged over classes weighted by the number of counterfactuals; classes with no counterfactual
    or fewer than two reference samples are skipped (zero if none remain). ``length_scale=None``
    takes the median pairwise distance of the reference samples (:func:`median_length_scale`).
    """
    if length_scale is None:
        length_scale = median_length_scale(reference.detach())
    total, weight = x_cf.new_zeros(()), 0
    for c in range(n_classes):
        cf_c, ref_c = x_cf[y_target == c], reference[y_reference == c]
        if len(cf_c) == 0 or len(ref_c) < 2:
            continue
        total = total + len(cf_c) * mmd2_biased(cf_c, ref_c, length_scale)
        weight += len(cf_c)
    return total / max(weight, 1)
