"""Reproduce rows of the paper's Table 1: BL (objective vanilla) vs CT (objective full).

Per data set four models are trained with identical seeds and data (or reused by run id):
  plausibility pair   BL, CT with all features mutable, evaluated all mutable      → IP, IP*
  actionability pair  BL, CT trained with the protected features immutable
                      (train(protect=True)) and evaluated with them immutable      → cost
Each is evaluated with the paper's protocol (recipes/evaluate.py); CT's effect is the percentage
reduction 100·(BL − CT)/BL with bootstrap standard errors (100 rounds) and an asterisk when the
99% bootstrap interval of the difference in means excludes zero.

Outputs in --out-dir (default outputs/compare/): table.md, table.csv, summary.json (or
--summary-json) and plots/; all are also logged to an MLflow parent run whose children are the
training runs (tag mlflow.parentRunId).

Every model is keyed by its fully resolved training configuration; a re-run of the same command
reuses finished trainings and evaluations from the MLflow store and continues where it stopped,
so an interrupted reproduction loses at most the models in progress. Rows are written as soon as
their four models are evaluated.

Examples:
  .venv/bin/python recipes/compare.py --data all --jobs 2                        # all nine rows, the paper's budget
  .venv/bin/python recipes/compare.py --data ls,circles,moons,ol                 # the synthetic rows
  .venv/bin/python recipes/compare.py --data circles --max-epochs 5 --n-runs 1 --n-individuals 20
  .venv/bin/python recipes/compare.py --data circles --bl-run-id ID1 --ct-run-id ID2 --no-actionability
  .venv/bin/python recipes/compare.py --data all --jobs 2 --seeds 0,1,2,3,4      # Table 1 over five training seeds

With --seeds (or --n-seeds) the reproduction runs once per training seed, each resumable as above and
written to OUT_DIR/sSEED (a seed's trainings and evaluations are keyed by their configuration, which
holds the seed, so seeds already in the store are reused); OUT_DIR then gets the table over seeds
(ct_lightning.evaluation.seeds: mean, SD, min-max, starred seeds, an across-seed t-test, agreement with
both published tables and a seed-robust verdict), logged to a parent run of the per-seed parent runs.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from ct_lightning.experiment import catalogue
from ct_lightning.experiment.cpu_math import apply_cpu_math
from ct_lightning.experiment.preflight import apply_threads, threads_for
from ct_lightning.experiment.protocol_options import add_protocol_arguments, protocol_config
from ct_lightning.experiment.settings import add_arguments, is_factory, is_table_file
from ct_lightning.experiment.console import PROGRESS_ENV, VERBOSE_ENV, quiet_console
from ct_lightning.experiment.tracking import (DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI, anchor_tracking_uri,
                                              check_tracking_reachable, store_location)
from ct_lightning.experiment.validation import (KNOWN_ERRORS, InputError, Parser, Rule, check_accelerator,
                                                check_output_file, check_run_ids, check_writable_folder, console_entry,
                                                exit_on_error)

ROLES = catalogue.constant("ct_lightning.experiment.reproduce", "ROLES")  # (role, objective, protected)
LABELS = {"bl": "BL", "ct": "CT", "bl_protected": "BL", "ct_protected": "CT"}


def _csv_list(text: str | None) -> list[str]:
    return [] if not text else [part.strip() for part in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/compare.py``."""
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True,
                        help=f"data set(s), comma-separated, or all: {', '.join(catalogue.available_datasets())}")
    parser.add_argument("--jobs", type=Rule("int", low=1).argtype(), default=1,
                        help="train and evaluate this many models at once in separate processes (default %(default)s)")
    add_arguments(parser, ["threads", "accelerator", "cpu_math"])
    budget = parser.add_argument_group("training")
    budget.add_argument("--max-epochs", type=Rule("int", low=1).argtype(), default=100,
                        help="training epochs (default %(default)s)")
    budget.add_argument("--seed", type=Rule("int", low=0).argtype(), default=0,
                        help="training seed, the same for BL and CT (default %(default)s)")
    budget.add_argument("--seeds", type=Rule("ints", low=0).argtype(),
                        help="several training seeds, comma-separated (e.g. 0,1,2,3,4): the reproduction runs once "
                             "per seed (outputs in OUT_DIR/sSEED) and OUT_DIR gets the table over seeds")
    budget.add_argument("--n-seeds", type=Rule("int", low=1).argtype(),
                        help="training seeds --seed, --seed+1, ..., --seed+N-1 (instead of --seeds)")
    budget.add_argument("--nce", type=Rule("int", low=1).argtype(), help="counterfactuals per epoch for CT [Table 2]")
    budget.add_argument("--search-lr", type=Rule("float", low=0.0, low_open=True).argtype(),
                        help="SGD step size η of the training-time search (default: 0.1 with --protocol "
                             "reference, as the authors' code ran; train.py's 0.25 with --protocol paper)")
    budget.add_argument("--limit-train-batches", type=Rule("float", low=0.0).argtype(), help="Lightning limit_train_batches (quick runs)")
    budget.add_argument("--data-dir", help="folder with the raw data files of the real data sets")
    add_arguments(budget, ["target", "data_spec", "impute"])  # a table file's, as in recipes/train.py
    budget.add_argument("--immutable", help="a table's protected columns, comma-separated (e.g. age,sex): immutable "
                        "in the actionability pair's training and evaluation, in addition to a data spec's "
                        "mutability: none; the plausibility pair keeps every feature mutable, as in the paper")
    reuse = parser.add_argument_group("reuse trained runs (comma-separated, aligned with --data; empty = train)")
    for key, _, _ in ROLES:
        reuse.add_argument(f"--{key.replace('_', '-')}-run-id", dest=f"{key}_run_id", help=f"run id(s) of {key}")
    parser.add_argument("--no-actionability", dest="actionability", action="store_false",
                        help="skip the protected pair (no cost column)")
    stats = parser.add_argument_group("bootstrap")
    stats.add_argument("--n-boot", type=Rule("int", low=1).argtype(), default=100, help="bootstrap rounds (default %(default)s)")
    stats.add_argument("--confidence", type=Rule("float", 0.0, 1.0, True, True).argtype(), default=0.99, help="confidence of the interval (default %(default)s)")
    stats.add_argument("--statistic", choices=("runs", "bootstrap"),
                       help="runs: per-run ratios and the quantile interval of per-run differences (the authors' "
                            "code; default with --protocol reference); bootstrap: pooled per-sample bootstrap "
                            "(the paper's text; default with --protocol paper)")
    out = parser.add_argument_group("tracking and output")
    out.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    out.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default %(default)s)")
    out.add_argument("--out-dir", default="outputs/compare", help="output folder (default %(default)s)")
    out.add_argument("--summary-json", help="JSON summary path (default OUT_DIR/summary.json)")
    add_arguments(out, ["progress", "verbose"])  # the same options, meaning the same, as recipes/train.py's
    add_protocol_arguments(parser)
    return parser


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


