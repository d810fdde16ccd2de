"""Ordered outcomes: explanations that count "at least" a class (rejected < interview < offer).

A data spec's ``target: {order: [...]}`` ranks the classes (:attr:`datamodules.codec.TabularCodec.order`). An
explanation towards class ``t`` is then valid where the counterfactual's predicted class ranks at or above ``t``,
and its search aims at the summed probability of those classes: the loss ``−log Σ_{c≥t} p_c`` and the threshold
τ on that sum, so that it does not push towards exactly ``t`` (an offer is as good as an interview asked for).

The search needs no generator of its own: :class:`AtLeast` turns the classifier into a two-class one whose logits
are ``[log Σ_{c<t} e^{z_c}, log Σ_{c≥t} e^{z_c}]``, so that its softmax is ``[P(<t), P(≥t)]``, its cross-entropy
towards class 1 is ``−log P(≥t)`` and ECCo's energy ``−logsumexp_{c≥t} z_c`` (while a class below the target is
still the predicted one, the search also pushes the best class at or above it past that one: see :class:`AtLeast`). Rows are searched in one batch per
target rank (a handful: the classes). A generator that reads the classes themselves (``reads_classes``: an
amortised network conditioned on them) searches towards exactly ``t``; validity still counts "at least".
Unordered classes never come here: their search is exactly the plain one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ct_lightning.generators.base import SearchResult, generate_counterfactuals


class AtLeast(nn.Module):
    """The classifier as two classes: ranked below ``rank`` (0) and at or above it (1); see the module.

    Its class 1 reaches ``tau`` where the summed probability of the classes at or above ``rank`` does *and* the
    predicted class is one of them: of three classes a sum of 0.63 over interview and offer (0.32 and 0.31) beside
    rejected at 0.37 is no valid explanation, yet reaches τ = 0.5. Where the best class below leads (by ``gap`` in
    logits), the lower logit is raised to ``log P(≥t) − logit(τ) + gap``: the row has not converged, and the loss
    pushes the classes at or above ``rank`` together past the best one below (the gap's gradient is that of
    ``max_{c<t} z_c − logsumexp_{c≥t} z_c``); elsewhere the logits are ``[log P(<t), log P(≥t)]`` and the loss
    ``−log P(≥t)`` exactly."""

    def __init__(self, classifier: nn.Module, ranks: torch.Tensor, rank: int, tau: float):
        super().__init__()
        self.classifier = classifier
        self.register_buffer("above", ranks >= rank, persistent=False)
        tau = min(max(float(tau), 1e-6), 1 - 1e-6)
        self.threshold = math.log(tau / (1 - tau))  # logit(τ)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[log P(<t), log P(≥t)]`` per row (up to a common constant), the first raised where a class below
        leads."""
        logits = self.classifier(x)
        low, high = logits[:, ~self.above], logits[:, self.above]
        above = high.logsumexp(1)
        leading = low.amax(1)
        # > 0: the predicted class is below the target; its gradient that of the best class below against all
        # those at or above together (the best one alone may be stuck in its band: an interview between the two)
        gap = leading - above + (above - high.amax(1)).detach()
        below = torch.where(gap > 0, torch.maximum(low.logsumexp(1), above - self.threshold + gap),
                            low.logsumexp(1))
        return torch.stack([below, above], 1)


def class_ranks(codec, device=None) -> torch.Tensor | None:
    """Each class's place in the codec's target order (0: the lowest), by class index; ``None`` unordered."""
    ranks = codec.class_ranks() if callable(getattr(codec, "class_ranks", None)) else None
    return None if ranks is None else torch.tensor(ranks, dtype=torch.long, device=device)


def next_class_up(predicted: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """The default target of an ordered outcome: the class one place above the prediction (the highest class
    stays itself: nothing ranks above it)."""
    by_rank = torch.argsort(ranks)  # class index at each place of the order
    return by_rank[(ranks[predicted] + 1).clamp(max=len(ranks) - 1)]


def accepted_classes(ranks: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``(rows, classes)``: the classes that count for each row's target, those ranked at or above it."""
    return ranks[None, :] >= ranks[targets][:, None]


def at_least_probability(probabilities: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """Per row, the summed probability of the accepted classes."""
    return (probabilities * accepted).sum(1)


def at_least_valid(probabilities: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """Per row, whether the predicted class is one of the accepted ones."""
    return accepted.gather(1, probabilities.argmax(1)[:, None]).squeeze(1)


def search_at_least(generator, classifier: nn.Module, x: torch.Tensor, targets: torch.Tensor, ranks: torch.Tensor,
                    tau: float, max_steps: int, epsilon: float, mutability, lower, upper,
                    feature_types=None) -> SearchResult:
    """Counterfactuals of ``x`` that reach at least ``targets`` (the summed probability of the classes at or above
    each row's target at least ``tau``), one search per target rank; a target of the lowest rank is reached by
    the factual itself (every class counts). A ``generator`` that ``reads_classes`` searches towards exactly the
    target."""
    n = len(x)
    result = SearchResult(x.clone(), x.clone(), torch.ones(n, dtype=torch.bool, device=x.device),
                          torch.zeros(n, dtype=torch.long, device=x.device),
                          torch.zeros(n, dtype=torch.long, device=x.device))
    exact = getattr(generator, "reads_classes", False)
    target_ranks = ranks[targets]
    for rank in torch.unique(target_ranks).tolist():
        rows = (target_ranks == rank).nonzero().squeeze(1)
        if rank == 0:
            continue  # every class counts: the factual is its own counterfactual
        model, aim = (classifier, targets[rows]) if exact else \
            (AtLeast(classifier, ranks, rank, tau), torch.ones(len(rows), dtype=torch.long, device=x.device))
        found = generate_counterfactuals(generator, model, x[rows], aim, tau, max_steps, epsilon, mutability,
                                         lower, upper, feature_types=feature_types)
        for field in ("counterfactual", "nascent", "converged", "steps", "nascent_steps"):
            getattr(result, field)[rows] = getattr(found, field).detach().to(getattr(result, field).dtype)
    return result
