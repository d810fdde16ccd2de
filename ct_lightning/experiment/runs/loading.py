"""Trained models for evaluation: load them from MLflow runs or checkpoints, with their data and constraints."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from mlflow.tracking import MlflowClient

from ct_lightning.experiment.configuration.settings import TABLE_KEYS, resolve_config
from ct_lightning.experiment.configuration.data import build_datamodule

if TYPE_CHECKING:
    from ct_lightning.module import CTModule

T = TypeVar("T")


@dataclass
class LoadedModel:
    """A trained ``CTModule`` with the resolved training configuration (``config.json``) and its source."""

    module: CTModule
    config: dict
    checkpoint: str
    run_id: str | None = None
    tracking_uri: str | None = None
    extra: dict = field(default_factory=dict)


def load_checkpoint(path: str | Path, weights_only: bool = True) -> CTModule:
    """``CTModule.load_from_checkpoint`` on the CPU, in eval mode."""
    # Lightning only where a whole CTModule is loaded: explain.py reads a run's checkpoint without it
    # (download_checkpoint, then checkpoints.load_trained_classifier).
    from ct_lightning.module import CTModule  # noqa: PLC0415

    module = CTModule.load_from_checkpoint(str(path), map_location="cpu", weights_only=weights_only)
    return module.eval()


def _client(tracking_uri: str) -> MlflowClient:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return MlflowClient(tracking_uri=tracking_uri)


def with_logged_code(load: Callable[[], T], run_id: str | None, tracking_uri: str | None) -> T:
    """``load()`` (a run's checkpoint read), and once more after importing the model code logged with run ``run_id``
    (:func:`import_logged_code`) where it failed because ``--model mynet:Net``'s module is not importable here (read
    from another folder); the first error where there is no run or no such code."""
    from ct_lightning.models import ModuleNotImportable  # noqa: PLC0415

    try:
        return load()
    except ModuleNotImportable:
        if not (run_id and import_logged_code(run_id, tracking_uri)):
            raise
    return load()


def with_checkpoint_code(load: Callable[[], T], checkpoint: str | Path) -> T:
    """``load()`` (a checkpoint file's read), and where ``--model mynet:Net``'s module is not importable here, once
    more with the code logged with the run that wrote the checkpoint (:func:`checkpoint_run`); else a one-line
    ``InputError`` on ``--checkpoint`` that says how to make the module importable."""
    from ct_lightning.experiment.configuration.validation import InputError  # noqa: PLC0415
    from ct_lightning.models import ModuleNotImportable  # noqa: PLC0415

    try:
        return load()
    except ModuleNotImportable as error:
        missing = error
    run = checkpoint_run(checkpoint)
    if run is not None and import_logged_code(*run):
        return load()
    raise InputError("--checkpoint", str(checkpoint), f"run from the folder that holds {missing.top_file}, add that "
                     f"folder to PYTHONPATH, or give its MLflow run with --run-id (the run keeps a copy of the code)",
                     f"its model {missing.spec} needs module {missing.module_name!r}, which is not importable here"
                     ) from None


def checkpoint_run(checkpoint: str | Path) -> tuple[str, str] | None:
    """``(run id, tracking URI)`` of the run that wrote ``checkpoint`` into its checkpoint folder, found by the
    folder's ``config.json`` (its store) and the run's ``ct.checkpoint_dir`` tag; ``None`` for a copied file, a
    store that is not there, or no such run."""
    from ct_lightning.experiment.runs.lifecycle import CHECKPOINT_DIR_TAG  # noqa: PLC0415

    folder = Path(checkpoint).resolve().parent
    beside = folder / "config.json"
    uri = json.loads(beside.read_text()).get("tracking_uri") if beside.is_file() else None
    if not uri or (uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()):
        return None  # a local store that is gone: MLflow would create an empty one
    quoted = str(folder).replace("'", "\\'")
    try:
        client = _client(uri)
        experiments = [experiment.experiment_id for experiment in client.search_experiments()]
        runs = client.search_runs(experiments, f"tags.`{CHECKPOINT_DIR_TAG}` = '{quoted}'", max_results=1)
    except Exception:  # noqa: BLE001 - a server that is down or a store of another version: no run to take code from
        return None
    return (runs[0].info.run_id, uri) if runs else None


def import_logged_code(run_id: str, tracking_uri: str | None) -> bool:
    """Import the user's model code logged with run ``run_id``'s MLflow model (its ``code_paths``: ``mynet.py`` of
    ``--model mynet:Net``) by loading that model, so that its checkpoint loads where the code is not on the path;
    ``False`` where the run has no such model."""
    import mlflow.pytorch  # noqa: PLC0415

    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri  # noqa: PLC0415

    try:
        with _tracking_uri(tracking_uri):
            mlflow.pytorch.load_model(f"runs:/{run_id}/model", map_location="cpu")  # leaves its code imported
    except Exception:  # noqa: BLE001 - MLflow raises several types for a missing model
        return False
    return True


def load_run(run_id: str, tracking_uri: str, which: str = "last", weights_only: bool = True,
             dst_dir: str | Path | None = None) -> LoadedModel:
    """Download ``checkpoints/<which>.ckpt`` and ``config.json`` of an MLflow run and load the model.

    ``which`` is ``last`` (the model at the end of training, the default) or ``best`` (best val/acc).
    """
    try:
        checkpoint, config = download_checkpoint(run_id, tracking_uri, which, dst_dir)
    except FileNotFoundError:
        if any(a.path.endswith(".ckpt") for a in _client(tracking_uri).list_artifacts(run_id, "checkpoints")):
            raise  # another checkpoint is there (--which best of a run that has last only): not the logged model
        return load_logged_model(run_id, tracking_uri)
    module = with_logged_code(lambda: load_checkpoint(checkpoint, weights_only), run_id, tracking_uri)
    return LoadedModel(module, config, checkpoint, run_id, tracking_uri)


def load_logged_model(run_id: str, tracking_uri: str) -> LoadedModel:
    """A run without checkpoints (a model logged as it is, ``--limit-train-batches 0``, as the worked example's
    "before" run): its logged MLflow model ``model`` with the settings of its ``config.json``, its trained
    constraints and fitted preprocessing from the logged ``predictor``; a ``FileNotFoundError`` where it has none."""
    from ct_lightning.experiment.runs.explanations import _from_logged_models  # noqa: PLC0415

    explainable = _from_logged_models(run_id, tracking_uri)
    if explainable.has_preprocessing:  # a table's fitted encoding, as a checkpoint carries it
        explainable.module.preprocessing = explainable.codec.to_dict()
    return LoadedModel(explainable.module, explainable.config, f"runs:/{run_id}/model", run_id, tracking_uri)


def model_uri_run(source: str | None, tracking_uri: str) -> str | None:
    """The run id of ``runs:/RUN_ID/model`` where that run is one of this project's (it logged ``config.json``):
    its model is loaded with the run's own settings (data, table options, architecture, ``model_inputs``), as
    ``--run-id`` loads a run without checkpoints (:func:`load_logged_model`); likewise the run that logged a
    registered version (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``: an unknown name or version is a one-line
    ``InputError`` naming those there are); ``None`` for any other source."""
    from ct_lightning.experiment.runs.registry import is_registered_uri, registered_run  # noqa: PLC0415

    match = re.fullmatch(r"runs:/([^/]+)/model/?", source or "")
    if match is None and not is_registered_uri(source):
        return None
    run_id = match.group(1) if match else registered_run("--checkpoint", source, tracking_uri)[0]
    try:
        names = {artifact.path for artifact in _client(tracking_uri).list_artifacts(run_id)}
    except Exception:  # noqa: BLE001 - an unknown run: the weights-only path says why it cannot load it
        return None
    return run_id if "config.json" in names else None


def download_checkpoint(run_id: str, tracking_uri: str, which: str = "last",
                        dst_dir: str | Path | None = None) -> tuple[str, dict]:
    """``(local path of checkpoints/<which>.ckpt, config.json)`` of an MLflow run, downloaded into ``dst_dir`` (a
    new temporary folder by default); a ``ValueError`` for an unknown run, ``FileNotFoundError`` for a run without
    that checkpoint."""
    client = _client(tracking_uri)
    try:
        client.get_run(run_id)
    except Exception as error:  # mlflow raises MlflowException for unknown ids
        raise ValueError(f"run-id: no run {run_id!r} in {tracking_uri}: {error}") from None
    dst = Path(dst_dir or tempfile.mkdtemp(prefix=f"ct-eval-{run_id[:8]}-"))
    names = [a.path for a in client.list_artifacts(run_id, "checkpoints")]
    wanted = f"checkpoints/{which}.ckpt"
    if wanted not in names:
        raise FileNotFoundError(f"run {run_id}: no artifact {wanted}; found {names or 'no checkpoints'}")
    checkpoint = client.download_artifacts(run_id, wanted, str(dst))
    config = json.loads(Path(client.download_artifacts(run_id, "config.json", str(dst))).read_text())
    return checkpoint, config


def load_checkpoint_with_config(path: str | Path, data: str | None = None, weights_only: bool = True) -> LoadedModel:
    """Load a checkpoint file; the configuration is ``config.json`` beside it, else built from ``data``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: no file {path}")
    sibling = path.parent / "config.json"
    extra = {}
    if sibling.is_file():
        config = json.loads(sibling.read_text())
        if data:
            extra["trained_data"] = config.get("data")  # the table it was trained on, where another is given
            config["data"] = data
    elif data:
        config = resolve_config({"data": data})
    else:
        raise ValueError(f"data: cannot infer the data set of {path} (no config.json beside it); pass --data")
    return LoadedModel(with_checkpoint_code(lambda: load_checkpoint(path, weights_only), path), config, str(path),
                       extra=extra)


def is_lightning_checkpoint(path: str | Path, weights_only: bool = True) -> bool:
    """Whether ``path`` is a Lightning checkpoint (as this project writes), not a plain ``state_dict``."""
    import torch  # noqa: PLC0415

    try:
        payload = torch.load(str(path), map_location="cpu", weights_only=weights_only, mmap=True)
    except Exception:  # noqa: BLE001 - unreadable with weights_only: Lightning's own loader says why
        return True
    return isinstance(payload, dict) and "pytorch-lightning_version" in payload


def load_any_checkpoint(source: str, data: str | None, given: dict, tracking_uri: str,
                        weights_only: bool = True) -> LoadedModel:
    """Every checkpoint form ``train.py --from-checkpoint`` accepts: a Lightning checkpoint of this project
    (its ``config.json`` beside it, else ``data``), a plain ``state_dict`` or ``{"state_dict": ...}`` of the
    configured architecture (MLP hidden sizes inferred from the tensors), ``runs:/RUN_ID/model`` and
    ``models:/NAME/VERSION``. ``given``: settings (``target``, ``data_spec``, ``impute``, ``model``,
    ``hidden_sizes``, ``activation``, ``model_inputs``) that apply where given."""
    from ct_lightning.experiment.configuration.settings import is_table_file  # noqa: PLC0415
    from ct_lightning.experiment.configuration.validation import InputError  # noqa: PLC0415

    given = {k: v for k, v in given.items() if v is not None}
    beside = ":/" not in source and (Path(source).parent / "config.json").is_file()
    if is_table_file(data) and not given.get("target") and not beside:
        raise InputError("--target", None, f"the column of {data} to predict (the class label)")
    if ":/" not in source and is_lightning_checkpoint(source, weights_only):
        table = {k: v for k, v in given.items() if k in TABLE_KEYS}
        if data and not (Path(source).parent / "config.json").is_file():
            module = with_checkpoint_code(lambda: load_checkpoint(source, weights_only), source)
            return LoadedModel(module, resolve_config({**table, "data": data}), source)
        loaded = load_checkpoint_with_config(source, data, weights_only)
        loaded.config.update(table)
        return loaded
    from ct_lightning.experiment.runs.train import (_architecture_from_source, build_module,  # noqa: PLC0415
                                                    load_given_weights)

    if not data:
        raise InputError("--data", None, "a data set, or a table file with --target",
                         f"{source} holds weights only, without the configuration of a run of this project; pass "
                         f"--data and, if not the default MLP, --model")
    weights, implied = _architecture_from_source(source, {**given, "tracking_uri": tracking_uri})
    config = resolve_config({**given, **implied, "data": data, "tracking_uri": tracking_uri})
    datamodule = build_datamodule(config)
    module = build_module(config, datamodule, weights)
    try:
        load_given_weights(config, module, weights, datamodule, source="the file")  # with train.py's hints
    except ValueError as error:
        raise InputError("--checkpoint", source, f"weights of a model of {datamodule.n_features} features and "
                         f"{datamodule.n_classes} classes ({config['data']})", str(error)) from None
    return LoadedModel(module.eval(), config, source, extra={"datamodule": datamodule})


def check_run_data(loaded: LoadedModel, option: str) -> None:
    """The table a run was trained on, as its ``config.json`` names it, is on this machine; else one line saying so
    and to give a copy with ``--data`` (a teammate's run read from a shared server names a file on the teammate's
    machine: the bare ``--data: file ... not found`` blamed an option the user had not given)."""
    from ct_lightning.experiment.configuration.settings import is_table_file  # noqa: PLC0415
    from ct_lightning.experiment.configuration.validation import EnvironmentProblem  # noqa: PLC0415
    from datamodules.workbook import split_sheet  # noqa: PLC0415 - plain Python

    data = loaded.config.get("data")
    if is_table_file(data) and not Path(split_sheet(str(data))[0]).is_file():
        raise EnvironmentProblem(f"{option}: run {loaded.run_id} was trained on {data}, which is not on this machine "
                                 "(its config.json names it); give a copy of that table with --data FILE")


def log_evaluation(client, run_id: str, summary: dict, prefix: str = "eval") -> dict[str, float]:
    """Log the protocol's metrics of ``summary`` as ``{prefix}/...`` (names from the metric table) to an MLflow run."""
    from ct_lightning.metrics.names import logged_values  # noqa: PLC0415 - torchmetrics: explain.py --run-id needs none

    logged = logged_values(summary, prefix)
    for name, value in logged.items():
        client.log_metric(run_id, name, value)
    return logged
