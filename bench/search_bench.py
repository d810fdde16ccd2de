"""Section 1: throughput of the batched ECCo search against a per-instance loop and bare passes.

A *counterfactual step* is one SGD step of one row; a search of ``n`` rows takes
``sum(result.steps)`` of them. Three ways to do the same work are timed:

* ``batched``: :func:`ct_lightning.generators.search.search_counterfactuals` on the whole pool;
* ``loop``: the same function called once per factual (the reference/DiCE design), timed on
  the first ``loop_subset`` factuals of the pool and extrapolated per instance;
* ``bare``: only the forward and backward passes of the model w.r.t. its inputs that the
  batched search performs (same number of passes, same active-row shapes: the search runs one
  pass over every row still active at each step), with the plain cross-entropy loss: the
  limit a search cannot beat.

Two modes: ``converging`` (the data set's τ, rows stop when they reach it) and ``fixed-T``
(τ = 1.0, unreachable in practice, so every row takes all T steps: a clean ratio).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.common import Clock, median, sync
from ct_lightning.generators import make_generator
from ct_lightning.constraints import Constraints
from ct_lightning.generators.search import search_counterfactuals
from ct_lightning.training.pool import random_targets

MAX_STEPS = 30
EPSILON = 0.3


def draw_pool(datamodule, model, n: int, seed: int, device: torch.device):
    """``n`` training factuals (without replacement when possible) and random targets ≠ prediction."""
    rng = torch.Generator().manual_seed(seed)
    n_train = len(datamodule.y_train)
    index = torch.randperm(n_train, generator=rng)[:n] if n <= n_train else torch.randint(n_train, (n,), generator=rng)
    x = datamodule.x_train[index].to(device)
    with torch.no_grad():
        predicted = model(x).argmax(1)
    return x, random_targets(predicted, datamodule.n_classes, rng)


def trained_pool(name: str, n: int = 1000, device: torch.device = torch.device("cpu")):
    """The set-up of the search benchmarks at pool ``n``: data set ``name``, the paper's MLP trained briefly
    (:func:`bench.common.train_vanilla`, in eval mode), ``n`` factuals with random targets (:func:`draw_pool`,
    seed 1000) and the domain at 3 standard deviations: ``(datamodule, model, x, target, lower, upper)``."""
    from bench.common import load_datamodule, train_vanilla

    datamodule = load_datamodule(name)
    model, _ = train_vanilla(datamodule, device=device)
    model.eval()
    x, target = draw_pool(datamodule, model, n, seed=1000, device=device)
    lower, upper = datamodule.domain(3.0)
    return datamodule, model, x, target, lower, upper


def ecco_modes(name: str, n: int = 1000):
    """The set-up of :func:`trained_pool` with ECCo, and its two modes: ``(model, x, target, generator, modes)``, each
    mode ``(name, tau, search keyword arguments)``: ``fixed-T`` (τ = 1, every row takes every step) and ``converging``
    (the data set's τ)."""
    datamodule, model, x, target, lower, upper = trained_pool(name, n)
    modes = [(mode, tau, dict(tau=tau, max_steps=MAX_STEPS, epsilon=EPSILON, lower=lower, upper=upper))
             for mode, tau in (("fixed-T", 1.0), ("converging", float(datamodule.ct_defaults.get("tau", 0.75))))]
    return model, x, target, make_generator("ecco"), modes


def pass_schedule(steps: torch.Tensor, max_steps: int) -> list[int]:
    """Rows in the forward+backward pass of each search iteration: at iteration ``s`` every row with
    ``steps >= s`` is still active (it stops at the iteration where it converges)."""
    counts = torch.bincount(steps.cpu(), minlength=max_steps + 1)
    alive = counts.flip(0).cumsum(0).flip(0)  # alive[s] = #(steps >= s)
    return [int(v) for v in alive[:max_steps] if v > 0]


def bare_passes(model, x: torch.Tensor, target: torch.Tensor, schedule: list[int]) -> None:
    """One forward+backward pass w.r.t. the inputs per entry of ``schedule``, on its first rows."""
    with torch.inference_mode(False), torch.enable_grad():
        for rows_n in schedule:
            rows = x[:rows_n].detach().requires_grad_(True)
            loss = F.cross_entropy(model(rows), target[:rows_n], reduction="sum")
            torch.autograd.grad(loss, rows)


def _anatomy_variant(model, x, target, generator, limits, level: int, steps: int, tau: float = 1.0) -> None:
    """A full-shape search loop (no freezing) with the parts of a search step up to ``level``:
    0 bare passes, 1 + ECCo penalty in the loss, 2 + SGD step, gradient mask and projection,
    3 + convergence check and nascent tracking (as the search does it on this device)."""
    rows, nascent = x, x.clone()
    nascent_steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
    inside = torch.ones(len(x), dtype=torch.bool, device=x.device)
    with torch.inference_mode(False), torch.enable_grad():
        for step in range(steps):
            rows = rows.detach().requires_grad_(True)
            logits = model(rows)
            loss = F.cross_entropy(logits, target, reduction="sum")
            if level >= 1:
                loss = loss + generator.penalty(rows, x, logits, target, step, steps).sum()
            (grad,) = torch.autograd.grad(loss, rows)
            previous = rows.detach()
            if level >= 2:
                rows = limits.step(previous, grad, generator.lr, x)
            if level >= 3:
                done = logits.detach().softmax(1).gather(1, target[:, None]).squeeze(1) >= tau
                int(done.sum())
                moved_inside = torch.sub(rows, x).abs_().amax(1) <= EPSILON
                leaving = inside & ~moved_inside & ~done
                if x.device.type == "cpu":
                    chosen = leaving.nonzero().squeeze(1)
                    if chosen.numel():
                        nascent.index_copy_(0, chosen, previous.index_select(0, chosen))
                        nascent_steps.index_fill_(0, chosen, step)
                else:
                    nascent = torch.where(leaving[:, None], previous, nascent)
                    nascent_steps = nascent_steps.masked_fill(leaving, step)
                inside = moved_inside


ANATOMY_LEVELS = ["bare forward+backward", "+ ECCo penalty in the loss", "+ SGD step, mask, projection",
                  "+ convergence check, nascent tracking"]


def run_search_section(datamodule, model, pools: list[int], repeats: int, loop_subset: int,
                       device: torch.device, anatomy_pool: int | None, log=print) -> dict:
    """All measurements of section 1 for one data set and a briefly trained ``model``."""
    generator = make_generator("ecco")
    lower, upper = (b.to(device) for b in datamodule.domain(3.0))
    tau_data = float(datamodule.ct_defaults.get("tau", 0.75))
    kwargs = dict(max_steps=MAX_STEPS, epsilon=EPSILON, mutability=None, lower=lower, upper=upper)
    rows, anatomy = [], None
    for n in pools:
        x, target = draw_pool(datamodule, model, n, seed=n, device=device)
        for mode, tau in (("converging", tau_data), ("fixed-T", 1.0)):
            result = search_counterfactuals(model, x, target, generator, tau=tau, **kwargs)  # warm-up, schedule
            schedule = pass_schedule(result.steps, MAX_STEPS)
            bare_passes(model, x, target, schedule)
            search_times, bare_times = [], []
            for _ in range(repeats):  # interleaved, so that load drift hits both alike
                sync(device)
                clock = Clock()
                search_counterfactuals(model, x, target, generator, tau=tau, **kwargs)
                sync(device)
                search_times.append(clock.read())
                clock = Clock()
                bare_passes(model, x, target, schedule)
                sync(device)
                bare_times.append(clock.read())
            k = min(n, loop_subset)
            loop_steps = 0
            sync(device)
            clock = Clock()
            for i in range(k):
                alone = search_counterfactuals(model, x[i:i + 1], target[i:i + 1], generator, tau=tau, **kwargs)
                loop_steps += int(alone.steps.sum())
            sync(device)
            loop_wall, loop_cpu = clock.read()
            steps_total = int(result.steps.sum())
            search_wall, search_cpu = median(t[0] for t in search_times), median(t[1] for t in search_times)
            bare_wall, bare_cpu = median(t[0] for t in bare_times), median(t[1] for t in bare_times)
            loop_extrapolated = loop_wall / k * n
            row = {
                "pool": n, "mode": mode, "tau": tau, "cf_steps": steps_total,
                "passes": sum(schedule), "iterations": len(schedule),
                "converged": float(result.converged.float().mean()),
                "search_s": search_wall, "search_cpu_s": search_cpu, "search_all_s": [t[0] for t in search_times],
                "bare_s": bare_wall, "bare_cpu_s": bare_cpu, "bare_all_s": [t[0] for t in bare_times],
                "ratio_bare": search_wall / bare_wall, "ratio_bare_cpu": search_cpu / bare_cpu,
                "loop_instances": k, "loop_s": loop_wall, "loop_cpu_s": loop_cpu,
                "loop_s_per_instance": loop_wall / k, "loop_extrapolated_s": loop_extrapolated,
                "loop_extrapolated": k < n,
                "loop_steps_match": loop_steps == int(result.steps[:k].sum()), "loop_cf_steps": loop_steps,
                "speedup_loop": loop_extrapolated / search_wall,
                "speedup_loop_cpu": (loop_cpu / k * n) / search_cpu,
                "throughput_batched": steps_total / search_wall,
                "throughput_bare": steps_total / bare_wall,
                "throughput_loop": loop_steps / loop_wall,
            }
            rows.append(row)
            log(f"  pool {n:>6} {mode:<10} steps {steps_total:>7}  batched {search_wall * 1e3:8.1f} ms  "
                f"bare {bare_wall * 1e3:8.1f} ms (×{row['ratio_bare']:.2f})  loop {loop_extrapolated:8.2f} s "
                f"(×{row['speedup_loop']:.0f} slower, {k} timed)")
    if anatomy_pool:
        anatomy = run_anatomy(datamodule, model, anatomy_pool, repeats, device, generator, lower, upper, log)
    return {"tau": tau_data, "rows": rows, "anatomy": anatomy}


def run_anatomy(datamodule, model, n: int, repeats: int, device, generator, lower, upper, log=print) -> dict:
    """Cost of each part of a search step (fixed T, every row active), built up level by level.

    Measured in CPU time of this process (with one thread: the work done, without the time spent
    waiting for a core on a shared machine), median of ``repeats`` interleaved rounds."""
    x, target = draw_pool(datamodule, model, n, seed=n, device=device)
    limits = Constraints(None, lower, upper, device)
    times: dict[str, list] = {name: [] for name in ANATOMY_LEVELS + ["search_counterfactuals (τ = 1)"]}
    for repeat in range(repeats + 1):
        for level, name in enumerate(ANATOMY_LEVELS):
            sync(device)
            clock = Clock()
            _anatomy_variant(model, x, target, generator, limits, level, MAX_STEPS)
            sync(device)
            if repeat:
                times[name].append(clock.read()[1])
        clock = Clock()
        search_counterfactuals(model, x, target, generator, tau=1.0, max_steps=MAX_STEPS, epsilon=EPSILON,
                               lower=lower, upper=upper)
        sync(device)
        if repeat:
            times["search_counterfactuals (τ = 1)"].append(clock.read()[1])
    per_step = {name: median(values) / MAX_STEPS for name, values in times.items()}
    log("  anatomy (pool %d, per step): " % n + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in per_step.items()))
    return {"pool": n, "steps": MAX_STEPS, "per_step_s": per_step}


