"""Sweeps: grid or random search over any training setting, one MLflow child run per trial.

A sweep is a parent MLflow run (tag ``ct.sweep_key``, a hash of what the sweep trains) with one
child run per trial (tags ``mlflow.parentRunId`` and ``ct.config_key``, the trial's resolved training
configuration, as in :mod:`ct_lightning.experiment.studies.reproduce`). The trials are dispatched by an
:class:`~ct_lightning.experiment.studies.executor.Executor` (Ray Tune by default, local processes without
Ray). Re-running the same sweep reopens its parent and reuses every trial that already finished,
so an interrupted sweep resumes without redoing them; a failed trial is reported, the others go on.
Trials that are one training (vanilla trials that differ only in what a vanilla training does not read,
:func:`shaping_key`) are trained once, before they reach the executor; the others get a child run that
names the training they share (:func:`record_shared_trial`) and report its results.
The objective is any metric logged on the trial runs (``val/acc``, ``val/ip`` from ``--eval-every``, ...).
"""

from __future__ import annotations

import math
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ct_lightning.experiment.studies.reproduce import CONFIG_KEY_TAG, NON_DEFINING_KEYS, stable_key, training_key
from ct_lightning.experiment.configuration.settings import (DEFAULTS, RUN_ONLY_KEYS, TABLE_KEYS, command_line,
                                                            resolve_config)
from ct_lightning.experiment.configuration.sweep_space import (MODES, SEARCHES, check_metric,  # noqa: F401 - and
                                                               combinations, parse_space,  # callers' imports from here
                                                               refuse_one_run_options, with_config_file)
from ct_lightning.experiment.configuration.validation import InputError
from ct_lightning.experiment.runs.atomic_files import write_json_atomic
from ct_lightning.experiment.runs.tracking import ensure_experiment, new_run, prepare_store

SWEEP_KEY_TAG = "ct.sweep_key"


def check_data_options(configs: list[dict], modules: dict | None = None) -> list[str]:
    """The data checks of a training (target, data spec, immutable and mutable columns: the data module and
    mutability of ``train``), once per distinct data configuration of the trials, before any trial runs. The
    descriptions of the tables read (columns, kinds, notes: what ``train`` prints at start-up), each once.
    ``modules``: tables' data modules already built and set up, by :func:`~ct_lightning.experiment.configuration.
    settings.table_key`, used instead of reading those tables again."""
    from ct_lightning.experiment.configuration.data import build_datamodule, mutability_spec
    from ct_lightning.experiment.configuration.settings import is_table_file, table_key
    from ct_lightning.experiment.runs.kept_preprocessing import kept_preprocessing

    keys = ("data", *TABLE_KEYS, "data_dir", "center_distance", "immutable", "mutability", "protect")
    seen, described = set(), []
    for config in configs:
        key = repr([config.get(k) for k in keys])
        if key not in seen:
            seen.add(key)
            built = (modules or {}).get(table_key(config["data"], config)) if modules and is_table_file(
                config["data"]) else None
            kept = None if built else kept_preprocessing(config)  # a model's own table preprocessing reads the table
            datamodule = built or build_datamodule(config, codec=kept, widen=kept is not None)
            mutability_spec(config, datamodule)
            text = datamodule.describe() if hasattr(datamodule, "describe") else None
            if text and text not in described:
                described.append(text)
    return described


def shaping_key(config: dict) -> str:
    """Key of what shapes a trial's model, from its resolved configuration: a vanilla training never reads the
    search, the generator or the CT penalties (``grids.VANILLA_IGNORED``), so vanilla trials that differ only in
    those are one training, as in the appendix grids. Generator options are checked when the generator is built,
    vanilla or not, so with them nothing is left out (a trial with options its generator refuses still fails)."""
    from ct_lightning.experiment.studies.grids import effective_overrides

    return training_key(config if config.get("generator_options") else effective_overrides(config))


def share_groups(configs: list[dict]) -> dict[int, list[int]]:
    """``{first trial: the later trials that are the same training}`` over the trials' resolved configurations
    (every trial is in one group; a trial that shares with none is a group of its own)."""
    groups: dict[str, list[int]] = {}
    for index, config in enumerate(configs):
        groups.setdefault(shaping_key(config), []).append(index)
    return {members[0]: members[1:] for members in groups.values()}


