"""Prototype (issue 25): K counterfactual trainings of small MLPs as one batched model (stack_module_state + vmap).

Run: ``PYTHONPATH=. .venv/bin/python bench/batched_ct.py [--models 1 8 32] [--nce 100 1000] [--epochs 5]
[--out bench/batched_ct.json]``.

The counterfactual (CT) counterpart of ``bench/batched_models.py``: a simplified but faithful CT epoch on
Moons (32-unit MLPs, batch 30, Adam, one thread), implemented twice in plain PyTorch with the same code for
one model and for K stacked models:

- per model and epoch a pool of ``nce`` factuals (a draw of training indices), random targets and ``x⁺``
  samples of the target class, from the model's own generator seeded by ``(seed, epoch)`` as ``CTModule``'s;
- a *fixed-T* Generic search (Eq. 1: cross-entropy towards the target + ``λ_cst·‖x' − x‖₁``, closed-form logit
  gradient as in ``FeatureSpace``, SGD with step η, domain clamp μ ± 3σ): every row runs T steps, a row
  whose target probability reached its model's τ stops moving (the per-row mask of ``_search_masked``);
  the nascent counterfactual is the last path point within ε (ℓ∞), and a non-converged row's negative is
  its ``x⁺`` (``contrast_pairs``);
- the epoch's steps: the pool spread over the batches (``chunk_bounds``), one forward pass over
  ``[x, x⁺, x', x'_tε]`` and Eq. 2 (``energy_terms``, ``adversarial_loss``) with per-model
  ``λ_div``/``λ_adv``/``λ_reg`` (and per-model τ and η in the search).

(a) K separate models in a row; (b) one stacked model: pool tensors ``[K, n, D]``, the search's input
gradients through ``vmap(functional_call)``, the mask per model and row, one Adam over the stacked
parameters. Reports wall and CPU times, the search's share, the largest weight and pool differences and
whether the weights are bit-identical; also checks the fixed-T search against the library's own search on
one pool. Not a unit test; not used by the grids (see docs/appendix.md §3).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

from ct_lightning.constraints import parse_mutability, resolve_domain
from ct_lightning.generators import make_generator
from ct_lightning.generators.search import search_counterfactuals
from ct_lightning.losses import adversarial_loss, energy_terms
from ct_lightning.training.pool import ClassSampler, chunk_bounds, random_targets

N_CLASSES = 2
LAMBDA_COST, EPSILON, MAX_STEPS = 0.001, 0.3, 30  # Note 1's λ_cst, ε and T


def make_model(seed: int) -> nn.Module:
    """The paper's MLP for 2-D data, with weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))


