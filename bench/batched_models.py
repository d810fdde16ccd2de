"""Prototype (issue 25): train K small MLPs as one batched model (torch.func.stack_module_state + vmap).

Run: ``PYTHONPATH=. .venv/bin/python bench/batched_models.py [--models 8] [--epochs 5] [--out bench/batched_models.json]``.
Vanilla training only (cross-entropy, Adam), Moons, 32-unit MLPs with seeds 0..K-1 and the same batch
order: K separate plain-PyTorch trainings in a row versus one vmapped training of the stacked
parameters (Adam is element-wise, so the stacked update is the same arithmetic per model). Reports both
wall times and the largest weight difference. Not a unit test; not used by the grids (see docs/appendix.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, stack_module_state


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))


def batches(n: int, batch_size: int, epochs: int):
    rng = torch.Generator().manual_seed(123)
    for _ in range(epochs):
        order = torch.randperm(n, generator=rng)
        for i in range(0, n, batch_size):
            yield order[i:i + batch_size]


def separate(x, y, seeds, epochs, batch_size) -> tuple[list[dict], float]:
    started = time.perf_counter()
    states = []
    for seed in seeds:
        model = make_model(seed)
        optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
        for index in batches(len(x), batch_size, epochs):
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x[index]), y[index]).backward()
            optimiser.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states, time.perf_counter() - started


def batched(x, y, seeds, epochs, batch_size) -> tuple[list[dict], float]:
    started = time.perf_counter()
    models = [make_model(seed) for seed in seeds]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    leaves = [p.requires_grad_() for p in params.values()]
    optimiser = torch.optim.Adam(leaves, lr=1e-3)

    def loss_one(p, b, xb, yb):
        return nn.functional.cross_entropy(functional_call(base, (p, b), (xb,)), yb)

    losses = torch.vmap(loss_one, in_dims=(0, 0, None, None))
    for index in batches(len(x), batch_size, epochs):
        optimiser.zero_grad()
        losses(params, buffers, x[index], y[index]).sum().backward()  # models' terms are independent
        optimiser.step()
    states = [{k: v[i].detach().clone() for k, v in params.items()} for i in range(len(seeds))]
    return states, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "batched_models.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from datamodules import get_datamodule_class

    dm = get_datamodule_class("moons")(batch_size=args.batch_size)
    dm.setup("fit")
    x, y = dm.x_train.float(), dm.y_train.long()
    seeds = list(range(args.models))
    one, t_separate = separate(x, y, seeds, args.epochs, args.batch_size)
    many, t_batched = batched(x, y, seeds, args.epochs, args.batch_size)
    diff = max(float((a[k] - b[k]).abs().max()) for a, b in zip(one, many) for k in a)
    equal = all(torch.equal(a[k], b[k]) for a, b in zip(one, many) for k in a)
    result = {"models": args.models, "epochs": args.epochs, "n_train": len(x), "batch_size": args.batch_size,
              "threads": 1, "separate_seconds": t_separate, "batched_seconds": t_batched,
              "speedup": t_separate / t_batched, "max_weight_difference": diff, "bit_identical": equal,
              "load_average": os.getloadavg(), "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
