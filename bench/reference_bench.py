"""Section ``reference``: our vanilla and CT epochs against a plain-PyTorch loop (issue 13).

The plain loop is what a user would write by hand: the same model (built by
``ct_lightning.models.build_model`` from the same seed), the same batch size, Adam with the
same learning rate, the same data order (``torch.randperm`` from a generator seeded like the
data module's, which is what ``DataLoader(shuffle=True, generator=...)`` draws), and a forward
pass over the validation split each epoch. Our epochs are measured as users run them: a
``train()`` run of ``ct_lightning.experiment.runs.train`` with validation, both checkpoint callbacks
and MLflow logging into a temporary SQLite store. The three are interleaved (plain, vanilla,
full, plain, ...) so that a change in the machine's load hits all of them alike; an epoch is
timed from one ``on_train_epoch_start`` to the next (the last one to ``on_train_end``), and the
first epoch of every run is a warm-up that is left out.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import Clock, median, sync
from datamodules.base import EVAL_BATCH_SIZE

# CT epoch ≤ TARGET × plain epoch (issue 13); vanilla ≤ 1.2× everywhere.
CT_TARGETS = {"circles": 1.5, "adult": 2.0, "mnist": 4.0, "mnist-cnn": 3.0}
VANILLA_TARGET = 1.2


def _settings(datamodule, overrides: dict) -> dict:
    from ct_lightning.experiment.configuration.settings import DATA_DEFAULT_KEYS, DEFAULTS

    return {**DEFAULTS, **{k: v for k, v in datamodule.ct_defaults.items() if k in DATA_DEFAULT_KEYS}, **overrides}


def _hand_written_setup(datamodule, architecture: str, device: torch.device, seed: int):
    """What both hand-written loops start from: the settings, the seeded model, Adam, and the data on ``device``."""
    from ct_lightning.models import build_model

    config = _settings(datamodule, {})
    torch.manual_seed(seed)
    model = build_model(architecture, datamodule.n_features, datamodule.n_classes,
                        list(config.get("hidden_sizes") or [32]), config.get("activation") or "relu").to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=config["lr"])
    x, y = datamodule.x_train.to(device), datamodule.y_train.to(device)
    return config, model, optimiser, x, y, datamodule.x_val.to(device)


def _validation_forward(model, x_val: torch.Tensor, batch: int) -> None:
    """The forward pass over the validation split, in the validation loader's batches."""
    model.eval()
    eval_batch = max(batch, EVAL_BATCH_SIZE)
    with torch.no_grad():
        for start in range(0, len(x_val), eval_batch):
            model(x_val[start:start + eval_batch])


def plain_epochs(datamodule, architecture: str, epochs: int, device: torch.device, seed: int = 0) -> list:
    """Wall/CPU seconds of each epoch of the hand-written loop (train + validation forward)."""
    _, model, optimiser, x, y, x_val = _hand_written_setup(datamodule, architecture, device, seed)
    batch = datamodule.batch_size
    generator = torch.Generator().manual_seed(datamodule.seed)
    times = []
    for _ in range(epochs):
        sync(device)
        clock = Clock()
        model.train()
        order = torch.randperm(len(y), generator=generator).to(device)
        for start in range(0, len(y), batch):
            index = order[start:start + batch]
            optimiser.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimiser.step()
        _validation_forward(model, x_val, batch)
        sync(device)
        times.append(clock.read())
    return times


