"""Counterfactual training of K models at once: one stacked model, one search, one Adam step per batch.

The members are ordinary :class:`~ct_lightning.module.CTModule` objects built from their own settings. They
may differ only in the scalars of :data:`PER_MODEL` (the penalty weights, τ, η, ``λ_cst``, ``λ_egy``);
everything that shapes the loop (data, seed, epochs, batch size, architecture, generator, T, ε, nce,
burn-in) is shared. Each epoch repeats what ``CTModule`` does under Lightning's fused epoch loop, for
every member:

- the same batches (the data module's epoch-seeded order) and the global RNGs seeded as
  :class:`~ct_lightning.callbacks.EpochSeed` does;
- each member draws its pool with its own RNG stream (:meth:`CTModule.draw_pool_inputs`) and its own
  predictions; all pools are searched together (:func:`~ct_lightning.generators.stacked_search.stacked_search`);
- per batch, one forward pass of ``[x, x⁺, x', x'_tε]`` for all members, each member's Eq. 2 with its own
  weights, and one Adam step over the stacked parameters (elementwise, so each member's update is its own);
- per member, the epoch's training terms, accuracy and search statistics, the validation loss and accuracy,
  the best epoch by validation accuracy (as ``ModelCheckpoint(monitor="val/acc")``), and the test metrics at the end.

The arithmetic is that of separate trainings up to the order of floating-point operations in the batched
kernels (``tests/test_stacked.py`` holds the weights and metrics of stacked and separate trainings within a
tolerance).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ct_lightning.callbacks.epoch_seed import epoch_seed
from ct_lightning.constraints import Constraints
from ct_lightning.generators.stacked_search import STACKED_SEARCH_GENERATORS, stacked_search
from ct_lightning.losses import check_objective, contrast_pairs
from ct_lightning.module import TERMS, CTModule
from ct_lightning.training.epoch_block import EpochBlockLoader
from ct_lightning.training.pool import chunk_bounds, target_tally
from ct_lightning.training.stacked_model import StackedMLP

# Generators a stack takes. Generic's and ECCo's pools are searched as one (generators.stacked_search). REVISE's are
# searched one model at a time with the lone code (CTModule.generate_pool): its VAE runs on the rows still
# searching, and on this CPU a matrix product of 1-3, 5-7 or 9-11 rows rounds differently from the same rows in a
# larger product, so a stacked latent search parts from a lone one in the last bits (measured: 100-epoch moons
# trainings ended 0.04-0.38 apart in weights); searched alone, its pools are the lone ones and only the steps stack.
STACKABLE_GENERATORS = ("generic", "ecco", "revise")
# CTModule settings that may differ between the members of one stack (one value per model).
PER_MODEL = ("lambda_clf", "lambda_div", "lambda_reg", "lambda_adv", "lambda_cost", "lambda_energy", "search_lr",
             "tau")


@dataclass
class StackedFit:
    """What a stacked training produced, per member: epoch metrics, best epoch and its weights, test metrics."""

    history: list[list[dict[str, float]]]          # member -> epoch -> {metric: value} (with "epoch")
    best_epoch: list[int]
    best_state: list[dict[str, torch.Tensor]]      # member -> state_dict of its model at the best epoch
    test: list[dict[str, float]] = field(default_factory=list)
    fit_seconds: float = 0.0
    steps: int = 0


def settings_blocker(settings: list[Mapping]) -> str | None:
    """Why trainings with these settings (``CTModule`` hyperparameters, or resolved run configurations) cannot
    train as one stack, or ``None``. The one rule of what stacks: the trainings agree in everything but
    :data:`PER_MODEL` (and the run's name), search one pool per epoch, and search with a generator of
    :data:`STACKABLE_GENERATORS` (a vanilla objective searches nothing)."""
    shared = [{k: v for k, v in s.items() if k not in PER_MODEL and k != "run_name"} for s in settings]
    for k, own in enumerate(shared[1:], start=1):
        differing = sorted(name for name in own.keys() | shared[0].keys() if own.get(name) != shared[0].get(name))
        if differing:
            return f"training {k} differs from training 0 in {', '.join(differing)}"
    first = settings[0]
    if first.get("pool", "epoch") != "epoch":
        return f"pool {first['pool']!r} (a stack searches one pool per epoch)"
    if any(check_objective(first.get("objective", "full"))) and first.get("generator") not in STACKABLE_GENERATORS:
        return f"generator {first.get('generator')!r} (a stack searches with {', '.join(STACKABLE_GENERATORS)})"
    return None


def stack_blocker(members: list[CTModule]) -> str | None:
    """Why ``members`` cannot train as one stack (:func:`settings_blocker` of their hyperparameters), or ``None``."""
    return settings_blocker([dict(m.hparams) for m in members])


def _logged_search(result, rows: int, n_models: int, seconds: float, target: torch.Tensor,
                   n_classes: int) -> list[dict[str, float]]:
    """Per member, the search statistics ``CTModule`` logs (``train/cf_*``, ``train/cf_converged_target_K`` of
    ``target``); the stacked search's time is shared equally."""
    converged = result.converged.view(n_models, rows).float().mean(1).tolist()
    steps = result.steps.view(n_models, rows).float().mean(1).tolist()
    nascent = (result.nascent_steps.view(n_models, rows) > 0).float().mean(1).tolist()
    tallies = [target_tally(c, t, n_classes).tolist() for c, t in
               zip(result.converged.view(n_models, rows), target.view(n_models, rows))]
    return [{"train/cf_converged": c, "train/cf_steps": s, "train/cf_nascent": a,
             "train/cf_search_seconds": seconds / n_models, "train/cf_count": float(rows),
             **{f"train/cf_converged_target_{k}": r / n for k, (n, r) in enumerate(zip(*tally)) if n > 0}}
            for c, s, a, tally in zip(converged, steps, nascent, tallies)]


def _split_stats(losses: torch.Tensor, correct: torch.Tensor, rows: int) -> list[dict[str, float]]:
    """Per member, the epoch's row-weighted mean loss terms and accuracy (``losses``: members × terms sums)."""
    means = (losses / rows).float().tolist()
    accuracy = (correct.double() / rows).float().tolist()
    return [{"train/loss": m[0], **{f"train/{name}": m[i] for i, name in enumerate(TERMS, start=1)},
             "train/acc": a} for m, a in zip(means, accuracy)]


@torch.no_grad()
def _evaluate(stacked: StackedMLP, x: torch.Tensor, y: torch.Tensor, stage: str) -> list[dict[str, float]]:
    """Per member, the mean cross-entropy and accuracy on ``(x, y)``."""
    logits = stacked(x.expand(stacked.n_models, *x.shape))
    n_classes = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, n_classes), y.repeat(stacked.n_models), reduction="none")
    loss = loss.view(stacked.n_models, -1).double().mean(1).float().tolist()
    accuracy = (logits.argmax(2) == y).double().mean(1).float().tolist()
    return [{f"{stage}/loss": l, f"{stage}/acc": a} for l, a in zip(loss, accuracy)]


