"""The model that travels: a run's classifier as two MLflow models, one to serve and one to train further.

- ``model`` (the PyTorch flavour, pickled ``nn.Module``): ``mlflow.pytorch.load_model("runs:/ID/model")``
  returns the classifier itself (logits of encoded inputs), which evaluates, fine-tunes
  (``train.py --from-checkpoint runs:/ID/model``) and goes back into ``CTModule``.
- ``predictor`` (a pyfunc, :class:`RawRowsClassifier`): takes the raw DataFrame with the original columns
  (listed with their types in the model's ``metadata["input_columns"]`` and shown by its input example; the
  signature has no input schema, so the predictor itself refuses an unknown column or a value of the wrong
  type, see :mod:`ct_lightning.experiment.runs.request_checks`), bundles the fitted preprocessing and returns
  the predicted class and the probability of each class; with the parameter ``explain=true`` also the counterfactual and its
  changes in original units. This is the one registered (``ct-DATA-ROLE``) and served
  (``mlflow models serve``); ``--from-checkpoint`` accepts it too (its classifier is unwrapped).

Loading either needs ``ct-lightning`` installed (the classes are pickled by reference).
"""

from __future__ import annotations

import logging
import warnings

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from ct_lightning.evaluation.explanation import explain, explanation_search, mark_filled
from ct_lightning.experiment.configuration.console import quiet_registry, verbose_console
from ct_lightning.experiment.runs.lifecycle import data_label
from ct_lightning.experiment.runs.request_checks import (as_rows, check_params, check_rows, requested_mutability,
                                                          requested_steps, requested_target, row_limit, target_default)
from datamodules.codec import LABELLED

PREDICTOR_NAME = "predictor"
_logger = logging.getLogger(__name__)
SEARCH_KEYS = ("generator", "tau", "max_steps", "epsilon", "lambda_cost", "lambda_energy", "lr", "mutability")


class OneLineError(MlflowException):
    """An MLflow error whose message the scoring server sends exactly as given.

    The server rewrites the message of an ``MlflowException`` raised in ``predict`` to
    ``Failed to predict data '<the whole input, printed>'. Error: ...``; this message stays as first set, so
    the answer is one line and does not echo the request."""

    @property
    def message(self) -> str:  # noqa: D102 - the message given
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_message"):
            self._message = value


class RequestRefused(OneLineError):
    """A bad request: HTTP 400 with a one-line message."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


class PredictorFailed(OneLineError):
    """The predictor failed on a request it accepted: HTTP 500 with a one-line message (the traceback is logged
    by the server, never sent)."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INTERNAL_ERROR)


