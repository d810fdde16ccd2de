"""Resumable reproduction of the paper's Table 1: train, evaluate and compare BL and CT on many data sets.

Every trained model is keyed by its fully resolved training configuration (tag ``ct.config_key``)
and every evaluation by the evaluation protocol and constraints (artifact
``evaluations/<key>.pt`` on the training run). A re-run finds finished trainings and
evaluations in the MLflow store and does only what is missing, so a killed reproduction loses
at most the work in progress. Independent trainings run in ``jobs`` processes.
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ct_lightning.experiment.configuration.console import child_training_echo, progress_shown, sweep_trial_echo
from ct_lightning.experiment.runs.atomic_files import atomic_file
from ct_lightning.experiment.configuration.settings import NON_DEFINING_KEYS, data_class, is_table_file

CONFIG_KEY_TAG = "ct.config_key"
ROLES = (  # (role, objective, protected)
    ("bl", "vanilla", False), ("ct", "full", False), ("bl_protected", "vanilla", True), ("ct_protected", "full", True))
# The run's role tag: its name's last part and its registered model (ct-adult-bl, ct-adult-bl-protected), so that the
# actionability pair neither looks like the plausibility pair in the MLflow UI nor replaces its registered versions.
ROLE_LABELS = {"bl": "BL", "ct": "CT", "bl_protected": "BL-protected", "ct_protected": "CT-protected"}
PROTECT_BY = "compare's actionability pair"  # who set protect, in a protected role's start-up line (not --protect)


# What the authors' code trained with for Table 1 where it differs from the stated defaults:
# its search optimiser is Flux's Descent() built without the configured η, so η = 0.1 throughout
# (CounterfactualTraining.jl, paper/experiments/CTExperiments/src/training_params.jl), and its
# cost-column runs (satml/mutability) train CT on the synthetic sets with clf + div only.
REFERENCE_TRAINING = {"search_lr": 0.1}
REFERENCE_PROTECTED_CT = {"lambda_reg": 0.0, "lambda_adv": 0.0}


def is_synthetic(data: str) -> bool:
    """Whether data set ``data`` is generated on the fly (its data module's ``synthetic``)."""
    return data_class(data).synthetic


def cost_hint(data: str) -> float:
    """Rough cost of one training of ``data`` relative to circles (its data module's ``cost_hint``)."""
    return data_class(data).cost_hint


def role_training_overrides(protocol: str, data: str, role: str) -> dict:
    """Training settings of one role that differ from Table 2 under ``protocol`` (only ``reference`` has any)."""
    if protocol != "reference":
        return {}
    extra = REFERENCE_PROTECTED_CT if role == "ct_protected" and is_synthetic(data) else {}
    return {**REFERENCE_TRAINING, **extra}


def stable_key(payload: dict) -> str:
    """A short, order-independent hash of a JSON-able mapping."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# Settings added after stores were filled: left out of the key while they hold these values, so that a
# newer version of the library still finds the trainings an older one made.
OMITTED_AT_DEFAULT = {"devices": "auto", "num_nodes": 1, "strategy": "auto", "center_distance": None,
                      "cpu_math": "native", "data_spec": None, "impute": "none", "target": None, "drop_columns": [],
                      "balance": "none", "model_inputs": None}


def training_key(config: dict) -> str:
    """Key of a resolved training configuration: everything that shapes the trained model, and for a model of one's
    own (:func:`own_model_sources`) the content of its module and starting weights."""
    return stable_key({**{k: v for k, v in config.items() if k not in NON_DEFINING_KEYS
                          and not (k in OMITTED_AT_DEFAULT and v == OMITTED_AT_DEFAULT[k])},
                       **own_model_sources(config)})


def own_model_sources(config: dict) -> dict:
    """What the key of a model of one's own adds to its settings: the SHA-256 of the file of ``--model
    package.module:factory``'s module (found as training imports it; an edited file is another model, the same file
    moved is not; the files it imports are not read) and of a local ``--from-checkpoint`` file (absolute in the
    configuration). Empty for the built-in networks from scratch, so their keys are as before."""
    from ct_lightning.models import factory_file  # noqa: PLC0415

    sources = {}
    module = factory_file(str(config.get("model") or "mlp"))
    if module is not None:
        sources["model_source"] = hashlib.sha256(module.read_bytes()).hexdigest()
    start = config.get("from_checkpoint")
    if start and ":/" not in str(start) and Path(start).is_file():
        sources["from_checkpoint_source"] = hashlib.sha256(Path(start).read_bytes()).hexdigest()
    return sources


def evaluation_key(protocol: dict, protect: bool, all_mutable: bool, split: str = "test",
                   data_spec_holds: bool = False) -> str:
    """Key of one evaluation of a trained model. ``data_spec_holds``: a table's evaluation, under its data spec's
    mutability (in the key only then, so that the built-in sets' stored evaluations keep their keys, and a table's
    plausibility evaluation stored before the spec held in it, with every feature mutable, is made again)."""
    payload = {"protocol": protocol, "protect": protect, "all_mutable": all_mutable, "split": split}
    return stable_key({**payload, "data_spec_holds": True} if data_spec_holds else payload)


def find_finished_training(client, experiment: str, key: str) -> str | None:
    """The newest FINISHED run of ``experiment`` tagged with training key ``key`` that has a checkpoint."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id],
                              f"tags.`{CONFIG_KEY_TAG}` = '{key}' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=5)
    for run in runs:
        names = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
        if "checkpoints/last.ckpt" in names:
            return run.info.run_id
    return None