def plain_ct_epochs(datamodule, architecture: str, epochs: int, device: torch.device, seed: int = 0) -> list:
    """Wall/CPU seconds of each epoch of a hand-written CT loop doing a ``train()`` CT epoch's work, without
    Lightning: the paper-default pool (nce factuals, random targets, x⁺, the library's batched search), then per
    batch one forward over [x, x⁺, x', x'_tε] of the batch's share of the pool, Eq. 2's loss, backward and Adam;
    then the validation forward. The limit of our CT epoch on this machine (issue 13's rule: the limit for an
    epoch is a plain loop doing the same work)."""
    from ct_lightning.constraints import resolve_domain
    from ct_lightning.generators import make_generator
    from ct_lightning.generators.search import search_counterfactuals
    from ct_lightning.losses import adversarial_loss, energy_terms
    from ct_lightning.training.pool import ClassSampler, chunk_bounds, random_targets

    config, model, optimiser, x, y, x_val = _hand_written_setup(datamodule, architecture, device, seed)
    lower, upper = resolve_domain("infer", datamodule.x_train, config["domain_std"], datamodule)
    lower, upper = lower.to(device), upper.to(device)
    search = make_generator(config["generator"], config["lambda_cost"], config["lambda_energy"], config["search_lr"])
    sampler = ClassSampler(datamodule.y_train, datamodule.n_classes)
    batch, nce, n_classes = datamodule.batch_size, config["nce"], datamodule.n_classes
    n_batches = -(-len(y) // batch)
    generator, rng = torch.Generator().manual_seed(datamodule.seed), torch.Generator().manual_seed(seed)
    times = []
    for _ in range(epochs):
        sync(device)
        clock = Clock()
        index = torch.randperm(len(y), generator=rng)[:nce].to(device)
        factuals, labels = x[index], y[index]
        model.eval()
        with torch.no_grad():
            target = random_targets(model(factuals).argmax(1), n_classes, rng)
        x_pos = x[sampler.sample(target, rng).to(device)]
        result = search_counterfactuals(model, factuals, target, search, config["tau"], config["max_steps"],
                                        config["epsilon"], None, lower, upper)
        x_neg = torch.where(result.converged[:, None], result.counterfactual, x_pos)
        bounds = chunk_bounds(len(index), n_batches)
        model.train()
        order = torch.randperm(len(y), generator=generator).to(device)
        for step, start in enumerate(range(0, len(y), batch)):
            rows = order[start:start + batch]
            part = slice(bounds[step], bounds[step + 1])
            m = bounds[step + 1] - bounds[step]
            logits = model(torch.cat([x[rows], x_pos[part], x_neg[part], result.nascent[part]]))
            logits, logits_pos, logits_neg, logits_adv = logits.split([len(rows), m, m, m])
            div, ridge = energy_terms(logits_pos, logits_neg, target[part])
            loss = (config["lambda_clf"] * F.cross_entropy(logits, y[rows]) + config["lambda_div"] * div
                    + config["lambda_reg"] * ridge + config["lambda_adv"] * adversarial_loss(logits_adv, labels[part]))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        _validation_forward(model, x_val, batch)
        sync(device)
        times.append(clock.read())
    return times


def our_epochs(data: str, objective: str, architecture: str, epochs: int, accelerator: str, store: Path,
               seed: int = 0, epoch_loop: str = "auto", search_compile: str = "auto") -> list:
    """Wall/CPU seconds of each epoch of a ``train()`` run (validation, checkpoints, MLflow included)."""
    from bench.epoch_bench import EpochTimer
    from ct_lightning.experiment.runs.train import train

    timer = EpochTimer()
    train({"data": data, "objective": objective, "model": architecture, "max_epochs": epochs, "seed": seed,
           "accelerator": accelerator, "progress": False, "epoch_loop": epoch_loop, "search_compile": search_compile,
           "tracking_uri": f"sqlite:///{store / 'mlflow.db'}",
           "experiment": "bench-reference"}, callbacks=[timer])
    return timer.epochs


def run_reference_section(name: str, datamodule, epochs: int, repeats: int, accelerator: str,
                          architecture: str = "mlp", log=print) -> dict:
    """Plain, vanilla and full runs interleaved ``repeats`` times; medians of the epochs after warm-up."""
    from bench.common import pick_device

    device = pick_device("cuda" if accelerator in ("gpu", "cuda") else
                         "cpu" if accelerator == "cpu" else "auto")
    for logger_name in ("mlflow", "alembic"):
        logging.getLogger(logger_name).setLevel(logging.ERROR)
    # vanilla/full: as users run them (the default epoch loop, fused on one process); vanilla_lightning: the
    # same run with Lightning's per-batch loop (epoch_loop="lightning"), for what fusing the epoch saves.
    runs = {"plain": [], "vanilla": [], "full": [], "vanilla_lightning": []}
    if architecture == "mlp":  # the CNN's CT epoch takes ~50 s here; its plain CT loop would double the section
        runs["plain_ct"] = []
    # full_eager: the CT run with search_compile off, where auto compiles the search step (large pools).
    from ct_lightning.generators.compiled_step import AUTO_MIN_VALUES

    if architecture == "mlp" and _settings(datamodule, {})["nce"] * datamodule.n_features >= AUTO_MIN_VALUES:
        runs["full_eager"] = []
    with tempfile.TemporaryDirectory(prefix="ct-bench-reference-") as folder:
        store = Path(folder)
        for _ in range(repeats):
            runs["plain"].append(plain_epochs(datamodule, architecture, epochs, device))
            if "plain_ct" in runs:
                runs["plain_ct"].append(plain_ct_epochs(datamodule, architecture, epochs, device))
            for objective in ("vanilla", "full"):
                runs[objective].append(our_epochs(name, objective, architecture, epochs, accelerator, store))
            runs["vanilla_lightning"].append(our_epochs(name, "vanilla", architecture, epochs, accelerator, store,
                                                        epoch_loop="lightning"))
            if "full_eager" in runs:
                runs["full_eager"].append(our_epochs(name, "full", architecture, epochs, accelerator, store,
                                                     search_compile="off"))
    out = {"architecture": architecture, "epochs": epochs, "repeats": repeats, "batch_size": datamodule.batch_size,
           "n_train": len(datamodule.y_train), "n_val": len(datamodule.y_val)}
    for key, values in runs.items():
        measured = [e for run in values for e in run[1:]]
        out[key] = {"epoch_s": median(w for w, _ in measured), "epoch_cpu_s": median(c for _, c in measured),
                    "epochs_s": [w for w, _ in measured]}
    plain = out["plain"]
    label = name if architecture == "mlp" else f"{name}-{architecture}"
    ct_target = CT_TARGETS.get(label)
    for key, target in (("vanilla", VANILLA_TARGET), ("full", ct_target), ("vanilla_lightning", None),
                        ("full_eager", None), ("plain_ct", None)):
        if key not in out:
            continue
        ratio = out[key]["epoch_s"] / plain["epoch_s"]
        ratio_cpu = out[key]["epoch_cpu_s"] / plain["epoch_cpu_s"]
        out[key].update({"ratio": ratio, "ratio_cpu": ratio_cpu, "target": target,
                         "met": None if target is None else ratio_cpu <= target})
    log(f"  plain {plain['epoch_s']:.3f} s  vanilla {out['vanilla']['epoch_s']:.3f} s "
        f"(×{out['vanilla']['ratio']:.2f}, CPU ×{out['vanilla']['ratio_cpu']:.2f})  full {out['full']['epoch_s']:.3f} s "
        f"(×{out['full']['ratio']:.2f}, CPU ×{out['full']['ratio_cpu']:.2f})  vanilla with Lightning's "
        f"per-batch loop {out['vanilla_lightning']['epoch_s']:.3f} s (CPU ×{out['vanilla_lightning']['ratio_cpu']:.2f})"
        + (f"  full, eager search step {out['full_eager']['epoch_s']:.3f} s (CPU ×{out['full_eager']['ratio_cpu']:.2f})"
           if "full_eager" in out else "")
        + (f"  plain CT loop {out['plain_ct']['epoch_s']:.3f} s (CPU ×{out['plain_ct']['ratio_cpu']:.2f})"
           if "plain_ct" in out else ""))
    return out


def protocol_time(name: str, datamodule, device: torch.device, log=print, n_runs: int | None = None) -> dict:
    """Wall/CPU seconds of the evaluation protocol (``--protocol reference``: 100 runs × the set's individuals ×
    5 λ_egy, T = 50) for one briefly trained MLP, robust accuracy included."""
    from bench.common import train_vanilla
    from ct_lightning.evaluation.protocol import EvaluationConfig, evaluate_model, protocol_settings
    from ct_lightning.experiment.configuration.protocol_options import reference_individuals

    model, _ = train_vanilla(datamodule, epochs=1, device=device)
    settings = {**protocol_settings("reference"), **({"n_runs": n_runs} if n_runs else {})}
    config = EvaluationConfig(**settings, n_individuals=reference_individuals(name))
    lower, upper = datamodule.domain(3.0)
    sync(device)
    clock = Clock()
    evaluate_model(model, datamodule.x_test.to(device), datamodule.y_test.to(device), datamodule.n_classes, config,
                   lower=lower.to(device), upper=upper.to(device), x_train=datamodule.x_train.to(device),
                   y_train=datamodule.y_train.to(device), data_name=name)
    sync(device)
    wall, cpu = clock.read()
    out = {"data": name, "n_runs": config.n_runs, "n_individuals": config.n_individuals,
           "lambda_energies": list(config.lambda_energies), "max_steps": config.max_steps, "wall_s": wall, "cpu_s": cpu,
           "device": str(device)}
    log(f"[protocol] {name}: {config.n_runs} runs × {config.n_individuals} individuals × "
        f"{len(config.lambda_energies)} λ, T = {config.max_steps}: {wall:.1f} s (CPU {cpu:.1f} s)")
    return out