class RawRowsClassifier(mlflow.pyfunc.PythonModel):
    """pyfunc: raw rows (original columns and units) → ``prediction``, ``probability`` and ``probability_CLASS``.

    ``params``: ``explain`` (bool) adds ``target``, ``target_probability`` (at the decoded counterfactual),
    ``valid``, ``counterfactual_prediction`` (the class predicted there), ``counterfactual`` (column → value) and
    ``changes`` (``[{feature, from, to}]``, with ``label``, ``unit_label``, ``from_label`` and ``to_label`` where the
    data spec words the column and its values; ``prediction_label``, ``target_label`` and
    ``counterfactual_prediction_label`` name classes it words); for an ordered outcome also ``valid_classes`` (the
    classes at or above the target, which count as valid; ``target_probability`` is their summed probability);
    ``target`` (a class label as text, or the data spec's words for it, as ``explain.py --target``; default: the most
    likely other class),
    ``max_steps``, and ``immutable`` and ``mutability`` (as ``explain.py``'s options: columns the explanation must not
    change, or only one way, on top of the run's own constraints), ``step`` (``income=1000``: changes in whole
    steps, as ``explain.py --step``) and ``max_change`` (``income=10000``: changes of at most that much, as
    ``explain.py --max-change``) steer the search.
    A bad request (see :mod:`ct_lightning.experiment.runs.request_checks`) raises :class:`RequestRefused`: HTTP 400
    with one line naming the column, the value and what is allowed; any other failure :class:`PredictorFailed`:
    HTTP 500 with one line, the traceback only in the server's log.
    """

    def __init__(self, model: torch.nn.Module, codec, search: dict):
        self.model = model.cpu().eval()
        self.codec = codec  # the fitted preprocessing itself, pickled with the model
        self.search = {k: v for k, v in search.items() if k in SEARCH_KEYS}

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:  # noqa: D102 - documented on the class
        try:
            return self._answer(model_input, dict(params or {}))
        except MlflowException:
            raise
        except ValueError as error:  # request_checks' and the codec's one-line refusals of a bad request
            raise RequestRefused(str(error).splitlines()[0]) from None
        except Exception as error:  # noqa: BLE001 - a 500 with one line; the traceback goes to the server's log
            _logger.exception("predictor: failed on an accepted request")
            raise PredictorFailed(f"the predictor failed on this request ({type(error).__name__}: "
                                  f"{(str(error).splitlines() or [''])[0]}); the server's log has the details") from None

    def _answer(self, model_input, params: dict) -> pd.DataFrame:
        codec = self.codec
        frame = as_rows(model_input)
        check_params(codec, params)
        mutability = {**dict(self.search.get("mutability") or {}), **requested_mutability(codec, params)}
        held = [name for name, kind in mutability.items() if kind == "none"]  # a row may break a rule on these
        frame = check_rows(codec, frame, row_limit(bool(params.get("explain"))), held)
        x = torch.as_tensor(codec.encode(frame), dtype=torch.float32)
        with torch.no_grad():
            probabilities = torch.softmax(self.model(x), dim=1).numpy()
        out = pd.DataFrame({"prediction": codec.decode_target(probabilities.argmax(1)),
                            "probability": probabilities.max(1).astype(float)})
        for index, label in enumerate(codec.classes):
            out[f"probability_{label}"] = probabilities[:, index].astype(float)
        words = getattr(codec, "class_labels", None)  # the data spec's words for the classes, beside them
        if words:
            out.insert(1, "prediction_label", [codec.class_label(c) for c in out["prediction"]])
        if params.get("explain"):
            search = {**self.search, **({"max_steps": int(params["max_steps"])} if params.get("max_steps") else {})}
            search["mutability"] = mutability
            search["steps"] = requested_steps(codec, params)
            search["max_changes"] = requested_steps(codec, params, "max_change")
            explained = explain(self.model, frame, target=requested_target(codec, params), codec=codec, **search)
            out["target"] = explained["target"].to_list()
            out["target_probability"] = explained["probability"].to_list()
            out["valid"] = explained["valid"].to_list()
            out["counterfactual_prediction"] = explained["counterfactual_prediction"].to_list()
            for key in ("target", "counterfactual_prediction") if words else ():
                out[f"{key}_label"] = [codec.class_label(c) for c in out[key]]
            if "valid_classes" in explained.columns:  # an ordered outcome: valid counts "at least" the target
                out["valid_classes"] = explained["valid_classes"].to_list()
            out["counterfactual"] = explained["counterfactual"].to_list()
            mark_filled(explained["changes"], frame.attrs.get("filled", {}))  # the request left them empty
            out["changes"] = explained["changes"].to_list()
        return out


def _column_type(column) -> str:
    if column.kind in LABELLED and column.categories:
        sample = column.categories[0]
        if isinstance(sample, (bool, np.bool_)):
            return "boolean"
        if isinstance(sample, (int, np.integer)):
            return "long"
        if isinstance(sample, (float, np.floating)):
            return "double"
        return "string"
    return "long" if column.kind == "integer" else "double"


