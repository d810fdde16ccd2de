"""Batched gradient-based counterfactual search over a whole pool at once: the one active-rows loop.

All counterfactuals of a pool live in one tensor. Each step runs one forward and one
backward pass over the rows that are still searching; a row freezes as soon as its
target probability reaches ``tau`` and the loop ends when every row has converged or
``max_steps`` steps are spent. :func:`active_rows_search` is that loop for any search variable;
:class:`FeatureSpace` searches ``x'`` itself (Eq. 1: Generic, ECCo), REVISE a VAE's latent code
(:class:`ct_lightning.generators.revise.latent.LatentSpace`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import Constraints, FeatureTypes
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.generators.base import SearchResult
from ct_lightning.generators.compiled_step import step_for
from ct_lightning.generators.input_gradient import model_passes
from ct_lightning.generators.native_search import native_search


@contextlib.contextmanager
def gradient_scope(*modules: nn.Module) -> Iterator[None]:
    """Eval mode for ``modules`` and gradients on, even inside ``torch.inference_mode`` (Lightning's
    validation hooks): what every search needs to differentiate through a frozen model."""
    with eval_mode(*modules), torch.inference_mode(False), torch.enable_grad():
        yield


TRANSPOSED_SOFTMAX_ROWS = 32  # from this many rows the transposed softmax is the faster on a CPU (5 rows: 2.4 µs, 1.1)


def class_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """The softmax of each row of ``(n, classes)`` logits. On a CPU it is taken over the transposed logits: torch's
    kernel over the last dimension pays about 45 ns per row whatever the classes, so 1 000 rows of 2 classes took
    45 µs against 6 µs transposed, and of 10 classes 155 µs against 20 (torch 2.13, one thread; a search takes it at
    every step); below :data:`TRANSPOSED_SOFTMAX_ROWS` rows the last-dimension kernel is the faster. The values agree
    to an ulp or two, not to the bit (since 2026-11-29: searches before differ in the last bits)."""
    if logits.device.type == "cpu" and logits.dim() == 2 and len(logits) >= TRANSPOSED_SOFTMAX_ROWS:
        return logits.t().softmax(0).t()
    return logits.softmax(1)


def target_reached(logits: torch.Tensor, target: torch.Tensor, tau: float) -> torch.Tensor:
    """Per row: the softmax probability of ``target`` is at least ``tau`` (τ-convergence)."""
    return class_probabilities(logits).gather(1, target[:, None]).squeeze(1) >= tau


def _logit_gradient(generator, logits: torch.Tensor, target: torch.Tensor, tau: float, step: int,
                    max_steps: int):
    """τ-convergence, ``∂(CE(logits, target) + penalty)/∂logits`` per row and the weight ``λ_cst`` of the ℓ1 cost.

    ∂CE/∂logits = softmax − onehot(target); the generator adds ``∂penalty/∂logit[target]`` per row. The
    ℓ1 cost's input gradient, ``λ_cst·sign(x' − x)``, does not pass through the model.
    """
    with torch.no_grad():
        probs = class_probabilities(logits.detach())
        column = target[:, None]
        done = probs.gather(1, column).squeeze(1) >= tau
        target_logit, lambda_cost = generator.penalty_gradient(logits.detach(), target, step, max_steps)
        delta = torch.full_like(target, -1, dtype=probs.dtype) if target_logit is None else target_logit - 1.0
        return done, probs.scatter_add_(1, column, delta[:, None]), lambda_cost


class SearchSpace(Protocol):
    """What an active-rows search optimises (see :func:`active_rows_search`)."""

    modules: tuple[nn.Module, ...]  # put in eval mode, with gradients on, for the search

    def start(self, x: torch.Tensor) -> torch.Tensor: ...  # the search variable at the factuals

    def gradient(self, v: torch.Tensor, x: torch.Tensor, target: torch.Tensor, tau: float, step: int, max_steps: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]: ...
    # points, done, ∂loss/∂v, and the points' ℓ∞ distances from x where the space has them at hand (else None)

    def reached(self, v: torch.Tensor, x: torch.Tensor, target: torch.Tensor, tau: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...
    # points, done (no gradient), and the points' ℓ∞ distances from x where the space has them at hand (else None)

    def advance(self, v: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...  # the next v


class FeatureSpace:
    """The search variable is the counterfactual ``x'`` itself (Generic, ECCo): Eq. 1's input gradient,
    in closed form where the generator gives its penalty's gradient, and a constrained SGD step."""

    def __init__(self, model: nn.Module, generator, limits: Constraints, compiled_step=None):
        self.model, self.generator, self.limits = model, generator, limits
        self.modules = (model,)
        # Generators whose penalty depends on the logits and |x' − x| alone give its gradient in closed form:
        # one backward pass through the model with the logit gradient as grad_outputs, no graph of its own.
        self.closed_form = callable(getattr(generator, "has_closed_form", None)) and generator.has_closed_form()
        # In closed form the model is only differentiated with respect to its inputs: by hand for a plain MLP.
        self.passes = model_passes(model) if self.closed_form else None
        # With a compiled step (closed form only), the cost's sign, the SGD step, the projection and the next
        # points' distances are one kernel in `advance`; `_advanced` keeps the points it returned and their
        # distances, which the next `gradient` reports unless the loop has repacked the rows in between.
        self.compiled_step = compiled_step if self.closed_form else None
        self._advanced = None
        self._scalars: dict[float, torch.Tensor] = {}

    def start(self, x: torch.Tensor) -> torch.Tensor:
        """The search starts at the factual."""
        return x

    def gradient(self, rows: torch.Tensor, rows_x: torch.Tensor, target: torch.Tensor, tau: float, step: int,
                 max_steps: int):
        """One forward and one backward pass: the points, their τ-convergence, the input gradient of Eq. 1 and
        (in closed form) the points' ℓ∞ distances from their factuals."""
        if self.limits.snaps:
            return self._snapped_gradient(rows, rows_x, target, tau, step, max_steps)
        points = rows
        if self.closed_form:
            logits, saved = self.passes.forward(rows)
            done, grad_logits, self.lambda_cost = _logit_gradient(self.generator, logits, target, tau, step,
                                                                  max_steps)
            grad = self.passes.input_gradient(saved, grad_logits)
            if self.compiled_step is not None:
                return points, done, grad, self._known_distance(points)
            # x' − x once, for the cost's sign and the distance.
            offset = torch.sub(points.detach(), rows_x)
            distance = _largest_magnitude(offset)
            return points, done, _add_cost(grad, offset.sign_(), self.lambda_cost), distance
        rows = rows.detach().requires_grad_(True)
        logits = self.model(rows)
        done = target_reached(logits.detach(), target, tau)
        loss = F.cross_entropy(logits, target, reduction="sum") + \
            self.generator.penalty(rows, rows_x, logits, target, step, max_steps).sum()
        (grad,) = torch.autograd.grad(loss, rows)
        return points, done, grad, None

    def _snapped_gradient(self, rows: torch.Tensor, rows_x: torch.Tensor, target: torch.Tensor, tau: float,
                          step: int, max_steps: int):
        """:meth:`gradient` with categorical or integer features: the search variable stays continuous, the point
        is its valid snap (:meth:`Constraints.snap`), and the model, τ-convergence, the model's input gradient
        (straight through the snap) and the ℓ∞ distance are taken at that point; the ℓ1 cost's gradient
        ``λ_cst·sign(x' − x)`` is taken on the continuous variable, as without types."""
        with torch.no_grad():
            points = self.limits.snap(rows.detach(), rows_x)
        if self.closed_form:
            logits, saved = self.passes.forward(points)
            done, grad_logits, self.lambda_cost = _logit_gradient(self.generator, logits, target, tau, step,
                                                                  max_steps)
            grad = self.passes.input_gradient(saved, grad_logits)
            if self.compiled_step is None:  # the compiled step adds it itself
                grad = _add_cost(grad, torch.sub(rows.detach(), rows_x).sign_(), self.lambda_cost)
            return points, done, grad, None
        variable = rows.detach().requires_grad_(True)
        logits = self.model(variable + (points - variable).detach())
        done = target_reached(logits.detach(), target, tau)
        loss = F.cross_entropy(logits, target, reduction="sum") + \
            self.generator.penalty(variable, rows_x, logits, target, step, max_steps).sum()
        (grad,) = torch.autograd.grad(loss, variable)
        return points, done, grad, None

    def reached(self, rows: torch.Tensor, rows_x: torch.Tensor, target: torch.Tensor, tau: float):
        """The points, their τ-convergence, without a gradient (the check after the last step), and their
        distances if the compiled step measured them."""
        with torch.no_grad():
            points = self.limits.snap(rows, rows_x)
            return points, target_reached(self.model(points), target, tau), self._known_distance(points)

    def _known_distance(self, points: torch.Tensor) -> torch.Tensor | None:
        """The ℓ∞ distances the compiled step measured, if ``points`` are the points it returned last (not when the
        loop has repacked the rows since, or snapped them)."""
        advanced = self._advanced
        return advanced[1] if advanced is not None and advanced[0] is points else None

    def advance(self, rows: torch.Tensor, grad: torch.Tensor, rows_x: torch.Tensor) -> torch.Tensor:
        """One SGD step, the gradient masked by mutability and the point projected onto the constraints
        (written into ``grad``'s buffer: the loop is done with it; or by the compiled step)."""
        if self.compiled_step is None:
            return self.limits.step(rows, grad, self.generator.lr, rows_x, reuse_gradient=True)
        points, distance = self.compiled_step(rows, rows_x, grad, self._scalar(self.generator.lr, rows),
                                              self._scalar(self.lambda_cost, rows), self.limits)
        self._advanced = (points, distance)
        return points

    def _scalar(self, value: float, like: torch.Tensor) -> torch.Tensor:
        """``value`` as a 0-d tensor on ``like``'s device, made once per search (a Python float would be
        compiled into the kernel, so each new value would compile it again)."""
        if value not in self._scalars:
            self._scalars[value] = torch.tensor(value, dtype=like.dtype, device=like.device)
        return self._scalars[value]