# ------------------------------------------------------------------ evaluation results on disk
def save_evaluation(result, path: str | Path) -> Path:
    """Write an :class:`EvaluationResult` atomically as a ``weights_only``-loadable torch file."""
    payload = {
        "samples": {k: torch.as_tensor(v) for k, v in result.samples.items()},
        "groups": {k: torch.as_tensor(v) for k, v in result.groups.items()},
        "per_model": {k: float(v) for k, v in result.per_model.items()},
        "accuracy": float(result.accuracy), "robust_accuracy": float(result.robust_accuracy),  # for older readers
        "robust_curve": {k: list(v) for k, v in result.robust_curve.items()},
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(result.config).items()},
        "factuals": result.factuals, "counterfactuals": result.counterfactuals,
    }
    with atomic_file(path) as temporary:
        torch.save(payload, temporary)
    return Path(path)


def load_evaluation(path: str | Path):
    """Read an :class:`EvaluationResult` written by :func:`save_evaluation`."""
    from ct_lightning.evaluation import EvaluationConfig, EvaluationResult

    payload = torch.load(str(path), map_location="cpu", weights_only=True)
    return EvaluationResult(
        samples={k: v.numpy() for k, v in payload["samples"].items()},
        groups={k: v.numpy() for k, v in payload["groups"].items()},
        per_model=payload.get("per_model") or {"accuracy": payload["accuracy"],
                                               "robust_accuracy": payload["robust_accuracy"]},
        robust_curve=payload["robust_curve"], config=EvaluationConfig(**payload["config"]),
        factuals=payload["factuals"], counterfactuals=payload["counterfactuals"])


def find_evaluation(client, run_id: str, key: str):
    """The stored evaluation ``key`` of training run ``run_id``, or ``None`` (also when unreadable)."""
    wanted = f"evaluations/{key}.pt"
    if wanted not in {a.path for a in client.list_artifacts(run_id, "evaluations")}:
        return None
    try:
        return load_evaluation(client.download_artifacts(run_id, wanted, tempfile.mkdtemp(prefix="ct-eval-")))
    except Exception:  # noqa: BLE001 - a torn or foreign file is recomputed, never trusted
        return None


