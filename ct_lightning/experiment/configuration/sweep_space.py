"""A sweep's inputs, checked before any work: its search space (``--param``), its own options and the trials'
training settings (no torch, no data, no MLflow), then the options that name a table's columns (``--target``,
``--immutable``, ``--mutability``: its header line, then its target's classes with pandas, as ``train.py``).

``recipes/sweep.py`` checks all of it right after parsing (:func:`check_sweep_inputs`), so that a bad value is
refused in one line within a second, not after torch, Lightning and the table were loaded; the checks that need
the data module (a table's data spec, a one-hot column's kind, ...) follow in
:func:`ct_lightning.experiment.studies.sweep.run_sweep`, which also repeats these for callers from Python.
"""

from __future__ import annotations

import importlib.util
import itertools
import random

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.configuration.preflight import check_table_columns, preflight_training
from ct_lightning.experiment.configuration.settings import (DEFAULTS, RUN_ONLY_KEYS, SETTINGS, SETTINGS_BY_NAME,
                                                            check_combination, is_factory, load_config_file)
from ct_lightning.experiment.configuration.validation import (EnvironmentProblem, InputError, check_output_file,
                                                              check_writable_folder, show)

SEARCHES = ("grid", "random")
MODES = ("max", "min")
EXECUTORS = ("ray", "local")
# Options that only Ray Tune trials read, with the value that means "not given" (--executor local refuses others).
RAY_ONLY = {"address": None, "gpus_per_trial": 0, "max_concurrent": 0, "storage_path": None}

# The run-only settings (settings.RUN_ONLY_KEYS) name one run's own outputs, how it shows itself, or the run to
# continue. A sweep shares these with every trial, gives each trial its own folder under this one, and refuses
# every other run-only setting before any work: a new one is refused until it is decided here.
SHARED_RUN_ONLY = frozenset({"config", "run_name", "overwrite", "progress", "verbose"})
PER_TRIAL_RUN_ONLY = frozenset({"checkpoint_dir"})  # trial N: CHECKPOINT_DIR/sweep-PARENT/trial-N
INSTEAD = {"summary_json": "--sweep-json FILE (the sweep's summary; each trial's summary is in its MLflow run)",
           "resume": "re-run the same sweep command without --resume (finished trials are reused, interrupted "
                     "ones resume from their checkpoints)"}
# A --param varies what defines a training; a setting that does not (where runs are written, threads, the device)
# would make trials that the sweep counts as one training: it is given once, for every trial.
SWEEPABLE = tuple(sorted(s.name for s in SETTINGS if s.defines))
PARAM_FORM = f"NAME=V1,V2,... with NAME a setting that defines the training ({', '.join(SWEEPABLE)})"


def refuse_one_run_options(base: dict) -> None:
    """A one-line :class:`InputError` for a run-only setting in ``base`` that names one run (see ``INSTEAD``)."""
    for name in sorted(RUN_ONLY_KEYS - SHARED_RUN_ONLY - PER_TRIAL_RUN_ONLY):
        if base.get(name) is not None:
            raise InputError(name, base[name], INSTEAD.get(name, "leave it out: a sweep trains many runs"),
                             "it applies to one run, a sweep trains many")


def values_allowed(name: str) -> str:
    """The values ``--param NAME=...`` allows, in words (``tau=V1,V2,... with each value a number in (0, 1]``)."""
    return f"{name}=V1,V2,... with each value {SETTINGS_BY_NAME[name].describe_allowed()}"


def parse_value(name: str, text: str, spec: str | None = None):
    """A value of setting ``name`` from text, read with the setting's type (``"0.1"`` → 0.1 for ``lambda_div``) and
    checked by its rule; an :class:`InputError` naming ``--param`` and ``spec`` (the ``--param`` as typed)."""
    spec = f"{name}={text}" if spec is None else spec
    setting = SETTINGS_BY_NAME[name]
    if setting.action in ("store_true", "store_false"):
        if text.lower() not in ("true", "false", "1", "0"):
            raise InputError("--param", spec, values_allowed(name), f"{text!r} is not true or false")
        return text.lower() in ("true", "1")
    try:
        value = (setting.type or str)(text)
    except (TypeError, ValueError):
        raise InputError("--param", spec, values_allowed(name), f"{text!r} cannot be read as a value of {name}") \
            from None
    try:
        setting.checked(value, name)
    except InputError as error:
        detail = f": {error.detail}" if error.detail else ""
        raise InputError("--param", spec, f"{name}=V1,V2,... with each value {error.allowed}",
                         f"{show(text)} is not allowed for {name}{detail}") from None
    except ValueError as error:  # a check that words its own message (model_inputs)
        raise InputError("--param", spec, values_allowed(name), str(error)) from None
    return value