def _add_cost(grad: torch.Tensor, sign: torch.Tensor, lambda_cost) -> torch.Tensor:
    """``grad + λ_cst·sign(x' − x)`` in ``grad``'s buffer; ``λ_cst`` is a number or one value per row (a stacked
    search, :mod:`ct_lightning.generators.stacked_search`)."""
    if isinstance(lambda_cost, torch.Tensor):
        return grad.addcmul_(sign, lambda_cost[:, None])
    return grad.add_(sign, alpha=lambda_cost) if lambda_cost else grad


# Below this many values an |offset| tensor stays in the core's cache, and two kernels cost less than four.
SMALL_OFFSET_VALUES = 1 << 16


def _largest_magnitude(offset: torch.Tensor) -> torch.Tensor:
    """Per row, ``max |offset|`` (the same values either way): on a small tensor as ``|offset|``'s row maxima (two
    kernels: a small search is bound by how many it launches), on a larger one as ``max(max offset, −min offset)``
    (two reductions, no ``|offset|`` tensor written through memory)."""
    if offset.numel() < SMALL_OFFSET_VALUES:
        return offset.abs().amax(1)
    return torch.maximum(offset.amax(1), offset.amin(1).neg_())


def _distance(points: torch.Tensor, x: torch.Tensor, known: torch.Tensor | None = None) -> torch.Tensor:
    """ℓ∞ distance of each point from its factual (``known`` when the search space already computed it)."""
    return known if known is not None else _largest_magnitude(torch.sub(points, x))


