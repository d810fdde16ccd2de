"""The paper's hyperparameter grids (App. D and E): definitions, shared trainings and resumable runs.

A grid (``configs/grids/<name>.yaml``) lists data sets, a space of training settings and the
evaluation's ``λ_egy`` values. Every point trains on Note 1's defaults (:data:`NOTE1`) plus the grid's
``base`` plus the point's settings. A training is keyed by the settings that shape it
(:func:`effective_overrides`): a ``vanilla`` training never reads the generator, the search or the
penalties, so all vanilla points of a data set that share the remaining settings (e.g. the epochs)
are one training, reused across the grid and across grids. Each distinct training is trained at
most once (reused from the MLflow store when a finished run has its key) and evaluated once per
evaluation key (stored as the artifact ``grid_eval/<key>.json`` on the training run), so a re-run
of an interrupted grid does only what is missing. One MLflow parent run per grid and data sets.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ct_lightning.experiment.configuration.console import progress_shown
from ct_lightning.experiment.runs.tracking import new_run, retry_race
from datamodules.yaml_file import load_yaml, yaml_problem


GRID_DIR = Path(__file__).resolve().parents[3] / "configs" / "grids"

# Note 1 (App. B.4): the training defaults of every grid point unless the grid sets the value.
NOTE1 = {"generator": "ecco", "burnin": 0.0, "tau": 0.75, "lambda_cost": 0.001, "lambda_energy": 5.0,
         "search_lr": 0.25, "max_steps": 30, "lambda_adv": 0.25, "lambda_clf": 1.0, "lambda_div": 0.5,
         "lambda_reg": 0.1, "lr": 0.001, "nce": 1000, "max_epochs": 100, "objective": "full"}

# Settings that a ``vanilla`` (cross-entropy only) training never reads: the counterfactual search,
# the generator and the CT penalties. Checked by tests/test_grids.py (same weights whatever their values).
VANILLA_IGNORED = ("generator", "burnin", "tau", "lambda_cost", "lambda_energy", "search_lr", "max_steps",
                   "lambda_adv", "lambda_div", "lambda_reg", "nce", "epsilon", "pool", "generator_options")
EVAL_KIND = "grid-v1"
RESULTS_EVERY_S = 30.0  # how often a running grid rewrites its results file (it always does at the end)


@dataclass
class Grid:
    """One grid of the paper: data sets, training space, evaluation ``λ_egy`` values, paper table values."""

    name: str
    title: str
    data: list[str]
    space: dict[str, list]
    evaluation: dict
    base: dict = field(default_factory=dict)
    paper: dict | None = None
    paper_table: int | None = None

    def points(self) -> list[dict]:
        """Every combination of the space (one per training-phase setting)."""
        names = list(self.space)
        return [dict(zip(names, values)) for values in itertools.product(*(self.space[n] for n in names))]


def available_grids() -> list[str]:
    """Names of the grids shipped in ``configs/grids``."""
    return sorted(p.stem for p in GRID_DIR.glob("*.yaml"))


def load_grid(name: str) -> Grid:
    """The grid ``name`` (a file in ``configs/grids``) or the grid in the YAML file at path ``name``."""
    path = Path(name)
    if not path.suffix:
        path = GRID_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"grid: unknown {name!r}; allowed: {', '.join(available_grids())} or a YAML file")
    try:
        raw = load_yaml(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"grid: got {name!r} (not valid YAML: {yaml_problem(error)}); allowed: "
                         f"{', '.join(available_grids())} or a YAML file of a grid") from None
    missing = [key for key in ("name", "data", "space") if not isinstance(raw, dict) or key not in raw]
    if missing:
        raise ValueError(f"grid: got {name!r} (no {', '.join(missing)}); allowed: "
                         f"{', '.join(available_grids())} or a YAML file with name, data and space")
    return Grid(name=raw["name"], title=raw.get("title", raw["name"]), data=list(raw["data"]),
                space={k: list(v) for k, v in raw["space"].items()}, evaluation=dict(raw.get("evaluation", {})),
                base=dict(raw.get("base") or {}), paper=raw.get("paper"), paper_table=raw.get("paper_table"))


def effective_overrides(overrides: dict) -> dict:
    """The training overrides that shape the model: a vanilla training drops what it never reads."""
    if overrides.get("objective") == "vanilla":
        return {k: v for k, v in overrides.items() if k not in VANILLA_IGNORED}
    return dict(overrides)


@dataclass
class ModelJob:
    """One distinct training of a grid (possibly standing for many points) and its evaluation."""

    data: str
    overrides: dict          # effective training overrides (data, settings), without store options
    protocol: dict           # EvaluationConfig fields
    tracking_uri: str
    experiment: str
    parent_run_id: str | None = None
    threads: int = 1

    @property
    def label(self) -> str:
        shown = {k: v for k, v in self.overrides.items() if k != "data"}
        return f"{self.data} " + ",".join(f"{k}={v}" for k, v in sorted(shown.items()))

    def training_overrides(self) -> dict:
        return {**self.overrides, "tracking_uri": self.tracking_uri, "experiment": self.experiment,
                "progress": False}

    def resolved(self) -> dict:
        """The training's resolved configuration (:func:`resolve_config` of :meth:`training_overrides`)."""
        return copy.deepcopy(_resolve(json.dumps(self.training_overrides(), sort_keys=True), os.getcwd()))

    def key(self) -> str:
        from ct_lightning.experiment.studies.reproduce import training_key

        return training_key(self.resolved())

    def eval_key(self) -> str:
        from ct_lightning.experiment.studies.reproduce import stable_key

        return stable_key({"kind": EVAL_KIND, "protocol": self.protocol, "split": "train"})


