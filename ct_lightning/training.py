"""One training run from a flat configuration: data, CTModule, Trainer, MLflow, summary."""

from __future__ import annotations

import inspect
import math
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger

from ct_lightning.callbacks import BurnIn
from ct_lightning.constraints import MUTABILITY_KINDS, parse_mutability
from ct_lightning.module import CTModule
from ct_lightning.tracking import (DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI, local_store_dir, prepare_store, run_url, ui_command,
                                   write_json_atomic)

# SPEC §4 (Note 1): defaults shared by all data sets; Table 2 values override per data set.
DEFAULTS = {
    "data": "circles", "objective": "full", "generator": "ecco", "max_epochs": 100, "seed": 0,
    "nce": 1000, "burnin": 0.0, "immutable": [], "protect": False, "mutability": "",
    "lambda_clf": 1.0, "lambda_div": 0.5, "lambda_reg": 0.1, "lambda_adv": 0.25,
    "lambda_cost": 0.001, "lambda_energy": 5.0, "search_lr": 0.25, "max_steps": 30, "tau": 0.75,
    "epsilon": 0.3, "pool": "epoch", "domain": True, "domain_std": 3.0,
    "hidden_sizes": [32], "activation": "relu", "lr": 1e-3, "batch_size": None, "data_dir": None,
    "tracking_uri": DEFAULT_TRACKING_URI, "experiment": DEFAULT_EXPERIMENT, "run_name": None,
    "checkpoint_dir": None, "summary_json": None, "accelerator": "auto", "progress": True,
    "limit_train_batches": None, "limit_val_batches": None, "fast_dev_run": False,
}
DATA_DEFAULT_KEYS = ("tau", "nce", "lambda_reg")


def resolve_config(overrides: dict) -> dict:
    """Fill a configuration: explicit values win, then the data set's Table 2 values, then SPEC defaults."""
    from datamodules import canonical_name, get_datamodule_class

    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}; allowed: {', '.join(sorted(DEFAULTS))}")
    given = {k: v for k, v in overrides.items() if v is not None}
    data = canonical_name(given.get("data", DEFAULTS["data"]))
    datamodule_class = get_datamodule_class(data)
    config = {**DEFAULTS, **{k: v for k, v in datamodule_class.ct_defaults.items() if k in DATA_DEFAULT_KEYS},
              **given, "data": data}
    config["batch_size"] = config["batch_size"] or datamodule_class.default_batch_size
    if isinstance(config["immutable"], str):
        config["immutable"] = [f.strip() for f in config["immutable"].split(",") if f.strip()]
    return config


def build_datamodule(config: dict):
    """Instantiate and set up the configured data module."""
    from datamodules import get_datamodule_class

    cls = get_datamodule_class(config["data"])
    kwargs = {"batch_size": config["batch_size"], "seed": config["seed"]}
    if config.get("data_dir") and "data_dir" in inspect.signature(cls.__init__).parameters:
        kwargs["data_dir"] = config["data_dir"]
    datamodule = cls(**kwargs)
    datamodule.setup("fit")
    return datamodule


def mutability_spec(config: dict, datamodule) -> dict[str, str]:
    """Merge ``mutability``, ``immutable`` and ``protect`` into one ``{feature: kind}`` mapping, validated."""
    spec: dict[str, str] = {}
    if config["mutability"]:
        for item in str(config["mutability"]).split(","):
            if "=" not in item:
                raise ValueError(f"mutability: expected FEATURE=KIND, got {item!r} "
                                 f"(KIND one of {', '.join(MUTABILITY_KINDS)})")
            name, kind = item.rsplit("=", 1)
            spec[name.strip()] = kind.strip()
    features = list(config["immutable"]) + (list(datamodule.protected) if config["protect"] else [])
    spec.update({feature: "none" for feature in features})
    parse_mutability(spec, datamodule.n_features, datamodule.feature_names, argument="mutability/immutable")
    return spec


