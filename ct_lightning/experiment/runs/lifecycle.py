"""The lifecycle of a training run in MLflow: its name and tags, where its outputs go, failure and resume.

A run's outputs (checkpoint folder, summary, plots) belong to that run alone: the logged
configuration holds only what defines the experiment (:func:`defining_config`), the checkpoint
folder is recorded as the run's tag ``ct.checkpoint_dir``, and an output path the user names
that already exists is refused unless ``overwrite`` is set (:func:`check_outputs`).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from ct_lightning.experiment.configuration.settings import (RESUME_OPTIONS, RUN_ONLY_KEYS,  # noqa: F401 - the roles live in the rows
                                                            is_table_file)

CHECKPOINT_DIR_TAG = "ct.checkpoint_dir"
SUMMARY_JSON_TAG = "ct.summary_json"  # where the run writes its summary (--summary-json): a resumed run too
STACK_TAG = "ct.stack"  # "k/K": member k of a stack of K trainings (experiment/runs/stacked_train.py)
ERROR_TAG = "error"
CONSTRAINTS_TAG = "ct.constraints"  # what the training's searches kept to, in words: alike for every run
# a fine-tuning's constraints kept from its model's original run, {feature: kind} as JSON: its configuration's
# mutability holds them among the given ones, and a resumed run names them as its first start did
KEPT_MUTABILITY_TAG = "ct.kept_mutability"


def defining_config(config: dict) -> dict:
    """The configuration that defines the experiment: what ``--config config.yaml`` repeats."""
    return {k: v for k, v in config.items() if k not in RUN_ONLY_KEYS}


def library_version() -> str:
    """The installed version of ct-lightning (``unknown`` when not installed as a package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ct-lightning")
    except PackageNotFoundError:
        return "unknown"


def data_label(data: str) -> str:
    """How a run names its data: the data set's name, or a table file's stem (``loans`` for ``/x/loans.csv``; a sheet
    named after ``#`` follows it: ``book-Applications``)."""
    from datamodules.workbook import table_label  # noqa: PLC0415 - plain Python

    return table_label(data) if is_table_file(str(data)) else str(data)


def start_label(start) -> str:
    """The weights a fine-tuning starts from, in a line or a tag: a file's name, or the whole ``runs:/``/``models:/``
    URI (whose last part alone, ``model`` or a version ``1``, says nothing)."""
    return str(start) if ":/" in str(start) else Path(str(start)).name


def run_tags(config: dict, extra: dict | None = None) -> dict[str, str]:
    """Tags to filter and group runs by in the UI: data, objective, generator, library version (+ ``extra``); a
    model other than the default MLP (``model``: ``hr_net:make``, ``cnn``) and the weights a fine-tuning starts from
    (``from_checkpoint``: the file's name, or the ``runs:/``/``models:/`` URI), so that a fine-tuned model of one's
    own stands apart from a training from scratch, whose name is built alike."""
    tags = {"data": data_label(config["data"]), "objective": config["objective"], "generator": config["generator"],
            "seed": str(config["seed"]), "ct_lightning.version": library_version()}
    if config.get("model") not in (None, "mlp"):
        tags["model"] = str(config["model"])
    start = config.get("from_checkpoint")
    if start:
        tags["from_checkpoint"] = start_label(start)
    tags.update({k: str(v) for k, v in (extra or {}).items()})
    return tags


def trained_under(module, datamodule) -> str:
    """The constraints a training's searches keep to, in one line (the data spec's and ``--immutable``,
    ``--mutability``, ``--protect``'s together): ``immutable: age; decrease only: debt; within the data domain``, or
    ``every feature mutable; ...``. The params show them only as given (``mutability: None`` or
    ``mutability/<column>``), so runs with and without constraints have different columns in the UI."""
    from ct_lightning.evaluation.eval_constraints import evaluation_constraints  # noqa: PLC0415

    return evaluation_constraints(module, datamodule).in_words()


def default_run_name(config: dict, role: str | None = None) -> str:
    """A descriptive run name without the short id: ``data-objective-generator-sSEED[-role]``; a vanilla training
    searches no counterfactuals, so its name leaves the generator out (``loans-vanilla-s0``)."""
    generator = [] if config["objective"] == "vanilla" else [config["generator"]]
    parts = [data_label(config["data"]), config["objective"], *generator, f"s{config['seed']}"]
    return "-".join(parts + ([role] if role else []))


def check_outputs(config: dict, resuming: bool = False) -> None:
    """Refuse (one-line ``ValueError``) output paths named by the user that exist, unless ``overwrite``.

    ``summary_json``: an existing file. ``checkpoint_dir``: an existing folder holding files (an
    empty folder is fine). Also refused: a summary path whose folder cannot be created.
    """
    overwrite = bool(config.get("overwrite"))
    summary = config.get("summary_json")
    if summary:
        path = Path(summary)
        if path.is_dir():
            raise ValueError(f"summary_json: {path} is a folder; give a file path")
        if path.exists() and not overwrite:
            raise ValueError(f"summary_json: {path} exists (another run's summary?); choose a new path or pass "
                             f"--overwrite")
    folder = config.get("checkpoint_dir")
    if folder and not resuming:
        path = Path(folder)
        if path.is_file():
            raise ValueError(f"checkpoint_dir: {path} is a file; give a folder")
        if path.is_dir() and any(path.iterdir()) and not overwrite:
            raise ValueError(f"checkpoint_dir: {path} already holds files (another run's checkpoints?); choose a "
                             f"new folder, leave it out (each run then gets its own) or pass --overwrite")


def create_run(client, experiment_id: str, config: dict, tags: dict | None = None) -> tuple[str, str]:
    """Create the MLflow run of a training; returns ``(run_id, run_name)``.

    The default name is descriptive plus the first 6 characters of the run id, so that runs
    differ even when Python's ``random`` was seeded (which fixes MLflow's own name generator).
    """
    from ct_lightning.experiment.runs.tracking import new_run  # noqa: PLC0415

    tags = dict(tags or {})
    given = config.get("run_name")
    base = given or default_run_name(config, tags.get("role"))
    run = new_run(client, experiment_id, run_name=base, tags=run_tags(config, tags))
    run_id = run.info.run_id
    name = given or f"{base}-{run_id[:6]}"
    if name != base:
        client.update_run(run_id, name=name)
    return run_id, name


def mark_failed(client, run_id: str, error: BaseException) -> None:
    """End a run FAILED with the error message as its ``error`` tag (never raises)."""
    message = f"{type(error).__name__}: {error}".strip()
    try:
        client.set_tag(run_id, ERROR_TAG, message[:4000])
        client.set_terminated(run_id, "FAILED")
    except Exception:  # noqa: BLE001 - reporting a failure must not hide the original error
        pass


def mark_interrupted(client, run_id: str, interrupted: BaseException, command: str) -> None:
    """End a run KILLED (MLflow's status for a stopped run, neither FAILED nor RUNNING) with the tag
    ``ct.interrupted``: the signal, the epochs done and the command that resumes it (never raises)."""
    from ct_lightning.experiment.runs.interrupt import INTERRUPTED_TAG

    try:
        client.set_tag(run_id, INTERRUPTED_TAG, f"{interrupted}; resume with: {command}"[:4000])
        client.set_terminated(run_id, "KILLED")
    except Exception:  # noqa: BLE001 - reporting an interruption must not hide it
        pass


RECIPES_DIR = Path(__file__).resolve().parents[3] / "recipes"  # recipes/ is ct_lightning's sibling


def project_scripts() -> dict[str, str]:
    """This project's installed console scripts, name → entry (``{"ct-train": "recipes.train:cli", ...}``);
    empty when the project is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        entries = distribution("ct-lightning").entry_points
    except PackageNotFoundError:
        return {}
    return {entry.name: entry.value for entry in entries if entry.group == "console_scripts"}


def recipe_launcher(recipe: str, argv0: str | None = None) -> list[str]:
    """The words that start ``recipes/RECIPE.py`` from any folder: under one of the project's console scripts
    (``argv0``, default ``sys.argv[0]``), the recipe's script (``ct-compare``; its bare name when it is the one on
    ``PATH``, else its absolute path); otherwise this Python and the recipe's absolute path."""
    import shutil

    argv0 = sys.argv[0] if argv0 is None else argv0
    scripts = project_scripts()
    script = next((name for name, entry in scripts.items() if entry == f"recipes.{recipe}:cli"), None)
    if script and Path(argv0).name in scripts:
        beside = Path(argv0).absolute().with_name(script)
        if beside.is_file():
            on_path = shutil.which(script)
            return [script if on_path and Path(on_path).resolve() == beside.resolve() else str(beside)]
    return [os.path.abspath(sys.executable), str(RECIPES_DIR / f"{recipe}.py")]