def fit_stacked(members: list[CTModule], datamodule, max_epochs: int, burnin: float = 0.0,
                should_stop=None) -> StackedFit:
    """Train ``members`` (``CTModule`` objects, :func:`stack_blocker` ``None``) together for ``max_epochs`` on
    ``datamodule`` (set up); their models hold the final weights afterwards. ``should_stop(epoch)`` is called after
    every epoch (an exception it raises stops the stack there)."""
    blocker = stack_blocker(members)
    if blocker:
        raise ValueError(f"stack: these trainings cannot share one stack: {blocker}")
    started = time.perf_counter()
    first = members[0]
    hp = first.hparams
    x_train, y_train = datamodule.train_tensors
    for member in members:
        member.prepare_counterfactual_data(x_train, y_train, datamodule)
    uses_search = first.uses_energy or first.uses_adversarial
    if uses_search:
        for member in members:
            member.generator.fit(member.fit_context())
    device = first.device  # the members' device (a stack trains where its members are)
    stacked = StackedMLP([m.model for m in members])
    optimizer = torch.optim.Adam(stacked.parameters(), lr=hp.lr)
    n_models = len(members)
    per_model = {name: torch.tensor([float(m.hparams[name]) for m in members], device=device) for name in PER_MODEL}
    limits = Constraints(first.mutability, first.lower, first.upper, device, first.feature_types)
    loader = datamodule.train_dataloader()
    blocks = EpochBlockLoader(loader)
    x_val, y_val = datamodule.x_val.float().to(device), datamodule.y_val.long().to(device)
    first_ct_epoch = round(burnin * max_epochs)
    history: list[list[dict]] = [[] for _ in members]
    best_acc = [-1.0] * n_models
    best_epoch = [0] * n_models
    best_state: list[dict] = [{} for _ in members]
    steps = 0
    for epoch in range(max_epochs):
        value = epoch_seed(hp.seed, epoch, 0)  # as EpochSeed does before each epoch
        random.seed(value)
        np.random.seed(value)
        torch.manual_seed(value)
        loader.sampler.set_epoch(epoch)
        block = next(iter(blocks)).to(device)
        ct_active = epoch >= first_ct_epoch
        searching = ct_active and uses_search
        pool = search_logs = None
        if searching:
            pool, search_logs = _stacked_pool(members, stacked, epoch, limits)
        n_batches = len(block)
        bounds = chunk_bounds(hp.nce, n_batches) if searching else None
        sums = torch.zeros(n_models, 1 + len(TERMS), dtype=torch.float64, device=device)
        correct = torch.zeros(n_models, dtype=torch.long, device=device)
        rows_seen = 0
        for index, (x, y) in enumerate(block.batches()):
            losses, logits = _step_losses(stacked, x, y, pool, bounds, index, first, per_model) if searching else \
                _plain_losses(stacked, x, y, per_model)
            total = losses[:, 0].sum()
            optimizer.zero_grad()
            total.backward()
            optimizer.step()
            sums += losses.detach().double() * len(y)
            correct += (logits.detach().argmax(2) == y).sum(1)
            rows_seen += len(y)
            steps += 1
        logged = _split_stats(sums, correct, rows_seen)
        validation = _evaluate(stacked, x_val, y_val, "val")
        for k in range(n_models):
            entry = {**(search_logs[k] if search_logs else {}), **logged[k], "train/ct_active": float(searching),
                     **validation[k], "epoch": float(epoch)}
            history[k].append(entry)
            if entry["val/acc"] > best_acc[k]:  # ModelCheckpoint(mode="max") keeps the first of equal maxima
                best_acc[k], best_epoch[k], best_state[k] = entry["val/acc"], epoch, stacked.member_state(k)
        if should_stop is not None:
            should_stop(epoch)
    stacked.write_to([m.model for m in members])
    test = _evaluate(stacked, datamodule.x_test.float().to(device), datamodule.y_test.long().to(device), "test")
    best_state = [{name: tensor.cpu() for name, tensor in state.items()} for state in best_state]
    return StackedFit(history, best_epoch, best_state, test, time.perf_counter() - started, steps)


