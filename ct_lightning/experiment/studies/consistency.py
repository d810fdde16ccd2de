"""Counterfactual consistency: the RS/LOO experiment around the invalidation rate (Black et al., Def. 2).

The invalidation rate (:func:`ct_lightning.metrics.functional.invalidation_rate`) of a counterfactual ``x_c`` found on a base model ``θ`` is the share of related
models ``θ'`` (retrained with another random seed, RS, or with one training point left out, LOO)
whose prediction at ``x_c`` differs from the base model's: ``IV = E_θ' 1[F(x_c; θ') ≠ F(x_c; θ)]``.

:func:`run_consistency` trains a base model and ``n_models`` related ones per model kind (BL: the
vanilla objective, CT: the full objective), generates counterfactuals on each base model for test
factuals with random targets, refines them with Stable Neighbor Search, and reports the
invalidation rate and cost (ℓ1, ℓ2) of the valid ones with and without SNS.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field

import lightning as L
import numpy as np
import torch

from ct_lightning.experiment.configuration.data import build_datamodule
from ct_lightning.experiment.configuration.settings import resolve_config
from ct_lightning.experiment.runs.train import build_module
from ct_lightning.generators import (FitContext, generate_counterfactuals, make_generator, prepare_standalone,
                                     stable_neighbor_search)
from ct_lightning.metrics.functional import invalidation_rate
from ct_lightning.training.pool import random_targets

KINDS = {"BL": "vanilla", "CT": "full"}
MODES = ("rs", "loo")


# ------------------------------------------------------------------------------ the experiment
@dataclass
class ConsistencyConfig:
    """Settings of the RS/LOO experiment; training settings not listed come from ``experiment.settings.DEFAULTS``.

    ``train`` holds extra :func:`ct_lightning.experiment.configuration.settings.resolve_config` overrides (e.g. ``nce``,
    ``batch_size``, ``limit_train_batches``, ``data_dir``, ``mutability``). Counterfactuals: ``generator``
    (``ecco`` by default, evaluation settings of SPEC Note 2 with one ``λ_egy``) on
    ``n_counterfactuals`` test factuals; SNS with ``sns_delta``, ``sns_steps``, ``sns_lr``, ``sns_n_grid``.
    """

    data: str = "moons"
    mode: str = "rs"
    n_models: int = 5
    kinds: tuple[str, ...] = ("BL", "CT")
    max_epochs: int = 10
    seed: int = 0
    n_counterfactuals: int = 100
    generator: str = "ecco"
    lambda_cost: float = 0.001
    lambda_energy: float = 5.0
    search_lr: float = 0.25
    tau: float = 0.95
    max_steps: int = 50
    sns_delta: float = 0.5
    sns_steps: int = 50
    sns_lr: float | None = None
    sns_n_grid: int = 10
    accelerator: str = "cpu"
    train: dict = field(default_factory=dict)

    def __post_init__(self):
        self.mode = self.mode.lower()
        self.kinds = tuple(k.upper() for k in self.kinds)
        if self.mode not in MODES:
            raise ValueError(f"mode: unknown {self.mode!r}; allowed: {', '.join(MODES)}")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds: unknown {unknown}; allowed: {', '.join(KINDS)}")
        if self.n_models < 1 or self.n_counterfactuals < 1:
            raise ValueError("n_models and n_counterfactuals: must be at least 1")


def _training_config(config: ConsistencyConfig, kind: str, seed: int) -> dict:
    overrides = {**config.train, "data": config.data, "objective": KINDS[kind], "max_epochs": config.max_epochs,
                 "seed": seed, "accelerator": config.accelerator, "progress": False}
    return resolve_config(overrides)


def train_related_model(training_config: dict, datamodule, exclude: int | None = None):
    """Train one ``CTModule`` as configured on ``datamodule`` (minus training row ``exclude``), without logging."""
    L.seed_everything(training_config["seed"], workers=True, verbose=False)
    dm = copy.copy(datamodule)
    dm.seed = training_config["seed"]
    if exclude is not None:
        keep = torch.ones(len(dm.y_train), dtype=torch.bool)
        keep[exclude] = False
        dm.x_train, dm.y_train = dm.x_train[keep], dm.y_train[keep]
    module = build_module(training_config, dm)
    limits = {k: training_config[k] for k in ("limit_train_batches",) if training_config.get(k) is not None}
    trainer = L.Trainer(max_epochs=training_config["max_epochs"], accelerator=training_config["accelerator"],
                        devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, **limits)
    trainer.fit(module, datamodule=dm)
    return module.eval()


def _generator_for(config: ConsistencyConfig, module, datamodule):
    generator = make_generator(config.generator, config.lambda_cost, config.lambda_energy, config.search_lr)
    context = FitContext(model=module.model, x_train=module.x_train, y_train=module.y_train,
                         n_classes=datamodule.n_classes, feature_names=list(datamodule.feature_names),
                         mutability=module.mutability, lower=module.lower, upper=module.upper,
                         name=getattr(datamodule, "name", "data"), feature_types=getattr(module, "feature_types", None))
    return prepare_standalone(generator, context)


def base_counterfactuals(config: ConsistencyConfig, module, datamodule) -> dict[str, dict]:
    """Counterfactuals of test factuals on the base model, without and with SNS.

    Returns ``{name: {"counterfactual", "valid", "target", "factual"}}`` for ``name`` in
    ``(generator, generator+sns)``; validity is judged by the base model.
    """
    model = module.model.eval()
    rng = torch.Generator().manual_seed(config.seed + 17)
    n_test = len(datamodule.y_test)
    index = torch.randperm(n_test, generator=rng)[:config.n_counterfactuals] if config.n_counterfactuals <= n_test \
        else torch.randint(n_test, (config.n_counterfactuals,), generator=rng)
    factuals = datamodule.x_test[index].to(module.device)
    with torch.no_grad():
        predicted = model(factuals).argmax(1)
    target = random_targets(predicted, datamodule.n_classes, rng)
    generator = _generator_for(config, module, datamodule)
    types = getattr(module, "feature_types", None)
    result = generate_counterfactuals(generator, model, factuals, target, config.tau, config.max_steps, 0.0,
                                      module.mutability, module.lower, module.upper, types)
    refined = stable_neighbor_search(model, result.counterfactual, target, config.sns_delta, config.sns_steps,
                                     config.sns_lr, config.sns_n_grid, module.mutability, module.lower, module.upper,
                                     feature_types=types)
    out = {}
    for name, x_cf in ((config.generator, result.counterfactual), (f"{config.generator}+sns", refined)):
        with torch.no_grad():
            valid = model(x_cf).argmax(1) == target
        out[name] = {"counterfactual": x_cf.detach(), "valid": valid, "target": target, "factual": factuals}
    return out


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return float(np.mean(finite)), float(np.std(finite))


def run_consistency(config: ConsistencyConfig, log=print) -> dict:
    """Run the RS or LOO experiment for every model kind; returns a JSON-ready summary.

    Summary keys: ``invalidation_rate[kind][generator]`` (mean over related models),
    ``invalidation_rate_std``, ``cost[kind][generator]`` (``l1``, ``l2`` means over valid
    counterfactuals), ``validity``, ``n_valid``, ``accuracy`` (base and related models, test split),
    ``seconds`` (training and evaluation per kind) and the configuration.
    """
    started = time.perf_counter()
    first = _training_config(config, config.kinds[0], config.seed)
    datamodule = build_datamodule(first)
    summary: dict = {"data": first["data"], "mode": config.mode, "n_models": config.n_models,
                     "config": asdict(config), "invalidation_rate": {}, "invalidation_rate_std": {}, "cost": {},
                     "validity": {}, "n_valid": {}, "accuracy": {}, "seconds": {}}
    rng = np.random.default_rng(config.seed)
    excluded = rng.choice(len(datamodule.y_train), size=config.n_models, replace=config.n_models > len(datamodule.y_train))
    summary["excluded_rows"] = [int(i) for i in excluded] if config.mode == "loo" else []
    x_test, y_test = datamodule.x_test, datamodule.y_test
    for kind in config.kinds:
        kind_started = time.perf_counter()
        base = train_related_model(_training_config(config, kind, config.seed), datamodule)
        cfs = base_counterfactuals(config, base, datamodule)
        related, accuracies = [], []
        for k in range(config.n_models):
            if config.mode == "rs":
                model = train_related_model(_training_config(config, kind, config.seed + 1 + k), datamodule)
            else:
                model = train_related_model(_training_config(config, kind, config.seed), datamodule, int(excluded[k]))
            related.append(model.model)
            with torch.no_grad():
                accuracies.append(float((model.model(x_test).argmax(1) == y_test).float().mean()))
            log(f"[{kind}] related model {k + 1}/{config.n_models} trained ({config.mode})")
        with torch.no_grad():
            base_acc = float((base.model(x_test).argmax(1) == y_test).float().mean())
        summary["accuracy"][kind] = {"base": base_acc, "related_mean": float(np.mean(accuracies))}
        for key in ("invalidation_rate", "invalidation_rate_std", "cost", "validity", "n_valid"):
            summary[key][kind] = {}
        for name, entry in cfs.items():
            x_cf, valid = entry["counterfactual"], entry["valid"]
            with torch.no_grad():
                base_pred = base.model(x_cf).argmax(1)
                predictions = torch.stack([model(x_cf).argmax(1) for model in related])
            per_model = invalidation_rate(base_pred, predictions, valid, reduction="per_model")
            mean, std = _mean_std(per_model.tolist()) if int(valid.sum()) else (None, None)
            delta = (x_cf - entry["factual"])[valid]
            summary["invalidation_rate"][kind][name] = mean
            summary["invalidation_rate_std"][kind][name] = std
            summary["cost"][kind][name] = {"l1": float(delta.abs().sum(1).mean()) if len(delta) else None,
                                           "l2": float(delta.norm(dim=1).mean()) if len(delta) else None}
            summary["validity"][kind][name] = float(valid.float().mean())
            summary["n_valid"][kind][name] = int(valid.sum())
        summary["seconds"][kind] = time.perf_counter() - kind_started
        log(f"[{kind}] invalidation rate: {summary['invalidation_rate'][kind]}")
    summary["seconds"]["total"] = time.perf_counter() - started
    return summary


def flat_metrics(summary: dict) -> dict[str, float]:
    """MLflow-ready metrics of a summary: ``ir/KIND/GEN``, ``ir_std/...``, ``cost_l1/...``, ``cost_l2/...``,
    ``validity/...``, ``acc/KIND/base``, ``seconds/KIND`` (``+`` in generator names becomes ``_``)."""
    out: dict[str, float] = {}

    def put(key: str, value) -> None:
        if value is not None and math.isfinite(float(value)):
            out[key.replace("+", "_")] = float(value)

    for kind, per_gen in summary["invalidation_rate"].items():
        for gen, value in per_gen.items():
            put(f"ir/{kind}/{gen}", value)
            put(f"ir_std/{kind}/{gen}", summary["invalidation_rate_std"][kind][gen])
            put(f"cost_l1/{kind}/{gen}", summary["cost"][kind][gen]["l1"])
            put(f"cost_l2/{kind}/{gen}", summary["cost"][kind][gen]["l2"])
            put(f"validity/{kind}/{gen}", summary["validity"][kind][gen])
        put(f"acc/{kind}/base", summary["accuracy"][kind]["base"])
        put(f"acc/{kind}/related_mean", summary["accuracy"][kind]["related_mean"])
    for key, value in summary["seconds"].items():
        put(f"seconds/{key}", value)
    return out