def load_search_module(path: str):
    """Import another version of ``search.py`` (e.g. ``git show REV:ct_lightning/search.py > old.py``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_search", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_ab(datamodule, model, baseline, pool: int, repeats: int, device, log=print) -> list[dict]:
    """The current search against ``baseline.search_counterfactuals`` on the same pool, interleaved;
    CPU time (wall on CUDA), median of ``repeats``; also checks that every output is identical."""
    generator = make_generator("ecco")
    lower, upper = (b.to(device) for b in datamodule.domain(3.0))
    x, target = draw_pool(datamodule, model, pool, seed=pool, device=device)
    rows = []
    for mode, tau in (("converging", float(datamodule.ct_defaults.get("tau", 0.75))), ("fixed-T", 1.0)):
        kwargs = dict(tau=tau, max_steps=MAX_STEPS, epsilon=EPSILON, lower=lower, upper=upper)
        old = baseline.search_counterfactuals(model, x, target, generator, **kwargs)
        new = search_counterfactuals(model, x, target, generator, **kwargs)
        identical = all(torch.equal(getattr(old, f), getattr(new, f))
                        for f in ("counterfactual", "nascent", "converged", "steps", "nascent_steps"))
        times = {"baseline": [], "current": []}
        for _ in range(repeats):
            for key, search in (("baseline", baseline.search_counterfactuals), ("current", search_counterfactuals)):
                sync(device)
                clock = Clock()
                search(model, x, target, generator, **kwargs)
                sync(device)
                wall, cpu = clock.read()
                times[key].append(wall if device.type == "cuda" else cpu)
        row = {"pool": pool, "mode": mode, "baseline_s": median(times["baseline"]),
               "current_s": median(times["current"]), "identical": identical}
        row["speedup"] = row["baseline_s"] / row["current_s"]
        rows.append(row)
        log(f"  A/B pool {pool} {mode:<10}: baseline {row['baseline_s'] * 1e3:8.1f} ms  current "
            f"{row['current_s'] * 1e3:8.1f} ms  ×{row['speedup']:.2f}  identical outputs: {identical}")
    return rows