def _search_masked(space: SearchSpace, x, target, tau, max_steps, epsilon, check_every: int) -> SearchResult:
    """The loop with every row kept in the batch and frozen rows masked: the same per-row path as the
    packed loop, with no host sync inside a step (for accelerators)."""
    n = len(x)
    device = x.device
    rows = space.start(x)
    x_cf, nascent = x.clone(), x.clone()
    nascent_steps = torch.zeros(n, dtype=torch.long, device=device)
    steps = torch.full((n,), max_steps, dtype=torch.long, device=device)
    converged = torch.zeros(n, dtype=torch.bool, device=device)
    previous = was_inside = None
    last = -1
    for step in range(max_steps):
        points, done, grad, distance = space.gradient(rows, x, target, tau, step, max_steps)
        inside = _distance(points, x, distance) <= epsilon
        if previous is not None:  # a row leaving the ε-ball: its previous point is its nascent CE so far
            leaving = was_inside & ~inside & ~converged
            nascent = torch.where(leaving[:, None], previous, nascent)
            nascent_steps = torch.where(leaving, step - 1, nascent_steps)
        newly = done & ~converged  # `converged` doubles as "frozen" until the loop ends
        x_cf = torch.where(newly[:, None], points, x_cf)
        record = newly & inside
        nascent = torch.where(record[:, None], points, nascent)
        nascent_steps = torch.where(record, step, nascent_steps)
        steps = torch.where(newly, step, steps)
        converged = converged | newly
        rows = torch.where(~converged[:, None], space.advance(rows, grad, x), rows)
        previous, was_inside, last = points, inside, step
        if (step + 1) % check_every == 0 and bool(converged.all()):  # the only host sync
            break
    searching = ~converged
    points, reached, distance = space.reached(rows, x, target, tau)
    inside = _distance(points, x, distance) <= epsilon
    if previous is not None:
        leaving = was_inside & ~inside & searching
        nascent = torch.where(leaving[:, None], previous, nascent)
        nascent_steps = torch.where(leaving, last, nascent_steps)
    x_cf = torch.where(searching[:, None], points, x_cf)
    record = searching & inside
    nascent = torch.where(record[:, None], points, nascent)
    nascent_steps = torch.where(record, max_steps, nascent_steps)
    converged = torch.where(searching, reached, converged)
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)


