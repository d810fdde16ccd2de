"""The two active-rows loops as they stood at commit 4a1336a, kept verbatim as the reference that the one loop of
``ct_lightning/generators/search.py`` must reproduce: the feature-space search (Generic/ECCo, packed and masked)
and REVISE's latent search (``ct_lightning/generators/revise/latent.py``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import Constraints
from ct_lightning.generators.base import SearchResult
from ct_lightning.generators.search import gradient_scope, target_reached


def _closed_form_step(generator, logits: torch.Tensor, rows: torch.Tensor, rows_x: torch.Tensor,
                      target: torch.Tensor, tau: float, step: int, max_steps: int):
    """τ-convergence and the input gradient of ``CE(logits, target) + penalty`` (summed over rows).

    ∂CE/∂logits = softmax − onehot(target); the generator adds ``∂penalty/∂logit[target]`` per row
    and the weight ``λ_cst`` of its ℓ1 cost, whose input gradient is ``λ_cst·sign(x' − x)``.
    """
    with torch.no_grad():
        probs = logits.detach().softmax(1)
        column = target[:, None]
        done = probs.gather(1, column).squeeze(1) >= tau
        target_logit, lambda_cost = generator.penalty_gradient(logits.detach(), target, step, max_steps)
        delta = torch.full_like(target, -1, dtype=probs.dtype) if target_logit is None else target_logit - 1.0
        grad_logits = probs.scatter_add_(1, column, delta[:, None])
    (grad,) = torch.autograd.grad(logits, rows, grad_outputs=grad_logits)
    if lambda_cost:
        grad = grad.add_(torch.sub(rows.detach(), rows_x).sign_(), alpha=lambda_cost)
    return done, grad


def _has_closed_form(generator) -> bool:
    # Generators whose penalty depends on the logits and |x' − x| alone give its gradient in closed form:
    # one backward pass through the model with the logit gradient as grad_outputs, no graph of its own.
    return callable(getattr(generator, "has_closed_form", None)) and generator.has_closed_form()


def _step_gradient(generator, closed_form: bool, model: nn.Module, rows: torch.Tensor, rows_x: torch.Tensor,
                   target: torch.Tensor, tau: float, step: int, max_steps: int):
    """One forward and one backward pass: τ-convergence of ``rows`` and the input gradient of Eq. 1."""
    rows = rows.detach().requires_grad_(True)
    logits = model(rows)
    if closed_form:
        return _closed_form_step(generator, logits, rows, rows_x, target, tau, step, max_steps)
    done = target_reached(logits.detach(), target, tau)
    loss = F.cross_entropy(logits, target, reduction="sum") + \
        generator.penalty(rows, rows_x, logits, target, step, max_steps).sum()
    (grad,) = torch.autograd.grad(loss, rows)
    return done, grad


def _search_masked(model, x, target, generator, tau, max_steps, epsilon, limits: Constraints,
                   check_every: int) -> SearchResult:
    """The search with every row kept in the batch and frozen rows masked: the same per-row path as the
    packed search, with no host sync inside a step (for accelerators)."""
    n = len(x)
    device = x.device
    closed_form = _has_closed_form(generator)
    with gradient_scope(model):
        x = x.detach().clone() if x.is_inference() else x.detach()
        target = target.detach().clone()
        rows, x_cf, nascent = x.clone(), x.clone(), x.clone()
        nascent_steps = torch.zeros(n, dtype=torch.long, device=device)
        steps = torch.full((n,), max_steps, dtype=torch.long, device=device)
        converged = torch.zeros(n, dtype=torch.bool, device=device)
        inside = torch.ones(n, dtype=torch.bool, device=device)
        for step in range(max_steps):
            done, grad = _step_gradient(generator, closed_form, model, rows, x, target, tau, step, max_steps)
            newly = done & ~converged  # `converged` doubles as "frozen" until the loop ends
            x_cf = torch.where(newly[:, None], rows, x_cf)
            record = newly & inside
            nascent = torch.where(record[:, None], rows, nascent)
            nascent_steps = torch.where(record, step, nascent_steps)
            steps = torch.where(newly, step, steps)
            converged = converged | newly
            moving = ~converged
            moved = limits.step(rows, grad, generator.lr, x)
            moved_inside = torch.sub(moved, x).abs_().amax(1) <= epsilon
            leaving = moving & inside & ~moved_inside  # last point within ε so far
            nascent = torch.where(leaving[:, None], rows, nascent)
            nascent_steps = torch.where(leaving, step, nascent_steps)
            rows = torch.where(moving[:, None], moved, rows)
            inside = torch.where(moving, moved_inside, inside)
            if (step + 1) % check_every == 0 and bool(converged.all()):  # the only host sync
                break
        searching = ~converged
        with torch.no_grad():
            reached = target_reached(model(rows), target, tau)
        x_cf = torch.where(searching[:, None], rows, x_cf)
        record = searching & inside
        nascent = torch.where(record[:, None], rows, nascent)
        nascent_steps = torch.where(record, max_steps, nascent_steps)
        converged = torch.where(searching, reached, converged)
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)


def search_counterfactuals(model: nn.Module, x: torch.Tensor, target: torch.Tensor, generator,
                           tau: float = 0.75, max_steps: int = 30, epsilon: float = 0.3,
                           mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                           upper: torch.Tensor | None = None, packed: bool | None = None,
                           check_every: int = 8) -> SearchResult:
    """Search counterfactuals of ``x`` for classes ``target`` with ``generator``'s penalty.

    ``mutability`` holds per-feature codes from :func:`ct_lightning.constraints.parse_mutability`;
    ``lower``/``upper`` are per-feature domain bounds (``None``: unbounded). Works inside
    Lightning's inference mode: gradients are switched on locally and the model's
    parameters receive none.

    The rows still searching are kept packed in their own tensors (``rows``, ``rows_x``, ...);
    a row is written to the outputs once, when it freezes, so a step costs one forward and one
    backward pass over the active rows plus a few elementwise operations, and one host sync
    (the count of rows that froze) to shrink the batch. The nascent counterfactual (the last path
    point within ε of the factual) is written only when a row leaves the ε-ball or freezes.

    ``packed`` (default: on CPU only) selects that scheme; otherwise, on an accelerator, all rows stay
    in the batch and frozen ones are masked (:func:`_search_masked`): no host sync except one every
    ``check_every`` steps to stop early once every row has converged.
    """
    if check_every < 1:
        raise ValueError(f"check_every: must be at least 1, got {check_every}")
    n, n_features = x.shape
    device = x.device
    limits = Constraints(mutability, lower, upper, device)
    if packed is None:
        packed = device.type == "cpu"
    if not packed:
        return _search_masked(model, x, target, generator, tau, max_steps, epsilon, limits, check_every)
    # On CPU the rows to write are found with nonzero (free there); on an accelerator, where nonzero
    # would cost a host sync, every row is written and the unselected ones go to a scratch row n.
    select_rows = device.type == "cpu"
    closed_form = _has_closed_form(generator)
    scratch = 0 if select_rows else 1
    with gradient_scope(model):
        # Inference tensors (made under torch.inference_mode) cannot take part in autograd: copy them.
        x = x.detach().clone() if x.is_inference() else x.detach()
        target = target.detach().clone()
        x_cf = x.clone()
        nascent = torch.cat([x, x[:scratch]]) if scratch else x.clone()
        nascent_steps = torch.zeros(n + scratch, dtype=torch.long, device=device)
        steps = torch.full((n,), max_steps, dtype=torch.long, device=device)
        converged = torch.zeros(n, dtype=torch.bool, device=device)

        def record_nascent(ids: torch.Tensor, points: torch.Tensor, mask: torch.Tensor, step: int) -> None:
            """nascent[ids[i]] = points[i] and nascent_steps[ids[i]] = step where mask[i]."""
            if select_rows:
                chosen = mask.nonzero().squeeze(1)
                if chosen.numel():
                    ids = ids.index_select(0, chosen)
                    nascent.index_copy_(0, ids, points.index_select(0, chosen))
                    nascent_steps.index_fill_(0, ids, step)
            else:
                ids = torch.where(mask, ids, n)
                nascent.index_copy_(0, ids, points)
                nascent_steps.index_fill_(0, ids, step)

        # The rows still searching, packed; `active` maps them to rows of the outputs. `inside`:
        # whether a row's current point lies within ε (ℓ∞) of its factual (the factual itself does).
        active = torch.arange(n, device=device)
        rows, rows_x, rows_target = x, x, target
        inside = torch.ones(n, dtype=torch.bool, device=device)
        for step in range(max_steps + 1):
            if active.numel() == 0:
                break
            if step == max_steps:  # convergence check only: no graph, no step
                with torch.no_grad():
                    logits = model(rows)
                converged[active] = target_reached(logits, rows_target, tau)
                break
            done, grad = _step_gradient(generator, closed_form, model, rows, rows_x, rows_target, tau, step,
                                        max_steps)
            rows = rows.detach()
            n_done = int(done.sum())  # the step's one host sync: how many rows froze
            if n_done == len(active):
                x_cf.index_copy_(0, active, rows)
                record_nascent(active, rows, inside, step)
                steps.index_fill_(0, active, step)
                converged.index_fill_(0, active, True)
                active = active[:0]
                break
            # One SGD step for every row (elementwise, so frozen rows can be dropped afterwards).
            moved = limits.step(rows, grad, generator.lr, rows_x)
            moved_inside = torch.sub(moved, rows_x).abs_().amax(1) <= epsilon
            # A row leaving the ε-ball (and not freezing): its current point is its nascent CE so far.
            record_nascent(active, rows, inside & ~moved_inside & ~done, step)
            if n_done:
                # Stable partition: searching rows first (in order), then the frozen ones.
                order = torch.argsort(done.to(torch.uint8), stable=True)
                keep, frozen = order[:len(order) - n_done], order[len(order) - n_done:]
                ids = active.index_select(0, frozen)
                points = rows.index_select(0, frozen)
                x_cf.index_copy_(0, ids, points)
                record_nascent(ids, points, inside.index_select(0, frozen), step)
                steps.index_fill_(0, ids, step)
                converged.index_fill_(0, ids, True)
                active, moved, rows_x, rows_target, moved_inside = (
                    t.index_select(0, keep) for t in (active, moved, rows_x, rows_target, moved_inside))
            rows, inside = moved, moved_inside
        if active.numel():  # rows that used all max_steps steps
            x_cf.index_copy_(0, active, rows.detach())
            record_nascent(active, rows.detach(), inside, max_steps)
    nascent, nascent_steps = nascent[:n], nascent_steps[:n]
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)


def latent_search(model: nn.Module, vae: nn.Module, x: torch.Tensor, target: torch.Tensor,
                  lambda_cost: float = 0.001, lr: float = 0.25, tau: float = 0.75, max_steps: int = 30,
                  epsilon: float = 0.3, mutability: torch.Tensor | None = None,
                  lower: torch.Tensor | None = None, upper: torch.Tensor | None = None) -> SearchResult:
    """Batched REVISE search of counterfactuals of ``x`` for classes ``target`` through ``vae``.

    ``vae`` needs ``encode_mean`` and ``decode``. Neither the model nor the VAE receives gradients;
    works inside Lightning's inference mode. Returns a :class:`SearchResult` whose
    ``counterfactual`` rows are decoded, projected points.
    """
    n, n_features = x.shape
    device = x.device
    codes = torch.zeros(n_features, dtype=torch.long, device=device) if mutability is None else mutability.to(device)
    with gradient_scope(model, vae):
        x = x.detach().clone()
        target = target.detach().clone()
        with torch.no_grad():
            z = vae.encode_mean(x).clone()
        x_cf, nascent = x.clone(), x.clone()
        steps = torch.zeros(n, dtype=torch.long, device=device)
        nascent_steps = torch.zeros(n, dtype=torch.long, device=device)
        converged = torch.zeros(n, dtype=torch.bool, device=device)
        active = torch.arange(n, device=device)
        limits = Constraints(codes, lower, upper, device)
        for step in range(max_steps + 1):
            if active.numel() == 0:
                break
            rows_z = z[active].requires_grad_(step < max_steps)
            rows_x, rows_target = x[active], target[active]
            decoded = vae.decode(rows_z)
            rows_cf = limits.project(decoded, rows_x)
            logits = model(rows_cf)
            x_cf[active] = rows_cf.detach()
            inside = (rows_cf.detach() - rows_x).abs().amax(1) <= epsilon
            nascent[active[inside]] = rows_cf.detach()[inside]
            nascent_steps[active[inside]] = steps[active[inside]]
            done = target_reached(logits.detach(), rows_target, tau)
            converged[active[done]] = True
            if step == max_steps:
                break
            loss = F.cross_entropy(logits, rows_target, reduction="sum") + \
                lambda_cost * (decoded - rows_x).abs().sum()
            (grad,) = torch.autograd.grad(loss, rows_z)
            keep = ~done
            active = active[keep]
            z[active] = rows_z.detach()[keep] - lr * grad[keep]
            steps[active] += 1
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)