def _stacked_pool(members: list[CTModule], stacked: StackedMLP, epoch: int, limits: Constraints):
    """Every member's pool of the epoch (drawn with its own RNG and predictions), searched as one where the
    generator allows (:data:`STACKED_SEARCH_GENERATORS`), else one member after the other."""
    stacked.write_to([m.model for m in members])  # the draws predict with each member's current weights
    hp = members[0].hparams
    if hp.generator not in STACKED_SEARCH_GENERATORS:
        return _pools_one_by_one(members, epoch)
    drawn = [m.draw_pool_inputs(hp.nce, m._rng(0, epoch=epoch), m._rng(0, shared=True, epoch=epoch))
             for m in members]
    _, x, labels, target, x_pos = (torch.cat(parts) for parts in zip(*drawn))
    started = time.perf_counter()
    result = stacked_search(stacked, [m.generator for m in members], x, target, [m.hparams.tau for m in members],
                            hp.max_steps, hp.epsilon, limits)
    seconds = time.perf_counter() - started
    rows = len(drawn[0][0])
    x_pos, x_neg = contrast_pairs(x_pos, result.counterfactual, result.converged, members[0].mutability)
    shape = (len(members), rows)
    pool = {"x_pos": x_pos.view(*shape, -1), "x_neg": x_neg.view(*shape, -1),
            "nascent": result.nascent.view(*shape, -1), "labels": labels.view(shape), "target": target.view(shape)}
    return pool, _logged_search(result, rows, len(members), seconds, target, int(hp.n_classes))


