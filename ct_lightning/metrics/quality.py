"""The generator quality report of Van Looveren et al. (Tables 2-3): MMD², sparsity and validity together."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ct_lightning.training.eval_mode import frozen
from ct_lightning.metrics.functional import median_length_scale, mmd2_unbiased, sparsity


def counterfactual_quality(classifier: nn.Module, x: torch.Tensor, x_cf: torch.Tensor, y_target: torch.Tensor,
                           groups: Sequence[Sequence[int]] = (), n_classes: int | None = None,
                           length_scale: float | None = None) -> dict[str, float]:
    """The paper's evaluation (Van Looveren et al., Tables 2-3) of counterfactuals ``x_cf`` of ``x``.

    ``mmd2``: unbiased MMD² between all counterfactuals and all factuals; ``mmd2_class_c``: between the
    counterfactuals ``M`` assigns to ``c`` and the factuals ``M`` assigns to ``c``; ``mmd2_class_mean``
    their mean; ``l1``, ``l1_numeric``, ``l0``, ``l0_categorical`` (means, see :func:`sparsity`);
    ``validity``: share with ``M(x_cf) = y_target``. The Gaussian kernel's bandwidth defaults to the
    median pairwise distance of ``x`` (the paper's MMD tooling does the same).
    """
    with frozen(classifier), torch.no_grad():
        y_model = classifier(x).argmax(1)
        y_cf = classifier(x_cf).argmax(1)
    n_classes = n_classes or int(torch.cat([y_model, y_cf, y_target]).max()) + 1
    scale = length_scale or median_length_scale(x)
    out = {"validity": float((y_cf == y_target).float().mean()), "length_scale": scale,
           "mmd2": float(mmd2_unbiased(x_cf, x, length_scale=scale))}
    per_class = []
    for c in range(n_classes):
        cf_c, x_c = x_cf[y_cf == c], x[y_model == c]
        value = float(mmd2_unbiased(cf_c, x_c, length_scale=scale)) if len(cf_c) >= 2 and len(x_c) >= 2 else math.nan
        out[f"mmd2_class_{c}"] = value
        per_class.append(value)
    finite = [v for v in per_class if math.isfinite(v)]
    out["mmd2_class_mean"] = float(sum(finite) / len(finite)) if finite else math.nan
    out.update({k: float(v.mean()) for k, v in sparsity(x_cf, x, groups).items()})
    return out