def predictor_signature(codec):
    """The output columns and the ``explain``/``target``/``max_steps``/``immutable``/``mutability``/``step``/
    ``max_change`` params; no input schema. Where the data spec words the classes, the outputs list
    ``prediction_label`` (the predicted class in those words) and the ``target`` param's default names each class in
    its words with the class in brackets (``no default [0], default [1]``), the legend of ``probability_0`` and
    ``probability_1``, whose names keep the class a program reads (:func:`class_entries` in the metadata too).

    With an input schema MLflow would drop columns the model does not know before the predictor sees them
    (with a warning in the server's log only) and convert or refuse values by rules of its own that differ
    between the scoring server and ``predict`` in Python (the server cut ``40.5`` to ``40`` in an integer column
    and read ``"false"`` as ``True``); without one the rows arrive as sent and
    :func:`~ct_lightning.experiment.runs.request_checks.check_rows` refuses both in one line. The columns and
    their types are in the model's metadata (:func:`input_columns`) and its input example."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    label_type = "string" if any(isinstance(c, str) for c in codec.classes) else "long"
    worded = [ColSpec("string", "prediction_label")] if getattr(codec, "class_labels", None) else []
    outputs = Schema([ColSpec(label_type, "prediction"), *worded, ColSpec("double", "probability"),
                      *[ColSpec("double", f"probability_{c}") for c in codec.classes]])
    params = ParamSchema([ParamSpec("explain", "boolean", False), ParamSpec("target", "string", target_default(codec)),
                          ParamSpec("max_steps", "long", 0), ParamSpec("immutable", "string", ""),
                          ParamSpec("mutability", "string", ""), ParamSpec("step", "string", ""),
                          ParamSpec("max_change", "string", "")])
    return ModelSignature(inputs=None, outputs=outputs, params=params)


def class_entries(codec) -> list[dict]:
    """The predictor's classes, as logged in its ``metadata["classes"]``: ``value`` (the class, as ``prediction``
    gives it), ``output`` (its ``probability_CLASS`` column) and ``label`` (the data spec's words for it, where it
    gives them)."""
    return [{"value": c.item() if isinstance(c, np.generic) else c, "output": f"probability_{c}",
             **({"label": codec.class_label(c)} if getattr(codec, "class_labels", None) and codec.class_label(c)
                else {})} for c in codec.classes]


def input_columns(codec) -> list[dict]:
    """The predictor's input columns, in order, as logged in its ``metadata["input_columns"]``: ``name``, ``type``
    (MLflow's name for it: ``long``, ``double``, ``string``, ``boolean``), ``kind`` (the preprocessing's:
    ``integer``, ``continuous``, ``categorical``, ``binary``, ``ordinal``) and either ``categories`` (an ordinal
    column's from lowest to highest) or, where known, the numeric ``domain`` ``[low, high]`` a request must keep to;
    and the data spec's words where it gives them: ``label``, ``unit`` and ``values`` (``[{value, label}]``)."""
    out = []
    for column in codec.columns:
        entry = {"name": column.name, "type": _column_type(column), "kind": column.kind}
        for key, name in (("label", "label"), ("unit", "unit_label")):
            if getattr(column, name, None):
                entry[key] = getattr(column, name)
        if getattr(column, "value_labels", None):
            entry["values"] = [{"value": value, "label": text} for value, text in column.value_labels]
        if column.kind in LABELLED and getattr(column, "categories", None):
            entry["categories"] = [c.item() if isinstance(c, np.generic) else c for c in column.categories]
        else:
            domain = getattr(column, "domain", None)
            bounds = domain() if domain else None
            if bounds and all(np.isfinite(bounds)):
                entry["domain"] = [float(bounds[0]), float(bounds[1])]
        out.append(entry)
    return out


def example_rows(codec, x_encoded: torch.Tensor, n: int = 3) -> pd.DataFrame:
    """``n`` rows in original units, decoded from encoded inputs (the logged input example)."""
    frame = codec.decode(x_encoded[:n].detach().cpu().numpy())
    for column in codec.columns:  # the example's types follow the signature
        kind = _column_type(column)
        if kind == "long":
            frame[column.name] = frame[column.name].round().astype("int64")
        elif kind == "double":
            frame[column.name] = frame[column.name].astype(float)
    return frame[[c.name for c in codec.columns]]


def registered_name(data: str, objective: str, role: str | None = None) -> str:
    """``ct-DATA-ROLE``: the run's ``role`` tag, else ``ct`` for counterfactual training and ``bl`` for vanilla."""
    role = role or ("bl" if objective == "vanilla" else "ct")
    clean = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in str(data).lower())
    return f"ct-{clean}-{role.lower()}"


def chosen_name(given: str | None, data: str, objective: str, role: str | None = None) -> str | None:
    """The registered name a run's predictor goes to: ``--registered-model`` as given (``none``: ``None``, not
    registered), else :func:`registered_name`."""
    if given:
        return None if given.lower() == "none" else given
    return registered_name(data, objective, role)