def _pools_one_by_one(members: list[CTModule], epoch: int):
    """Each member's pool from its own lone search (``CTModule.generate_pool``), stacked."""
    pools, logs = [], []
    for member in members:
        member.generator.update(member.fit_context(), epoch)  # as CTModule.on_train_epoch_start
        member._target_tally = None  # this epoch's search only (CTModule.converged_by_target)
        pool, stats = member.generate_pool(member.hparams.nce, member._rng(0, epoch=epoch),
                                           member._rng(0, shared=True, epoch=epoch))
        pools.append(pool)
        logs.append({**{f"train/cf_{key}": value for key, value in stats.items()}, "train/cf_count": float(len(pool)),
                     **{f"train/cf_converged_target_{k}": share for k, (_, share) in
                        member.converged_by_target().items()}})
    stacked = {name: torch.stack([getattr(pool, name) for pool in pools])
               for name in ("x_pos", "x_neg", "nascent", "labels", "target")}
    return stacked, logs


def _weighted(per_model: dict, terms: dict) -> torch.Tensor:
    """Eq. 2 per member: ``λ_clf·clf + λ_div·div + λ_reg·ridge + λ_adv·adv`` (the weights are the member's own)."""
    return per_model["lambda_clf"] * terms["clf"] + per_model["lambda_div"] * terms["div"] + \
        per_model["lambda_reg"] * terms["ridge"] + per_model["lambda_adv"] * terms["adv"]


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per member, the mean cross-entropy of ``logits`` ``[K, n, C]`` against ``labels`` ``[K, n]`` or ``[n]``."""
    n_models, rows, n_classes = logits.shape
    labels = labels.expand(n_models, rows).reshape(-1)
    return F.cross_entropy(logits.reshape(-1, n_classes), labels, reduction="none").view(n_models, rows).mean(1)


def _plain_losses(stacked: StackedMLP, x, y, per_model: dict):
    """A conventional step (burn-in, or a vanilla objective): cross-entropy only."""
    logits = stacked(x.expand(stacked.n_models, *x.shape))
    clf = _cross_entropy(logits, y)
    zero = torch.zeros_like(clf)
    loss = per_model["lambda_clf"] * clf
    return torch.stack([loss, clf, zero, zero, zero], 1), logits


def _step_losses(stacked: StackedMLP, x, y, pool: dict, bounds, index: int, first: CTModule, per_model: dict):
    """One CT step of every member: its batch ``x``, its chunk of the pool, Eq. 2 with its own weights."""
    lo, hi = bounds[index], bounds[index + 1]
    n_models = stacked.n_models
    chunk = {name: tensor[:, lo:hi] for name, tensor in pool.items()}
    m = hi - lo
    inputs = torch.cat([x.expand(n_models, *x.shape), chunk["x_pos"], chunk["x_neg"], chunk["nascent"]], 1)
    logits = stacked(inputs)
    logits, logits_pos, logits_neg, logits_adv = logits.split([len(x), m, m, m], 1)
    clf = _cross_entropy(logits, y)
    zero = torch.zeros_like(clf)
    if m:
        target = chunk["target"].unsqueeze(2)
        energy_pos = -logits_pos.gather(2, target).squeeze(2)
        energy_neg = -logits_neg.gather(2, target).squeeze(2)
        div, ridge = (energy_pos - energy_neg).mean(1), (energy_pos.square() + energy_neg.square()).mean(1)
        adv = _cross_entropy(logits_adv, chunk["labels"])
    else:
        div = ridge = adv = zero
    if not first.uses_energy:
        div, ridge = div.detach() * 0.0, ridge.detach() * 0.0
    if not first.uses_adversarial:
        adv = adv.detach() * 0.0
    terms = {"clf": clf, "div": div, "ridge": ridge, "adv": adv}
    loss = _weighted(per_model, terms)
    return torch.stack([loss, clf, div, ridge, adv], 1), logits
