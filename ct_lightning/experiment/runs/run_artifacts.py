"""What a training run records in MLflow besides metrics: the model, its data sets and cheap plots.

Each is logged once per run, at the end of training, so it costs nothing per step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.logger import _add_prefix
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ct_lightning.experiment.runs.tracking import retry_race

MODEL_NAME = "model"


MAX_PARAMS_PER_BATCH = 100  # MLflow's most parameters in one log_batch


def log_params_in_batches(client, run_id: str, params: list, **kwargs) -> None:
    """Log ``params`` (MLflow ``Param`` entities) to run ``run_id`` in as few ``log_batch`` calls as MLflow allows: a
    table of many columns has a ``mutability/<column>`` for each."""
    for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id=run_id, params=params[start:start + MAX_PARAMS_PER_BATCH], **kwargs)


def param_name(key: str) -> str:
    """``key`` as MLflow takes a parameter's name: letters, digits, ``_ - . / :`` and spaces; others become ``_``."""
    return re.sub(r"[^/\w.\- :]", "_", str(key))


class EpochStepMLFlowLogger(MLFlowLogger):
    """``MLFlowLogger`` that logs epoch-level metrics with ``step = epoch``, so the UI plots them per epoch.

    Each store call is a transaction (several milliseconds on SQLite, a round trip to a server), a fixed
    cost as large as a whole epoch of the paper's small models. So metrics wait here, by epoch, and are
    sent together in one batch once ``flush_seconds`` have passed since the last send (at an epoch's
    first metric), at :meth:`flush` and at the end of a stage: an epoch longer than ``flush_seconds``
    is sent as soon as the next one starts logging, as before; fast epochs are sent a few at a time.
    A run killed while metrics wait here loses nothing: every checkpoint holds the epochs not yet sent
    (:class:`EpochMetricsInCheckpoint`) and ``--resume`` logs them (:func:`log_missing_epoch_metrics`).
    """

    steps_by_epoch = True  # files every metric under its ``epoch`` value (CTModule.log_epochs_directly relies on it)

    def __init__(self, *args, flush_seconds: float | None = 2.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.flush_seconds = float("inf") if flush_seconds is None else flush_seconds  # None: LastCheckpoint flushes
        self._pending: dict[int, dict] = {}  # step -> {"timestamp": ms of its first metric, "metrics": {...}}
        self._last_flush = time.monotonic()

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        """As ``MLFlowLogger``'s, with each character MLflow refuses in a name (a column's ``%`` or ``=`` in
        ``mutability/<column>``) written as ``_``: the run's config.json and checkpoints keep the names as given.
        Values are kept up to MLflow's own limit (6000 characters), not Lightning's 250, which cut a table's
        ``feature_names`` in the middle of a category."""
        from lightning.fabric.utilities.logger import _convert_params, _flatten_dict  # noqa: PLC0415
        from mlflow.entities import Param  # noqa: PLC0415
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH  # noqa: PLC0415

        params = [Param(param_name(key), str(value)[:MAX_PARAM_VAL_LENGTH])
                  for key, value in _flatten_dict(_convert_params(params)).items()]
        log_params_in_batches(self.experiment, self.run_id, params, **self._log_batch_kwargs)

    @rank_zero_only
    def log_metrics(self, metrics, step=None):
        if "epoch" in metrics:
            step = int(metrics["epoch"])
        step = step or 0
        if step not in self._pending and self._pending and time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()
        entry = self._pending.setdefault(step, {"timestamp": int(time.time() * 1000), "metrics": {}})
        entry["metrics"].update(metrics)

    def unsent(self) -> list[dict]:
        """The epochs whose metrics wait here: ``[{"epoch": step, "metrics": {key: value}}]`` (for checkpoints)."""
        return [{"epoch": step, "metrics": {k: float(v) for k, v in entry["metrics"].items() if not isinstance(v, str)}}
                for step, entry in self._pending.items()]

    def flush_with_checkpoints(self) -> None:
        """Send the waiting metrics: called by :class:`~ct_lightning.experiment.runs.last_checkpoint.LastCheckpoint`
        right after it writes ``last.ckpt``, when this logger waits for it (``flush_seconds=None``)."""
        if self.flush_seconds == float("inf"):
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        """Send every waiting metric to the store, in one batch."""
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        from mlflow.entities import Metric

        batch = []
        for step, entry in pending.items():
            for key, value in _add_prefix(entry["metrics"], self._prefix, self.LOGGER_JOIN_CHAR).items():
                if isinstance(value, str):
                    warnings.warn(f"MLflow: discarding metric {key}={value!r}: a string is not a metric value")
                    continue
                name = re.sub("[^a-zA-Z0-9_/. -]+", "", key)  # the characters MLflow allows in a metric name
                if name != key:
                    warnings.warn(f"MLflow: metric {key!r} logged as {name!r} (MLflow allows only letters, digits "
                                  "and '_', '/', '.', '-', ' ' in metric names)")
                batch.append(Metric(key=name, value=value, timestamp=entry["timestamp"], step=step))
        self.experiment.log_batch(run_id=self.run_id, metrics=batch, **self._log_batch_kwargs)

    def finalize(self, status: str = "success") -> None:
        self.flush()
        # train() ends the run FINISHED itself, after the test, the model and the plots are logged: a run
        # killed after fit() must not look finished. Failures still end it FAILED here.
        if status != "success":
            try:
                super().finalize(status)
            except Exception as error:  # noqa: BLE001 - an unreachable server must not hide the failure itself
                warnings.warn(f"MLflow: the run could not be marked {status} ({str(error).splitlines()[0][:200]})")


@contextlib.contextmanager
def _tracking_uri(uri: str, experiment_id: str | None = None):
    """MLflow's fluent API pointed at ``uri`` (and ``experiment_id``) for the duration of the block."""
    import mlflow

    previous, previous_experiment = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_EXPERIMENT_ID")
    # set_tracking_uri writes $MLFLOW_TRACKING_URI too, which names the store of every later command of this process
    # (store.default_tracking_uri): restored as it was, not left at MLflow's own default
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if experiment_id is not None:  # the fluent API files logged models under the active experiment
        os.environ["MLFLOW_EXPERIMENT_ID"] = str(experiment_id)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
        if experiment_id is not None:
            if previous_experiment is None:
                os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
            else:
                os.environ["MLFLOW_EXPERIMENT_ID"] = previous_experiment


def user_code_paths(model: torch.nn.Module) -> list[str]:
    """The files of the user's own code a pickled ``model`` needs to load (``--model mynet:Net``: ``mynet.py``, or the
    package folder of ``pkg.nets``): each class's module that is neither installed (site-packages) nor torch's or
    ct-lightning's, for MLflow's ``code_paths``, so that the logged model loads and serves where that code is not
    importable."""
    import sys  # noqa: PLC0415

    found = []
    for module in model.modules():
        top = type(module).__module__.split(".")[0]
        origin = getattr(sys.modules.get(top), "__file__", None)
        if not origin or top in ("torch", "ct_lightning", "__main__") or "site-packages" in origin \
                or "dist-packages" in origin:
            continue
        path = Path(origin)
        path = path.parent if path.name == "__init__.py" else path
        if str(path) not in found:
            found.append(str(path))
    return found


def model_requirements(*extra: str) -> list[str]:
    """The pip requirements of a logged model: this torch, ct-lightning (its classes are pickled in the model; a
    serving environment of MLflow's own, ``--env-manager virtualenv``, fails clearly at install without it rather than
    at load), and ``extra``."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        ours = f"ct-lightning=={version('ct-lightning')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        ours = "ct-lightning"
    return [f"torch=={torch.__version__.split('+')[0]}", ours, *extra]


def log_classifier(tracking_uri: str, experiment_id: str, run_id: str, model: torch.nn.Module,
                   example: torch.Tensor, step: int = 0):
    """Log ``model`` (returns logits) as the run's MLflow model ``model`` with a signature and an input example.

    ``mlflow.pyfunc.load_model("runs:/RUN_ID/model")`` then predicts the logits of a float32 array, and
    ``mlflow.pytorch.load_model`` returns the ``nn.Module`` itself (pickled, not a ``torch.export`` graph), which
    evaluates and trains again.
    """
    import mlflow.pytorch
    from mlflow.models import infer_signature

    model = model.cpu().eval()
    example = example[:5].detach().cpu().float()
    with torch.no_grad():
        output = model(example).numpy()
    signature = infer_signature(example.numpy(), output)
    with _tracking_uri(tracking_uri, experiment_id):
        return mlflow.pytorch.log_model(model, name=MODEL_NAME, run_id=run_id, signature=signature,
                                        input_example=example.numpy(), serialization_format="pickle", step=step,
                                        pip_requirements=model_requirements(),
                                        code_paths=user_code_paths(model) or None)


def _digest(x: torch.Tensor, y: torch.Tensor) -> str:
    hasher = hashlib.sha256()
    for tensor in (x, y):
        hasher.update(tensor.detach().cpu().contiguous().numpy())  # the array's own bytes, not a copy of them
    return hasher.hexdigest()[:16]


SCHEMA_ROWS = 64  # rows the dataset schema is inferred from


def _dataset_source(datamodule, data_dir: str | None = None) -> Path:
    """Where a run's data comes from: a table's own file, the raw files' folder for real data, the generating
    module's file for the embedded synthetic sets."""
    import datamodules

    table = getattr(datamodule, "source", None)
    if isinstance(table, (str, Path)):
        return Path(table).resolve()
    return Path(data_dir or getattr(datamodule, "data_dir", None) or datamodules.__file__).resolve()


def log_datasets(client, run_id: str, datamodule, data_dir: str | None = None) -> None:
    """Record the training and test splits as MLflow dataset inputs (name, digest, source, feature schema)."""
    import mlflow.data
    import pandas as pd
    from mlflow.entities import DatasetInput, InputTag

    source = _dataset_source(datamodule, data_dir).as_uri()
    inputs = []
    for split in ("train", "test"):
        x, y = getattr(datamodule, f"x_{split}"), getattr(datamodule, f"y_{split}")
        # the split's own memory (a copy of a 200 000-row table's inputs is hundreds of MiB at the run's start)
        frame = pd.DataFrame(x.numpy(), columns=list(datamodule.feature_names), copy=False)
        frame["label"] = y.numpy()
        with warnings.catch_warnings():  # MLflow's hints about integer columns and ambiguous local sources
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(frame, source=source, targets="label",
                                              name=f"{datamodule.name}-{split}", digest=_digest(x, y))
            # MLflow infers the schema by testing every cell for NaN in Python (4.6 s on Adult). The splits are
            # finite (checked at setup), so the schema of a few rows is the schema of all; it is a cached_property.
            dataset.__dict__["schema"] = mlflow.data.from_pandas(frame.head(SCHEMA_ROWS), source=source,
                                                                 targets="label").schema
            entity = dataset._to_mlflow_entity()
        inputs.append(DatasetInput(entity, tags=[InputTag("mlflow.data.context", split)]))
    # Runs that start together insert the same dataset rows at once; MLflow's insert then fails on its
    # UNIQUE constraint for all but one of them, and a retry finds the row and links it.
    retry_race(lambda: client.log_inputs(run_id, datasets=inputs))


PREPROCESSING_ARTIFACT = "preprocessing.json"  # the fitted codec of a table's run, beside config.json


def log_training_inputs(client, logger, run_id: str, config: dict, module, datamodule) -> None:
    """What a new training run records before its epochs: the run-level settings that Lightning does not log as
    hyperparameters (``logger``: the run's MLflow logger), ``config.json``/``config.yaml``, the fitted
    preprocessing of a table and the data sets."""
    from ct_lightning.experiment.runs.lifecycle import defining_config  # noqa: PLC0415

    defining = defining_config(config)
    logger.log_hyperparams({k: v for k, v in defining.items() if k not in module.hparams})
    client.log_dict(run_id, defining, "config.json")
    client.log_dict(run_id, defining, "config.yaml")
    if module.preprocessing is not None:
        client.log_dict(run_id, module.preprocessing, PREPROCESSING_ARTIFACT)
    log_datasets(client, run_id, datamodule, config.get("data_dir"))


def log_training_plots(client, run_id: str, module, datamodule, n_counterfactuals: int = 12) -> list[str]:
    """The cheap plots at the end of training: the share of mature counterfactuals per epoch and, for
    2-D data, the decision boundary with a few counterfactuals. Returns the artifact paths logged."""
    from ct_lightning.training.eval_mode import eval_mode
    from ct_lightning.evaluation.plots import metric_history, plot_convergence, plot_decision_boundaries
    from ct_lightning.training.pool import random_targets

    with tempfile.TemporaryDirectory(prefix="ct-plots-") as folder:
        history = metric_history(client, run_id, "train/cf_converged")
        paths = [plot_convergence({"CT": history}, Path(folder) / "mature_counterfactuals.png")]
        if datamodule.n_features == 2:
            model = module.model.cpu().eval()
            x = datamodule.x_test[:n_counterfactuals].float()
            rng = torch.Generator().manual_seed(int(module.hparams.seed))
            with eval_mode(model), torch.no_grad():
                target = random_targets(model(x).argmax(1), int(module.hparams.n_classes), rng)
            hp = module.hparams
            lower, upper = getattr(module, "lower", None), getattr(module, "upper", None)
            mutability = getattr(module, "mutability", None)
            result = module.generator.generate(model, x, target, hp.tau, hp.max_steps, hp.epsilon,
                                               None if mutability is None else mutability.cpu(),
                                               None if lower is None else lower.cpu(),
                                               None if upper is None else upper.cpu())
            panel = {"model": model, "title": f"{hp.objective} ({hp.generator})", "factuals": x,
                     "counterfactuals": result.counterfactual.detach(), "targets": target}
            paths.append(plot_decision_boundaries([panel], Path(folder) / "decision_boundary.png",
                                                  datamodule.x_train, datamodule.y_train,
                                                  feature_names=tuple(datamodule.feature_names[:2])))
        client.log_artifacts(run_id, folder, artifact_path="plots")  # one call: the folder holds these plots only
        return [f"plots/{Path(path).name}" for path in paths]


def _load_torch_module(uri: str) -> torch.nn.Module:
    """The ``nn.Module`` of an MLflow model: the PyTorch flavour's, or the classifier inside a ``predictor`` pyfunc."""
    import mlflow.pyfunc
    import mlflow.pytorch
    from mlflow.models import Model

    flavors = Model.load(uri).flavors
    if "pytorch" in flavors:
        return mlflow.pytorch.load_model(uri, map_location="cpu")
    wrapped = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    if not isinstance(getattr(wrapped, "model", None), torch.nn.Module):
        raise ValueError(f"no PyTorch classifier in it (flavours: {', '.join(flavors)})")
    return wrapped.model


def model_uri_preprocessing(uri: str, tracking_uri: str) -> dict | None:
    """The fitted preprocessing of a table that the run behind an MLflow model (``runs:/RUN_ID/model``,
    ``models:/NAME/VERSION``) logged (:data:`PREPROCESSING_ARTIFACT`); ``None`` where it logged none."""
    import mlflow
    from mlflow.models import Model

    try:
        with _tracking_uri(tracking_uri):
            run_id = Model.load(uri).run_id
        client = mlflow.tracking.MlflowClient(tracking_uri=tracking_uri)
        if run_id is None or PREPROCESSING_ARTIFACT not in {a.path for a in client.list_artifacts(run_id)}:
            return None
        with tempfile.TemporaryDirectory(prefix="ct-preprocessing-") as folder:
            found = json.loads(Path(client.download_artifacts(run_id, PREPROCESSING_ARTIFACT, folder)).read_text())
    except Exception:  # noqa: BLE001 - a model without a run of ours: load_model_uri says what it cannot load
        return None
    return found if isinstance(found, dict) and found.get("kind") == "tabular" else None


def load_model_uri(uri: str, tracking_uri: str) -> tuple[dict[str, torch.Tensor], dict]:
    """Weights and implied architecture of an MLflow model (``runs:/RUN_ID/model``, ``models:/NAME/VERSION``)."""
    import mlflow.pytorch

    from ct_lightning.models import ACTIVATIONS

    try:
        with _tracking_uri(tracking_uri):
            model = _load_torch_module(uri)
    except Exception as error:  # noqa: BLE001 - MLflow raises several types for a missing run/model
        raise ValueError(f"from_checkpoint: cannot load MLflow model {uri} from {tracking_uri} "
                         f"({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    metadata = {}
    names = {cls: name for name, cls in ACTIVATIONS.items()}
    activations = [names[type(m)] for m in model.modules() if type(m) in names]
    if activations:
        metadata["activation"] = activations[0]
    if getattr(model, "entries", None):  # an AdaptedModel: its network reads the inputs of --model-inputs
        metadata["input_map"] = list(model.entries)
        if getattr(model, "labels", None):  # and the classes of its outputs, in its order
            metadata["outputs"] = list(model.labels)
    return state, metadata


class EpochMetricsInCheckpoint(L.Callback):
    """Store in every checkpoint the metrics the store may not have yet, so a resume can log those a kill lost:
    the epoch's own (Lightning writes the epoch-end checkpoint just before it sends the epoch's training
    metrics to the logger) and those still waiting in :class:`EpochStepMLFlowLogger`.
    """

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        metrics = {}
        for key, value in trainer.callback_metrics.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                metrics[key] = float(value.item())
        checkpoint["ct_epoch_metrics"] = {"epoch": int(trainer.current_epoch), "metrics": metrics}
        checkpoint["ct_unsent_metrics"] = [entry for logger in trainer.loggers
                                           if isinstance(logger, EpochStepMLFlowLogger) for entry in logger.unsent()]


def log_missing_epoch_metrics(client, run_id: str, checkpoint) -> int:
    """Log the metrics stored in ``checkpoint`` (see :class:`EpochMetricsInCheckpoint`) at ``step = epoch``
    where the run's history lacks that step. Returns how many values were logged."""
    from mlflow.entities import Metric

    stored = torch.load(checkpoint, map_location="cpu", weights_only=True)
    epochs = [*stored.get("ct_unsent_metrics", []), *([stored["ct_epoch_metrics"]] if stored.get("ct_epoch_metrics") else [])]
    by_epoch: dict[int, dict] = {}
    for entry in epochs:
        by_epoch.setdefault(int(entry["epoch"]), {}).update(entry["metrics"])
    now, histories, missing = int(time.time() * 1000), {}, []
    for epoch, metrics in sorted(by_epoch.items()):
        for key, value in {**metrics, "epoch": float(epoch)}.items():
            if key not in histories:
                histories[key] = {m.step for m in client.get_metric_history(run_id, key)}
            if epoch not in histories[key]:
                missing.append(Metric(key, value, now, epoch))
    if missing:
        client.log_batch(run_id, metrics=missing)
    return len(missing)