@functools.lru_cache(maxsize=4096)
def _resolve(overrides_json: str, cwd: str) -> dict:
    """:func:`resolve_config` of the JSON ``overrides``, once per process and working folder (a relative data path
    resolves against it): a grid asks for each job's configuration several times (its key, its stack), and
    resolving takes about 15 ms."""
    from ct_lightning.experiment.configuration.settings import resolve_config

    return resolve_config(json.loads(overrides_json))


def grid_protocol(grid: Grid, data: str, n_runs: int | None = None, n_individuals: int | None = None) -> dict:
    """The evaluation protocol of a grid: the reference protocol with the grid's ``λ_egy`` values (Notes 4-12)."""
    from ct_lightning.evaluation.protocol import EvaluationConfig, protocol_settings
    from ct_lightning.experiment.configuration.protocol_options import reference_individuals

    settings = protocol_settings("reference")
    settings["n_individuals"] = n_individuals or reference_individuals(data)
    if n_runs:
        settings["n_runs"] = n_runs
    config = EvaluationConfig(**settings, lambda_energies=tuple(grid.evaluation.get("lambda_energy", (5.0,))))
    from dataclasses import asdict

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}


def plan(grid: Grid, datasets: list[str], tracking_uri: str, experiment: str, *, extra: dict | None = None,
         n_runs: int | None = None, n_individuals: int | None = None, threads: int = 1,
         parent_run_id: str | None = None) -> tuple[list[dict], dict[str, ModelJob]]:
    """``(points, jobs)``: every grid point of every data set with its training key, and one job per key.

    ``extra`` overrides every point (e.g. ``max_epochs`` for a tiny test); a grid setting wins over it.
    """
    points, jobs = [], {}
    for data in datasets:
        protocol = grid_protocol(grid, data, n_runs, n_individuals)
        for params in grid.points():
            overrides = effective_overrides({**NOTE1, **grid.base, **(extra or {}), **params, "data": data})
            job = ModelJob(data, overrides, protocol, tracking_uri, experiment, parent_run_id, threads)
            key = job.key()
            jobs.setdefault(key, job)
            points.append({"data": data, "params": params, "key": key})
    return points, jobs


def f1_score(predicted, labels, n_classes: int) -> float:
    """F1 of class 1 for two classes, else the unweighted mean over classes (macro F1)."""
    import torch

    scores = []
    for c in ([1] if n_classes == 2 else range(n_classes)):
        tp = float(((predicted == c) & (labels == c)).sum())
        fp = float(((predicted == c) & (labels != c)).sum())
        fn = float(((predicted != c) & (labels == c)).sum())
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(torch.tensor(scores).mean())