# ------------------------------------------------------------------------------ one task
@dataclass
class Task:
    """One model of a comparison: train (or reuse) it, then evaluate it with the protocol."""

    data: str
    role: str
    objective: str
    protected: bool
    training: dict          # training overrides (without objective/protect)
    protocol: dict          # EvaluationConfig as a dict
    tracking_uri: str
    experiment: str
    parent_run_id: str | None = None
    reuse_run_id: str | None = None
    threads: int = 1
    # the role of the same data whose training this one's is (``"bl"`` for ``bl_protected``): an actionability pair
    # that would train exactly as the plausibility pair (a table whose data spec already holds every protected column
    # immutable in both) reuses its models and is only evaluated, for the cost column (``None``: trained itself)
    training_of: str | None = None
    described: tuple[str, ...] = ()  # table descriptions the caller printed once: its training leaves them out
    _config: dict | None = field(default=None, init=False, repr=False, compare=False)  # resolved once

    @property
    def label(self) -> str:
        from ct_lightning.experiment.runs.lifecycle import data_label  # noqa: PLC0415 - a table by its file's stem

        return f"{data_label(self.data)}/{self.role}"

    @property
    def protects(self) -> bool:
        """Whether this task's model is trained and evaluated with ``protect``: an actionability role that trains its
        own model (one that is the plausibility pair's, ``training_of``, is neither)."""
        return self.protected and self.training_of is None

    def overrides(self) -> dict:
        """The training overrides of this task."""
        return {**self.training, "data": self.data, "objective": self.objective,
                "protect": self.protects, "tracking_uri": self.tracking_uri,
                "experiment": self.experiment, "progress": False}

    def resolved_config(self) -> dict:
        """The fully resolved training configuration (what the key is computed from), resolved once per task."""
        from ct_lightning.experiment.configuration.settings import resolve_config

        if self._config is None:
            self._config = resolve_config(self.overrides())
        return dict(self._config)

    @property
    def evaluated_as(self) -> tuple[bool, bool]:
        """``(protect, all_mutable)`` of this task's evaluation. An actionability model that is the plausibility
        pair's (``training_of``) is evaluated as that pair is: its protected columns are the data spec's immutable
        ones, which hold there already (the same constraints, so the same key: with the same protocol, one
        evaluation serves both columns)."""
        return self.protects, not self.protects

    def eval_key(self) -> str:
        """Key of this task's evaluation (its protocol and constraints)."""
        return evaluation_key(self.protocol, *self.evaluated_as, data_spec_holds=is_table_file(self.data))

    def constraints(self, module, datamodule):
        """The constraints this task's model is evaluated under: the data's own mutability (a table's data spec)
        always; the actionability pair also its training constraints and protected features."""
        from ct_lightning.evaluation import evaluation_constraints

        protect, all_mutable = self.evaluated_as
        return evaluation_constraints(module, datamodule, protect=protect, all_mutable=all_mutable)


def constraints_in_words(task: Task) -> str:
    """Which features a task's model may change, in training and in evaluation. A table's data spec (its
    mutability, increase/decrease included, and its domain) holds in the training and evaluation of both pairs;
    ``--immutable`` is added for the actionability pair only."""
    # a given run (--bl-run-id ...) was trained as it was, perhaps with --immutable: only its evaluation is compare's
    when = "in evaluation (trained as the given run was)" if task.reuse_run_id else "in training and evaluation"
    if task.training_of:
        return (f"the data spec's own mutability {when}: the plausibility pair's {ROLE_LABELS[task.training_of]}, "
                "for the cost column")
    if task.protected:
        protected = ("--immutable columns and the data spec's mutability" if is_table_file(task.data)
                     else "protected features immutable")
        return f"{protected} {when}: the actionability pair for the cost column"
    if is_table_file(task.data):
        return f"the data spec's own mutability {when} (no --immutable)"
    return "all features mutable" + (" in evaluation (trained as the given run was)" if task.reuse_run_id else "")


def task_state(task: Task, client) -> tuple[str | None, bool]:
    """``(run id of a finished training or None, whether its evaluation is stored)``."""
    run_id = task.reuse_run_id or find_finished_training(client, task.experiment, training_key(task.resolved_config()))
    if run_id is None:
        return None, False
    names = {a.path for a in client.list_artifacts(run_id, "evaluations")}
    return run_id, f"evaluations/{task.eval_key()}.pt" in names


