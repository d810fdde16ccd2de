"""Several trainings as one stack (:mod:`ct_lightning.stacked`), each recorded as its own run.

:func:`train_stack` takes the overrides of K trainings that differ only in per-model scalars (penalty
weights, τ, η, ``λ_cst``, ``λ_egy``), builds each ``CTModule`` exactly as :func:`~ct_lightning.experiment.runs.train.train`
would (same seed, same initial weights), trains them together, and then writes one MLflow run per
training with what ``train()`` writes: parameters, tags, ``config.json``, data sets, per-epoch metrics,
``last``/``best`` checkpoints (loadable with ``CTModule.load_from_checkpoint``), the logged models and the
plots. Each run is tagged ``ct.stack`` (``k/K``) so that it can be told apart. A stack is one unit of
work: it is trained whole or not at all (an interrupted stack leaves no runs and is trained again).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from mlflow.tracking import MlflowClient

from ct_lightning.callbacks.convergence import convergence_notes, tau_may_be_lowered
from ct_lightning.experiment.configuration.cpu_math import cpu_math_state
from ct_lightning.experiment.configuration.data import build_datamodule, mutability_spec
from ct_lightning.experiment.configuration.preflight import preflight_training
from ct_lightning.experiment.configuration.settings import resolve_config
from ct_lightning.experiment.configuration.store import local_store_dir
from ct_lightning.experiment.runs.lifecycle import (CHECKPOINT_DIR_TAG, CONSTRAINTS_TAG, STACK_TAG, check_outputs,
                                                    create_run, mark_failed, trained_under)
from ct_lightning.experiment.runs.interrupt import TrainingInterrupted
from ct_lightning.experiment.runs.run_artifacts import EpochStepMLFlowLogger, log_training_inputs, log_training_plots
from ct_lightning.experiment.runs.served_model import log_models
from ct_lightning.experiment.runs.stop_on_signal import StopOnSignal
from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store
from ct_lightning.stacked import PER_MODEL, StackedFit, fit_stacked, settings_blocker

# Settings a stack requires at these values (everything else, except PER_MODEL and run_name, must be shared).
STACK_REQUIRES = {"model": ("mlp",), "resume": (None,), "from_checkpoint": (None,),
                  "config": (None,), "checkpoint_dir": (None,), "summary_json": (None,), "fast_dev_run": (False, 0),
                  "limit_train_batches": (None,), "limit_val_batches": (None,), "eval_every": (0,),
                  "accelerator": ("auto", "cpu", "gpu", "cuda"), "devices": ("auto", 1), "num_nodes": (1,),
                  "strategy": ("auto",), "target": (None,), "model_inputs": (None,)}


def config_blocker(configs: list[dict]) -> str | None:
    """Why the resolved ``configs`` cannot train as one stack, or ``None``: what a run needs of a stack
    (:data:`STACK_REQUIRES`), then the rule of :func:`ct_lightning.stacked.settings_blocker`."""
    for name, allowed in STACK_REQUIRES.items():
        for config in configs:
            if config.get(name) not in allowed:
                return f"{name} {config.get(name)!r} (a stack needs {' or '.join(map(repr, allowed))})"
    return settings_blocker(configs)


def shared_settings(config: dict) -> dict:
    """What a training shares with the others of its stack: its resolved configuration less :data:`PER_MODEL`."""
    return {k: v for k, v in config.items() if k not in PER_MODEL and k != "run_name"}


def stack_device(accelerator: str) -> torch.device:
    """Where a stack trains: the device a lone training with ``accelerator`` would use (``auto``: the GPU if there
    is one, as Lightning chooses)."""
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def train_stack(overrides: list[dict], tags: list[dict] | None = None, echo=print,
                progress_seconds: float = 30.0) -> list[dict]:
    """Train the configured models as one stack; returns one run summary (``run_id``, ``metrics``, ...) per training.

    ``echo`` gets a progress line at most every ``progress_seconds`` while the stack trains, and one per written run."""
    from ct_lightning.experiment.runs.train import build_module  # noqa: PLC0415 - train imports this module's peers

    tags = tags or [{} for _ in overrides]
    configs = []
    for given in overrides:
        checked = preflight_training(given).overrides
        config = resolve_config({k: v for k, v in checked.items() if v is not None})
        check_outputs(config)
        configs.append(config)
    blocker = config_blocker(configs)
    if blocker:
        raise ValueError(f"stack: these trainings cannot share one stack: {blocker}")
    first = configs[0]
    L.seed_everything(first["seed"], workers=True, verbose=False)
    datamodule = build_datamodule(first)
    # Every member starts from the random state a lone training has here: the same initial weights.
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    members = []
    for config in configs:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        module = build_module(config, datamodule)
        codec = getattr(datamodule, "codec", None)
        if codec is not None:
            module.preprocessing = codec.to_dict()
        members.append(module)
    device = stack_device(first["accelerator"])
    for module in members:
        module.to(device)
    echo(f"stack of {len(members)} trainings on {first['data']} ({first['max_epochs']} epochs, {device.type})",
         flush=True)
    # SIGTERM/SIGINT: the stack stops after its current epoch (no run is written: it is trained again), or
    # once its runs are written when the signal comes after training; a second signal stops at once.
    stopper = StopOnSignal(echo)
    stopper.install()
    try:
        stopper.phase = "loop"
        fit = fit_stacked(members, datamodule, int(first["max_epochs"]), float(first["burnin"]),
                          _after_epoch(stopper, len(members), int(first["max_epochs"]), echo, progress_seconds))
        stopper.phase = "after"
        for module in members:  # as Lightning leaves a lone training's module after fit
            module.cpu()
        summaries = []
        for k, (config, module, member_tags) in enumerate(zip(configs, members, tags)):
            summaries.append(record_member(config, module, datamodule, fit, k, member_tags))
            echo(f"stack: run {k + 1}/{len(members)} written ({summaries[-1]['run_id']})", flush=True)
            # what ConvergenceWatch says for a lone training, and that it recovered
            for kind, text in member_notes(module, fit.history[k]):
                echo(f"{'WARNING' if kind == 'warning' else 'note'}: run {summaries[-1]['run_id']}: {text}",
                     flush=True)
    finally:
        stopper.restore()
    stopper.pass_on()  # a signal after training still stops the study that called this
    return summaries


def member_notes(module, history: list[dict]) -> list[tuple[str, str]]:
    """What :class:`~ct_lightning.callbacks.ConvergenceWatch` would have said during a stack member's training, from
    its ``history`` (one dict per epoch): the warning and the recovery note, with "a lower --tau" advised only where
    it may help ``module`` (:func:`~ct_lightning.callbacks.convergence.tau_may_be_lowered`)."""
    return convergence_notes([(int(e["epoch"]), e["train/cf_converged"]) for e in history if "train/cf_converged" in e],
                             lower_tau=tau_may_be_lowered(module))


def _after_epoch(stopper: StopOnSignal, n_models: int, max_epochs: int, echo, every: float):
    """Called after each epoch of a stack: stop on a signal; say how far the stack is, at most every ``every`` s."""
    started = last = time.monotonic()

    def after(epoch: int) -> None:
        nonlocal last
        if stopper.signum is not None:
            raise TrainingInterrupted(stopper.signum, epoch + 1)
        now = time.monotonic()
        if now - last >= every and epoch + 1 < max_epochs:
            last = now
            echo(f"stack of {n_models}: epoch {epoch + 1}/{max_epochs} after {(now - started) / 60:.1f} min",
                 flush=True)

    return after


def _checkpoint(module, state: dict, epoch: int, global_step: int, metrics: dict) -> dict:
    """A Lightning-format checkpoint of ``module`` with the model weights ``state`` (what
    ``CTModule.load_from_checkpoint`` reads, with ``weights_only``)."""
    checkpoint = {"epoch": epoch, "global_step": global_step, "pytorch-lightning_version": L.__version__,
                  "state_dict": {f"model.{name}": tensor for name, tensor in state.items()},
                  "hparams_name": "kwargs", "hyper_parameters": dict(module.hparams),
                  "ct_epoch_metrics": {"epoch": epoch, "metrics": metrics}}
    module.on_save_checkpoint(checkpoint)
    return checkpoint


def _save_atomic(checkpoint: dict, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save(checkpoint, partial)
    partial.replace(path)


def record_member(config: dict, module, datamodule, fit: StackedFit, k: int, tags: dict | None = None) -> dict:
    """Write member ``k`` of a stacked training as its own finished MLflow run; returns its summary."""
    n_models = len(fit.history)
    artifact_location = prepare_store(config["tracking_uri"], config["experiment"])
    client = MlflowClient(tracking_uri=config["tracking_uri"])
    experiment_id = ensure_experiment(client, config["experiment"], artifact_location)
    run_tags = {**(tags or {}), **{f"ct.{key}": value for key, value in cpu_math_state().items()},
                STACK_TAG: f"{k + 1}/{n_models}", CONSTRAINTS_TAG: trained_under(module, datamodule)}
    run_id, run_name = create_run(client, experiment_id, config, run_tags)
    try:
        config = {**config, "checkpoint_dir": str((local_store_dir(config["tracking_uri"]) / "checkpoints" / run_id)
                                                  .resolve())}
        folder = Path(config["checkpoint_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        client.set_tag(run_id, CHECKPOINT_DIR_TAG, config["checkpoint_dir"])
        logger = EpochStepMLFlowLogger(experiment_name=config["experiment"], tracking_uri=config["tracking_uri"],
                                       run_id=run_id)
        logger.log_hyperparams(dict(module.hparams))  # what Lightning logs for a lone training
        log_training_inputs(client, logger, run_id, config, module, datamodule)
        history = fit.history[k]
        for entry in history:
            logger.log_metrics(entry, step=int(entry["epoch"]))
        logger.flush()
        epochs = len(history)
        last_metrics = {key: value for key, value in history[-1].items()}
        paths = {"last": folder / "last.ckpt", "best": folder / "best.ckpt"}
        _save_atomic(_checkpoint(module, {n: t.detach().clone() for n, t in module.model.state_dict().items()},
                                 epochs - 1, fit.steps, last_metrics), paths["last"])
        best = fit.best_epoch[k]
        _save_atomic(_checkpoint(module, fit.best_state[k], best, fit.steps * (best + 1) // max(epochs, 1),
                                 history[best]), paths["best"])
        fit_seconds = fit.fit_seconds / n_models  # this training's share of the stack's time
        metrics = {**last_metrics, **fit.test[k], "fit_seconds": fit_seconds, "epochs": epochs}
        metrics.pop("epoch", None)
        for name, value in fit.test[k].items():
            client.log_metric(run_id, name, value, step=epochs - 1)
        client.log_metric(run_id, "fit_seconds", fit_seconds)
        client.log_metric(run_id, "stack_fit_seconds", fit.fit_seconds)
        for path in paths.values():
            client.log_artifact(run_id, str(path), artifact_path="checkpoints")
        module.eval()
        models = log_models(client, config["tracking_uri"], experiment_id, run_id, module, datamodule, config, metrics,
                            mutability_spec(config, datamodule) or None)
        plots = log_training_plots(client, run_id, module, datamodule)
        client.set_terminated(run_id, "FINISHED")
    except BaseException as error:
        mark_failed(client, run_id, error)
        raise
    return {"run_id": run_id, "run_name": run_name, "experiment_id": experiment_id,
            "tracking_uri": config["tracking_uri"], "config": config, "data": datamodule.summary(),
            "metrics": metrics, "checkpoints": {key: str(path) for key, path in paths.items()},
            "models": models, "plots": plots}