def group_means(result) -> list[dict]:
    """Per ``(run, λ_egy)``: mean IP and cost over valid counterfactuals, and validity."""
    import numpy as np

    rows = []
    samples = result.samples
    for run, lam in zip(result.groups["run"], result.groups["lambda_energy"]):
        mask = (samples["run"] == run) & (samples["lambda_energy"] == lam)
        ip, cost = samples["ip"][mask], samples["cost"][mask]
        ip, cost = ip[np.isfinite(ip)], cost[np.isfinite(cost)]
        rows.append({"run": int(run), "lambda_energy": float(lam),
                     "ip": float(ip.mean()) if ip.size else None, "cost": float(cost.mean()) if cost.size else None,
                     "validity": float(samples["valid"][mask].mean())})
    return rows


def evaluate_job(run_id: str, job: ModelJob) -> dict:
    """Evaluate a trained grid model: test accuracy and F1, counterfactuals for training factuals (App. D.1)."""
    import torch

    from ct_lightning.evaluation import EvaluationConfig, evaluate_model, evaluation_constraints
    from ct_lightning.evaluation.plots import metric_history
    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.configuration.data import model_datamodule
    from mlflow.tracking import MlflowClient

    loaded = load_run(run_id, job.tracking_uri)
    datamodule = model_datamodule(loaded.config, loaded.module)
    model = loaded.module.cpu().eval()
    with torch.no_grad():
        predicted = model(datamodule.x_test.float()).argmax(1)
    labels = datamodule.y_test.long()
    constraints = evaluation_constraints(model, datamodule, protect=False, all_mutable=True)
    config = EvaluationConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in job.protocol.items()})
    result = evaluate_model(model, datamodule.x_train, datamodule.y_train, datamodule.n_classes, config,
                            constraints.mutability, constraints.lower, constraints.upper, robust=False,
                            x_train=datamodule.x_train, feature_names=list(datamodule.feature_names),
                            y_train=datamodule.y_train, data_name=datamodule.name,
                            group_metrics=False)  # the grid keeps IP, cost and validity (group_means), not IP*
    client = MlflowClient(tracking_uri=job.tracking_uri)
    return {"accuracy": float((predicted == labels).float().mean()),
            "f1": f1_score(predicted, labels, datamodule.n_classes),
            "groups": group_means(result),
            "mature": metric_history(client, run_id, "train/cf_converged")}


def find_grid_evaluation(client, run_id: str, key: str) -> dict | None:
    """The stored grid evaluation ``key`` of ``run_id``, or ``None`` (also when unreadable)."""
    wanted = f"grid_eval/{key}.json"
    if wanted not in {a.path for a in client.list_artifacts(run_id, "grid_eval")}:
        return None
    try:
        return json.loads(Path(client.download_artifacts(run_id, wanted, tempfile.mkdtemp(prefix="ct-grid-")))
                          .read_text())
    except Exception:  # noqa: BLE001 - a torn or foreign file is recomputed, never trusted
        return None


def run_job(job: ModelJob) -> dict:
    """Train (unless a finished run has the key) and evaluate (unless stored) one grid model; safe to repeat."""
    import torch
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.studies.reproduce import find_finished_training
    from ct_lightning.experiment.runs.train import train

    torch.set_num_threads(max(1, job.threads))
    client = MlflowClient(tracking_uri=job.tracking_uri)
    started = time.perf_counter()
    key = job.key()
    run_id = find_finished_training(client, job.experiment, key)
    trained = run_id is None
    if trained:
        run_id = train(job.training_overrides(), tags=_training_tags(job, key))["run_id"]
    return _evaluated(client, job, key, run_id, trained, time.perf_counter() - started, started)


def _training_tags(job: ModelJob, key: str) -> dict:
    from ct_lightning.experiment.studies.reproduce import CONFIG_KEY_TAG

    tags = {CONFIG_KEY_TAG: key, "ct.role": "grid-model"}
    if job.parent_run_id:
        tags["mlflow.parentRunId"] = job.parent_run_id
    return tags


def _evaluated(client, job: ModelJob, key: str, run_id: str, trained: bool, train_seconds: float,
               started: float) -> dict:
    """The grid evaluation of ``job``'s trained run (stored on the run, computed unless already there)."""
    eval_key = job.eval_key()
    evaluation = find_grid_evaluation(client, run_id, eval_key)
    evaluated = evaluation is None
    if evaluated:
        evaluation = {"training_key": key, "eval_key": eval_key, **evaluate_job(run_id, job)}
        with tempfile.TemporaryDirectory(prefix="ct-grid-") as folder:
            path = Path(folder) / f"{eval_key}.json"
            path.write_text(json.dumps(evaluation))
            client.log_artifact(run_id, str(path), artifact_path="grid_eval")
    return {"key": key, "run_id": run_id, "trained": trained, "evaluated": evaluated,
            "train_seconds": train_seconds, "seconds": time.perf_counter() - started, "evaluation": evaluation}


