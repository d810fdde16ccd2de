"""``recipes/compare.py`` with given runs (``--bl-run-id``, ``--ct-run-id``, ...): the data and the table settings
(``--target``, ``--data-spec``, ``--impute``, ``--drop-columns``, ``--balance``) those runs were trained with, from
their ``config.json``, so that the command line need not repeat them; where compare trains the other roles, the
network too (``--model``, ``--hidden-sizes``, ``--activation``, ``--from-checkpoint``, ``--model-inputs``; for a
model of one's own also ``--max-epochs`` and ``--lr``). A value given on the command line that differs from the
runs', and runs of one comparison trained on different data, or with different networks where compare trains
roles beside them, are refused in one line before any work."""

from __future__ import annotations

import argparse
import filecmp
import json
import tempfile
from pathlib import Path

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.configuration.settings import (SETTINGS_BY_NAME, TABLE_KEYS, csv_names, is_table_file)
from ct_lightning.experiment.configuration.validation import InputError
from datamodules.workbook import resolved, split_sheet, table_file

FROM_RUNS = ("data", *TABLE_KEYS)  # what a given run says about the data it was trained on
FILES = ("data", "data_spec", "model_inputs", "from_checkpoint")  # the same file, or one of the same content


def option(key: str) -> str:
    """The command-line option of a setting of :data:`FROM_RUNS` (``data`` is compare's ``--data``)."""
    return SETTINGS_BY_NAME[key].option


def comparable(key: str, value):
    """A setting's value in one form for the command line's and a run's: a table by its absolute path, a built-in
    set by its canonical name, the dropped columns as a set, an unset impute or balance as ``none``, another file
    (:data:`FILES`) by its absolute path, hidden sizes as a list."""
    if key == "data":
        return resolved(value) if is_table_file(value) else (catalogue.canonical_dataset(value) or value)
    if key == "drop_columns":
        return frozenset(csv_names(value))
    if key in ("impute", "balance"):
        return value or "none"
    if key in ("data_spec", "model_inputs", "from_checkpoint"):
        return str(Path(value).resolve()) if value and ":/" not in str(value) else (value or None)
    if key == "hidden_sizes":
        return list(value)
    return value


def same(key: str, given, trained) -> bool:
    """Whether ``given`` means what the run's ``trained`` value means (a table, data spec, inputs list or checkpoint
    (:data:`FILES`): the same file, or one of the same content elsewhere: a copy, or the project moved)."""
    a, b = comparable(key, given), comparable(key, trained)
    if a == b:
        return True
    (a, sheet_a), (b, sheet_b) = split_sheet(a), split_sheet(b)  # a workbook's sheet: the same one
    return key in FILES and bool(a and b) and sheet_a == sheet_b and Path(a).is_file() \
        and Path(b).is_file() and filecmp.cmp(a, b, shallow=False)


def moved(key: str, given, trained) -> bool:
    """Whether ``given`` is a table or data spec that exists where the run's ``trained`` one no longer does (the
    project moved to another folder or machine): it is taken in the run's file's place, and said so."""
    return key in ("data", "data_spec") and bool(given and trained) and is_table_file(str(given)) == \
        is_table_file(str(trained)) and Path(table_file(given)).is_file() and not Path(table_file(trained)).exists()


def shown(key: str, value) -> str:
    """A value as the command line would give it (``--drop-columns id,notes``; an unset one as ``(none)``)."""
    if key == "drop_columns":
        return ",".join(csv_names(value)) or "(none)"
    if key == "hidden_sizes":
        return ",".join(map(str, value))
    return "(none)" if value in (None, "") else str(value)


def differs_from_runs(key: str, given, trained, role: str, run_id: str) -> InputError:
    """The one-line refusal of a setting ``given`` on the command line that is not the ``trained`` value of the run
    ``run_id`` given for ``role``."""
    return InputError(option(key), shown(key, given), f"{shown(key, trained)}, what --{role.replace('_', '-')}-run-id "
                      f"{run_id} was trained with (leave {option(key)} out to take it from the runs)")


