"""A registered model (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``, ``models:/NAME/latest``: what train.py prints
when it registers one) read as the MLflow run that logged it, so that explain.py and evaluate.py load it with that
run's checkpoints, settings and preprocessing, and log to that run."""

from __future__ import annotations

import os
import re

from ct_lightning.experiment.configuration.validation import InputError

MODEL_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:/(?P<version>[^/@]+)|@(?P<alias>[^/@]+))/?")
FORMS = "models:/NAME/VERSION, models:/NAME@ALIAS or models:/NAME/latest of a model registered by train.py"


def is_registered_uri(value) -> bool:
    """Whether ``value`` is a registry URI (``models:/NAME...``) rather than a run id or a logged model's id."""
    return str(value or "").startswith("models:/") and not str(value).startswith("models:/m-")


def registered_run(option: str, uri: str, tracking_uri: str) -> tuple[str, str]:
    """``(run id, version)`` of the registered model version ``uri`` names in the store ``tracking_uri``; a one-line
    :class:`InputError` on ``option`` for an unknown name (naming the registered models), an unknown version or alias
    (naming the versions and aliases that exist) or a version registered from no run of this store."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    match = MODEL_URI.fullmatch(str(uri))
    if match is None:
        raise InputError(option, uri, FORMS)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=tracking_uri)
    name = match["name"]
    try:
        model = client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        names = sorted(m.name for m in client.search_registered_models(max_results=1000))
        raise InputError(option, uri, FORMS + (f"; registered in {tracking_uri}: {', '.join(names)}" if names else
                                               f"; {tracking_uri} holds no registered model"),
                         f"no registered model {name!r}") from None
    quoted = name.replace("'", "\\'")
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{quoted}'", max_results=1000))
    aliases = dict(model.aliases or {})
    wanted = aliases.get(match["alias"]) if match["alias"] else \
        (versions[-1] if versions else None) if match["version"] == "latest" else match["version"]
    if wanted is None or not str(wanted).isdigit() or int(wanted) not in versions:
        held = ", ".join(map(str, versions)) or "none"
        named = "; aliases: " + ", ".join(f"@{a} (version {v})" for a, v in sorted(aliases.items())) if aliases else ""
        asked = f"no alias @{match['alias']}" if match["alias"] else f"no version {match['version']}"
        raise InputError(option, uri, f"a version of {name} (versions: {held}{named})", f"{name} has {asked}")
    version = client.get_model_version(name, str(wanted))
    if not version.run_id:
        raise InputError(option, uri, f"a version registered from a run of {tracking_uri} (train.py registers its "
                         "runs' predictors)", f"version {wanted} of {name} comes from {version.source}, no run")
    return version.run_id, str(wanted)


def run_of_reference(option: str, value: str, tracking_uri: str, echo=print) -> str:
    """``value`` (a ``--run-id``) as a run id: a registry URI is resolved (:func:`registered_run`) and said in a note;
    anything else is returned as it is."""
    if not is_registered_uri(value):
        return value
    from ct_lightning.experiment.configuration.store import check_store_exists  # noqa: PLC0415

    check_store_exists("--tracking-uri", tracking_uri, f"{option} {value}")
    run_id, version = registered_run(option, value, tracking_uri)
    echo(f"note: {option} {value} is version {version} of {MODEL_URI.fullmatch(value)['name']}, logged by run "
         f"{run_id}: its model, with the run's settings and preprocessing")
    return run_id