# The packed loop drops frozen rows from its tensors once they are at least this share of the rows it holds: each
# repacking copies the pool-sized tensors (points, factuals), and until then a frozen row costs its share of a step.
REPACK_SHARE = 0.25


def rows_where(mask: torch.Tensor, count: int, sync_free: bool | None = None) -> torch.Tensor:
    """The indices of ``mask``'s ``count`` true rows, in order: ``nonzero`` on a CPU, and on an accelerator
    (``sync_free``, by default off the CPU) a stable sort of the flags, which needs no host sync when ``count`` is
    known."""
    if not (mask.device.type != "cpu" if sync_free is None else sync_free):
        return mask.nonzero().squeeze(1)
    return torch.argsort((~mask).to(torch.uint8), stable=True)[:count]


def _search_packed(space: SearchSpace, x, target, tau, max_steps, epsilon) -> SearchResult:
    """The loop with the rows still searching packed in their own tensors (see :func:`active_rows_search`)."""
    n = len(x)
    device = x.device
    # On CPU the rows to write are found with nonzero (free there); on an accelerator, where nonzero
    # would cost a host sync, every row is written and the unselected ones go to a scratch row n.
    select_rows = device.type == "cpu"
    scratch = 0 if select_rows else 1
    x_cf = x.clone()
    nascent = torch.cat([x, x[:scratch]]) if scratch else x.clone()
    nascent_steps = torch.zeros(n + scratch, dtype=torch.long, device=device)
    steps = torch.full((n,), max_steps, dtype=torch.long, device=device)
    converged = torch.zeros(n, dtype=torch.bool, device=device)

    def record_nascent(ids: torch.Tensor, points: torch.Tensor, mask: torch.Tensor, step: int,
                       point_rows: torch.Tensor | None = None) -> None:
        """nascent[ids[i]] = points[j] and nascent_steps[ids[i]] = step where mask[i], with j = point_rows[i] (the
        row of ``points`` that row i of the packing was before a repacking; ``None``: j = i)."""
        if select_rows:
            chosen = mask.nonzero().squeeze(1)
            if chosen.numel():
                ids = ids.index_select(0, chosen)
                nascent.index_copy_(0, ids, points.index_select(0, chosen if point_rows is None
                                                                else point_rows.index_select(0, chosen)))
                nascent_steps.index_fill_(0, ids, step)
        else:
            ids = torch.where(mask, ids, n)
            nascent.index_copy_(0, ids, points if point_rows is None else points.index_select(0, point_rows))
            nascent_steps.index_fill_(0, ids, step)

    def freeze(ids: torch.Tensor, points: torch.Tensor, inside: torch.Tensor, step: int) -> None:
        """Rows ``ids`` converged at ``step`` with these points."""
        x_cf.index_copy_(0, ids, points)
        record_nascent(ids, points, inside, step)
        steps.index_fill_(0, ids, step)
        converged.index_fill_(0, ids, True)

    # The packed rows; `active` maps them to rows of the outputs, and `searching` marks those that have not frozen
    # since the last repacking (None: all of them): frozen rows stay packed, unread, until they are REPACK_SHARE of
    # the rows. `previous`: the points at the step before (row `previous_rows[i]` for packed row i after a
    # repacking, else row i), `was_inside`: whether the packed rows' previous points lay within ε (ℓ∞) of the factual.
    active = torch.arange(n, device=device)
    rows, rows_x, rows_target = space.start(x), x, target
    searching, n_searching = None, n
    previous = was_inside = previous_rows = None
    for step in range(max_steps + 1):
        if step == max_steps:  # convergence check only: no graph, no step
            points, done, distance = space.reached(rows, rows_x, rows_target, tau)
        else:
            points, done, grad, distance = space.gradient(rows, rows_x, rows_target, tau, step, max_steps)
        inside = _distance(points, rows_x, distance) <= epsilon
        if previous is not None:  # a row leaving the ε-ball: its previous point is its nascent CE so far
            leaving = was_inside > inside  # was inside, is not (one kernel)
            record_nascent(active, previous, leaving if searching is None else leaving & searching, step - 1,
                           previous_rows)
        if step == max_steps:  # rows that used all max_steps steps
            if searching is not None:
                keep = rows_where(searching, n_searching)
                active, points, done, inside = (t.index_select(0, keep) for t in (active, points, done, inside))
            converged[active] = done
            x_cf.index_copy_(0, active, points)
            record_nascent(active, points, inside, max_steps)
            break
        if searching is not None:
            done = done & searching
        n_done = int(done.sum())  # the step's one host sync: how many rows froze
        if n_done == len(active):
            freeze(active, points, inside, step)
            break
        if n_done:
            frozen = rows_where(done, n_done)
            freeze(active.index_select(0, frozen), points.index_select(0, frozen), inside.index_select(0, frozen),
                   step)
            n_searching -= n_done
            if n_searching == 0:
                break
            searching = ~done if searching is None else searching & ~done
        rows = space.advance(rows, grad, rows_x)  # a frozen row still packed steps too: its points are never read
        previous, was_inside, previous_rows = points, inside, None
        if searching is not None and len(active) - n_searching >= REPACK_SHARE * len(active):
            # Stable: the searching rows keep their order. The previous points stay where they are (previous_rows).
            keep = rows_where(searching, n_searching)
            active, rows, rows_x, rows_target, was_inside = (
                t.index_select(0, keep) for t in (active, rows, rows_x, rows_target, was_inside))
            searching, previous_rows = None, keep
    return SearchResult(x_cf, nascent[:n], converged, steps, nascent_steps[:n])