def run_configs(reuse_lists: dict[str, list[str]], tracking_uri: str) -> dict[tuple[str, int], tuple[str, dict]]:
    """``(role, position) → (run id, its config.json)`` for every given run (checked by ``check_run_ids``). The
    files are downloaded into one temporary folder, removed once they are read."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri=tracking_uri)
    configs = {}
    with tempfile.TemporaryDirectory(prefix="ct-compare-") as downloads:
        for role, ids in reuse_lists.items():
            for position, run_id in enumerate(ids):
                if not run_id:
                    continue
                folder = Path(downloads) / f"{role}-{position}"
                folder.mkdir()
                try:
                    config = json.loads(Path(client.download_artifacts(run_id, "config.json", str(folder)))
                                        .read_text())
                except Exception:  # noqa: BLE001 - MLflow raises several types for a missing artifact
                    raise InputError(f"--{role.replace('_', '-')}-run-id", run_id, "the id of a run of train.py (its "
                                     "config.json names the data it was trained on), or an empty entry to train",
                                     "it logged no config.json") from None
                configs[role, position] = (run_id, config)
    return configs


OWN_MODEL_KEYS = ("model", "from_checkpoint", "model_inputs")  # a run of a model compare does not build by default
MODEL_KEYS = ("model", "hidden_sizes", "activation", "from_checkpoint", "model_inputs")  # the network compare trains
BUDGET_KEYS = ("max_epochs", "lr")  # a model of one's own: the runs' where not given (compare's own default else)


def own_model(config: dict) -> str | None:
    """How a run's model differs from the networks compare trains by default (``--model bnnet:make``), or ``None``."""
    said = [f"{option(key)} {config[key]}" for key in OWN_MODEL_KEYS if config.get(key) not in (None, "", "mlp", "cnn")]
    return " ".join(said) or None


def roles_to_train(args: argparse.Namespace, reuse_lists: dict[str, list[str]]) -> list[str]:
    """The roles compare trains for at least one data set: the plausibility pair and, unless
    ``--no-actionability``, the actionability pair (``reuse_lists`` holds every role, in that order), without a run
    id."""
    roles = list(reuse_lists)[:4 if getattr(args, "actionability", True) else 2]
    width = max((len(ids) for ids in reuse_lists.values()), default=0)
    return [role for role in roles if len(reuse_lists[role]) < width or not all(reuse_lists[role])]


def model_from_runs(args: argparse.Namespace, reuse_lists: dict[str, list[str]],
                    configs: dict[tuple[str, int], tuple[str, dict]]) -> list[str]:
    """Where compare trains a role beside given runs, it trains the network they were trained with: each setting of
    :data:`MODEL_KEYS` not given is set on ``args`` from the runs; for a model of one's own also ``--max-epochs``
    and ``--lr`` (:data:`BUDGET_KEYS`; a given one is the budget of the roles compare trains). Returns what was
    taken, as options. Refused in one line: given runs trained with different networks, a given setting that
    differs from theirs, runs of one's own model with different budgets and none given."""
    missing = roles_to_train(args, reuse_lists)
    unused = [key for key in (*MODEL_KEYS, "lr") if getattr(args, key, None) not in (None, "")]
    if not missing and configs and unused:  # it would be silently ignored: every model is the given runs'
        raise InputError(option(unused[0]), shown(unused[0], getattr(args, unused[0])), f"{option(unused[0])} left "
                         "out, or a role's run id left empty for compare to train it",
                         "every role is given by run id, so compare trains nothing with it")
    if not missing or not configs:
        return []
    from ct_lightning.experiment.configuration.settings import DEFAULTS  # noqa: PLC0415

    first: dict[str, tuple[str, str, object]] = {}
    for (role, _), (run_id, config) in configs.items():
        for key in MODEL_KEYS:
            value = config.get(key, DEFAULTS[key])
            if key not in first:
                first[key] = (role, run_id, value)
            elif not same(key, value, first[key][2]):
                other_role, other_id, wanted = first[key]
                raise InputError(f"--{role.replace('_', '-')}-run-id", run_id, f"a run trained with {option(key)} "
                                 f"{shown(key, wanted)}, as --{other_role.replace('_', '-')}-run-id {other_id} was "
                                 f"(compare trains {', '.join(missing)} with one network)",
                                 f"trained with {option(key)} {shown(key, value)}")
    taken = []
    for key in MODEL_KEYS:
        role, run_id, value = first[key]
        mine = getattr(args, key, None)
        if mine in (None, ""):
            setattr(args, key, value)
            if not same(key, value, DEFAULTS[key]):
                taken.append(f"{option(key)} {shown(key, value)}")
        elif not same(key, mine, value):
            raise differs_from_runs(key, mine, value, role, run_id)
    if own_model({key: first[key][2] for key in OWN_MODEL_KEYS}) is None:
        return taken
    for key in BUDGET_KEYS:
        values = {(role, run_id): config.get(key, DEFAULTS[key]) for (role, _), (run_id, config) in configs.items()}
        if getattr(args, key, None) is not None:
            continue
        if len(set(values.values())) > 1:
            raise InputError(option(key), "(none)", f"a value for {', '.join(missing)} (the given runs of your own "
                             "model differ: " + ", ".join(f"--{role.replace('_', '-')}-run-id {run_id}: {value}"
                                                          for (role, run_id), value in values.items()) + ")")
        setattr(args, key, next(iter(values.values())))
        taken.append(f"{option(key)} {shown(key, getattr(args, key))}")
    return taken