def _resolve_names(text: str) -> list[str]:
    """``all`` or a comma-separated list of data set names (canonicalised), table files (absolute paths) and
    ``package.module:Class`` data modules."""
    parts = _csv_list(text)
    if parts == ["all"]:
        return catalogue.available_datasets()
    names = []
    for name in filter(None, parts):
        if is_table_file(name):
            if not Path(name).is_file():
                raise InputError("--data", name, "an existing .csv/.parquet file", "no such file")
            names.append(str(Path(name).resolve()))
        elif is_factory(name):
            names.append(name)
        elif catalogue.canonical_dataset(name) is None:
            raise InputError("--data", name, "comma-separated names from " + ", ".join(catalogue.available_datasets())
                             + ", .csv/.parquet files, package.module:Class, or all")
        else:
            names.append(catalogue.canonical_dataset(name))
    return names


def check_table_options(args, names: list[str]) -> None:
    """A table needs ``--target``; its actionability pair needs protected features (``--immutable`` or a data
    spec's ``mutability: none``); ``--target``/``--immutable`` without a use are refused, not ignored."""
    from ct_lightning.experiment.settings import data_class  # noqa: PLC0415 - imports torch

    tables = [name for name in names if is_table_file(name)]
    if not tables:
        for option in ("target", "data_spec", "immutable"):
            if getattr(args, option):
                raise InputError(f"--{option.replace('_', '-')}", str(getattr(args, option)),
                                 "only with a .csv/.parquet --data (the built-in sets define their own)")
        return
    if not args.target:
        raise InputError("--target", "(none)", f"the target column of {Path(tables[0]).name}")
    if args.immutable and not args.actionability:
        raise InputError("--immutable", args.immutable, "nothing with --no-actionability (only the actionability "
                         "pair protects features; the plausibility pair keeps every feature mutable)")
    for table in tables:  # reading the table checks it (columns, classes, missing values, ...) before any work
        module = data_class(table)(table, args.target, args.data_spec, args.impute or "none")
        if args.actionability and not args.immutable and not module.protected_features:
            raise InputError("--immutable", "(none)", f"the protected columns of {Path(table).name} for the "
                             "actionability pair (e.g. --immutable age,sex), a data spec with mutability: none, "
                             "or --no-actionability")


