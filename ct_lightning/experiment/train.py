"""One training run from a flat configuration: data, CTModule, Trainer, MLflow, summary."""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from ct_lightning.callbacks import BurnIn, CounterfactualEvaluation
from ct_lightning.experiment.checkpoints import infer_mlp_hidden_sizes, load_weights, read_checkpoint
from ct_lightning.experiment.data import build_datamodule, mutability_spec
from ct_lightning.experiment.preflight import preflight_training
from ct_lightning.experiment.settings import DEFAULTS, load_config_file, module_kwargs, resolve_config
from ct_lightning.experiment.tracking import local_store_dir, prepare_store, run_url, ui_command, write_json_atomic
from ct_lightning.module import CTModule


def build_module(config: dict, datamodule) -> CTModule:
    """A ``CTModule`` with the configured architecture for the configured data set."""
    return CTModule(**module_kwargs(config, datamodule.n_features, datamodule.n_classes, datamodule.feature_names,
                                    mutability_spec(config, datamodule) or None))


def _architecture_from_checkpoint(path: str, given: dict) -> tuple[dict, dict]:
    """Weights of ``path`` and the architecture settings it implies, unless given explicitly."""
    state, metadata = read_checkpoint(path)
    implied = {key: metadata[key] for key in ("hidden_sizes", "activation") if key in metadata}
    if "architecture" in metadata:
        implied["model"] = metadata["architecture"]
    if "hidden_sizes" not in implied and given.get("model", metadata.get("architecture", "mlp")) == "mlp":
        inferred = infer_mlp_hidden_sizes(state)
        if inferred is not None:
            implied["hidden_sizes"] = inferred
    return state, {k: v for k, v in implied.items() if given.get(k) is None}


def _find_resumable_run(client: MlflowClient, config: dict) -> str:
    """The run id to resume: the one given, or the newest unfinished run of the experiment."""
    if config["resume"] != "latest":
        return config["resume"]
    experiment = client.get_experiment_by_name(config["experiment"])
    runs = [] if experiment is None else client.search_runs(
        [experiment.experiment_id], "attributes.status != 'FINISHED'", order_by=["attributes.start_time DESC"],
        max_results=1)
    if not runs:
        raise ValueError(f"resume: no unfinished run in experiment {config['experiment']!r} at {config['tracking_uri']}")
    return runs[0].info.run_id


def _resume_config(overrides: dict) -> tuple[dict, str, Path]:
    """The logged configuration of the run to resume, its id and its last checkpoint."""
    base = {**DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}
    prepare_store(base["tracking_uri"])
    client = MlflowClient(tracking_uri=base["tracking_uri"])
    run_id = _find_resumable_run(client, base)
    try:
        logged = Path(client.download_artifacts(run_id, "config.json", tempfile.mkdtemp(prefix="ct-resume-")))
    except Exception as error:  # noqa: BLE001 - MLflow raises several types for a missing run/artifact
        raise ValueError(f"resume: run {run_id} has no logged config.json to resume from ({error})") from None
    config = json.loads(logged.read_text())
    # Only where output goes may change on resume; everything that shapes training stays as logged.
    for key in ("progress", "summary_json"):
        if overrides.get(key) is not None:
            config[key] = overrides[key]
    config["resume"] = run_id
    last = Path(config["checkpoint_dir"]) / "last.ckpt"
    if not last.is_file():
        raise ValueError(f"resume: run {run_id} has no checkpoint yet at {last}; start it again instead")
    return config, run_id, last


def _scalar_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        out[key] = value if math.isfinite(value) else None
    return out