SHARES_TAG = "ct.sweep_shares_training_of"  # on a shared trial's run: the run that trained its model
SHARES_TRIAL_TAG = "ct.sweep_shares_trial"  # ... and that run's trial index


def record_shared_trial(client, experiment_id: str, trial: "Trial", key: str, trained_run_id: str,
                        source: "Trial") -> str:
    """A FINISHED child run for ``trial``, whose model is the one ``source`` trained in run ``trained_run_id``:
    nothing is trained; its parameters are that run's with this trial's settings, its metrics that run's whole history
    (every epoch's values: the same curves), its artifacts that run's but the checkpoints (plots, preprocessing; its
    ``config.json``/``config.yaml`` with this trial's settings), its tags name the run and trial it shares
    (:data:`SHARES_TAG`: the run that holds its checkpoints and models) and its note says why, with a link. Its run
    id."""
    import json

    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    from ct_lightning.experiment.runs.copied_run import NOT_COPIED, copy_artifacts, copy_metric_history
    from ct_lightning.experiment.runs.run_artifacts import log_params_in_batches

    trained = client.get_run(trained_run_id)
    differ = ", ".join(k for k in trial.params if trial.params[k] != source.params.get(k)) or "no setting"
    link = f"[run {trained_run_id}](#/experiments/{experiment_id}/runs/{trained_run_id})"
    note = (f"Not trained: this trial is the same training as trial {source.index} ({link}), which differs only in "
            f"{differ}, which a vanilla training does not read. Its metrics and plots are copied from there; its "
            f"model and {', '.join(NOT_COPIED)} are that run's.")
    tags = {CONFIG_KEY_TAG: key, "mlflow.parentRunId": trial.parent_run_id, "ct.role": "sweep-trial",
            SHARES_TAG: trained_run_id, SHARES_TRIAL_TAG: str(source.index), "mlflow.note.content": note,
            **{f"sweep.{k}": str(v) for k, v in trial.params.items()}}
    run = new_run(client, experiment_id, run_name=trial.overrides()["run_name"], tags=tags)
    run_id = run.info.run_id
    params = {**trained.data.params, **{k: str(v) for k, v in trial.params.items()}}
    copy_metric_history(client, trained_run_id, run_id)
    log_params_in_batches(client, run_id, [Param(k, v[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()])
    own = ("config.json", "config.yaml")  # the trained run's configuration with this trial's settings
    copy_artifacts(client, trained_run_id, run_id, replace=own)
    with tempfile.TemporaryDirectory(prefix="ct-config-") as folder:
        try:
            config = json.loads(Path(client.download_artifacts(trained_run_id, own[0], folder)).read_text())
        except (OSError, ValueError):
            config = None  # a run without its configuration (none logged): none is made up
    if config is not None:
        for name in own:
            client.log_dict(run_id, {**config, **trial.params}, name)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def stored_outcome(client, run_id: str, index: int, label: str):
    """The outcome of trial ``index`` from its finished run ``run_id`` (of an earlier run of the sweep); a shared
    trial's outcome names the run that trained its model and, as ``shares``, that run's trial."""
    from ct_lightning.experiment.studies.executor import Outcome

    run = client.get_run(run_id)
    shares = run.data.tags.get(SHARES_TRIAL_TAG)
    return Outcome(index, label, {"run_id": run.data.tags.get(SHARES_TAG, run_id), "reused": 1, "trial_seconds": 0.0,
                                  "shares": None if shares is None else int(shares),
                                  **{f"metric:{k}": float(v) for k, v in run.data.metrics.items()}})


@dataclass
class Trial:
    """One training of a sweep: the base overrides plus this trial's settings, under the sweep's parent run."""

    index: int
    params: dict
    base: dict
    parent_run_id: str
    metric: str
    threads: int = 1
    extra: dict = field(default_factory=dict)
    described: tuple[str, ...] = ()  # table descriptions the sweep printed once: its trials leave them out

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())

    def overrides(self) -> dict:
        """Training overrides of this trial (the trial's settings win over the base); with ``checkpoint_dir``, the
        trial's own folder in it (an earlier attempt of the same trial of this sweep may be replaced)."""
        run_name = self.base.get("run_name") or "trial"
        # the trial's settings in its name, so that runs tell apart in the MLflow UI's list ("trial-0 lambda_div=0.1")
        name = f"{run_name}-{self.index} {self.label}" if self.params else f"{run_name}-{self.index}"
        overrides = {**self.base, **self.params, "run_name": name, "progress": False}
        if self.base.get("checkpoint_dir"):
            overrides["checkpoint_dir"] = str(Path(self.base["checkpoint_dir"]) / f"sweep-{self.parent_run_id[:8]}"
                                              / f"trial-{self.index}")
            overrides["overwrite"] = True
        return overrides

    def key(self) -> str:
        return training_key(resolve_config(self.overrides()))


def find_finished_trial(client, experiment_id: str, parent_run_id: str, key: str) -> str | None:
    """A FINISHED child of ``parent_run_id`` with training key ``key``."""
    runs = client.search_runs([experiment_id], f"tags.`{CONFIG_KEY_TAG}` = '{key}' and "
                              f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'FINISHED'",
                              max_results=1)
    return runs[0].info.run_id if runs else None


def find_interrupted_trial(client, experiment_id: str, parent_run_id: str, key: str):
    """``(run, last checkpoint)`` of the newest KILLED child of ``parent_run_id`` with training key ``key`` that can be
    resumed, else ``(None, None)``; KILLED children without a checkpoint are tagged as replaced."""
    from ct_lightning.experiment.runs.lifecycle import last_checkpoint_of

    runs = client.search_runs([experiment_id], f"tags.`{CONFIG_KEY_TAG}` = '{key}' and "
                              f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'KILLED'",
                              order_by=["attributes.start_time DESC"])
    for run in runs:
        if REPLACED_TAG not in run.data.tags:
            last = last_checkpoint_of(run)
            if last is not None:
                return run, last
    return None, None


TRIAL_RESUME_HINT = "re-run the same sweep command: it resumes this trial"  # not the trial's own train.py --resume
REPLACED_TAG = "ct.sweep_replaced"  # on a trial run that a later attempt of the same trial replaced


def run_trial(trial: Trial) -> dict:
    """Train one trial unless its parent already has a finished child with the same configuration (then reused) or
    an interrupted one with a checkpoint (then resumed in the same run); its metrics."""
    import torch
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.configuration.console import sweep_trial_echo
    from ct_lightning.experiment.runs.train import train

    torch.set_num_threads(max(1, trial.threads))
    echo = sweep_trial_echo(trial.described)
    overrides = trial.overrides()
    client = MlflowClient(tracking_uri=overrides["tracking_uri"])
    experiment_id = client.get_experiment_by_name(overrides["experiment"]).experiment_id
    key = trial.key()
    started = time.perf_counter()
    run_id = find_finished_trial(client, experiment_id, trial.parent_run_id, key)
    reused = run_id is not None
    if not reused:
        killed, _ = find_interrupted_trial(client, experiment_id, trial.parent_run_id, key)
        if killed is not None:  # keeps its epochs: only the options --resume allows are passed
            run_id = train({"resume": killed.info.run_id, "tracking_uri": overrides["tracking_uri"],
                            "experiment": overrides["experiment"], "progress": False,
                            **{k: overrides[k] for k in ("threads", "verbose") if overrides.get(k) is not None}},
                           echo=echo, resume_hint=TRIAL_RESUME_HINT)["run_id"]
        else:
            tags = {CONFIG_KEY_TAG: key, "mlflow.parentRunId": trial.parent_run_id, "ct.role": "sweep-trial",
                    **{f"sweep.{k}": str(v) for k, v in trial.params.items()}}
            run_id = train(overrides, tags=tags, echo=echo, resume_hint=TRIAL_RESUME_HINT)["run_id"]
            mark_replaced(client, experiment_id, trial.parent_run_id, key, run_id)
    metrics = client.get_run(run_id).data.metrics  # the latest value of every metric logged on the run
    return {"run_id": run_id, "reused": int(reused), "trial_seconds": time.perf_counter() - started,
            **{f"metric:{k}": float(v) for k, v in metrics.items()}}


def mark_replaced(client, experiment_id: str, parent_run_id: str, key: str, run_id: str) -> None:
    """Tag the earlier unfinished attempts (KILLED, FAILED) of a trial as replaced by run ``run_id``."""
    runs = client.search_runs([experiment_id], f"tags.`{CONFIG_KEY_TAG}` = '{key}' and "
                              f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status != 'FINISHED'")
    for run in runs:
        if run.info.run_id != run_id and run.info.status in ("KILLED", "FAILED"):
            client.set_tag(run.info.run_id, REPLACED_TAG, f"by run {run_id}")


def kill_running_trials(client, experiment_id: str, parent_run_id: str, interrupted) -> list[str]:
    """End KILLED the children of ``parent_run_id`` still RUNNING once the sweep stopped (trials that could not end
    their own runs, e.g. Ray Tune's, stopped by Tune); their ids."""
    from ct_lightning.experiment.runs.interrupt import INTERRUPTED_TAG

    runs = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}' and "
                              "attributes.status = 'RUNNING'")
    for run in runs:
        client.set_tag(run.info.run_id, INTERRUPTED_TAG, f"{interrupted}; re-run the same sweep command to resume")
        client.set_terminated(run.info.run_id, "KILLED")
    return [run.info.run_id for run in runs]