def build_tasks(names: list[str], reuse_lists: dict[str, list[str]], args, parent: str | None) -> list[Task]:
    """One task per data set and role, with the shared training budget and evaluation protocol."""
    from ct_lightning.experiment.reproduce import Task, role_training_overrides  # noqa: PLC0415 - heavy

    training = {"max_epochs": args.max_epochs, "seed": args.seed, "nce": args.nce, "search_lr": args.search_lr,
                "data_dir": args.data_dir, "accelerator": args.accelerator,
                "limit_train_batches": args.limit_train_batches, "cpu_math": args.cpu_math}
    if any(is_table_file(name) for name in names):
        training.update({"target": args.target, "data_spec": args.data_spec, "impute": args.impute})
    roles = ROLES if args.actionability else ROLES[:2]
    tasks = []
    for i, data in enumerate(names):
        for role, objective, protected in roles:
            ids = reuse_lists.get(role) or []
            protocol = asdict(protocol_config(args, data, cost_pair=protected))
            given = {k: v for k, v in training.items() if v is not None}  # explicit flags beat the preset
            role_training = {**role_training_overrides(args.protocol, data, role), **given}
            if not is_table_file(data):
                role_training = {k: v for k, v in role_training.items() if k not in ("target", "data_spec", "impute")}
            elif protected and args.immutable:
                role_training["immutable"] = args.immutable
            tasks.append(Task(data, role, objective, protected, role_training, protocol, args.tracking_uri,
                              args.experiment, parent, (ids[i] or None) if ids else None,
                              threads_for(args.threads, accelerator=args.accelerator)))
    return tasks


def compare_data(data: str, outcomes: dict[str, dict], tasks: list[Task], args, client, parent: str,
                 out_dir: Path) -> tuple[dict, list]:
    """Compare the evaluated models of one data set; returns the Table 1 row and plot paths."""
    from ct_lightning.evaluation import evaluation_constraints  # noqa: PLC0415 - heavy
    from ct_lightning.evaluation.compare import compare_evaluations, table_row  # noqa: PLC0415
    from ct_lightning.metrics.names import table_metrics  # noqa: PLC0415
    from ct_lightning.evaluation.plots import (evaluation_figures, figure2_panels, is_image_data,  # noqa: PLC0415
                                               metric_history, plot_figure2)
    from ct_lightning.experiment.reproduce import find_evaluation  # noqa: PLC0415
    from ct_lightning.experiment.runs import load_run  # noqa: PLC0415
    from ct_lightning.experiment.data import build_datamodule  # noqa: PLC0415

    entries, summaries, results = {}, {}, {}
    datamodule = None
    for task in (t for t in tasks if t.data == data):
        run_id = outcomes[task.label]["run_id"]
        loaded = load_run(run_id, args.tracking_uri)
        datamodule = datamodule or build_datamodule(loaded.config)
        constraints = evaluation_constraints(loaded.module, datamodule, protect=task.protected,
                                             all_mutable=not task.protected)
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
    row["runs"] = {role: entry["run_id"] for role, entry in entries.items()}
    row["protocol"] = {task.role: task.protocol for task in tasks if task.data == data}
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


def _write_outputs(rows: list[dict], plots: list, args, client, parent: str, command: str, out_dir: Path,
                   final: bool) -> dict:
    from ct_lightning.evaluation.compare import markdown_table, write_csv  # noqa: PLC0415 - heavy
    from ct_lightning.evaluation.paper import paper_comparison  # noqa: PLC0415
    from ct_lightning.experiment.tracking import write_json_atomic, write_text_atomic  # noqa: PLC0415

    table = markdown_table(rows)
    summary = {"parent_run_id": parent, "tracking_uri": args.tracking_uri, "command": command, "complete": final,
               "protocol": args.protocol, "statistic": args.statistic or ("runs" if args.protocol == "reference"
                                                                         else "bootstrap"),
               "evaluation": {row["data"]: row["protocol"] for row in rows},
               "training": {"max_epochs": args.max_epochs, "seed": args.seed, "nce": args.nce,
                            "search_lr": args.search_lr},
               "rows": rows, "table_markdown": table, "plots": [str(p) for p in plots]}
    write_text_atomic(out_dir / "table.md", table)
    write_text_atomic(out_dir / "paper_comparison.md", paper_comparison(rows))
    write_csv(rows, out_dir / "table.csv")
    summary_path = Path(args.summary_json or out_dir / "summary.json")
    write_json_atomic(summary_path, summary)
    for path in (out_dir / "table.md", out_dir / "paper_comparison.md", out_dir / "table.csv", summary_path):
        client.log_artifact(parent, str(path))
    return summary