def settings_from_runs(args: argparse.Namespace, reuse_lists: dict[str, list[str]],
                       names: list[str] | None) -> tuple[list[str], list[str]]:
    """The data sets of the comparison (``names`` from ``--data``, else those of the given runs, position by
    position) and the table settings: each one not given is set on ``args`` from the runs. Returns the data sets and
    what was taken from the runs, as options (``--target approved``). Refused in one line: a given value that differs
    from the runs', runs of one position trained on different data, and table runs with different table settings
    (compare reads all its tables with one ``--target``, ``--impute``...)."""
    configs = run_configs(reuse_lists, args.tracking_uri)
    positions = max((len(ids) for ids in reuse_lists.values()), default=0)
    first: dict[str, tuple[str, str, object]] = {}  # setting → (role, run id, value) of the first run that says it
    data = []
    for position in range(positions):
        given = [(role, *configs[role, position]) for role in reuse_lists if (role, position) in configs]
        if not given and names is None:
            raise InputError("--data", None, "the data sets, comma-separated, one per entry of the run ids",
                             f"entry {position + 1} of the run ids is empty: no run to take its data from")
        for role, run_id, config in given:
            keys = FROM_RUNS if is_table_file(config.get("data")) else ("data",)
            for key in keys:
                scope = f"{key}@{position}" if key == "data" else key
                if scope not in first:
                    first[scope] = (role, run_id, config.get(key))
                    continue
                other_role, other_id, value = first[scope]
                if not same(key, config.get(key), value):
                    raise InputError(f"--{role.replace('_', '-')}-run-id", run_id,
                                     f"a run trained with {option(key)} {shown(key, value)}, as "
                                     f"--{other_role.replace('_', '-')}-run-id {other_id} was (the models of a "
                                     f"comparison are evaluated on the same data)",
                                     f"trained with {option(key)} {shown(key, config.get(key))}")
        if given:
            data.append(comparable("data", first[f"data@{position}"][2]))
    if names is None:
        names = data
    taken = [] if getattr(args, "data_sets", None) else [f"--data {','.join(names)}"]
    for position, name in enumerate(names):
        if f"data@{position}" in first and not same("data", name, first[f"data@{position}"][2]):
            role, run_id, value = first[f"data@{position}"]
            if moved("data", name, value):
                taken.append(f"(--data {name} in place of {value}, which no longer exists)")
                continue
            raise InputError("--data", name, f"{shown('data', value)}, the data --{role.replace('_', '-')}-run-id "
                             f"{run_id} was trained on (leave --data out to take it from the runs)")
    for key in TABLE_KEYS:
        if key not in first:
            continue
        role, run_id, value = first[key]
        mine = getattr(args, key, None)
        if mine in (None, ""):
            setattr(args, key, value)
            if value not in (None, "", [], "none"):
                taken.append(f"{option(key)} {shown(key, value)}")
        elif moved(key, mine, value):
            taken.append(f"({option(key)} {shown(key, mine)} in place of {shown(key, value)}, which no longer exists)")
        elif not same(key, mine, value):
            raise differs_from_runs(key, mine, value, role, run_id)
    return names, taken + model_from_runs(args, reuse_lists, configs)