def register_run_predictor(tracking_uri: str, run_id: str, verbose: bool = False) -> tuple[str | None, str | None]:
    """Register the ``predictor`` run ``run_id`` logged (a sweep's best trial) under its ``--registered-model`` or as
    ``ct-DATA-ROLE``, once: ``(name, version)``, the existing version when this run is registered there already;
    ``(None, None)`` for ``--registered-model none``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    given = run.data.params.get("registered_model")  # "None" where the trials were given no name
    name = chosen_name(None if given == "None" else given, tags.get("data", "data"),
                       tags.get("objective", "full"), tags.get("role"))
    if name is None:
        return None, None
    if client.search_registered_models(f"name = '{name}'"):
        existing = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
        if existing:
            return name, str(existing[0].version)
    return name, register_predictor(tracking_uri, f"runs:/{run_id}/{PREDICTOR_NAME}", name, verbose)


def register_predictor(tracking_uri: str, model_uri: str, name: str, verbose: bool = False) -> str:
    """Register a logged predictor (``models:/MODEL_ID`` or ``runs:/RUN_ID/predictor``) as a new version of
    ``name``: that version. MLflow's own registry lines ("Successfully registered model ...", "Created version ...")
    only when ``verbose``; its errors raise as they are."""
    import mlflow

    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri

    with _tracking_uri(tracking_uri), quiet_registry(verbose):
        return str(mlflow.register_model(model_uri, name).version)


def registered_text(name: str, version: str, tracking_uri: str) -> str:
    """``NAME version V: models:/NAME/V; serve: COMMAND``: a registered predictor, how to load it and to serve it."""
    from ct_lightning.experiment.runs.tracking import serve_command

    uri = f"models:/{name}/{version}"
    return f"{name} version {version}: {uri}; serve: {serve_command(tracking_uri, uri)}"


def log_predictor(model: torch.nn.Module, codec, x_encoded: torch.Tensor, search: dict,
                  registered_model_name: str | None = None, run_id: str | None = None, step: int = 0):
    """Log :class:`RawRowsClassifier` as the run's ``predictor`` (registered under ``registered_model_name``, with
    MLflow's own registry lines; :func:`log_models` registers it quietly instead)."""
    from mlflow.models import Model

    from ct_lightning.experiment.runs.run_artifacts import model_requirements, user_code_paths

    signature = predictor_signature(codec)
    example = example_rows(codec, x_encoded)
    metadata = {"input_columns": input_columns(codec), "classes": class_entries(codec)}
    if getattr(codec, "dropped", None):  # trained without them (--drop-columns): a request may carry them
        metadata["ignored_columns"] = list(codec.dropped)
    python_model = RawRowsClassifier(model, codec, search)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        # mlflow.pyfunc.log_model has no run_id; Model.log (which it calls) files the model under a given run.
        return Model.log(
            None, name=PREDICTOR_NAME, flavor=mlflow.pyfunc, python_model=python_model, signature=signature, input_example=example,
            metadata=metadata,
            run_id=run_id, registered_model_name=registered_model_name, step=step,
            code_paths=user_code_paths(model) or None,  # --model mynet:Net: mynet.py travels with the model
            pip_requirements=model_requirements("pandas", f"mlflow=={mlflow.__version__}"))


def final_step(metrics: dict) -> int:
    """The step (epoch) of the last training epoch's metrics."""
    return max(int(metrics.get("epochs", 1) or 1) - 1, 0)


def link_final_metrics(client, run_id: str, model_ids: list[str], datasets: dict, logged_step: int) -> int:
    """Link the run's last values of the metrics named ``PREFIX/...`` for each ``PREFIX`` of ``datasets``
    (``{"test": (name, digest)}``) to its logged models, with that data set, so the model page lists it.

    MLflow itself links the metrics of the step a model is logged at (the last epoch: ``train/*``, ``val/*``,
    without a data set); the test metrics come one step later (at the same step when no epoch was trained,
    and then stay without a data set). Each value is logged again with its own step
    and timestamp, which the run's store keeps as the same point (no duplicate in the run's curves).
    Returns the number of values linked.
    """
    from mlflow.entities import Metric

    batch = []
    for key in client.get_run(run_id).data.metrics:
        if key.split("/")[0] not in datasets:
            continue
        history = client.get_metric_history(run_id, key)
        own = [m for m in history if not getattr(m, "model_id", None)]
        if not own:
            continue
        last = max(own, key=lambda m: (m.step, m.timestamp))
        if last.step == logged_step:  # MLflow linked it already, with the model (a second link is refused)
            continue
        name, digest = datasets[key.split("/")[0]]
        for model_id in model_ids:
            batch.append(Metric(key, last.value, last.timestamp, last.step, model_id=model_id, dataset_name=name,
                                dataset_digest=digest, run_id=run_id))
    for start in range(0, len(batch), 500):
        client.log_batch(run_id, metrics=batch[start:start + 500])
    return len(batch)


