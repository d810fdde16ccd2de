"""``recipes/compare.py``: reproduce rows of the paper's Table 1 (BL vs CT), resumable: train or reuse the four
models of each data set (``experiment.reproduce``), evaluate them with the protocol, compare them (bootstrap or
per-run arithmetic), write and log the table, plots and summary; with several training seeds, once per seed and
then the table over seeds."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.runs.atomic_files import write_json_atomic, write_text_atomic
from ct_lightning.experiment.configuration.console import VERBOSE_ENV, quiet_console
from ct_lightning.experiment.configuration.preflight import check_table_columns, threads_for
from ct_lightning.experiment.configuration.protocol_options import protocol_config
from ct_lightning.experiment.runner import checking, open_store, start, trained_batches
from ct_lightning.experiment.configuration.settings import (TABLE_FILE, TABLE_KEYS, csv_names, is_factory, is_table_file,
                                                            model_inputs_without_table)
from ct_lightning.experiment.configuration.store import check_tracking_reachable
from ct_lightning.experiment.configuration.validation import (InputError, check_accelerator, check_output_file, check_run_ids,
                                                check_writable_folder)
from ct_lightning.experiment.workflows.compare_runs import MODEL_KEYS
from ct_lightning.experiment.workflows.parent_outbox import end_pending, log_metrics_once, parent_client
from datamodules.workbook import WORKBOOK_SUFFIXES, check_sheet, resolved, table_file

if TYPE_CHECKING:
    from ct_lightning.experiment.studies.reproduce import Task

ROLES = catalogue.constant("ct_lightning.experiment.studies.reproduce", "ROLES")  # (role, objective, protected)
LABELS = {"bl": "BL", "ct": "CT", "bl_protected": "BL", "ct_protected": "CT"}
EPOCHS = 100  # --max-epochs not given (a model of one's own beside given runs: theirs)


def csv_list(text: str | None) -> list[str]:
    return [] if not text else [part.strip() for part in text.split(",")]


def resolve_seeds(args, reuse_lists: dict[str, list[str]]) -> list[int] | None:
    """The training seeds of a multi-seed reproduction (``--seeds`` or ``--n-seeds``), or ``None`` for one seed."""
    if args.seeds is not None and args.n_seeds is not None:
        raise InputError("--n-seeds", str(args.n_seeds), "nothing when --seeds is given (use one of them)")
    if args.seeds is None and args.n_seeds is None:
        return None
    seeds = list(args.seeds) if args.seeds is not None else [args.seed + i for i in range(args.n_seeds)]
    if not seeds:
        raise InputError("--seeds", ",".join(map(str, seeds)), "one or more comma-separated integers ≥ 0")
    if len(set(seeds)) != len(seeds):
        raise InputError("--seeds", ",".join(map(str, seeds)), "distinct seeds")
    given = [f"--{key.replace('_', '-')}-run-id" for key, ids in reuse_lists.items() if ids]
    if given:
        raise InputError(given[0], ",".join(reuse_lists[given[0][2:-7].replace("-", "_")]),
                         "no run ids with --seeds/--n-seeds (each seed trains or finds its own models)")
    return seeds


def resolve_names(text: str) -> list[str]:
    """``all`` or a comma-separated list of data set names (canonicalised), table files (absolute paths) and
    ``package.module:Class`` data modules."""
    parts = csv_list(text)
    if parts == ["all"]:
        return catalogue.available_datasets()
    names = []
    for name in filter(None, parts):
        if is_table_file(name):
            if not Path(table_file(name)).is_file():
                raise InputError("--data", name, f"an existing {TABLE_FILE.removeprefix('a ')}", "no such file")
            if table_file(name).lower().endswith(WORKBOOK_SUFFIXES):  # its sheet, named as given, before any run
                check_sheet(name, "--data")
            names.append(resolved(name))
        elif is_factory(name):
            names.append(name)
        elif catalogue.canonical_dataset(name) is None:
            raise InputError("--data", name, "comma-separated names from " + ", ".join(catalogue.available_datasets())
                             + f", {TABLE_FILE.removeprefix('a ')}s, package.module:Class, or all")
        else:
            names.append(catalogue.canonical_dataset(name))
    return names


# train.py's options that compare.py does not take, and what it takes instead (the parser's "unrecognized" line)
OPTION_HINTS = {"--mutability": "compare.py takes a table's increase/decrease-only columns from its data spec "
                                "(--data-spec FILE, a column's mutability: increase|decrease|none), for both pairs; "
                                "--immutable adds protected columns to the actionability pair"}


def check_table_options(args, names: list[str], modules: dict | None = None) -> dict[str, list[str]]:
    """A table needs ``--target``; its actionability pair needs protected features (``--immutable`` or a data
    spec's ``mutability: none``); ``--target``/``--immutable`` without a use are refused, not ignored. Returns the
    tables whose actionability pair would train exactly as their plausibility pair (every column it protects is one
    the data spec already holds immutable in both pairs), each with those columns: their models are trained once.
    ``modules`` gets each table's data module as read here (by ``table_key``), for :func:`describe_tables`."""
    tables = [name for name in names if is_table_file(name)]
    if not tables:
        for option in ("target", "data_spec", "drop_columns", "balance", "immutable"):
            if getattr(args, option) not in (None, "", [], "none"):
                raise InputError(f"--{option.replace('_', '-')}", str(getattr(args, option)),
                                 "only with a table file in --data (the built-in sets define their own)")
        return {}
    if not args.target:
        raise InputError("--target", "(none)", f"the target column of {Path(tables[0]).name}")
    if args.immutable and not args.actionability:
        raise InputError("--immutable", args.immutable, "nothing with --no-actionability (only the actionability "
                         "pair gets --immutable columns; the plausibility pair keeps only the data spec's own "
                         "mutability)")
    for table in tables:  # before torch, as train.py: the header line's names, then the table's problems
        check_table_columns({"data": table, "target": args.target, "drop_columns": args.drop_columns,
                             "immutable": args.immutable, "data_spec": args.data_spec, "impute": args.impute,
                             "balance": args.balance, "from_checkpoint": args.from_checkpoint})
    from ct_lightning.experiment.configuration.settings import table_key, table_module  # noqa: PLC0415 - torch

    from ct_lightning.constraints import data_mutability  # noqa: PLC0415

    from ct_lightning.experiment.runs.kept_preprocessing import kept_preprocessing  # noqa: PLC0415

    same_training = {}
    for table in tables:  # reading the table checks it (columns, classes, missing values, ...) before any work
        # every role fine-tunes --from-checkpoint's model: one that carries its table preprocessing reads the table so
        kept = kept_preprocessing({"data": table, "from_checkpoint": args.from_checkpoint,
                                   "tracking_uri": args.tracking_uri})
        module = table_module(table, args, codec=kept, widen=kept is not None)
        held = check_immutable_columns(args.immutable, module)
        if modules is not None:
            modules[table_key(table, args)] = module
        if args.actionability and not args.immutable and not module.protected_features:
            raise InputError("--immutable", "(none)", f"the protected columns of {Path(table).name} for the "
                             "actionability pair (e.g. --immutable age,sex), a data spec with mutability: none, "
                             "or --no-actionability")
        if args.actionability and held == data_mutability(module):
            same_training[table] = [name for name, kind in held.items() if kind == "none"]
    return same_training


def check_own_model(args, names: list[str]) -> None:
    """A model of one's own (``--model``, ``--hidden-sizes``, ``--activation``, ``--lr``, ``--from-checkpoint``,
    ``--model-inputs``) is checked as train.py checks it, before the first role trains: each value, the checkpoint
    file, the inputs list (a table's only), and that ``--model package.module:factory`` imports and names a class or
    function. A local ``--from-checkpoint`` and ``--model-inputs`` are made absolute, as a run's configuration names
    them (the training key holds them)."""
    from ct_lightning.experiment.configuration.preflight import preflight_training  # noqa: PLC0415

    own = {key: getattr(args, key, None) for key in (*MODEL_KEYS, "lr")}
    preflight_training({key: value for key, value in own.items() if value is not None}, store=False)
    if args.model_inputs is not None:
        for name in names:
            if not is_table_file(name):
                raise model_inputs_without_table(args.model_inputs, name)
        args.model_inputs = str(Path(args.model_inputs).resolve())
    if args.from_checkpoint and ":/" not in args.from_checkpoint:
        args.from_checkpoint = str(Path(args.from_checkpoint).resolve())
    if args.model not in (None, "mlp", "cnn"):
        from ct_lightning.models import factory_arguments, load_factory  # noqa: PLC0415 - torch, as the table's check

        # train.py's lines for a module that does not import, a name it has not, an argument no training gives
        factory_arguments(args.model, load_factory(args.model))


def check_immutable_columns(immutable, module) -> dict[str, str]:
    """``--immutable`` names columns of the table (the data spec's mutability checked with it), by the check a
    training makes (``mutability_spec``), before the first pair trains; returns what the actionability pair's
    trainings keep to (the data spec's mutability, ``--immutable`` and the protected columns), ``{column: kind}``."""
    from ct_lightning.experiment.configuration.data import mutability_spec  # noqa: PLC0415 - imports torch

    module.setup("fit")
    try:
        return mutability_spec({"mutability": None, "immutable": csv_names(immutable), "protect": True}, module)
    except ValueError as error:  # compare has no --mutability: name the option the user gave
        raise ValueError(str(error).replace("mutability/immutable:", "--immutable:", 1)) from None


def build_tasks(names: list[str], reuse_lists: dict[str, list[str]], args, parent: str | None,
                same_training: dict | None = None) -> list[Task]:
    """One task per data set and role, with the shared training budget and evaluation protocol. For a table in
    ``same_training`` (:func:`check_table_options`) the actionability roles reuse the plausibility pair's models
    (``Task.training_of``) where no run of either role is given."""
    from ct_lightning.experiment.studies.reproduce import Task, role_training_overrides  # noqa: PLC0415 - heavy

    training = {"max_epochs": args.max_epochs, "seed": args.seed, "nce": args.nce, "search_lr": args.search_lr,
                "data_dir": args.data_dir, "accelerator": args.accelerator,
                "limit_train_batches": args.limit_train_batches, "cpu_math": args.cpu_math,
                **{key: getattr(args, key, None) for key in (*MODEL_KEYS, "lr")}}
    if any(is_table_file(name) for name in names):
        training.update({"target": args.target, "data_spec": args.data_spec, "impute": args.impute,
                         "drop_columns": csv_names(args.drop_columns) or None, "balance": args.balance})
    roles = ROLES if args.actionability else ROLES[:2]
    tasks = []
    for i, data in enumerate(names):
        for role, objective, protected in roles:
            given_ids = {key: (ids[i] or None) if ids else None for key, ids in reuse_lists.items()}
            main = role.removesuffix("_protected")
            shared = protected and data in (same_training or {}) and not (given_ids.get(role) or given_ids.get(main))
            protocol = asdict(protocol_config(args, data, cost_pair=protected))
            given = {k: v for k, v in training.items() if v is not None}  # explicit flags beat the preset
            role_training = {**role_training_overrides(args.protocol, data, main if shared else role), **given}
            if not is_table_file(data):
                role_training = {k: v for k, v in role_training.items()
                                 if k not in TABLE_KEYS}
            elif protected and args.immutable and not shared:
                role_training["immutable"] = args.immutable
            tasks.append(Task(data, role, objective, protected, role_training, protocol, args.tracking_uri,
                              args.experiment, parent, given_ids.get(role),
                              threads_for(args.threads, args.model, args.accelerator), main if shared else None))
    return tasks


def same_training_line(table: str, columns: list[str], immutable: str | None) -> str:
    """The plan's one line for a table whose actionability pair would train as its plausibility pair."""
    from ct_lightning.experiment.runs.lifecycle import data_label  # noqa: PLC0415

    given = f"--immutable {immutable} adds no column" if immutable else "no --immutable"
    return (f"  {data_label(table)}: the actionability pair would train exactly as the plausibility pair ({given}; "
            f"the data spec holds {', '.join(columns)} immutable in both): its BL and CT are trained once, and the "
            f"cost column measures their counterfactuals with {', '.join(columns)} immutable (--immutable COLUMNS "
            "protects more columns in the actionability pair)")


def describe_tables(tasks: list, modules: dict | None = None) -> list[str]:
    """The descriptions of the tables the tasks train on and their CT settings (what ``train`` prints at start-up),
    each once; every task keeps them, so that its training leaves them out (``Task.described``), in whichever
    process it runs. ``modules``: the tables' data modules :func:`check_table_options` built (not read again)."""
    from ct_lightning.experiment.runs.train import ct_settings_line  # noqa: PLC0415 - heavy
    from ct_lightning.experiment.studies.sweep import check_data_options  # noqa: PLC0415

    configs = [task.resolved_config() for task in tasks if is_table_file(task.data) and task.training_of is None]
    described = check_data_options(configs, modules)
    described += list(dict.fromkeys(ct_settings_line(config) for config in configs))
    for task in tasks:
        task.described = tuple(described)
    return described


def parent_run_name(names: list[str], args, seeds: list[int] | None = None) -> str:
    """The descriptive name of a compare's parent run (``find_or_create_parent`` adds its short id, as a training's
    name has one): the data (a table by its file's stem), the seed or seeds, and what tells two compares of the same
    data apart where given: ``compare-loans-s0-immutable-age,sex-spec-loans-hiring_net:Net-no-cost-paper-5ep``."""
    from ct_lightning.experiment.runs.lifecycle import data_label  # noqa: PLC0415

    parts = ["compare", ",".join(data_label(name) for name in names),
             "seeds-" + ",".join(map(str, seeds)) if seeds else f"s{args.seed}"]
    if args.immutable:
        parts.append("immutable-" + ",".join(csv_names(args.immutable)))
    if args.data_spec:
        parts.append(f"spec-{Path(args.data_spec).stem}")
    if args.model not in (None, "mlp"):
        parts.append(args.model)
    if args.from_checkpoint:
        parts.append("from-checkpoint")
    if not args.actionability:
        parts.append("no-cost")
    if args.protocol != "reference":
        parts.append(args.protocol)
    if args.max_epochs not in (None, EPOCHS):
        parts.append(f"{args.max_epochs}ep")
    return "-".join(parts)


def compare_data(data: str, outcomes: dict[str, dict], tasks: list[Task], args, client, parent: str,
                 out_dir: Path) -> tuple[dict, list]:
    """Compare the evaluated models of one data set; returns the Table 1 row and plot paths."""
    from ct_lightning.evaluation.compare import compare_evaluations, table_row  # noqa: PLC0415 - heavy
    from ct_lightning.metrics.names import table_metrics  # noqa: PLC0415
    from ct_lightning.evaluation.plots import (evaluation_figures, figure2_panels, is_image_data,  # noqa: PLC0415
                                               metric_history, plot_figure2)
    from ct_lightning.experiment.studies.reproduce import find_evaluation  # noqa: PLC0415
    from ct_lightning.experiment.configuration.data import model_datamodule  # noqa: PLC0415
    from ct_lightning.experiment.runs.loading import load_run  # noqa: PLC0415

    entries, summaries, results = {}, {}, {}
    datamodule = None
    for task in (t for t in tasks if t.data == data):
        run_id = outcomes[task.label]["run_id"]
        loaded = load_run(run_id, args.tracking_uri)
        datamodule = datamodule or model_datamodule(loaded.config, loaded.module)
        constraints = task.constraints(loaded.module, datamodule)
        result = find_evaluation(client, run_id, task.eval_key())
        results[task.role], summaries[task.role] = result, result.summary()
        entries[task.role] = {"module": loaded.module, "result": result, "constraints": constraints, "run_id": run_id}
    statistic = args.statistic or ("runs" if args.protocol == "reference" else "bootstrap")
    plausibility = compare_evaluations(results["bl"], results["ct"], table_metrics("all_mutable"), args.n_boot,
                                       args.confidence, args.seed, statistic)
    actionability = compare_evaluations(results["bl_protected"], results["ct_protected"], table_metrics("protected"),
                                        args.n_boot, args.confidence, args.seed + 10, statistic) \
        if args.actionability else {}
    row = table_row(datamodule.name, plausibility, actionability, summaries["bl"], summaries["ct"],
                    summaries.get("bl_protected"), summaries.get("ct_protected"))
    row["synthetic"] = datamodule.synthetic
    # only a built-in set is the paper's data: a user's credit.csv is not the paper's Credit row
    row["built_in"] = not is_table_file(data) and catalogue.canonical_dataset(data) is not None
    row["runs"] = {role: entry["run_id"] for role, entry in entries.items()}
    row["protocol"] = {task.role: task.protocol for task in tasks if task.data == data}
    row["evaluated_under"] = {role: entry["constraints"].in_words() for role, entry in entries.items()}
    row["robust_curves"] = {role: entry["result"].robust_curve for role, entry in entries.items()}
    row["details"] = {"plausibility": plausibility, "actionability": actionability,
                      "per_lambda": {role: s["per_lambda"] for role, s in summaries.items()},
                      "converged": {role: s.get("converged") for role, s in summaries.items()},
                      "n_valid": {role: s.get("n_valid") for role, s in summaries.items()}}
    convergence = {f"{LABELS[role]}{' protected' if 'protected' in role else ''}":
                   metric_history(client, entry["run_id"]) for role, entry in entries.items() if role.startswith("ct")}
    figures = {f"{LABELS[role]}{' protected' if 'protected' in role else ''}": {**entry, "title": LABELS[role]}
               for role, entry in entries.items()}
    plots = evaluation_figures(figures, datamodule, out_dir / "plots", convergence, prefix=f"{datamodule.name}_")
    if is_image_data(datamodule.n_features) and {"bl_protected", "ct_protected"} <= set(entries):
        models = {LABELS[role]: (entries[role]["module"], entries[role]["constraints"],
                                 entries[f"{role}_protected"]["module"]) for role in ("bl", "ct")}
        panels = figure2_panels(models, datamodule, entries["bl"]["result"].config)
        mask = entries["ct_protected"]["constraints"].protected_mask
        side = math.isqrt(datamodule.n_features)
        plots.append(plot_figure2(panels, out_dir / "plots" / f"{datamodule.name}_figure2.png", (side, side),
                                  protected_mask=mask))
    return row, plots


def write_outputs(rows: list[dict], plots: list, args, client, parent: str, command: str, out_dir: Path,
                   final: bool) -> dict:
    from ct_lightning.evaluation.compare import constraint_notes, markdown_table, write_csv  # noqa: PLC0415 - heavy
    from ct_lightning.evaluation.paper import paper_comparison  # noqa: PLC0415
    notes = constraint_notes(rows)
    table = markdown_table(rows) + (f"\n{notes}" if notes else "")
    summary = {"parent_run_id": parent, "tracking_uri": args.tracking_uri, "command": command, "complete": final,
               "protocol": args.protocol, "statistic": args.statistic or ("runs" if args.protocol == "reference"
                                                                         else "bootstrap"),
               "evaluation": {row["data"]: row["protocol"] for row in rows},
               "training": {"max_epochs": args.max_epochs, "seed": args.seed, "nce": args.nce,
                            "search_lr": args.search_lr},
               "rows": rows, "table_markdown": table, "plots": [str(p) for p in plots]}
    write_text_atomic(out_dir / "table.md", table)
    # beside the paper's tables: the built-in data sets only (a table file, even one named credit.csv, is not)
    paper_rows = [row for row in rows if row.get("built_in", True)]
    if paper_rows:
        write_text_atomic(out_dir / "paper_comparison.md", paper_comparison(paper_rows))
    write_csv(rows, out_dir / "table.csv")
    summary_path = Path(args.summary_json or out_dir / "summary.json")
    write_json_atomic(summary_path, summary, strict=True)  # NaN as null: any JSON reader opens it
    for path in (out_dir / "table.md", out_dir / "paper_comparison.md", out_dir / "table.csv", summary_path):
        if path.exists():
            client.log_artifact(parent, str(path))
    return summary


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """Train or reuse, evaluate, compare; print and save the table; log everything to a parent run. ``argv``: the
    command line, printed as the command that resumes the reproduction."""
    with checking():
        args.limit_train_batches = trained_batches(args.limit_train_batches)
        reuse_lists = {key: csv_list(getattr(args, f"{key}_run_id")) for key, _, _ in ROLES}
        given_runs = any(reuse_lists.values())
        names = resolve_names(args.data_sets) if args.data_sets or not given_runs else None
        if names == []:
            raise InputError("--data", args.data_sets, "comma-separated data set names, or all (or --bl-run-id/"
                             "--ct-run-id...: the data those runs were trained on)")
        width = len(names) if names is not None else max(len(ids) for ids in reuse_lists.values())
        for key, ids in reuse_lists.items():  # without --data: as many entries as the longest list of run ids
            if ids and len(ids) != width:
                raise InputError(f"--{key.replace('_', '-')}-run-id", ",".join(ids),
                                 f"one id per data set ({width}), empty entries to train")
        seeds = resolve_seeds(args, reuse_lists)
        taken = []
        if given_runs:  # a given run is evaluated from its last checkpoint; its data and table settings hold
            check_tracking_reachable(args.tracking_uri)
            for key, ids in reuse_lists.items():
                check_run_ids(f"--{key.replace('_', '-')}-run-id", ids, args.tracking_uri, checkpoint="last")
            from ct_lightning.experiment.workflows.compare_runs import settings_from_runs  # noqa: PLC0415

            names, taken = settings_from_runs(args, reuse_lists, names)
        if args.max_epochs is None:  # not given, nor taken from given runs of a model of one's own
            args.max_epochs = EPOCHS
        modules: dict = {}  # each table's data module, read once for the checks and the start-up description
        same_training = check_table_options(args, names, modules)
        check_own_model(args, names)
        check_accelerator("--accelerator", args.accelerator)
        if not given_runs:  # else checked before the runs were read
            check_tracking_reachable(args.tracking_uri)
        check_writable_folder("--out-dir", args.out_dir)
        check_output_file("--summary-json", args.summary_json)
    if taken:  # where the data came from: the given runs, not the command line
        print(f"from the given runs (their config.json, not repeated on the command line): {' '.join(taken)}",
              flush=True)
    quiet_console(args.verbose)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # seen by --jobs workers too
    start(args)  # the CPU arithmetic is set before torch is imported
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    client, _, artifact_location = open_store(args.tracking_uri, args.experiment)  # created once, under a file lock
    from ct_lightning.experiment.runs.lifecycle import recipe_command  # noqa: PLC0415

    # from this folder: its relative paths (--data loans.csv, --out-dir, the default store) mean the same again
    command = f"cd {shlex.quote(os.getcwd())} && " + recipe_command("compare",
                                                                     list(argv if argv is not None else sys.argv[1:]))
    if seeds is None:
        return run_seed(args, names, reuse_lists, client, artifact_location, command, out_dir, same_training,
                        modules=modules)
    summaries = {}
    for seed in seeds:  # one seed after another; each is the resumable single-seed reproduction
        print(f"=== training seed {seed} ({seeds.index(seed) + 1}/{len(seeds)}) ===", flush=True)
        seed_args = argparse.Namespace(**{**vars(args), "seed": seed})
        summaries[seed] = run_seed(seed_args, names, reuse_lists, client, artifact_location, command,
                                   out_dir / f"s{seed}", same_training, quiet=True, modules=modules)
    from ct_lightning.experiment.workflows.compare_seeds import write_seed_outputs  # noqa: PLC0415

    return write_seed_outputs(summaries, args, names, client, artifact_location, command, out_dir)


def run_seed(args, names: list[str], reuse_lists: dict, client, artifact_location, command: str, out_dir: Path,
             same_training: dict | None = None, quiet: bool = False, modules: dict | None = None) -> dict:
    """Train or reuse, evaluate and compare every model of one training seed (``args.seed``); returns the summary.
    ``same_training``: the tables whose actionability pair is their plausibility pair (:func:`check_table_options`);
    ``modules``: their data modules as it read them."""
    from ct_lightning.evaluation.plots import plot_robust_accuracy_panels  # noqa: PLC0415
    from ct_lightning.experiment.runs.lifecycle import link_children  # noqa: PLC0415
    from ct_lightning.experiment.studies.reproduce import (describe_plan, find_or_create_parent, is_synthetic,  # noqa: PLC0415
                                                   run_tasks, stable_key, training_key)

    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = build_tasks(names, reuse_lists, args, None, same_training)
    reproduction_key = stable_key({"tasks": [(t.label, training_key(t.resolved_config()), t.eval_key())
                                             for t in tasks], "n_boot": args.n_boot,
                                   "confidence": args.confidence})
    parent = find_or_create_parent(client, args.experiment, artifact_location, reproduction_key,
                                   parent_run_name(names, args))
    for task in tasks:  # the same tasks, now children of the parent run (their configuration is resolved once)
        task.parent_run_id = parent
    client = parent_client(client, args.tracking_uri, parent, out_dir)
    client.log_param(parent, "data", ",".join(names))
    for key in ("max_epochs", "seed", "protocol", "n_boot", "confidence"):
        client.log_param(parent, key, getattr(args, key))
    for key in ("target", "immutable", "n_runs", "n_individuals", "model"):  # what tells two compares of one table apart
        value = getattr(args, key, None)
        if value not in (None, "", []):
            client.log_param(parent, key, ",".join(map(str, value)) if isinstance(value, list) else value)
    client.log_param(parent, "lambda_energy", ",".join(f"{v:g}" for v in args.lambda_energies))
    print(f"MLflow parent run: {parent} (re-run the same command to resume; finished trainings and evaluations "
          f"are reused)", flush=True)
    print(f"compare plan: {len(tasks)} models", flush=True)
    print("\n".join(describe_plan(tasks, client, args.actionability)), flush=True)
    described = describe_tables(tasks, modules)
    for text in described:  # once for the compare, not once per model or worker process
        print(text, flush=True)
    shared = {task.data for task in tasks if task.training_of}
    for table in (name for name in names if name in shared):
        print(same_training_line(table, same_training[table], args.immutable), flush=True)
    status = "FAILED"
    outage: BaseException | None = None
    rows: dict[str, dict] = {}
    plots: list = []
    outcomes: dict[str, dict] = {}

    def on_done(outcome: dict) -> None:
        outcomes[outcome["label"]] = outcome
        link_children(client, parent, {label: o["run_id"] for label, o in outcomes.items()})
        data = next(t.data for t in tasks if t.label == outcome["label"])
        if all(t.label in outcomes for t in tasks if t.data == data):
            row, row_plots = compare_data(data, outcomes, tasks, args, client, parent, out_dir)
            rows[data] = row
            plots.extend(row_plots)
            for path in row_plots:
                client.log_artifact(parent, str(path), artifact_path="plots")
            from ct_lightning.metrics.names import table_metrics  # noqa: PLC0415 - heavy

            values = {f"{key}_{suffix}": row[f"{key}_{suffix}"] for key in table_metrics()
                      for suffix in ("reduction_pct", "se")}
            log_metrics_once(client, parent, {f"{row['data']}/{name}": float(value) for name, value in values.items()
                                              if value == value})  # not NaN
            write_outputs([rows[n] for n in names if n in rows], plots, args, client, parent, command, out_dir,
                           final=False)
            print(f"table row {row['data']} written to {out_dir / 'table.md'}", flush=True)
        if len(outcomes) < len(tasks):
            stopping.check()  # a safe point: the outcome and its table row are kept, no write is under way

    from ct_lightning.experiment.runs.interrupt import (INTERRUPTED_TAG, TrainingInterrupted,  # noqa: PLC0415
                                                        clear_interrupted, stop_between_trainings)

    # SIGTERM/SIGINT: a training stops after its epoch; outside one (evaluations, tables) the compare stops once the
    # current task is kept (``on_done`` checks; raising in the middle of a store write could leave it locked)
    with stop_between_trainings(defer=True) as stopping:
        try:
            run_tasks(tasks, args.jobs, client, on_done)
            ordered = [rows[n] for n in names]
            # Figure 3 shows the real data sets
            real = [row for row in ordered
                    if not (row["synthetic"] if "synthetic" in row else is_synthetic(row["data"]))]
            if len(real) > 1:
                figure = plot_robust_accuracy_panels(real, out_dir / "plots" / "robust_accuracy_real.png")
                if figure:
                    plots.append(figure)
                    client.log_artifact(parent, str(figure), artifact_path="plots")
            summary = write_outputs(ordered, plots, args, client, parent, command, out_dir, final=True)
            clear_interrupted(client, parent)  # a resumed compare: its earlier interruption no longer describes it
            status = "FINISHED"
        except TrainingInterrupted as interrupted:
            status = "KILLED"
            client.set_tag(parent, INTERRUPTED_TAG, f"{interrupted}; resume with: {command}")
            print(f"interrupted ({interrupted}): parent run {parent} is KILLED; finished trainings and evaluations "
                  f"are kept: re-run the same command to resume:\n  {command}", file=sys.stderr, flush=True)
            raise
        except Exception as error:  # noqa: BLE001 - only a server that stopped answering is handled here
            from ct_lightning.experiment.runs.tracking_server import is_outage  # noqa: PLC0415

            if not is_outage(error):
                raise
            outage = error
        finally:
            client.set_terminated(parent, status)  # kept in the outbox if the server went away
    if outage is not None:  # a read (stored evaluations, children) needs the server: stop, saying how to resume
        from ct_lightning.experiment.configuration.validation import fail  # noqa: PLC0415
        from ct_lightning.experiment.runs.outbox import OUTBOX_DIR  # noqa: PLC0415

        reason = str(outage).splitlines()[0][:160] if str(outage) else type(outage).__name__
        fail(f"--tracking-uri: the tracking server {args.tracking_uri} stopped answering during the compare "
             f"({reason}); finished trainings and evaluations are kept, and the parent run's records wait in "
             f"{out_dir / OUTBOX_DIR}: re-run the same command once the server answers: {command}", 1)
    summary["reproduction_key"] = reproduction_key
    end_pending(client, summary, args, out_dir)
    if quiet:
        print(f"seed {args.seed}: table in {out_dir / 'table.md'} (MLflow parent run {parent})", flush=True)
        return summary
    print(summary["table_markdown"])
    if any(is_table_file(name) for name in names):
        from ct_lightning.experiment.runs.lifecycle import data_label  # noqa: PLC0415

        once = ", ".join(data_label(name) for name in names if name in shared)
        print("IP/IP*: a table's data spec (mutability and domain) holds in the training and evaluation of both "
              "pairs; Cost: --immutable columns immutable in addition, in training and evaluation"
              + (f" ({once}: none in addition, so its cost column measures the plausibility pair's models)." if once
                 else "."))
    else:
        print("IP/IP*: all features mutable; Cost: protected features immutable in training and evaluation.")
    print(statistic_legend(summary["statistic"], args.confidence))
    print("† fewer than 30 valid counterfactuals on one side (n BL/CT): not a reliable comparison.")
    print(f"MLflow parent run: {parent}; outputs in {out_dir}")
    return summary


def statistic_legend(statistic: str, confidence: float) -> str:
    """The table's legend line for ``±`` and ``*`` under ``statistic`` (``runs`` or ``bootstrap``) at
    ``confidence`` (``--confidence``: 0.99 is "99%")."""
    level = f"{100 * confidence:g}%"
    if statistic == "runs":
        from ct_lightning.evaluation.compare import fewest_runs  # noqa: PLC0415 - heavy

        return (f"± 100·sd of the per-run CT/BL ratios over the evaluation runs; * the central {level} quantile "
                "interval of the per-run differences excludes zero (the authors' Table 1 arithmetic; with fewer than "
                f"{fewest_runs(confidence)} runs no * but '(too few runs for a test)': the interval of a few runs is "
                "their range, on one side of zero by chance);")
    return f"± bootstrap standard error; * {level} bootstrap interval of the difference in means excludes zero;"