def stack_key(job: ModelJob) -> str | None:
    """What a job shares with the others of its stack (its resolved configuration less the per-model scalars), or
    ``None`` when it trains alone: a vanilla training (one per data set anyway), or one that a stack cannot take
    (``stacked_train.config_blocker``)."""
    from ct_lightning.experiment.runs.stacked_train import config_blocker, shared_settings
    from ct_lightning.experiment.studies.reproduce import stable_key

    config = job.resolved()
    if config["objective"] == "vanilla" or config_blocker([config]):
        return None
    return stable_key(shared_settings(config))


def work_items(jobs: list[ModelJob], stack: int, workers: int = 1) -> list:
    """``jobs`` as work items: a job alone, or a list of up to ``stack`` jobs that train as one stack (same
    :func:`stack_key`).

    Per data set (in ``jobs``' order of data sets), jobs that train alone keep their order and come first (the
    BL: every % change needs it); then the stacks, largest first by :func:`stack_cost`, so that the cheap ones
    fill the workers at the end. With ``workers`` > 1 a data set's stacks are split (the fullest first, into
    near-equal parts) until their number is a multiple of ``workers``: three stacks of 45 on two workers would
    leave one worker idle for a whole stack; 45, 45, 23 and 22 keep both busy. Splitting changes no result: a
    member trains to the same weights in any stack.
    """
    if stack <= 1:
        return list(jobs)
    alone: dict[str, list] = {}
    groups: dict[str, dict[str, list]] = {}
    for job in jobs:
        key = stack_key(job)
        if key is None:
            alone.setdefault(job.data, []).append(job)
        else:
            groups.setdefault(job.data, {}).setdefault(key, []).append(job)
    items = []
    for data in dict.fromkeys(job.data for job in jobs):
        items.extend(alone.get(data, []))
        members = list(groups.get(data, {}).values())
        parts = [math.ceil(len(group) / stack) for group in members]
        while workers > 1 and sum(parts) % workers:
            fullest = max(range(len(members)), key=lambda g: (len(members[g]) / parts[g], -g))
            if len(members[fullest]) <= parts[fullest]:
                break  # every stack is down to one job
            parts[fullest] += 1
        chunks = [chunk for group, n in zip(members, parts) for chunk in _split(group, n)]
        items.extend(sorted(chunks, key=stack_cost, reverse=True))  # stable: equal costs keep the grid's order
    return [item[0] if isinstance(item, list) and len(item) == 1 else item for item in items]


def _split(group: list, parts: int) -> list[list]:
    """``group`` in ``parts`` consecutive chunks whose sizes differ by at most one."""
    size, extra = divmod(len(group), parts)
    bounds = [k * size + min(k, extra) for k in range(parts + 1)]
    return [group[bounds[k]:bounds[k + 1]] for k in range(parts)]


def stack_cost(chunk: list[ModelJob]) -> float:
    """A stack's relative cost for ordering: members × epochs × counterfactuals per epoch × search steps."""
    settings = {**NOTE1, **chunk[0].overrides}
    return len(chunk) * float(settings["max_epochs"]) * float(settings["nce"]) * float(settings["max_steps"])


def default_stack(echo=print) -> int:
    """The grid's stack size when ``--stack`` is not given: 64 on the CPU, where a stack gives the lone trainings'
    weights; 1 where a GPU would train, since a stacked GPU training agrees with a lone one within rounding only
    (``bench/gpu_appendix_h200.json``: 0.024 apart in weights after 100 epochs on an H200)."""
    import torch

    if not torch.cuda.is_available():
        return 64
    echo("--stack: this machine has a GPU, so every grid training runs alone on it (stacked GPU trainings are "
         "about 17x faster but agree with lone ones within rounding only); --stack 64 stacks them", flush=True)
    return 1


def run_item(item) -> list[dict]:
    """A work item of :func:`work_items`: one job (:func:`run_job`) or a stack (:func:`run_stack`)."""
    return run_stack(item) if isinstance(item, list) else [run_job(item)]


