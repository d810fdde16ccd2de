"""A fine-tuning on a table keeps the preprocessing its model was trained with.

``train.py --data november.csv --from-checkpoint october/last.ckpt`` (or ``runs:/ID/model``, ``models:/NAME/V``) encodes
November's rows with October's fitted :class:`~datamodules.codec.TabularCodec`: the network's inputs keep their
meaning (October's column order, categories and standardisation), where a codec fitted again on November would feed
the same weights other numbers. The domain widens to hold November's training rows (:func:`datamodules.kept_codec.
widen_domain`); a resumed fine-tuning reads the codec it trained with from its own checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from ct_lightning.experiment.configuration.settings import is_table_file

FITTED = ("mean", "scale", "train_min", "train_max", "fill", "unit", "thousands")  # learnt from rows, not declared


def kept_preprocessing(config: dict, resume_from: Path | None = None) -> dict | None:
    """The fitted preprocessing a training on a table file keeps: that of the ``from_checkpoint`` model (a checkpoint
    of this project, ``runs:/``, ``models:/``), or of ``resume_from`` when resuming such a fine-tuning; ``None`` for a
    training from scratch, data that is no table file, or weights without a table's preprocessing (a plain
    ``state_dict``: ct-lightning fits its own encoding, as before)."""
    from ct_lightning.experiment.runs.checkpoints import checkpoint_preprocessing  # noqa: PLC0415
    from ct_lightning.experiment.runs.run_artifacts import model_uri_preprocessing  # noqa: PLC0415

    source = config.get("from_checkpoint")
    if not source or not is_table_file(config.get("data")):
        return None
    if resume_from is not None:
        return checkpoint_preprocessing(resume_from)
    if ":/" in source:
        return model_uri_preprocessing(source, config["tracking_uri"])
    return checkpoint_preprocessing(source)


DECLARED = ("kind", "mutability", "lower", "upper", "step", "max_change", "order")  # a data spec's keys for a column


def check_data_spec(config: dict, kept: dict) -> None:
    """A ``data_spec`` given beside a kept preprocessing must declare what the model was trained with (the BL run's
    spec given again to its CT fine-tuning): each key it gives a column, and the mutability, bounds and steps the model
    holds, alike; else a one-line ``ValueError`` naming the first that differs: a fine-tuning cannot change what its
    inputs mean."""
    from datamodules.codec import read_spec, target_entry  # noqa: PLC0415

    if not config.get("data_spec"):
        return
    spec = read_spec(config["data_spec"])
    columns = dict(spec.get("columns") or {})
    for column in kept["columns"]:
        given = dict(columns.get(column["name"]) or {})
        trained = {"kind": column["kind"], "mutability": column.get("mutability", "both"),
                   "lower": column.get("lower_rule") or column.get("lower"),
                   "upper": column.get("upper_rule") or column.get("upper"), "step": column.get("step"),
                   "max_change": column.get("max_change"),
                   "order": column.get("categories") if column["kind"] == "ordinal" else None}
        for key in DECLARED:
            value = given.get(key, "both" if key == "mutability" else None)
            if key == "kind" and key not in given or key == "order" and value is None:
                continue  # an inferred kind, and a numeric ordinal column's sorted values, need not be written
            same = value == trained[key] or (value is not None and trained[key] is not None
                                             and str(value).replace(" ", "") == str(trained[key]).replace(" ", ""))
            if not same:
                raise ValueError(f"data_spec: got {config['data_spec']!r} ({column['name']}: {key} {value!r}; the "
                                 f"model of --from-checkpoint was trained with {trained[key]!r}); allowed: the data "
                                 "spec the model was trained with, or none: a fine-tuning keeps its model's "
                                 "preprocessing (add constraints with --immutable and --mutability)")
    _, order = target_entry(spec)
    for key, value in (("positive", spec.get("positive")), ("order", order)):
        if value is not None and value != kept.get(key) and str(value) != str(kept.get(key)):
            raise ValueError(f"data_spec: got {config['data_spec']!r} (target {key} {value!r}; the model of "
                             f"--from-checkpoint was trained with {kept.get(key)!r}); allowed: the data spec the "
                             "model was trained with, or none")


def kept_line(config: dict, resumed: bool = False) -> str:
    """The start-up line of a training that keeps its model's preprocessing."""
    from ct_lightning.experiment.runs.lifecycle import start_label  # noqa: PLC0415

    whose = "its own checkpoint's" if resumed else f"that of {start_label(config['from_checkpoint'])}"
    return (f"encoding {Path(config['data']).name} with the preprocessing the model was trained with ({whose}: its "
            "columns, categories and standardisation, not fitted again on this file)")


