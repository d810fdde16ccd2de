"""Which constraints hold when a trained model is evaluated: mutability codes, domain and immutable names."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ct_lightning.constraints import NONE, FeatureTypes, parse_mutability, resolve_domain, resolve_feature_types


@dataclass
class EvaluationConstraints:
    """Mutability codes, domain bounds and the names of immutable features used at evaluation."""

    mutability: torch.Tensor
    lower: torch.Tensor | None
    upper: torch.Tensor | None
    immutable: list[str]
    feature_types: FeatureTypes | None = None  # one-hot groups and integers: counterfactuals stay valid

    @property
    def protected_mask(self) -> torch.Tensor:
        """Boolean mask of features that may not move at all."""
        return self.mutability == NONE


def evaluation_constraints(module, datamodule, protect: bool = False,
                           all_mutable: bool = False) -> EvaluationConstraints:
    """Constraints for evaluating ``module`` on ``datamodule``.

    By default the model's own training constraints (``hparams.mutability``) hold at test time;
    ``protect`` makes the data set's protected features immutable in addition; ``all_mutable``
    drops the training constraints. The domain follows ``hparams.domain``.
    """
    hp = module.hparams
    names = list(datamodule.feature_names)
    spec = {} if all_mutable or not hp.get("mutability") else dict(hp.mutability)
    if protect:
        spec.update({feature: "none" for feature in datamodule.protected})
    codes = parse_mutability(spec or None, datamodule.n_features, names)
    lower, upper = resolve_domain(hp.get("domain", "infer"), datamodule.x_train, hp.get("domain_std", 3.0), datamodule)
    immutable = [names[i] if i < len(names) else str(i) for i in torch.nonzero(codes == NONE).flatten().tolist()]
    types = resolve_feature_types(datamodule, names, datamodule.n_features)
    return EvaluationConstraints(codes, lower, upper, immutable, types)