def run_stack(jobs: list[ModelJob]) -> list[dict]:
    """Train the jobs of one stack that no finished run has yet as one stacked training, then evaluate each job."""
    import torch
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.studies.reproduce import find_finished_training
    from ct_lightning.experiment.runs.stacked_train import train_stack
    from ct_lightning.experiment.runs.train import train

    torch.set_num_threads(max(1, jobs[0].threads))
    client = MlflowClient(tracking_uri=jobs[0].tracking_uri)
    started = time.perf_counter()
    keys = [job.key() for job in jobs]
    run_ids = [find_finished_training(client, job.experiment, key) for job, key in zip(jobs, keys)]
    missing = [i for i, run_id in enumerate(run_ids) if run_id is None]
    if len(missing) == 1:
        job = jobs[missing[0]]
        run_ids[missing[0]] = train(job.training_overrides(), tags=_training_tags(job, keys[missing[0]]))["run_id"]
    elif missing:
        summaries = train_stack([jobs[i].training_overrides() for i in missing],
                                [_training_tags(jobs[i], keys[i]) for i in missing])
        for i, summary in zip(missing, summaries):
            run_ids[i] = summary["run_id"]
    share = (time.perf_counter() - started) / max(len(missing), 1)  # each training's share of the stack
    results = []
    for i, (job, key, run_id) in enumerate(zip(jobs, keys, run_ids)):
        results.append(_evaluated(client, job, key, run_id, i in missing, share if i in missing else 0.0,
                                  time.perf_counter() - (share if i in missing else 0.0)))
        if results[-1]["evaluated"]:
            print(f"stack: model {i + 1}/{len(jobs)} evaluated", flush=True)
    return results