def active_rows_search(space: SearchSpace, x: torch.Tensor, target: torch.Tensor, tau: float = 0.75,
                       max_steps: int = 30, epsilon: float = 0.3, packed: bool | None = None,
                       check_every: int = 8) -> SearchResult:
    """The one batched active-rows loop of every iterative search (feature space, REVISE's latent space).

    ``space`` (a :class:`SearchSpace`) says what differs: ``start(x)`` gives the search variable (``x'``
    itself, or a latent code), ``gradient(v, x, target, tau, step, max_steps)`` the counterfactual points at
    ``v`` (detached), their τ-convergence, the gradient of the objective with respect to ``v`` (one
    forward and one backward pass) and the points' ℓ∞ distances from ``x`` if it formed them (else
    ``None``), ``reached(v, x, target, tau)`` the points and their convergence without a gradient (and their
    distances or ``None``, as ``gradient``), ``advance(v, grad, x)`` the next variable (the step and any projection; it may write into ``grad``,
    which the loop does not use after it); ``modules`` are put in eval mode with gradients on. Per row: at
    each step ``s`` the row freezes with its current point once its target probability reaches ``tau``
    (``steps = s``), otherwise it takes a step; after ``max_steps`` steps its point is checked once more. The nascent counterfactual is the last path point within ``epsilon``
    (ℓ∞) of the factual (the factual itself if none is), written when a row leaves the ε-ball or freezes.

    ``packed`` (default: on CPU only): the rows still searching are kept packed in their own tensors, so a
    step costs one forward and one backward pass over the active rows plus a few elementwise operations,
    and one host sync (the count of rows that froze); rows that froze are dropped from the packed tensors once
    they are :data:`REPACK_SHARE` of them (until then they ride along, masked, and are never read). Otherwise, on
    an accelerator, all rows stay in the batch and frozen ones are masked: no host sync except one every
    ``check_every`` steps to stop early once every row has converged.
    """
    if check_every < 1:
        raise ValueError(f"check_every: must be at least 1, got {check_every}")
    if packed is None:
        packed = x.device.type == "cpu"
    with gradient_scope(*space.modules):
        # Inference tensors (made under torch.inference_mode) cannot take part in autograd: copy them.
        x = x.detach().clone() if x.is_inference() else x.detach()
        target = target.detach().clone()
        if packed:
            result = native_search(space, x, target, tau, max_steps, epsilon)
            return _search_packed(space, x, target, tau, max_steps, epsilon) if result is None else result
        return _search_masked(space, x, target, tau, max_steps, epsilon, check_every)