def run_codec(datamodule, mutability: dict | None = None):
    """The data module's fitted preprocessing (``codec``), else the identity :class:`FeatureCodec` of its features."""
    from ct_lightning.evaluation.explanation import FeatureCodec

    codec = getattr(datamodule, "codec", None)
    if codec is not None:
        return codec
    names = list(getattr(datamodule, "feature_names", None) or []) or None
    return FeatureCodec(names, n_features=int(datamodule.n_features), n_classes=int(datamodule.n_classes),
                        mutability=mutability)


def log_models(client, tracking_uri: str, experiment_id: str, run_id: str, module, datamodule, config: dict,
               metrics: dict, mutability: dict | None = None) -> dict:
    """Log ``model`` (PyTorch) and ``predictor`` (raw rows), register the predictor as ``ct-DATA-ROLE`` and link the
    final metrics and the data sets to both. Returns ``{"model": id, "predictor": id, "registered": name, "version":
    version}`` (MLflow's registry lines only with ``verbose``; a registration the store refuses is a warning).

    A grid's models (tag ``ct.role = grid-model``) are points of a study, not models to serve: they log ``model``
    only (``predictor`` and ``registered`` are ``None``). A predictor costs about half a second per run, and a grid
    has hundreds of runs per data set; ``recipes/explain.py --run-id ID`` explains with any of them from its checkpoints."""
    from ct_lightning.experiment.runs.run_artifacts import _digest, _tracking_uri, log_classifier

    step = final_step(metrics)  # MLflow links the metrics of this step to the logged models
    logged = log_classifier(tracking_uri, experiment_id, run_id, module.model, datamodule.x_train, step)
    codec = run_codec(datamodule, mutability)
    hp = module.hparams
    search = {**explanation_search(hp), "mutability": dict(mutability or {})}  # the run's constraints hold too
    search["generator"] = search["generator"] if search["generator"] in ("generic", "ecco") else "ecco"
    tags = client.get_run(run_id).data.tags
    data = data_label(str(config.get("data") or datamodule.name))  # a user's table by its file: loans.csv -> loans
    datasets = {"test": (f"{datamodule.name}-test", _digest(datamodule.x_test, datamodule.y_test))}
    if tags.get("ct.role") == "grid-model":
        _link_quietly(client, run_id, [logged.model_id], datasets, step)
        return {"model": logged.model_id, "predictor": None, "registered": None, "version": None}
    # A sweep's trials are candidates: each logs its predictor, and the sweep registers only its best one at the end
    # (register_run_predictor), so `models:/ct-DATA-ROLE/latest` never becomes whichever trial finished last.
    name = None if tags.get("ct.role") == "sweep-trial" else \
        chosen_name(config.get("registered_model"), data, config.get("objective", "full"), tags.get("role"))
    with _tracking_uri(tracking_uri, experiment_id):
        predictor = log_predictor(module.model, codec, datamodule.x_train, search, None, run_id, step)
    version = None
    if name is not None:
        try:  # the recipe prints one line of its own (train.announce) instead of MLflow's
            version = register_predictor(tracking_uri, predictor.model_uri, name, verbose_console(config.get("verbose")))
        except Exception as error:  # noqa: BLE001 - registration races between simultaneous runs
            warnings.warn(f"MLflow: predictor not registered ({str(error).splitlines()[0]}); register it by hand: "
                          f"mlflow.register_model('runs:/{run_id}/{PREDICTOR_NAME}', '{name}')")
            name = None
    _link_quietly(client, run_id, [logged.model_id, predictor.model_id], datasets, step)
    return {"model": logged.model_id, "predictor": predictor.model_id, "registered": name, "version": version}


def _link_quietly(client, run_id: str, model_ids: list[str], datasets: dict, step: int) -> None:
    """:func:`link_final_metrics`, with a warning instead of an error: a model page's decoration must not fail a
    finished training."""
    try:
        link_final_metrics(client, run_id, model_ids, datasets, step)
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"MLflow: final metrics not linked to the logged models ({str(error).splitlines()[0]})")