def run_task(task: Task) -> dict:
    """Train (unless a finished run with the same key exists) and evaluate one model; safe to repeat."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.evaluation import EvaluationConfig, evaluate_model
    from ct_lightning.experiment.configuration.preflight import evaluation_device
    from ct_lightning.experiment.runs.loading import load_run, log_evaluation
    from ct_lightning.experiment.configuration.data import model_datamodule
    from ct_lightning.experiment.runs.train import train

    if task.threads > 0:  # 0: torch's default
        torch.set_num_threads(task.threads)
    client = MlflowClient(tracking_uri=task.tracking_uri)
    started = time.perf_counter()
    config = task.resolved_config()
    key = training_key(config)
    run_id = task.reuse_run_id or find_finished_training(client, task.experiment, key)
    trained = run_id is None
    eval_key = task.eval_key()
    # A new training has no evaluation yet; otherwise download and read the stored one once.
    evaluated = trained or find_evaluation(client, run_id, eval_key) is None
    if evaluated and progress_shown():
        # Printed by the process doing the work, so that with --jobs it shows what really runs.
        print(f"started {task.label} ({'training and ' if trained else ''}evaluation; "
              f"{constraints_in_words(task)}, "
              f"objective {task.objective})", flush=True)
    if trained:
        tags = {CONFIG_KEY_TAG: key, "ct.compare.role": task.role, "role": ROLE_LABELS[task.role]}
        if task.parent_run_id:
            tags["mlflow.parentRunId"] = task.parent_run_id
        # compare, not the user, set protect: the start-up line names the pair (a table's --immutable beside it)
        echo = child_training_echo if not task.described else sweep_trial_echo(task.described, child_training_echo)
        run_id = train(task.overrides(), tags=tags, echo=echo, protect_by=PROTECT_BY)["run_id"]
    train_seconds = time.perf_counter() - started
    if evaluated:
        loaded = load_run(run_id, task.tracking_uri)
        loaded.module.to(evaluation_device(task.training.get("accelerator")))  # the data follow the model
        datamodule = model_datamodule(loaded.config, loaded.module)
        constraints = task.constraints(loaded.module, datamodule)
        result = evaluate_model(loaded.module, datamodule.x_test, datamodule.y_test, datamodule.n_classes,
                                EvaluationConfig(**task.protocol), constraints.mutability, constraints.lower,
                                constraints.upper, x_train=datamodule.x_train,
                                feature_names=list(datamodule.feature_names), y_train=datamodule.y_train,
                                data_name=datamodule.name, feature_types=constraints.feature_types)
        log_evaluation(client, run_id, result.summary())
        with tempfile.TemporaryDirectory(prefix="ct-eval-") as folder:
            path = save_evaluation(result, Path(folder) / f"{eval_key}.pt")
            client.log_artifact(run_id, str(path), artifact_path="evaluations")
    return {"label": task.label, "run_id": run_id, "trained": trained, "evaluated": evaluated,
            "train_seconds": train_seconds, "seconds": time.perf_counter() - started}


def describe_plan(tasks: list[Task], client, actionability: bool) -> list[str]:
    """What a comparison will do for each model and why, before anything runs (one line each)."""
    lines, protected_to_train = [], []
    for task in tasks:
        run_id, evaluated = task_state(task, client)
        what = constraints_in_words(task)
        if task.reuse_run_id:
            action = f"reuse run {run_id} (given), {'evaluation stored' if evaluated else 'evaluate it'}"
        elif task.training_of:
            same = task.label.rsplit("/", 1)[0] + "/" + task.training_of
            action = (f"reuse the model of {same} (the same training), "
                      f"{'evaluation stored' if evaluated else 'evaluate it for the cost column'}")
        elif run_id:
            action = (f"reuse finished run {run_id} (same configuration in the store), "
                      f"{'evaluation stored' if evaluated else 'evaluate it'}")
        else:
            action = "train and evaluate (no run id given and no finished run with this configuration in the store)"
            if task.protected:
                protected_to_train.append(task.label)
        lines.append(f"  {task.label} ({ROLE_LABELS[task.role]}, objective {task.objective}, {what}): {action}")
    if protected_to_train:
        lines.append(f"  the protected pair ({', '.join(protected_to_train)}) is trained for the cost column; "
                     f"pass --no-actionability to skip it (no cost column), or give --bl-protected-run-id/"
                     f"--ct-protected-run-id")
    elif not actionability:
        lines.append("  --no-actionability: no protected pair, no cost column")
    return lines


# ----------------------------------------------------------------------------- progress
class Progress:
    """Prints which task runs, what is done and an estimate of the time left (from measured task times)."""

    def __init__(self, tasks: list[Task], done: set[str], echo=print):
        self.tasks = {t.label: t for t in tasks}
        self.done = set(done)
        self.durations: dict[str, float] = {}
        self.started = time.perf_counter()
        self.echo = echo

    def _estimate(self, label: str) -> float | None:
        if not self.durations:
            return None
        unit = sum(self.durations[k] / cost_hint(self.tasks[k].data) for k in self.durations) \
            / len(self.durations)
        return unit * cost_hint(self.tasks[label].data)

    def eta(self) -> str:
        remaining = [label for label in self.tasks if label not in self.done]
        estimates = [self._estimate(label) for label in remaining]
        if not remaining:
            return "0s"
        if any(e is None for e in estimates):
            return "unknown until the first task finishes"
        return _duration(sum(estimates))

    def finish(self, outcome: dict, jobs: int = 1) -> None:
        self.done.add(outcome["label"])
        if outcome["trained"] or outcome["evaluated"]:
            self.durations[outcome["label"]] = outcome["seconds"]
        what = "trained+evaluated" if outcome["trained"] else ("evaluated" if outcome["evaluated"] else "reused")
        eta = self.eta()
        if jobs > 1 and eta[0].isdigit():
            eta += f" of work on {jobs} processes"
        self.echo(f"[{len(self.done)}/{len(self.tasks)} done] {outcome['label']} {what} in "
                  f"{_duration(outcome['seconds'])} (run {outcome['run_id']}); elapsed "
                  f"{_duration(time.perf_counter() - self.started)}, estimated time left {eta}", flush=True)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


def run_tasks(tasks: list[Task], jobs: int, client, on_done=None, echo=print, executor=None) -> dict[str, dict]:
    """Run every task (longest first), ``jobs`` at a time in separate processes; returns outcomes by label.

    ``on_done(outcome)`` is called in this process as each task finishes, so callers can write
    results as they come. A failed task raises after the others have finished. ``executor``
    (default: :class:`~ct_lightning.experiment.studies.executor.LocalExecutor` with ``jobs`` processes)
    dispatches the tasks, e.g. a ``RayTuneExecutor``.
    """
    from ct_lightning.experiment.studies.executor import LocalExecutor

    done = {t.label for t in tasks if task_state(t, client)[1]}
    progress = Progress(tasks, set(), echo if progress_shown() else lambda *a, **k: None)
    echo(f"reproduction: {len(tasks)} models, {len(done)} already trained and evaluated in the store; "
         f"{len(tasks) - len(done)} to do with {jobs} process(es)", flush=True)
    order = sorted(tasks, key=lambda t: (t.label in done, -cost_hint(t.data)))
    # a task that reuses another's training (training_of) runs once that one has finished: run beside it, it
    # would not find the model in the store and train it a second time
    waiting = [t for t in order if t.training_of and t.label not in done]
    order = [t for t in order if t not in waiting]
    outcomes: dict[str, dict] = {}
    failures: list[str] = []

    def finished(outcome) -> None:
        if not outcome.ok:
            failures.append(f"{outcome.label}: {outcome.error}")
            echo(f"FAILED {outcome.label}: {outcome.error}", flush=True)
            return
        outcomes[outcome.label] = outcome.result
        progress.finish(outcome.result, jobs)
        if on_done:
            on_done(outcome.result)

    executor = executor or LocalExecutor(jobs, (order or waiting)[0].threads if order or waiting else 1,
                                         fail_fast=True)
    for batch in (order, waiting):
        if batch and not failures:
            executor.run(run_task, batch, [t.label for t in batch], finished)
    if failures:
        raise RuntimeError("tasks failed: " + "; ".join(failures))
    return outcomes


def find_or_create_parent(client, experiment: str, artifact_location: str | None, key: str, name: str) -> str:
    """The parent run of a reproduction with this key (reopened), or a new one named ``name`` and the first 6
    characters of its id, so that compares of the same data differ in the UI (a parent named before, ``compare
    PATH``, as all of one table's were, takes that name when reopened)."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment,
                                                                              artifact_location=artifact_location)
    runs = client.search_runs([experiment_id], f"tags.`ct.reproduction_key` = '{key}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if runs:
        run_id = runs[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        if (runs[0].info.run_name or "").startswith("compare "):
            client.update_run(run_id, name=f"{name}-{run_id[:6]}")
        return run_id
    from ct_lightning.experiment.runs.tracking import new_run  # noqa: PLC0415

    run = new_run(client, experiment_id, run_name=name, tags={"ct.role": "compare", "ct.reproduction_key": key,
                                                          "role": "compare"})
    client.update_run(run.info.run_id, name=f"{name}-{run.info.run_id[:6]}")
    return run.info.run_id


def finite_or_none(value):
    """``value`` as float, or ``None`` when missing or not finite (for JSON)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