def parse_space(specs: list[str]) -> dict[str, list]:
    """``["lambda_div=0.01,0.1,1", "nce=100,1000"]`` → ``{"lambda_div": [0.01, 0.1, 1.0], "nce": [100, 1000]}``.

    A value list uses ``,``; settings whose values contain commas (``hidden_sizes``) separate values with ``;``.
    Every name and value is checked: an :class:`InputError` names ``--param``, what was given and what is allowed.
    """
    space: dict[str, list] = {}
    for spec in specs:
        if "=" not in spec:
            raise InputError("--param", spec, PARAM_FORM, "no '='")
        name, values = (part.strip() for part in spec.split("=", 1))
        name = name.replace("-", "_")
        if name not in SETTINGS_BY_NAME:
            raise InputError("--param", spec, PARAM_FORM, f"unknown setting {name!r}")
        if name not in SWEEPABLE:
            raise InputError("--param", spec, PARAM_FORM, f"{name} does not change the trained model: give it once, "
                             f"as {SETTINGS_BY_NAME[name].option}, for every trial")
        if name in space:
            raise InputError("--param", spec, f"one --param per setting, with all its values ({values_allowed(name)})",
                             f"{name} is already given")
        separator = ";" if ";" in values or name == "hidden_sizes" else ","
        texts = [v.strip() for v in values.split(separator) if v.strip()]
        if not texts:
            raise InputError("--param", spec, values_allowed(name), "no values")
        parsed = [parse_value(name, text, spec) for text in texts]
        repeated = next((text for i, text in enumerate(texts) if parsed[i] in parsed[:i]), None)
        if repeated is not None:
            raise InputError("--param", spec, f"{values_allowed(name)}, each once", f"{repeated} is given twice")
        space[name] = parsed
    if not space:
        raise ValueError(f"--param: none given; allowed: one or more --param {PARAM_FORM}")
    return space


def combinations(space: dict[str, list], search: str = "grid", num_samples: int = 10, seed: int = 0) -> list[dict]:
    """The trials' settings: every combination (``grid``) or ``num_samples`` distinct ones drawn at random."""
    if search not in SEARCHES:
        raise InputError("--search", search, ", ".join(SEARCHES))
    names = list(space)
    grid = [dict(zip(names, values)) for values in itertools.product(*(space[n] for n in names))]
    if search == "grid":
        return grid
    if num_samples < 1:
        raise InputError("--num-samples", num_samples, "an integer ≥ 1")
    return random.Random(seed).sample(grid, min(num_samples, len(grid)))