def build_module(config: dict, datamodule) -> CTModule:
    """A ``CTModule`` with the default MLP for the configured data set."""
    return CTModule(
        n_features=datamodule.n_features, n_classes=datamodule.n_classes,
        hidden_sizes=list(config["hidden_sizes"]), activation=config["activation"],
        objective=config["objective"], lambda_clf=config["lambda_clf"], lambda_div=config["lambda_div"],
        lambda_reg=config["lambda_reg"], lambda_adv=config["lambda_adv"], generator=config["generator"],
        lambda_cost=config["lambda_cost"], lambda_energy=config["lambda_energy"],
        search_lr=config["search_lr"], max_steps=config["max_steps"], tau=config["tau"],
        epsilon=config["epsilon"], nce=config["nce"], pool=config["pool"],
        mutability=mutability_spec(config, datamodule) or None, feature_names=list(datamodule.feature_names),
        domain="infer" if config["domain"] else None, domain_std=config["domain_std"], lr=config["lr"],
        seed=config["seed"])


def _scalar_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        out[key] = value if math.isfinite(value) else None
    return out


def train(overrides: dict) -> dict:
    """Train one model as configured, track it in MLflow and return the run summary."""
    config = resolve_config(overrides)
    L.seed_everything(config["seed"], workers=True, verbose=False)
    datamodule = build_datamodule(config)
    module = build_module(config, datamodule)

    artifact_location = prepare_store(config["tracking_uri"])
    logger = MLFlowLogger(experiment_name=config["experiment"], run_name=config["run_name"],
                          tracking_uri=config["tracking_uri"], artifact_location=artifact_location)
    run_id, experiment_id = logger.run_id, logger.experiment_id
    # Lightning logs the module's hyperparameters itself; add the run-level settings it lacks.
    logger.log_hyperparams({k: v for k, v in config.items() if k not in module.hparams and k != "summary_json"})
    checkpoint_dir = Path(config["checkpoint_dir"] or local_store_dir(config["tracking_uri"]) / "checkpoints" / run_id)
    checkpoint = ModelCheckpoint(dirpath=checkpoint_dir, filename="best", monitor="val/acc", mode="max",
                                 save_top_k=1, save_last=True)
    trainer_kwargs = {k: config[k] for k in ("limit_train_batches", "limit_val_batches") if config[k] is not None}
    trainer = L.Trainer(max_epochs=config["max_epochs"], accelerator=config["accelerator"], logger=logger,
                        callbacks=[checkpoint, BurnIn(config["burnin"])], deterministic=False,
                        enable_progress_bar=config["progress"], enable_model_summary=config["progress"],
                        fast_dev_run=config["fast_dev_run"], log_every_n_steps=1, **trainer_kwargs)
    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    fit_seconds = time.perf_counter() - started
    metrics = _scalar_metrics(trainer.callback_metrics)
    trainer.test(module, datamodule=datamodule, verbose=False)
    metrics.update(_scalar_metrics(trainer.callback_metrics))
    metrics["fit_seconds"] = fit_seconds

    summary = {
        "run_id": run_id, "experiment_id": experiment_id, "tracking_uri": config["tracking_uri"],
        "config": config, "data": datamodule.summary(), "metrics": metrics,
        "checkpoints": {"last": checkpoint.last_model_path or None, "best": checkpoint.best_model_path or None},
    }
    client = logger.experiment
    client.log_metric(run_id, "fit_seconds", fit_seconds)
    for path in {checkpoint.last_model_path, checkpoint.best_model_path} - {""}:
        client.log_artifact(run_id, path, artifact_path="checkpoints")
    config_path = checkpoint_dir / "config.json"
    write_json_atomic(config_path, config)
    client.log_artifact(run_id, str(config_path))
    if config["summary_json"]:
        write_json_atomic(config["summary_json"], summary)
    return summary


def announce(summary: dict) -> str:
    """Human-readable lines naming the run and how to look at it."""
    return "\n".join([
        f"MLflow run id: {summary['run_id']}",
        f"Open the MLflow UI:  {ui_command(summary['tracking_uri'])}",
        f"then browse to {run_url(summary['experiment_id'], summary['run_id'])}",
    ])