def settings(k: int) -> dict:
    """Model ``k``'s own values, cycled: Note 5's λ_div/λ_adv/λ_reg, Note 3's τ, η 0.25 (Note 1)/0.5/0.1 (Note 11)."""
    grid = list(itertools.product([0.01, 0.1, 1.0], [0.1, 0.25, 1.0], [0.0, 0.01, 0.1, 0.25, 0.5]))
    lambda_div, lambda_adv, lambda_reg = grid[(7 * k) % len(grid)]
    return {"seed": k, "lambda_div": lambda_div, "lambda_adv": lambda_adv, "lambda_reg": lambda_reg,
            "tau": [0.75, 0.9, 0.95][k % 3], "search_lr": [0.25, 0.5, 0.1][(k // 3) % 3]}


def batches(n: int, batch_size: int, epoch: int) -> list[torch.Tensor]:
    """The epoch's batch indices, the same for every model."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + epoch))
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def pool_rng(seed: int, epoch: int) -> torch.Generator:
    """A model's pool stream for an epoch, keyed like CTModule._rng."""
    return torch.Generator().manual_seed(hash((seed, epoch, 0)) % (2**63))


def draw_pool(data: dict, predict, rng: torch.Generator, nce: int):
    """Factual indices, targets and ``x⁺`` for one model (``predict`` gives its logits on the factuals)."""
    index = torch.randperm(len(data["y"]), generator=rng)[:nce]
    x = data["x"][index]
    with torch.no_grad():
        predicted = predict(x).argmax(-1)
    target = random_targets(predicted, N_CLASSES, rng)
    x_pos = data["x"][data["sampler"].sample(target, rng)]
    return x, data["y"][index], target, x_pos


def fixed_t_search(forward, x, target, tau, lr, lower, upper, steps: int = MAX_STEPS):
    """T masked SGD steps of the Generic search from ``x`` (any leading dims: ``[n, D]`` or ``[K, n, D]``).

    ``tau`` and ``lr`` broadcast against the rows' and the features' shapes. Returns the final points,
    the nascent points and the per-row convergence.
    """
    rows, nascent = x.clone(), x.clone()
    converged = torch.zeros(target.shape, dtype=torch.bool)
    column = target.unsqueeze(-1)
    for _ in range(steps):
        rows.requires_grad_(True)
        logits = forward(rows)
        with torch.no_grad():
            probs = logits.softmax(-1)
            done = probs.gather(-1, column).squeeze(-1) >= tau
            grad_logits = probs.scatter_add_(-1, column, torch.full_like(probs[..., :1], -1.0))
        (grad,) = torch.autograd.grad(logits, rows, grad_outputs=grad_logits)
        with torch.no_grad():
            rows = rows.detach()
            offset = rows - x
            inside = offset.abs().amax(-1) <= EPSILON
            nascent = torch.where((inside & ~converged).unsqueeze(-1), rows, nascent)  # last point within ε
            converged = converged | done
            moved = torch.clamp(rows - lr * (grad + LAMBDA_COST * offset.sign()), lower, upper)
            rows = torch.where(converged.unsqueeze(-1), rows, moved)
    with torch.no_grad():  # the check after the last step
        probs = forward(rows).softmax(-1)
        inside = (rows - x).abs().amax(-1) <= EPSILON
        nascent = torch.where((inside & ~converged).unsqueeze(-1), rows, nascent)
        converged = converged | (probs.gather(-1, column).squeeze(-1) >= tau)
    return rows, nascent, converged


def ct_loss(logits_all, y, m: int, target, labels, lambda_div, lambda_adv, lambda_reg):
    """Eq. 2 from one forward pass over ``[x, x⁺, x', x'_tε]`` (λ_clf = 1)."""
    logits, logits_pos, logits_neg, logits_adv = logits_all.split([len(y), m, m, m])
    loss = F.cross_entropy(logits, y)
    if m:  # a step without counterfactuals (nce < batches) has the classification term only
        div, ridge = energy_terms(logits_pos, logits_neg, target)
        loss = loss + lambda_div * div + lambda_reg * ridge + lambda_adv * adversarial_loss(logits_adv, labels)
    return loss


def separate(data, chosen, epochs, nce, batch_size):
    """(a) One plain-PyTorch CT training per model, one after the other."""
    wall, cpu = time.perf_counter(), time.process_time()
    search_seconds, states, pools = 0.0, [], []
    v = vectors(chosen)
    for k, s in enumerate(chosen):
        model = make_model(s["seed"])
        optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
        for epoch in range(epochs):
            started = time.perf_counter()
            x, labels, target, x_pos = draw_pool(data, model, pool_rng(s["seed"], epoch), nce)
            cf, nascent, converged = fixed_t_search(model, x, target, v["tau"][k], v["search_lr"][k],
                                                    data["lower"], data["upper"])
            x_neg = torch.where(converged[:, None], cf, x_pos)
            search_seconds += time.perf_counter() - started
            batch_list = batches(len(data["y"]), batch_size, epoch)
            bounds = chunk_bounds(nce, len(batch_list))
            for b, index in enumerate(batch_list):
                lo, hi = bounds[b], bounds[b + 1]
                logits = model(torch.cat([data["x"][index], x_pos[lo:hi], x_neg[lo:hi], nascent[lo:hi]]))
                loss = ct_loss(logits, data["y"][index], hi - lo, target[lo:hi], labels[lo:hi],
                               v["lambda_div"][k], v["lambda_adv"][k], v["lambda_reg"][k])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        states.append({n: p.detach().clone() for n, p in model.state_dict().items()})
        pools.append((x_neg, converged))
    return states, pools, time.perf_counter() - wall, time.process_time() - cpu, search_seconds


def vectors(chosen) -> dict[str, torch.Tensor]:
    """The per-model values as float32 vectors over models (the same numbers in (a) and (b))."""
    return {key: torch.tensor([s[key] for s in chosen], dtype=torch.float32)
            for key in ("lambda_div", "lambda_adv", "lambda_reg", "tau", "search_lr")}


def batched(data, chosen, epochs, nce, batch_size):
    """(b) All models as one: stacked parameters, vmapped forward passes, one Adam."""
    wall, cpu = time.perf_counter(), time.process_time()
    search_seconds = 0.0
    models = [make_model(s["seed"]) for s in chosen]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    optimiser = torch.optim.Adam([p.requires_grad_() for p in params.values()], lr=1e-3)
    v = vectors(chosen)

    def apply(p, b, x):
        return functional_call(base, (p, b), (x,))

    stacked = torch.vmap(apply, in_dims=(0, 0, 0))  # [K, n, D] → [K, n, C]
    losses = torch.vmap(lambda p, b, xb, yb, pos, neg, nas, m, tgt, lab, ld, la, lr:
                        ct_loss(apply(p, b, torch.cat([xb, pos, neg, nas])), yb, m, tgt, lab, ld, la, lr),
                        in_dims=(0, 0, None, None, 0, 0, 0, None, 0, 0, 0, 0, 0))
    for epoch in range(epochs):
        started = time.perf_counter()
        frozen = {n: p.detach() for n, p in params.items()}  # the search does not train the models

        def forward(x):
            return stacked(frozen, buffers, x)

        # draw_pool's draws per model, in its order, with one stacked prediction of every model's factuals
        rngs = [pool_rng(s["seed"], epoch) for s in chosen]
        index = torch.stack([torch.randperm(len(data["y"]), generator=r)[:nce] for r in rngs])
        x = data["x"][index]
        with torch.no_grad():
            predicted = forward(x).argmax(-1)
        target = torch.stack([random_targets(predicted[k], N_CLASSES, r) for k, r in enumerate(rngs)])
        x_pos = torch.stack([data["x"][data["sampler"].sample(target[k], r)] for k, r in enumerate(rngs)])
        labels = data["y"][index]
        cf, nascent, converged = fixed_t_search(forward, x, target, v["tau"][:, None], v["search_lr"][:, None, None],
                                                data["lower"], data["upper"])
        x_neg = torch.where(converged[..., None], cf, x_pos)
        search_seconds += time.perf_counter() - started
        batch_list = batches(len(data["y"]), batch_size, epoch)
        bounds = chunk_bounds(nce, len(batch_list))
        for b, idx in enumerate(batch_list):
            lo, hi = bounds[b], bounds[b + 1]
            total = losses(params, buffers, data["x"][idx], data["y"][idx], x_pos[:, lo:hi], x_neg[:, lo:hi],
                           nascent[:, lo:hi], hi - lo, target[:, lo:hi], labels[:, lo:hi],
                           v["lambda_div"], v["lambda_adv"], v["lambda_reg"]).sum()  # models' terms independent
            optimiser.zero_grad()
            total.backward()
            optimiser.step()
    states = [{n: p[k].detach().clone() for n, p in params.items()} for k in range(len(chosen))]
    pools = [(x_neg[k], converged[k]) for k in range(len(chosen))]
    return states, pools, time.perf_counter() - wall, time.process_time() - cpu, search_seconds


def library_check(data, nce: int, state: dict, epoch: int) -> dict:
    """The fixed-T search against the library's Generic search (packed and masked) on a pool of model 0
    with the trained weights ``state`` (a fresh MLP is too flat for any row to reach τ in T steps)."""
    s = settings(0)
    model = make_model(s["seed"])
    model.load_state_dict(state)
    x, _, target, _ = draw_pool(data, model, pool_rng(s["seed"], epoch), nce)
    started = time.perf_counter()
    cf, nascent, converged = fixed_t_search(model, x, target, torch.tensor(s["tau"]), torch.tensor(s["search_lr"]),
                                            data["lower"], data["upper"])
    ours_seconds = time.perf_counter() - started
    generator = make_generator("generic", LAMBDA_COST, 5.0, s["search_lr"])
    out = {"fixed_t_seconds": ours_seconds}
    for packed in (True, False):
        started = time.perf_counter()
        result = search_counterfactuals(model, x, target, generator, s["tau"], MAX_STEPS, EPSILON,
                                        parse_mutability(None, 2), data["lower"], data["upper"], packed=packed)
        name = "packed" if packed else "masked"
        out[f"library_{name}_seconds"] = time.perf_counter() - started
        out[f"library_{name}_max_difference"] = max(float((cf - result.counterfactual).abs().max()),
                                                    float((nascent - result.nascent).abs().max()))
        out[f"library_{name}_same_convergence"] = bool(torch.equal(converged, result.converged))
        out["library_mean_steps"] = float(result.steps.float().mean())
    out["converged_share"] = float(converged.float().mean())
    return out


def compare(one, many, pools_one, pools_many) -> dict:
    """Largest weight and final-pool differences, and whether the weights are bit-identical."""
    return {"last_converged_share": float(torch.stack([p[1] for p in pools_one]).float().mean()),
            "max_weight_difference": max(float((a[n] - b[n]).abs().max()) for a, b in zip(one, many) for n in a),
            "bit_identical": all(torch.equal(a[n], b[n]) for a, b in zip(one, many) for n in a),
            "max_last_pool_difference": max(float((a[0] - b[0]).abs().max()) for a, b in zip(pools_one, pools_many)),
            "same_last_convergence": all(torch.equal(a[1], b[1]) for a, b in zip(pools_one, pools_many))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--nce", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "batched_ct.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from datamodules import get_datamodule_class

    dm = get_datamodule_class("moons")(batch_size=args.batch_size)
    dm.setup("fit")
    x, y = dm.x_train.float(), dm.y_train.long()
    lower, upper = resolve_domain("infer", x, 3.0, dm)
    data = {"x": x, "y": y, "sampler": ClassSampler(y, N_CLASSES), "lower": lower, "upper": upper}
    separate(data, [settings(0)], 1, 10, args.batch_size)  # warm-up: first calls, allocator, vmap
    batched(data, [settings(0)], 1, 10, args.batch_size)
    rows, check = [], {}
    for nce in args.nce:
        for k in args.models:
            chosen = [settings(i) for i in range(k)]
            one, pools_one, wall_a, cpu_a, search_a = separate(data, chosen, args.epochs, nce, args.batch_size)
            many, pools_many, wall_b, cpu_b, search_b = batched(data, chosen, args.epochs, nce, args.batch_size)
            row = {"models": k, "nce": nce, "separate_seconds": wall_a, "batched_seconds": wall_b,
                   "speedup": wall_a / wall_b, "separate_cpu_seconds": cpu_a, "batched_cpu_seconds": cpu_b,
                   "cpu_speedup": cpu_a / cpu_b, "separate_search_seconds": search_a,
                   "batched_search_seconds": search_b, **compare(one, many, pools_one, pools_many),
                   "load_average": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if k == args.models[0]:
                check[nce] = library_check(data, nce, one[0], args.epochs)
    print(json.dumps(check), flush=True)
    result = {"data": "moons", "epochs": args.epochs, "n_train": len(y), "batch_size": args.batch_size,
              "threads": 1, "max_steps": MAX_STEPS, "lambda_cost": LAMBDA_COST, "epsilon": EPSILON,
              "settings": [settings(i) for i in range(max(args.models))][:8], "rows": rows,
              "search_check": check, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