def objective_metrics(evaluates: bool, validation: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The metrics a trial's run logs, any of which a sweep may optimise (``evaluates``: with ``eval_every``);
    ``validation``: the ``val/`` names of the evaluation callback (default: the metric table's, read by
    :func:`catalogue.validation_metrics`)."""
    terms = catalogue.constant("ct_lightning.module", "TERMS")
    stats = catalogue.constant("ct_lightning.generators.base", "SEARCH_STATS")
    names = ["val/acc", "val/loss", "test/acc", "test/loss", "train/acc", "train/loss", "train/ct_active",
             *(f"train/{term}" for term in terms),
             *(f"train/cf_{stat}" for stat in (*stats, "search_seconds", "count")), "fit_seconds", "epoch"]
    validation = catalogue.validation_metrics() if validation is None else validation
    return tuple(names + ([f"val/{name}" for name in validation] if evaluates else []))


def check_metric(metric: str, evaluates: bool, validation: tuple[str, ...] | None = None) -> None:
    """A one-line :class:`InputError` unless the trials log ``metric``."""
    allowed = objective_metrics(evaluates, validation)
    if metric in allowed:
        return
    detail = "not logged by the trials"
    if not evaluates and metric in objective_metrics(True, validation):
        detail = "logged only with --eval-every N"
    raise InputError("metric", metric, ", ".join(allowed), detail)


def with_config_file(base: dict) -> dict:
    """``base`` with the settings of its ``config`` file beneath the given ones (as a training merges them), so that
    every check, the trials' keys and the sweep's identity see them; without the ``config`` key."""
    if not base.get("config"):
        return {k: v for k, v in base.items() if k != "config"}
    from_file = load_config_file(base["config"])
    return {**from_file, **{k: v for k, v in base.items() if k != "config"}}


def check_executor_options(sweep: dict) -> None:
    """The executor's options: the Ray-only ones only with ``--executor ray``, ``--jobs`` only with ``local``,
    ``--storage-path`` a folder that can be written."""
    executor = sweep.get("executor", "ray")
    if executor not in EXECUTORS:
        raise InputError("--executor", executor, ", ".join(EXECUTORS))
    if executor == "local":
        for name, unset in RAY_ONLY.items():
            if sweep.get(name, unset) != unset:
                option = "--" + name.replace("_", "-")
                raise InputError(option, sweep[name], "only with --executor ray (left out with --executor local)",
                                 "local trials are processes of this machine, not Ray Tune trials")
        return
    if importlib.util.find_spec("ray") is None:  # not imported: importing Ray takes seconds
        raise EnvironmentProblem('--executor: got \'ray\', but Ray is not installed; install the sweep extra: '
                                 'pip install -e ".[sweep]", or use --executor local')
    if sweep.get("jobs", 1) != 1:
        raise InputError("--jobs", sweep["jobs"], "1 with --executor ray (--max-concurrent N runs N trials at once), "
                         "or any number with --executor local")
    if sweep.get("storage_path"):
        check_writable_folder("--storage-path", sweep["storage_path"])


def check_trials(base: dict, settings: list[dict]) -> None:
    """Every trial's settings (the base overridden by its own) are allowed together, and its files and device are
    there: the checks of a training that need no data (:func:`preflight_training`; the store once)."""
    preflight_training(base)
    for params in settings:
        check_combination({**DEFAULTS, **preflight_training({**base, **params}, store=False).given})


def check_table_options(base: dict, settings: list[dict]) -> None:
    """The options that name a table's columns (``target``, ``immutable``, ``mutability``) and the table's problems
    (gaps without ``impute``, dates, the data spec, ...), once per distinct table configuration of the trials, as
    ``train.py`` checks them before torch is imported
    (:func:`~ct_lightning.experiment.configuration.preflight.check_table_columns`: the header line, then the table
    read with pandas): the same one line, in a second instead of after torch and the data module."""
    seen = set()
    for params in settings:
        config = {**base, **params}
        key = repr([config.get(k) for k in ("data", "target", "drop_columns", "immutable", "mutability", "data_spec",
                                            "impute", "balance")])
        if key not in seen:
            seen.add(key)
            check_table_columns(config)


def check_sweep_inputs(base: dict, sweep: dict) -> tuple[dict, dict[str, list], list[dict]]:
    """``(base, space, settings)``: the trials' base (its config file merged in), the search space and the trials'
    settings, after every check that needs no data, then those of a table's columns (:func:`check_table_options`);
    a one-line error (:class:`InputError`, ``ValueError``, ``OSError``) otherwise."""
    base = with_config_file({k: v for k, v in base.items() if v is not None})
    refuse_one_run_options(base)
    space = parse_space(sweep.get("param") or [])
    settings = combinations(space, sweep.get("search", "grid"), sweep.get("num_samples", 10),
                            sweep.get("sweep_seed", 0))
    if sweep.get("mode", "max") not in MODES:
        raise InputError("--mode", sweep["mode"], ", ".join(MODES))
    evaluates = any({**DEFAULTS, **base, **params}.get("eval_every") for params in settings)
    if not is_factory(base.get("data")):  # a data module of one's own may register metrics
        check_metric(sweep.get("metric", "val/acc"), evaluates)
    check_executor_options(sweep)
    if sweep.get("sweep_json"):
        check_output_file("--sweep-json", sweep["sweep_json"])
    check_trials(base, settings)
    check_table_options(base, settings)
    return base, space, settings