def main(argv: list[str] | None = None) -> dict:
    """Train or reuse, evaluate, compare; print and save the table; log everything to a parent run."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.limit_train_batches is not None and float(args.limit_train_batches).is_integer() \
            and args.limit_train_batches >= 1:
        args.limit_train_batches = int(args.limit_train_batches)
    args.tracking_uri = anchor_tracking_uri(args.tracking_uri)
    try:
        names = _resolve_names(args.data)
        if not names:
            raise InputError("--data", args.data, "comma-separated data set names, or all")
        reuse_lists = {key: _csv_list(getattr(args, f"{key}_run_id")) for key, _, _ in ROLES}
        for key, ids in reuse_lists.items():
            if ids and len(ids) != len(names):
                raise InputError(f"--{key.replace('_', '-')}-run-id", ",".join(ids),
                                 f"one id per data set ({len(names)}), empty entries to train")
        seeds = resolve_seeds(args, reuse_lists)
        check_table_options(args, names)
        check_accelerator("--accelerator", args.accelerator)
        check_tracking_reachable(args.tracking_uri)
        check_writable_folder("--out-dir", args.out_dir)
        check_output_file("--summary-json", args.summary_json)
        for key, ids in reuse_lists.items():
            check_run_ids(f"--{key.replace('_', '-')}-run-id", ids, args.tracking_uri)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    quiet_console(args.verbose)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # seen by --jobs workers too
    if not args.progress:
        os.environ[PROGRESS_ENV] = "0"
    print(f"MLflow store: {store_location(args.tracking_uri)}", flush=True)
    print(apply_cpu_math(args.cpu_math or "native"), flush=True)  # before torch is imported (apply_threads imports it)
    print(apply_threads(threads_for(args.threads, accelerator=args.accelerator)), flush=True)
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - heavy: only after the checks

    from ct_lightning.experiment.tracking import prepare_store  # noqa: PLC0415

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    artifact_location = prepare_store(args.tracking_uri, args.experiment)  # created once, under a file lock
    client = MlflowClient(tracking_uri=args.tracking_uri)
    command = f"{sys.executable} recipes/compare.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    if seeds is None:
        return run_seed(args, names, reuse_lists, client, artifact_location, command, out_dir)
    summaries = {}
    for seed in seeds:  # one seed after another; each is the resumable single-seed reproduction
        print(f"=== training seed {seed} ({seeds.index(seed) + 1}/{len(seeds)}) ===", flush=True)
        seed_args = argparse.Namespace(**{**vars(args), "seed": seed})
        summaries[seed] = run_seed(seed_args, names, reuse_lists, client, artifact_location, command,
                                   out_dir / f"s{seed}", quiet=True)
    return write_seed_outputs(summaries, args, names, client, artifact_location, command, out_dir)


def run_seed(args, names: list[str], reuse_lists: dict, client, artifact_location, command: str, out_dir: Path,
             quiet: bool = False) -> dict:
    """Train or reuse, evaluate and compare every model of one training seed (``args.seed``); returns the summary."""
    from ct_lightning.evaluation.plots import plot_robust_accuracy_panels  # noqa: PLC0415
    from ct_lightning.experiment.lifecycle import link_children  # noqa: PLC0415
    from ct_lightning.experiment.reproduce import (describe_plan, find_or_create_parent, is_synthetic,  # noqa: PLC0415
                                                   run_tasks, stable_key, training_key)

    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = build_tasks(names, reuse_lists, args, None)
    reproduction_key = stable_key({"tasks": [(t.label, training_key(t.resolved_config()), t.eval_key())
                                             for t in tasks], "n_boot": args.n_boot,
                                   "confidence": args.confidence})
    parent = find_or_create_parent(client, args.experiment, artifact_location, reproduction_key,
                                   f"compare {','.join(names)}")
    for task in tasks:  # the same tasks, now children of the parent run (their configuration is resolved once)
        task.parent_run_id = parent
    client.log_param(parent, "data", ",".join(names))
    for key in ("max_epochs", "seed", "protocol", "n_boot", "confidence"):
        client.log_param(parent, key, getattr(args, key))
    client.log_param(parent, "lambda_energy", ",".join(f"{v:g}" for v in args.lambda_energy))
    print(f"MLflow parent run: {parent} (re-run the same command to resume; finished trainings and evaluations "
          f"are reused)", flush=True)
    print(f"compare plan: {len(tasks)} models", flush=True)
    print("\n".join(describe_plan(tasks, client, args.actionability)), flush=True)
    status = "FAILED"
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

            for key in table_metrics():
                for suffix in ("reduction_pct", "se"):
                    value = row[f"{key}_{suffix}"]
                    if value == value:  # not NaN
                        client.log_metric(parent, f"{row['data']}/{key}_{suffix}", float(value))
            _write_outputs([rows[n] for n in names if n in rows], plots, args, client, parent, command, out_dir,
                           final=False)
            print(f"table row {data} written to {out_dir / 'table.md'}", flush=True)

    from ct_lightning.experiment.interrupt import INTERRUPTED_TAG, TrainingInterrupted  # noqa: PLC0415

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop(signum, frame):  # outside a training (evaluation, tables); a training stops at its epoch's end
        raise TrainingInterrupted(signum)

    for signum in previous:
        signal.signal(signum, stop)
    try:
        run_tasks(tasks, args.jobs, client, on_done)
        ordered = [rows[n] for n in names]
        real = [row for row in ordered if not (row["synthetic"] if "synthetic" in row else is_synthetic(row["data"]))]  # Figure 3 shows the real data sets
        if len(real) > 1:
            figure = plot_robust_accuracy_panels(real, out_dir / "plots" / "robust_accuracy_real.png")
            if figure:
                plots.append(figure)
                client.log_artifact(parent, str(figure), artifact_path="plots")
        summary = _write_outputs(ordered, plots, args, client, parent, command, out_dir, final=True)
        status = "FINISHED"
    except TrainingInterrupted as interrupted:
        status = "KILLED"
        client.set_tag(parent, INTERRUPTED_TAG, f"{interrupted}; resume with: {command}")
        print(f"interrupted ({interrupted}): parent run {parent} is KILLED; finished trainings and evaluations "
              f"are kept: re-run the same command to resume:\n  {command}", file=sys.stderr, flush=True)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        client.set_terminated(parent, status)
    summary["reproduction_key"] = reproduction_key
    if quiet:
        print(f"seed {args.seed}: table in {out_dir / 'table.md'} (MLflow parent run {parent})", flush=True)
        return summary
    print(summary["table_markdown"])
    print("IP/IP*: all features mutable; Cost: protected features immutable in training and evaluation.")
    if summary["statistic"] == "runs":
        print("± 100·sd of the per-run CT/BL ratios over the evaluation runs; * the central 99% quantile interval "
              "of the per-run differences excludes zero (the authors' Table 1 arithmetic);")
    else:
        print("± bootstrap standard error; * 99% bootstrap interval of the difference in means excludes zero;")
    print("† fewer than 30 valid counterfactuals on one side (n BL/CT): not a reliable comparison.")
    print(f"MLflow parent run: {parent}; outputs in {out_dir}")
    return summary


def write_seed_outputs(summaries: dict[int, dict], args, names: list[str], client, artifact_location,
                       command: str, out_dir: Path) -> dict:
    """Aggregate the per-seed tables; write table.md, table.csv, summary.json and paper_comparison.md to
    ``out_dir`` and log them to a parent run whose children are the per-seed parent runs."""
    import csv  # noqa: PLC0415

    from ct_lightning.evaluation.paper import PUBLISHED  # noqa: PLC0415
    from ct_lightning.evaluation.seeds import (ROBUST_SHARE, aggregate_rows, aggregate_table,  # noqa: PLC0415
                                               beside_published_table, flat_aggregates, per_seed_table,
                                               robust_counts)
    from ct_lightning.experiment.reproduce import find_or_create_parent, stable_key  # noqa: PLC0415
    from ct_lightning.experiment.tracking import atomic_file, write_json_atomic, write_text_atomic  # noqa: PLC0415

    seeds = sorted(summaries)
    key = stable_key({"seeds": {str(s): summaries[s]["reproduction_key"] for s in seeds}})
    parent = find_or_create_parent(client, args.experiment, artifact_location, key,
                                   f"compare {','.join(names)} seeds {','.join(map(str, seeds))}")
    for seed in seeds:
        client.set_tag(summaries[seed]["parent_run_id"], "mlflow.parentRunId", parent)
    client.log_param(parent, "seeds", ",".join(map(str, seeds)))
    client.log_param(parent, "data", ",".join(names))
    client.log_param(parent, "protocol", args.protocol)
    rows_by_seed = {s: summaries[s]["rows"] for s in seeds}
    aggregates = aggregate_rows(rows_by_seed, args.confidence)
    need = f"{math.ceil(ROBUST_SHARE * len(seeds) - 1e-9)} of {len(seeds)}"
    table = ("## Table 1 over training seeds " + ", ".join(map(str, seeds)) + "\n\n" + aggregate_table(aggregates)
             + f"\nmean ± SD over seeds of the per-seed reductions [min, max], k*/n: seeds with a star (the "
               f"per-seed 99% interval of per-run differences excludes 0); p: two-sided one-sample t-test of "
               f"the per-seed reductions against 0.\n\n## Every seed\n\n" + per_seed_table(rows_by_seed))
    comparison = []
    for published, (title, _, source) in PUBLISHED.items():
        listed = {kind: ", ".join(f"{v} {k}" for k, v in sorted(robust_counts(aggregates, published, kind).items(),
                                                               key=lambda kv: -kv[1]))
                  for kind in ("robust", "t_verdict")}
        comparison.append(f"## Beside the {title}\n\nSource: {source}.\n\n"
                          + beside_published_table(aggregates, published)
                          + f"\nk*/n: seeds with a star; p: t-test of the per-seed reductions against 0; "
                            f"sign/sig/both: in how many seeds our cell has the published sign, significance, "
                            f"and both; robust verdict: the per-seed verdict of at least {need} seeds, else "
                            f"seed-dependent; t-test verdict: the verdict of the mean over seeds, significant when "
                            f"p < {1 - args.confidence:.2g}.\n\nRobust verdicts: {listed['robust']}. "
                            f"t-test verdicts: {listed['t_verdict']}.\n")
    for metric in ("ip", "ip_star", "cost"):
        for row in aggregates:
            cell = row[metric]
            if cell["n_seeds"]:
                client.log_metric(parent, f"{row['data']}/{metric}_mean", float(cell["mean"]))
                if cell["n_seeds"] > 1:
                    client.log_metric(parent, f"{row['data']}/{metric}_sd", float(cell["sd"]))
    summary = {"parent_run_id": parent, "tracking_uri": args.tracking_uri, "command": command, "seeds": seeds,
               "protocol": args.protocol, "confidence": args.confidence, "robust_share": ROBUST_SHARE,
               "aggregate": aggregates,
               "robust_counts": {k: robust_counts(aggregates, k) for k in PUBLISHED},
               "t_verdict_counts": {k: robust_counts(aggregates, k, "t_verdict") for k in PUBLISHED},
               "per_seed": {str(s): {"parent_run_id": summaries[s]["parent_run_id"],
                                     "out_dir": str(out_dir / f"s{s}"),
                                     "rows": [{k: v for k, v in row.items() if k not in ("robust_curves", "details", "protocol")}
                                              for row in summaries[s]["rows"]]} for s in seeds},
               "table_markdown": table}
    write_text_atomic(out_dir / "table.md", table)
    write_text_atomic(out_dir / "paper_comparison.md", "\n".join(comparison))
    flat = flat_aggregates(aggregates)
    columns: list[str] = []
    for entry in flat:
        columns += [k for k in entry if k not in columns]
    with atomic_file(out_dir / "table.csv") as temporary, open(temporary, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
    summary_path = Path(args.summary_json or out_dir / "summary.json")
    write_json_atomic(summary_path, summary)
    for path in (out_dir / "table.md", out_dir / "paper_comparison.md", out_dir / "table.csv", summary_path):
        client.log_artifact(parent, str(path))
    client.set_terminated(parent, "FINISHED")
    print(table)
    print("\n".join(comparison))
    print(f"MLflow parent run: {parent} (per-seed parent runs are its children); outputs in {out_dir}")
    return summary


cli = console_entry(main)  # the console script ct-compare

if __name__ == "__main__":
    sys.exit(cli())