def recipe_command(recipe: str, argv: list[str]) -> str:
    """The shell command that runs ``recipes/RECIPE.py`` with ``argv`` again, from any folder."""
    return " ".join(shlex.quote(part) for part in [*recipe_launcher(recipe), *argv])


def resume_command(run_id: str, tracking_uri: str, experiment: str) -> str:
    """The shell command that resumes run ``run_id``, as it works from any folder (:func:`recipe_launcher`)."""
    return recipe_command("train", ["--resume", run_id, "--tracking-uri", tracking_uri, "--experiment", experiment])


def checkpoint_dir_of(run) -> Path | None:
    """The checkpoint folder of an MLflow run (its tag, or the parameter older runs logged)."""
    folder = run.data.tags.get(CHECKPOINT_DIR_TAG) or run.data.params.get("checkpoint_dir")
    return Path(folder) if folder else None


def last_checkpoint_of(run, echo=None) -> Path | None:
    """The run's ``last.ckpt`` if it exists on this machine and reads as a checkpoint; if it is missing or
    unreadable (truncated), ``last-previous.ckpt`` (the one before it), saying so through ``echo``; else ``None``."""
    from ct_lightning.experiment.runs.checkpoint_io import previous_of

    folder = checkpoint_dir_of(run)
    if not folder:
        return None
    last = folder / "last.ckpt"
    problem = "missing" if not last.is_file() else _unreadable(last)
    if problem is None:
        return last
    previous = previous_of(last)
    if previous.is_file() and _unreadable(previous) is None:
        if echo is not None and problem != "missing":
            echo(f"resume: {last} is unreadable ({problem}); resuming from the previous checkpoint {previous} "
                 f"(after {completed_epochs(previous)} epoch(s))", flush=True)
        return previous
    return None