def trained_mutability(source: str, tracking_uri: str) -> dict[str, str]:
    """``{feature: kind}`` the ``from_checkpoint`` model was trained under (its data spec's and its ``--immutable``,
    ``--mutability`` and ``--protect``): a checkpoint's hyperparameters, or the MLflow model's run's; ``{}`` where
    they do not say."""
    if ":/" not in source:
        from ct_lightning.experiment.runs.checkpoints import read_checkpoint  # noqa: PLC0415

        found = read_checkpoint(source)[1].get("mutability")
        return dict(found) if isinstance(found, dict) else {}
    import mlflow  # noqa: PLC0415
    from mlflow.models import Model  # noqa: PLC0415

    try:
        run_id = Model.load(source).run_id
        params = mlflow.tracking.MlflowClient(tracking_uri=tracking_uri).get_run(run_id).data.params
        found = json.loads(params.get("mutability", "{}").replace("'", '"'))
    except Exception:  # noqa: BLE001 - no run of ours behind it: nothing to keep
        return {}
    return dict(found) if isinstance(found, dict) else {}


def inherit_mutability(config: dict, kept: dict) -> tuple[str | None, dict[str, str]]:
    """Keep the constraints the ``from_checkpoint`` model was trained under (``--immutable age,sex`` in October holds
    in November's fine-tuning, as its preprocessing does): each feature it held that the command line does not name is
    added to ``config["mutability"]`` (the data spec's own are the kept preprocessing's already); a feature named on
    the command line takes the kind given there (``--mutability sex=both`` frees it). The note saying so (``None``
    where nothing is kept) and the ``{feature: kind}`` kept, for the mutability line to name where they came from."""
    from ct_lightning.experiment.configuration.table_columns import named_features  # noqa: PLC0415

    data = {c["name"]: c.get("mutability", "both") for c in kept["columns"]}
    named = {name for _, name, _ in named_features(config)}
    trained = trained_mutability(config["from_checkpoint"], config["tracking_uri"])
    inherited = {name: kind for name, kind in trained.items()
                 if kind != "both" and name in data and data[name] != kind and name not in named}
    if not inherited:
        return None, {}
    pairs = [f"{name}={kind}" for name, kind in inherited.items()]
    config["mutability"] = ",".join([p for p in str(config.get("mutability") or "").split(",") if p] + pairs)
    shown = ", ".join(f"{name}: {kind}" for name, kind in inherited.items())
    return (f"note: the model was trained with {shown} (the --immutable/--mutability of the run that "
            "trained it): kept in this fine-tuning; --mutability COLUMN=both frees a column"), inherited


def is_other_table(trained, given, datamodule, run_id: str | None = None, tracking_uri: str | None = None) -> bool:
    """Whether ``given``, the table a model is evaluated on (``evaluate.py --data``), is another table than
    ``trained``, the one it was trained on (next month's file, not a copy of the training file): another content
    where the training file is on this machine, else other test rows than the run logged (its ``test`` dataset's
    digest); a table the run's cannot be compared with counts as a copy of it (``False``)."""
    import filecmp  # noqa: PLC0415

    from datamodules.workbook import split_sheet  # noqa: PLC0415

    if not given or not is_table_file(given) or not is_table_file(trained):
        return False
    (ours, our_sheet), (theirs, their_sheet) = split_sheet(str(trained)), split_sheet(str(given))
    if Path(ours).is_file():
        return our_sheet != their_sheet or not filecmp.cmp(ours, theirs, shallow=False)
    if run_id is None:
        return False
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    from ct_lightning.experiment.runs.run_artifacts import _digest  # noqa: PLC0415

    try:
        inputs = MlflowClient(tracking_uri=tracking_uri).get_run(run_id).inputs.dataset_inputs
    except Exception:  # noqa: BLE001 - a store that does not answer: taken as the copy the user says it is
        return False
    logged = [entry.dataset.digest for entry in inputs
              if any(tag.key == "mlflow.data.context" and tag.value == "test" for tag in entry.tags)]
    return bool(logged) and _digest(datamodule.x_test, datamodule.y_test) not in logged