def trial_metrics(result: dict) -> dict[str, float]:
    """The run metrics in a trial result (without the ``metric:`` prefix)."""
    return {k[len("metric:"):]: v for k, v in result.items() if k.startswith("metric:")}


def sweep_key(base: dict, trials: list[dict], metric: str, mode: str) -> str:
    """Identity of a sweep: the resolved base configuration, the trials' settings and the objective."""
    resolved = {k: v for k, v in resolve_config(base).items() if k not in NON_DEFINING_KEYS}
    return stable_key({"base": resolved, "trials": trials, "metric": metric, "mode": mode})


def find_or_create_sweep_parent(client, experiment_id: str, key: str, name: str, echo=print,
                                given_name: bool = False, tags: dict | None = None) -> tuple[str, bool]:
    """``(run id, reopened)``: the parent run of the sweep with ``key`` (set running again), or a new one with
    ``tags`` (its trials' ``data``, so that the UI's column shows it for the parent too).

    A reopened parent takes ``name`` when it was given (``given_name``) and differs, saying so in one line."""
    runs = client.search_runs([experiment_id], f"tags.`{SWEEP_KEY_TAG}` = '{key}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if runs:
        run = runs[0]
        client.update_run(run.info.run_id, status="RUNNING")
        if given_name and run.info.run_name != name:
            client.update_run(run.info.run_id, name=name)
            echo(f"sweep: resuming sweep {run.info.run_name!r} (parent run {run.info.run_id}: the same base options, "
                 f"trials and objective), renamed {name!r} as --sweep-name asks", flush=True)
        return run.info.run_id, True
    run = new_run(client, experiment_id, run_name=name,
                  tags={**(tags or {}), SWEEP_KEY_TAG: key, "ct.role": "sweep"})
    return run.info.run_id, False


def retrain_options(given: dict, shown=()) -> list[str]:
    """The ``train.py`` options that train the settings ``given`` (a trial's: the sweep's base and its own) on their
    own (:func:`~ct_lightning.experiment.configuration.settings.command_line`): ``--data`` and the table's options,
    the settings named in ``shown`` (the swept ones), then every other setting whose value is not the one
    ``train.py`` takes without it for that data (the data set's Table 2 values, the defaults); the store where it is
    not the default one of the folder the sweep ran in. The sweep's run-only settings (a trial's run name, its
    checkpoint folder, ...) are left out."""
    from ct_lightning.experiment.configuration.store import anchor_tracking_uri

    given = {k: v for k, v in given.items() if v is not None and k not in RUN_ONLY_KEYS}
    data_keys = ("data", *TABLE_KEYS)
    resolved = resolve_config(given)
    plain = resolve_config({k: given[k] for k in data_keys if k in given})  # what train.py takes for this data
    kept = {k: resolved[k] for k in given
            if k in ("data", *shown) or resolved[k] != (DEFAULTS if k in data_keys else plain)[k]}
    if anchor_tracking_uri(str(kept.get("tracking_uri"))) == anchor_tracking_uri(DEFAULTS["tracking_uri"]):
        kept.pop("tracking_uri", None)
    return command_line(kept)


RETRAIN_LINE = "train the best trial on its own: "  # the start of the sweep's last line, before the command


def retrain_command(trial: "Trial") -> str:
    """The shell command that trains ``trial``'s configuration on its own with ``recipes/train.py`` (from any
    folder, shell-quoted; :func:`retrain_options`, its swept settings always shown)."""
    from ct_lightning.experiment.runs.lifecycle import recipe_command

    return recipe_command("train", retrain_options({**trial.base, **trial.params}, shown=tuple(trial.params)))


def _register_best(tracking_uri: str, run_id: str, echo) -> str | None:
    """Register the best trial's predictor (``name/version``); a warning instead where the store refuses."""
    from ct_lightning.experiment.configuration.console import verbose_console
    from ct_lightning.experiment.runs.served_model import register_run_predictor, registered_text

    try:
        name, version = register_run_predictor(tracking_uri, run_id, verbose_console())
    except Exception as error:  # noqa: BLE001 - registering must not lose a finished sweep's summary
        echo(f"warning: the best trial's predictor was not registered ({str(error).splitlines()[0][:200]})",
             flush=True)
        return None
    if name is None:  # --registered-model none
        return None
    echo(f"registered the best trial's predictor as {registered_text(name, version, tracking_uri)}", flush=True)
    return f"{name}/{version}"


def run_sweep(base: dict, space: dict[str, list], executor, *, search: str = "grid", num_samples: int = 10,
              seed: int = 0, metric: str = "val/acc", mode: str = "max", name: str | None = None,
              threads: int = 1, out_json: str | None = None, echo=print) -> dict:
    """Run (or resume) a sweep of trainings and return its summary (trials, best trial, failures).

    ``base``: training overrides shared by all trials (``tracking_uri``, ``experiment``, ``max_epochs``, ...);
    ``space``: values per setting; ``executor``: where the trials run.
    """
    from mlflow.tracking import MlflowClient

    from ct_lightning.metrics.names import METRICS, validation_metrics

    if mode not in MODES:
        raise InputError("mode", mode, ", ".join(MODES))
    base = with_config_file({k: v for k, v in base.items() if v is not None})
    refuse_one_run_options(base)
    settings = combinations(space, search, num_samples, seed)
    # every trial's configuration is valid before anything runs: values, objective, the table's columns
    configs = [resolve_config({**base, **params}) for params in settings]
    check_metric(metric, any(config["eval_every"] for config in configs),
                 tuple(METRICS[key].logged for key in validation_metrics()))  # rows registered at run time too
    described = check_data_options(configs)
    groups = share_groups(configs)  # the first trial of each training → the later trials that share it
    resolved = resolve_config(base)
    tracking_uri, experiment = resolved["tracking_uri"], resolved["experiment"]
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_absolute():
        # Trials may run in other working directories (Ray workers): make the store path absolute.
        tracking_uri = "sqlite:///" + str(Path(tracking_uri[len("sqlite:///"):]).resolve())
    base = {**base, "tracking_uri": tracking_uri, "experiment": experiment, "data": resolved["data"]}  # a table: absolute
    for path_key in ("data_spec", "model_inputs", "checkpoint_dir"):
        if isinstance(base.get(path_key), str):
            base[path_key] = str(Path(base[path_key]).resolve())
    artifact_location = prepare_store(tracking_uri)  # the store, created once under a file lock
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = ensure_experiment(client, experiment, artifact_location)
    key = sweep_key(base, settings, metric, mode)
    from ct_lightning.experiment.runs.lifecycle import data_label  # noqa: PLC0415

    data = data_label(base["data"])  # two sweeps of the same options on two tables are told apart by name
    parent, reopened = find_or_create_sweep_parent(client, experiment_id, key, name or f"sweep {data}: "
                                                   f"{','.join(space)}", echo, given_name=name is not None,
                                                   tags={"data": data})
    if not reopened:
        # sweep.* names: the parent shares the UI's columns with its trials, whose "objective" is full/vanilla
        client.log_param(parent, "sweep.search", search)
        client.log_param(parent, "sweep.goal", f"{mode} {metric}")
        client.log_param(parent, "sweep.trials", len(settings))
        client.log_param(parent, "sweep.trainings", len(groups))
        for param, values in space.items():
            client.log_param(parent, f"space.{param}", ",".join(map(str, values))[:500])
        # the settings every trial shares, so that two sweeps' parents can be told apart in the UI
        for key in ("data", "target", "objective", "generator", "max_epochs", "seed", "immutable", "mutability"):
            value = resolved.get(key) if key not in base else base[key]
            if value not in (None, "", []) and key not in space:
                client.log_param(parent, f"base.{key}",
                                 (",".join(map(str, value)) if isinstance(value, list) else str(value))[:500])
    trials = [Trial(i, params, base, parent, metric, threads, described=tuple(described))
              for i, params in enumerate(settings)]
    keys = [trial.key() for trial in trials]
    shared_note = "" if len(groups) == len(trials) else \
        f" as {len(groups)} trainings (vanilla trials that differ only in settings vanilla does not read share one)"
    echo(f"sweep: {len(trials)} trials ({search}){shared_note} in experiment {experiment!r}, parent run {parent}"
         f"{' (resumed: finished trials are reused)' if reopened else ''}; objective {mode} {metric}", flush=True)
    for text in described:  # once for the sweep, not once per trial (also in the parent run, as data.txt)
        echo(text, flush=True)
    if described:
        client.log_text(parent, "\n\n".join(described) + "\n", "data.txt")
    started = time.perf_counter()
    rows: list[dict] = []
    failures: list[dict] = []
    waiting: dict[int, list[int]] = {}  # a trial to train → the trials that share its training

    def record(outcome) -> None:
        trial = trials[outcome.index]
        if not outcome.ok:
            failures.append({"trial": outcome.index, "params": trial.params, "error": outcome.error})
            echo(f"FAILED trial {outcome.index} ({trial.label}): {outcome.error}", flush=True)
            return
        metrics = trial_metrics(outcome.result)
        value = metrics.get(metric)
        shares = outcome.result.get("shares")
        rows.append({"trial": outcome.index, "params": trial.params, "run_id": outcome.result["run_id"],
                     "reused": bool(outcome.result["reused"]), "objective": value,
                     "seconds": outcome.result["trial_seconds"], "metrics": metrics,
                     **({"shares_training_of": shares} if shares is not None else {})})
        what = "reused" if outcome.result["reused"] else f"trained in {outcome.result['trial_seconds']:.1f}s"
        if shares is not None:
            what = f"{'reused (it shares' if outcome.result['reused'] else 'shares'} trial {shares}'s training" \
                   f"{')' if outcome.result['reused'] else ''}"
        shown = "missing" if value is None else f"{value:.4g}"
        echo(f"[{len(rows) + len(failures)}/{len(trials)}] trial {outcome.index} ({trial.label}) {what}; "
             f"{metric} = {shown}", flush=True)

    def share(index: int, source) -> None:
        """Trial ``index`` is the training of the outcome ``source`` (of another trial): record it, or its failure."""
        trial = trials[index]
        if not source.ok:
            record(Outcome(index, trial.label, error=f"shares trial {source.index}'s training, which failed: "
                                                     f"{source.error}"))
            return
        record_shared_trial(client, experiment_id, trial, keys[index], source.result["run_id"], trials[source.index])
        record(Outcome(index, trial.label, {**source.result, "reused": 0, "trial_seconds": 0.0,
                                            "shares": source.index}))

    def finished(outcome) -> None:
        record(outcome)
        for index in waiting.pop(outcome.index, []):
            share(index, outcome)
        if stopping is not None and len(rows) + len(failures) < len(trials):
            stopping.check()  # a safe point: the outcome is kept, no write is under way

    from ct_lightning.experiment.runs.interrupt import TrainingInterrupted, stop_between_trainings
    stopping = None

    from ct_lightning.experiment.studies.executor import Outcome

    todo = []
    for first, others in groups.items():  # finished trials are read from the store here, not dispatched again
        found = {index: find_finished_trial(client, experiment_id, parent, keys[index]) for index in (first, *others)}
        source = None  # the outcome of the group's training, where the store has it
        for index, run_id in found.items():
            if run_id is not None:
                outcome = stored_outcome(client, run_id, index, trials[index].label)
                record(outcome)
                shares = outcome.result["shares"]
                source = source or Outcome(index if shares is None else shares, "", {**outcome.result, "shares": None})
        missing = [index for index, run_id in found.items() if run_id is None]
        if missing and source is not None:  # the training is there: the trials without a run of their own share it
            for index in missing:
                share(index, source)
        elif missing:
            todo.append(trials[missing[0]])
            waiting[missing[0]] = missing[1:]
    if todo and len(rows) + len(failures):
        echo(f"{len(rows) + len(failures)} trials already finished; {len(todo)} trainings to run", flush=True)
    status = "FAILED"
    interrupted = None
    try:
        if todo:
            def dispatched(outcome) -> None:  # positions in ``todo`` → trial indices
                finished(Outcome(todo[outcome.index].index, outcome.label, outcome.result, outcome.error))

            # SIGINT/SIGTERM: a training stops after its epoch (its run KILLED, resumable); between trainings the
            # sweep stops once the finished trial is kept
            with stop_between_trainings(defer=True) as stopping:
                executor.run(run_trial, todo, [t.label for t in todo], dispatched)
        status = "FINISHED"
    except (TrainingInterrupted, KeyboardInterrupt) as error:
        interrupted = error if isinstance(error, TrainingInterrupted) else TrainingInterrupted(signal.SIGINT)
        status = "KILLED"
        kill_running_trials(client, experiment_id, parent, interrupted)
    finally:
        scored = [r for r in rows if r["objective"] is not None and math.isfinite(r["objective"])]
        # Ties go to the lowest trial index: trials finish in any order, and a resumed sweep must name the same best.
        sign = -1.0 if mode == "max" else 1.0
        best = min(scored, key=lambda r: (sign * r["objective"], r["trial"])) if scored else None
        summary = {"parent_run_id": parent, "experiment": experiment, "tracking_uri": tracking_uri,
                   "search": search, "metric": metric, "mode": mode, "n_trials": len(trials),
                   "n_trainings": len(groups),
                   "wall_seconds": time.perf_counter() - started,
                   "trials": sorted(rows, key=lambda r: r["trial"]), "failures": failures, "best": best}
        if best is not None:
            best = summary["best"] = {**best, "train_command": retrain_command(trials[best["trial"]])}
            client.log_metric(parent, f"best/{metric}", best["objective"])
            client.set_tag(parent, "best_run_id", best["run_id"])
            if status == "FINISHED":  # the best of every trial: the one model of the sweep to serve
                summary["registered"] = _register_best(tracking_uri, best["run_id"], echo)
                if summary["registered"]:
                    client.set_tag(parent, "registered_model", summary["registered"])
        client.log_metric(parent, "failed_trials", len(failures))
        client.log_dict(parent, summary, "sweep.json")
        if out_json:
            write_json_atomic(out_json, summary)
        if status == "FINISHED" and interrupted is None:
            from ct_lightning.experiment.runs.interrupt import clear_interrupted  # noqa: PLC0415

            clear_interrupted(client, parent)  # a resumed sweep: its earlier interruption no longer describes it
        client.set_terminated(parent, "FAILED" if failures and status != "KILLED" else status)
    if interrupted is not None:
        from ct_lightning.experiment.runs.interrupt import INTERRUPTED_TAG

        client.set_tag(parent, INTERRUPTED_TAG, f"{interrupted}; re-run the same sweep command to resume")
        echo(f"interrupted ({interrupted}): sweep parent run {parent} is KILLED with {len(rows)} of {len(trials)} "
             f"trials finished; re-run the same command to resume it (interrupted trials continue from their last "
             f"checkpoint)", file=sys.stderr, flush=True)
        raise interrupted
    if best is not None:
        echo(f"best trial {best['trial']} ({', '.join(f'{k}={v}' for k, v in best['params'].items())}): "
             f"{metric} = {best['objective']:.4g} (run {best['run_id']})", flush=True)
        echo(f"{RETRAIN_LINE}{best['train_command']}", flush=True)
    if failures:
        echo(f"{len(failures)} of {len(trials)} trials failed; re-run the same command to retry them", flush=True)
    return summary