def find_or_create_grid_parent(client, experiment_id: str, key: str, name: str) -> str:
    """The parent run of the grid run with ``key`` (reopened), or a new one."""
    runs = client.search_runs([experiment_id], f"tags.`ct.grid_key` = '{key}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if runs:
        client.update_run(runs[0].info.run_id, status="RUNNING")
        return runs[0].info.run_id
    return new_run(client, experiment_id, run_name=name, tags={"ct.grid_key": key, "ct.role": "grid"}).info.run_id


def run_grid(grid: Grid, datasets: list[str], tracking_uri: str, out_json: str | Path, *, jobs: int = 1,
             experiment: str = "ct-appendix", extra: dict | None = None, n_runs: int | None = None,
             n_individuals: int | None = None, threads: int = 1, stack: int | None = 1, echo=print) -> dict:
    """Run or resume ``grid`` on ``datasets``; writes the results (points + per-model evaluations) to ``out_json``.

    Returns the results. Trainings shared by several points (vanilla) run once. ``stack`` > 1: CT trainings that
    differ only in per-model scalars train up to ``stack`` at a time as one stacked training (:func:`run_stack`);
    ``None``: :func:`default_stack`.
    """
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.studies.executor import LocalExecutor
    from ct_lightning.experiment.studies.reproduce import stable_key
    from ct_lightning.experiment.runs.atomic_files import write_json_atomic
    from ct_lightning.experiment.runs.interrupt import (INTERRUPTED_TAG, TrainingInterrupted, clear_interrupted,
                                                        stop_between_trainings)
    from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store

    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_absolute():
        tracking_uri = "sqlite:///" + str(Path(tracking_uri[len("sqlite:///"):]).resolve())
    artifact_location = prepare_store(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = ensure_experiment(client, experiment, artifact_location)
    points, models = plan(grid, datasets, tracking_uri, experiment, extra=extra, n_runs=n_runs,
                          n_individuals=n_individuals, threads=threads)
    grid_key = stable_key({"grid": grid.name, "space": grid.space, "base": grid.base, "data": datasets,
                           "extra": extra or {}, "models": sorted(models)})
    parent = find_or_create_grid_parent(client, experiment_id, grid_key, f"{grid.name} {','.join(datasets)}")
    for job in models.values():
        job.parent_run_id = parent
    client.log_param(parent, "grid", grid.name) if not client.get_run(parent).data.params else None
    echo(f"grid {grid.name}: {len(points)} points on {', '.join(datasets)} -> {len(models)} distinct trainings "
         f"(parent run {parent})", flush=True)
    started = time.perf_counter()
    outcomes: dict[str, dict] = {}
    failures: list[str] = []

    last_write = -math.inf  # when write() last ran (time.monotonic)

    def write() -> dict:
        nonlocal last_write
        last_write = time.monotonic()
        results = {"grid": grid.name, "title": grid.title, "data": datasets, "space": grid.space,
                   "n_points": len(points), "n_models": len(models), "parent_run_id": parent,
                   "points": points, "models": {k: {"data": models[k].data, "overrides": models[k].overrides,
                                                    **{f: o[f] for f in ("run_id", "trained", "evaluated",
                                                                         "train_seconds", "seconds",
                                                                         "evaluation")}}
                                                for k, o in outcomes.items()},
                   "failures": failures, "wall_seconds": time.perf_counter() - started}
        write_json_atomic(out_json, results)
        return results

    def finished(outcome) -> None:
        item = items[outcome.index]
        members = item if isinstance(item, list) else [item]
        for job, result in zip(members, outcome.result if outcome.ok else [None] * len(members)):
            record(job.label, result, outcome.error)
        if len(outcomes) + len(failures) < len(models):
            stopping.check()  # a safe point: the outcome is kept, no write is under way

    def record(label: str, result: dict | None, error: str | None) -> None:
        if error is not None:
            failures.append(f"{label}: {error}")
            echo(f"FAILED {label}: {error}", flush=True)
            return
        outcomes[result["key"]] = result
        what = "trained+evaluated" if result["trained"] else ("evaluated" if result["evaluated"] else "reused")
        if progress_shown():  # not under --no-progress
            echo(f"[{len(outcomes)}/{len(models)}] {label} {what} in {result['seconds']:.1f}s; "
                 f"elapsed {time.perf_counter() - started:.0f}s", flush=True)
        # The results file holds every evaluation (tens of MB for a large grid): rewriting it after each of hundreds
        # of models would keep this process busy beside the workers. Every model is in the store the moment it is
        # recorded (a re-run reuses it), so the file is rewritten at most every RESULTS_EVERY_S seconds, and at the end.
        due = time.monotonic() - last_write >= RESULTS_EVERY_S
        if (result["trained"] or result["evaluated"]) and due or len(outcomes) == len(models):
            write()

    # One data set after the other (a partial run still gives whole data sets), its BL first (every
    # % change needs it), then the longest trainings first.
    order = sorted(models.values(), key=lambda j: (datasets.index(j.data), j.overrides.get("objective") != "vanilla",
                                                    -j.overrides.get("max_epochs", 100),
                                                    -j.overrides.get("nce", 0)))
    stack = default_stack(echo) if stack is None else stack
    items = work_items(order, stack, jobs)
    labels = [f"stack of {len(item)}: {item[0].label} ..." if isinstance(item, list) else item.label for item in items]
    status = "FAILED"
    try:
        # SIGTERM/SIGINT: a training stops after its epoch; otherwise the grid stops once the point is kept
        with stop_between_trainings(defer=True) as stopping:  # ``finished`` checks it (bound before any call)
            LocalExecutor(jobs, threads).run(run_item, items, labels, finished)
        status = "FINISHED" if not failures else "FAILED"
        retry_race(lambda: clear_interrupted(client, parent))  # a resumed grid: no longer interrupted
    except TrainingInterrupted as interrupted:
        status = "KILLED"
        reason = f"{interrupted}; re-run the same command to resume"
        retry_race(lambda: client.set_tag(parent, INTERRUPTED_TAG, reason))
        echo(f"interrupted ({interrupted}): grid parent run {parent} is KILLED; finished trainings and evaluations "
             f"are kept in {out_json} and the store: re-run the same command to resume", flush=True)
        raise
    finally:
        results = write()
        # Workers stopping on the same signal may still hold SQLite's write lock: the last records wait for it.
        for closing in (lambda: client.log_metric(parent, "n_models", len(models)),
                        lambda: client.log_metric(parent, "n_points", len(points)),
                        lambda: client.log_metric(parent, "wall_seconds", results["wall_seconds"]),
                        lambda: client.log_dict(parent, {k: v for k, v in results.items() if k != "models"},
                                                "grid_points.json"),
                        lambda: client.set_terminated(parent, status)):
            retry_race(closing)
    return results


def is_finite(value) -> bool:
    """``value`` is a finite number."""
    return isinstance(value, (int, float)) and math.isfinite(value)