def search_counterfactuals(model: nn.Module, x: torch.Tensor, target: torch.Tensor, generator,
                           tau: float = 0.75, max_steps: int = 30, epsilon: float = 0.3,
                           mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                           upper: torch.Tensor | None = None, packed: bool | None = None,
                           check_every: int = 8, feature_types: FeatureTypes | None = None) -> SearchResult:
    """Search counterfactuals of ``x`` for classes ``target`` with ``generator``'s penalty (Eq. 1, feature space).

    ``mutability`` holds per-feature codes from :func:`ct_lightning.constraints.parse_mutability`;
    ``lower``/``upper`` are per-feature domain bounds (``None``: unbounded). Works inside
    Lightning's inference mode: gradients are switched on locally and the model's
    parameters receive none. ``packed`` and ``check_every``: see :func:`active_rows_search`. With
    ``feature_types`` (one-hot groups, integers) every returned point is valid and judged where it is valid
    (see :meth:`FeatureSpace._snapped_gradient`); without, the search is exactly the plain one.
    """
    limits = Constraints(mutability, lower, upper, x.device, feature_types)
    space = FeatureSpace(model, generator, limits, step_for(x.numel(), x.device.type))
    return active_rows_search(space, x, target, tau, max_steps, epsilon, packed, check_every)