def _unreadable(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (e.g. truncated), or ``None`` when it loads."""
    import torch

    try:
        payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
        int(payload["epoch"])
    except Exception as error:  # noqa: BLE001 - any failure to load means: not usable
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    return None


def completed_epochs(checkpoint: Path) -> int:
    """Epochs fully trained when ``checkpoint`` (an epoch-end checkpoint of this project) was written."""
    import torch

    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return int(payload["epoch"]) + 1


def no_checkpoint_reason(run) -> str:
    """Why a run has no checkpoint to resume from here, after ``resume: run ID``: its checkpoint folder is not on this
    machine (a teammate's run on a shared server, a job that ran on another node, a folder moved or deleted), or the
    run stopped before its first epoch ended."""
    folder = checkpoint_dir_of(run)
    if folder is not None and not folder.is_dir():
        return (f"keeps its checkpoints in {folder}, which is not on this machine (trained on another one, or the "
                f"folder was moved or deleted), and uploaded none to its store (a run on a tracking server uploads its "
                f"last checkpoint when it stops early, not when it is killed outright): resume it where that folder "
                f"is, or copy the folder to that path here")
    return "has no checkpoint (it stopped before its first epoch ended); start it again instead"


def resumable_checkpoint(client, run, tracking_uri: str, echo=None, mine_only: bool = False) -> Path | None:
    """The checkpoint to resume ``run`` from: :func:`last_checkpoint_of` its folder here, unless the run uploaded one
    of more epochs to its shared store (it stopped early on another machine:
    :mod:`~ct_lightning.experiment.runs.checkpoint_upload`), which is then fetched into its folder if that is here,
    else into ``mlruns/checkpoints/RUN_ID``; ``None`` where there is neither. ``mine_only``: fetch only a run of this
    user (``mlflow.user``), as ``--resume`` without a run id must not pick up a teammate's run."""
    from ct_lightning.experiment.configuration.store import local_store_dir  # noqa: PLC0415
    from ct_lightning.experiment.runs.checkpoint_upload import fetch_uploaded_checkpoint, uploaded_epochs  # noqa: PLC0415
    from ct_lightning.experiment.runs.tracking import current_user  # noqa: PLC0415

    last = last_checkpoint_of(run, echo)
    uploaded = uploaded_epochs(run)
    if uploaded is None or (last is not None and completed_epochs(last) >= uploaded):
        return last
    if mine_only and run.data.tags.get("mlflow.user") != current_user():
        return last
    folder = checkpoint_dir_of(run)
    if folder is None or not folder.is_dir():
        folder = local_store_dir(tracking_uri).resolve() / "checkpoints" / run.info.run_id
    if last is not None and echo is not None:
        echo(f"resume: {last} holds {completed_epochs(last)} epoch(s), the checkpoint run {run.info.run_id} uploaded "
             f"{uploaded}: resuming from the uploaded one", flush=True)
    return fetch_uploaded_checkpoint(client, run, folder, echo)


def find_resumable_run(client, experiment: str, tracking_uri: str, wanted: str, echo=print):
    """The run to resume: ``wanted`` (a run id), or for ``"latest"`` the newest unfinished run with a checkpoint.

    Runs without a checkpoint (killed or failed before their first epoch ended) are skipped with
    a note. Returns ``(run, last_checkpoint)``; raises a one-line ``ValueError`` when none fits.
    """
    if wanted != "latest":
        try:
            run = client.get_run(wanted)
        except Exception:  # noqa: BLE001 - MLflow raises several types for an unknown id
            raise ValueError(f"resume: no run {wanted!r} in {tracking_uri}") from None
        if STACK_TAG in run.data.tags:
            raise ValueError(f"resume: run {wanted} was trained in a stack ({STACK_TAG} {run.data.tags[STACK_TAG]}): "
                             f"its checkpoints hold the weights but no optimiser or loop state, so it cannot be "
                             f"resumed or extended; start a new run from its weights with --from-checkpoint "
                             f"runs:/{wanted}/model")
        last = resumable_checkpoint(client, run, tracking_uri, echo)
        if last is None:
            raise ValueError(f"resume: run {wanted} {no_checkpoint_reason(run)}")
        return run, last
    found = client.get_experiment_by_name(experiment)
    runs = [] if found is None else client.search_runs(
        [found.experiment_id], "attributes.status != 'FINISHED'", order_by=["attributes.start_time DESC"],
        max_results=200)
    for run in runs:
        if run.data.tags.get("ct.role") == "compare":
            continue
        last = resumable_checkpoint(client, run, tracking_uri, echo, mine_only=True)
        if last is not None:
            return run, last
        echo(f"resume: skipping run {run.info.run_id} ({run.info.run_name}, {run.info.status}): it "
             f"{no_checkpoint_reason(run)}", flush=True)
    raise ValueError(f"resume: no unfinished run with a checkpoint in experiment {experiment!r} at {tracking_uri}")


def compare_url(experiment_ids: list[str], run_ids: list[str], port: int = 5000) -> str:
    """Address of the MLflow UI's comparison view of ``run_ids``."""
    from urllib.parse import quote

    runs = quote(json.dumps(list(run_ids), separators=(",", ":")))
    experiments = quote(json.dumps(sorted(set(experiment_ids)), separators=(",", ":")))
    from ct_lightning.experiment.runs.tracking import ML_VIEW_QUERY

    return f"http://127.0.0.1:{port}/#/compare-runs?runs={runs}&experiments={experiments}&{ML_VIEW_QUERY}"


def link_children(client, parent_run_id: str, children: dict[str, str]) -> str:
    """Record a comparison's child runs on its parent (tags ``ct.child.<label>``, a description with links).

    ``children`` maps labels such as ``circles/bl`` to run ids. Returns the comparison URL of all children.
    """
    experiment_ids = [client.get_run(run_id).info.experiment_id for run_id in children.values()]
    url = compare_url(experiment_ids, list(children.values()))
    for label, run_id in children.items():
        client.set_tag(parent_run_id, f"ct.child.{label.replace('/', '.')}", run_id)
    client.set_tag(parent_run_id, "ct.children", json.dumps(children))
    pairs = {}
    for label, run_id in children.items():
        data, role = label.split("/", 1)
        pairs.setdefault((data, "protected" in role), {})[role.split("_")[0]] = run_id
    lines = ["Child runs of this comparison (BL vs CT):", ""]
    for (data, protected), roles in sorted(pairs.items()):
        pair_url = compare_url(experiment_ids, list(roles.values()))
        ids = ", ".join(f"{role.upper()} `{run_id}`" for role, run_id in sorted(roles.items()))
        lines.append(f"- {data}{' (protected features immutable)' if protected else ''}: {ids} — [compare]({pair_url})")
    lines += ["", f"[Compare all children]({url})"]
    client.set_tag(parent_run_id, "mlflow.note.content", "\n".join(lines))
    return url
