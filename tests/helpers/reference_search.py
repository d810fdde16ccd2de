"""Today's batched search (ct_lightning/generators/search.py at commit c742175), kept verbatim as the reference
that the closed-form-gradient search must reproduce up to floating-point rounding."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.constraints import Constraints
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.generators.base import SearchResult


@contextlib.contextmanager
def gradient_scope(*modules: nn.Module) -> Iterator[None]:
    """Eval mode for ``modules`` and gradients on, even inside ``torch.inference_mode`` (Lightning's
    validation hooks): what every search needs to differentiate through a frozen model."""
    with eval_mode(*modules), torch.inference_mode(False), torch.enable_grad():
        yield


def target_reached(logits: torch.Tensor, target: torch.Tensor, tau: float) -> torch.Tensor:
    """Per row: the softmax probability of ``target`` is at least ``tau`` (τ-convergence)."""
    return logits.softmax(1).gather(1, target[:, None]).squeeze(1) >= tau


def search_counterfactuals(model: nn.Module, x: torch.Tensor, target: torch.Tensor, generator,
                           tau: float = 0.75, max_steps: int = 30, epsilon: float = 0.3,
                           mutability: torch.Tensor | None = None, lower: torch.Tensor | None = None,
                           upper: torch.Tensor | None = None) -> SearchResult:
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
    """
    n, n_features = x.shape
    device = x.device
    limits = Constraints(mutability, lower, upper, device)
    # On CPU the rows to write are found with nonzero (free there); on an accelerator, where nonzero
    # would cost a host sync, every row is written and the unselected ones go to a scratch row n.
    select_rows = device.type == "cpu"
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
            rows = rows.detach().requires_grad_(True)
            logits = model(rows)
            done = target_reached(logits.detach(), rows_target, tau)
            loss = F.cross_entropy(logits, rows_target, reduction="sum") + \
                generator.penalty(rows, rows_x, logits, rows_target, step, max_steps).sum()
            (grad,) = torch.autograd.grad(loss, rows)
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