def train(overrides: dict, *, callbacks: list | None = None, tags: dict | None = None) -> dict:
    """Train one model as configured, track it in MLflow and return the run summary.

    ``overrides`` may hold ``config`` (a YAML file, below the other overrides), ``from_checkpoint``
    (start from those weights: fine-tuning) and ``resume`` (a run id or ``"latest"``: continue an
    interrupted run from its last checkpoint in the same MLflow run). ``callbacks`` are added to
    the Trainer's; ``tags`` are set on the MLflow run (e.g. ``{"mlflow.parentRunId": ID}``).
    """
    overrides = preflight_training(overrides).overrides  # every check before anything is created
    given = {k: v for k, v in overrides.items() if v is not None}
    if given.get("resume"):
        config, run_id, resume_from = _resume_config(given)
    else:
        if given.get("config"):
            given = {**load_config_file(given["config"]), **given}
        weights = None
        if given.get("from_checkpoint"):
            weights, implied = _architecture_from_checkpoint(given["from_checkpoint"], given)
            given.update(implied)
        config, run_id, resume_from = resolve_config(given), None, None
    L.seed_everything(config["seed"], workers=True, verbose=False)
    datamodule = build_datamodule(config)
    module = build_module(config, datamodule)
    if resume_from is None and config.get("from_checkpoint"):
        load_weights(module.model, weights, source=f"from_checkpoint {config['from_checkpoint']}")

    artifact_location = prepare_store(config["tracking_uri"], config["experiment"])
    logger = MLFlowLogger(experiment_name=config["experiment"], run_name=config["run_name"],
                          tracking_uri=config["tracking_uri"], artifact_location=artifact_location,
                          tags=dict(tags) if tags else None, run_id=run_id)
    run_id, experiment_id = logger.run_id, logger.experiment_id
    client = logger.experiment
    if resume_from is None:
        # Under DDP only rank 0 has a run id; ModelCheckpoint uses rank 0's folder on every rank.
        config["checkpoint_dir"] = str(Path(config["checkpoint_dir"] or local_store_dir(config["tracking_uri"])
                                            / "checkpoints" / (run_id or "rank-not-zero")).resolve())
        # Lightning logs the module's hyperparameters itself; add the run-level settings it lacks.
        logger.log_hyperparams({k: v for k, v in config.items() if k not in module.hparams and k != "summary_json"})
        client.log_dict(run_id, config, "config.json")
        client.log_dict(run_id, config, "config.yaml")
    validates = config["limit_val_batches"] != 0
    # Lightning writes checkpoints through an fsspec transaction: a temporary file renamed into place.
    # Two callbacks: Lightning's own save_last only refreshes last.ckpt when a top-k file is saved.
    last = ModelCheckpoint(dirpath=config["checkpoint_dir"], filename="last", monitor=None, save_top_k=1,
                           enable_version_counter=False)
    checkpoints = [last]
    if validates:
        best = ModelCheckpoint(dirpath=config["checkpoint_dir"], filename="best", monitor="val/acc", mode="max",
                               save_top_k=1, enable_version_counter=False)
        checkpoints.append(best)
    trainer_kwargs = {k: config[k] for k in ("limit_train_batches", "limit_val_batches") if config[k] is not None}
    extra_callbacks = list(callbacks or [])
    if config["eval_every"]:
        extra_callbacks.append(CounterfactualEvaluation(int(config["eval_every"])))
    trainer = L.Trainer(max_epochs=config["max_epochs"], accelerator=config["accelerator"], devices=config["devices"],
                        num_nodes=config["num_nodes"], strategy=config["strategy"], logger=logger,
                        callbacks=[*checkpoints, BurnIn(config["burnin"]), *extra_callbacks], deterministic=False,
                        enable_progress_bar=config["progress"], enable_model_summary=config["progress"],
                        fast_dev_run=config["fast_dev_run"], log_every_n_steps=1, **trainer_kwargs)
    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    fit_seconds = time.perf_counter() - started
    metrics = _scalar_metrics(trainer.callback_metrics)
    trainer.test(module, datamodule=datamodule, verbose=False)
    metrics.update(_scalar_metrics(trainer.callback_metrics))
    metrics["fit_seconds"] = fit_seconds
    metrics["epochs"] = trainer.current_epoch

    summary = {
        "run_id": run_id, "experiment_id": experiment_id, "tracking_uri": config["tracking_uri"],
        "config": config, "data": datamodule.summary(), "metrics": metrics,
        "checkpoints": {"last": last.best_model_path or None, "best": best.best_model_path if validates else None},
    }
    client.log_metric(run_id, "fit_seconds", fit_seconds)
    for path in set(summary["checkpoints"].values()) - {None, ""}:
        client.log_artifact(run_id, path, artifact_path="checkpoints")
    if config["summary_json"] and trainer.is_global_zero:  # under DDP only rank 0 holds the MLflow run
        write_json_atomic(config["summary_json"], summary)
    return summary


def announce(summary: dict) -> str:
    """Human-readable lines naming the run and how to look at it."""
    return "\n".join([
        f"MLflow run id: {summary['run_id']}",
        f"Open the MLflow UI:  {ui_command(summary['tracking_uri'])}",
        f"then browse to {run_url(summary['experiment_id'], summary['run_id'])}",
    ])
