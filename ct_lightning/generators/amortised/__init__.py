"""Conditional generative counterfactuals (Van Looveren et al.; SPEC §6) and the ``amortised`` CT generator.

A generator network ``G(x, y_M, y_T, z)`` returns counterfactuals for a whole batch in one forward
pass. It is trained against a frozen classifier ``M`` (only its predictions are used, no labels) with

    L_G = w_M·CE(M(x_CF), y_T) + w_l1·‖x − x_CF‖₁ + w_χ·L_χ

where ``L_χ`` keeps ``x_CF`` in distribution:

- ``variant="mmd"`` (paper App. B): MMD² between the counterfactuals of target class ``c`` and the
  samples of the batch that ``M`` assigns to ``c`` (Gaussian kernel; median-distance bandwidth
  unless ``length_scale`` is given), averaged over classes weighted by counterfactual counts;
- ``variant="gan"`` (paper Sec. 3.4, tabular): a discriminator ``D(x, y)`` conditioned on the class,
  fed real samples with ``y_M`` and counterfactuals with ``y_T``; vanilla GAN losses
  ``L_D = −log D(x, y_M) − log(1 − D(x_CF, y_T))`` and ``L_χ = −log D(x_CF, y_T)`` (non-saturating).

Continuous features are generated as a perturbation ``x + δ`` (the last layer starts at zero, so an
untrained generator is the identity). One-hot groups (columns named ``feature=value``) are generated
directly, as in the paper's tabular model: per-group logits (biased towards the factual's category),
straight-through Gumbel-softmax while training and a hard arg-max at generation. Mutability and the
domain are enforced on every output with :func:`ct_lightning.constraints.enforce`.

:class:`~ct_lightning.generators.amortised.training.CounterfactualNetworkModule` is the LightningModule (manual optimisation, trained with a ``Trainer`` in
``recipes/train_generator.py``; its ``fit_epochs`` is a plain loop for quick refits).
:class:`Amortised` plugs it into CT as the generator ``amortised``: it fits the network when CT
starts and re-fits it for ``refit_epochs`` epochs every ``refit_every`` epochs to follow the
changing classifier.

Modules: ``network`` (the networks), ``losses`` (the MMD loss), ``training`` (fitting against the
classifier), ``generator`` (the registered CT generator).
"""

from ct_lightning.generators.amortised.generator import Amortised
from ct_lightning.generators.amortised.network import ConditionalDiscriminator, CounterfactualNetwork, one_hot_groups

LAZY = ("VARIANTS", "CounterfactualNetworkModule")  # from training, which imports Lightning: on first use


def __getattr__(name: str):
    """``VARIANTS`` and ``CounterfactualNetworkModule`` of ``training``, imported on first use (the generator
    catalogue imports this package, and explaining a decision needs no Lightning)."""
    if name in LAZY:
        from ct_lightning.generators.amortised import training  # noqa: PLC0415

        return getattr(training, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["VARIANTS", "Amortised", "ConditionalDiscriminator", "CounterfactualNetwork", "CounterfactualNetworkModule",
           "one_hot_groups"]
