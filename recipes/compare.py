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

Examples:
  python recipes/compare.py --data ls,circles,moons,ol                 # the paper's budget
  python recipes/compare.py --data circles --max-epochs 5 --n-runs 1 --n-individuals 20
  python recipes/compare.py --data circles --bl-run-id ID1 --ct-run-id ID2 --no-actionability
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ct_lightning.evaluation import evaluate_model, evaluation_constraints
from ct_lightning.evaluation.compare import compare_evaluations, markdown_table, table_row, write_csv
from ct_lightning.evaluation.plots import evaluation_figures, metric_history
from ct_lightning.experiment.protocol_options import add_protocol_arguments, protocol_config
from ct_lightning.experiment.runs import build_data, load_run, log_evaluation
from ct_lightning.experiment.tracking import DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI, prepare_store, write_json_atomic
from ct_lightning.experiment.train import train
from datamodules import available, canonical_name

ROLES = (  # (key, objective, protected)
    ("bl", "vanilla", False), ("ct", "full", False), ("bl_protected", "vanilla", True), ("ct_protected", "full", True))
LABELS = {"bl": "BL", "ct": "CT", "bl_protected": "BL", "ct_protected": "CT"}


def _csv_list(text: str | None) -> list[str]:
    return [] if not text else [part.strip() for part in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/compare.py``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help=f"data set(s), comma-separated: {', '.join(available())}")
    budget = parser.add_argument_group("training")
    budget.add_argument("--max-epochs", type=int, default=100, help="training epochs (default %(default)s)")
    budget.add_argument("--seed", type=int, default=0, help="training seed, the same for BL and CT (default %(default)s)")
    budget.add_argument("--nce", type=int, help="counterfactuals per epoch for CT [Table 2]")
    budget.add_argument("--limit-train-batches", type=float, help="Lightning limit_train_batches (quick runs)")
    budget.add_argument("--data-dir", help="folder with the raw data files of the real data sets")
    reuse = parser.add_argument_group("reuse trained runs (comma-separated, aligned with --data; empty = train)")
    for key, _, _ in ROLES:
        reuse.add_argument(f"--{key.replace('_', '-')}-run-id", dest=f"{key}_run_id", help=f"run id(s) of {key}")
    parser.add_argument("--no-actionability", dest="actionability", action="store_false",
                        help="skip the protected pair (no cost column)")
    stats = parser.add_argument_group("bootstrap")
    stats.add_argument("--n-boot", type=int, default=100, help="bootstrap rounds (default %(default)s)")
    stats.add_argument("--confidence", type=float, default=0.99, help="confidence of the interval (default %(default)s)")
    out = parser.add_argument_group("tracking and output")
    out.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    out.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default %(default)s)")
    out.add_argument("--out-dir", default="outputs/compare", help="output folder (default %(default)s)")
    out.add_argument("--summary-json", help="JSON summary path (default OUT_DIR/summary.json)")
    out.add_argument("--progress", action="store_true", help="show Lightning progress bars")
    add_protocol_arguments(parser)
    return parser


def _parent_run(client, args, names: list[str]) -> str:
    artifact_location = prepare_store(args.tracking_uri)
    experiment = client.get_experiment_by_name(args.experiment)
    experiment_id = experiment.experiment_id if experiment else \
        client.create_experiment(args.experiment, artifact_location=artifact_location)
    run = client.create_run(experiment_id, run_name=f"compare {','.join(names)}", tags={"ct.role": "compare"})
    return run.info.run_id


def _train_or_reuse(role: str, objective: str, protected: bool, data: str, reuse: str | None, args, parent: str) -> str:
    if reuse:
        return reuse
    overrides = {"data": data, "objective": objective, "protect": protected, "max_epochs": args.max_epochs,
                 "seed": args.seed, "nce": args.nce, "tracking_uri": args.tracking_uri, "experiment": args.experiment,
                 "run_name": f"{data}-{role}", "progress": args.progress, "data_dir": args.data_dir,
                 "limit_train_batches": args.limit_train_batches}
    summary = train(overrides, tags={"mlflow.parentRunId": parent, "ct.compare.role": role})
    return summary["run_id"]


def compare_data(data: str, reuse: dict[str, str | None], args, client, parent: str, out_dir: Path) -> tuple[dict, list]:
    """Train/reuse, evaluate and compare the models of one data set; returns the table row and plot paths."""
    config = protocol_config(args)
    roles = ROLES if args.actionability else ROLES[:2]
    entries, summaries, results = {}, {}, {}
    datamodule = None
    for role, objective, protected in roles:
        started = time.perf_counter()
        run_id = _train_or_reuse(role, objective, protected, data, reuse.get(role), args, parent)
        loaded = load_run(run_id, args.tracking_uri)
        datamodule = datamodule or build_data(loaded.config)
        constraints = evaluation_constraints(loaded.module, datamodule, protect=protected, all_mutable=not protected)
        result = evaluate_model(loaded.module, datamodule.x_test, datamodule.y_test, datamodule.n_classes, config,
                                constraints.mutability, constraints.lower, constraints.upper,
                                x_train=datamodule.x_train, feature_names=list(datamodule.feature_names),
                                y_train=datamodule.y_train, data_name=datamodule.name)
        results[role], summaries[role] = result, result.summary()
        log_evaluation(client, run_id, summaries[role])
        entries[role] = {"module": loaded.module, "result": result, "constraints": constraints, "run_id": run_id}
        print(f"[{data}] {role}: run {run_id}, {time.perf_counter() - started:.0f}s, "
              f"ip {summaries[role]['ip']}, cost {summaries[role]['cost']}, validity {summaries[role]['validity']:.3f}",
              flush=True)
    plausibility = compare_evaluations(results["bl"], results["ct"], ("ip", "ip_star"), args.n_boot, args.confidence,
                                       args.seed)
    actionability = compare_evaluations(results["bl_protected"], results["ct_protected"], ("cost",), args.n_boot,
                                        args.confidence, args.seed + 10) if args.actionability else {}
    row = table_row(datamodule.name, plausibility, actionability, summaries["bl"], summaries["ct"],
                    summaries.get("bl_protected"), summaries.get("ct_protected"))
    row["runs"] = {role: entry["run_id"] for role, entry in entries.items()}
    row["details"] = {"plausibility": plausibility, "actionability": actionability,
                      "per_lambda": {role: s["per_lambda"] for role, s in summaries.items()}}
    convergence = {f"{LABELS[role]}{' protected' if 'protected' in role else ''}":
                   metric_history(client, entry["run_id"]) for role, entry in entries.items() if role.startswith("ct")}
    figures = {f"{LABELS[role]}{' protected' if 'protected' in role else ''}": {**entry, "title": LABELS[role]}
               for role, entry in entries.items()}
    plots = evaluation_figures(figures, datamodule, out_dir / "plots", convergence, prefix=f"{datamodule.name}_")
    return row, plots


def main(argv: list[str] | None = None) -> dict:
    """Train or reuse, evaluate, compare; print and save the table; log everything to a parent run."""
    from mlflow.tracking import MlflowClient

    args = build_parser().parse_args(argv)
    if args.limit_train_batches is not None and float(args.limit_train_batches).is_integer() \
            and args.limit_train_batches >= 1:
        args.limit_train_batches = int(args.limit_train_batches)
    try:
        names = [canonical_name(name) for name in _csv_list(args.data) if name]
        if not names:
            raise ValueError("data: give at least one data set")
        reuse_lists = {key: _csv_list(getattr(args, f"{key}_run_id")) for key, _, _ in ROLES}
        for key, ids in reuse_lists.items():
            if ids and len(ids) != len(names):
                raise ValueError(f"--{key.replace('_', '-')}-run-id: give one id per data set ({len(names)}), "
                                 f"empty entries to train")
        protocol_config(args)
    except ValueError as error:
        sys.exit(f"error: {error}")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=args.tracking_uri)
    parent = _parent_run(client, args, names)
    command = "python recipes/compare.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    client.log_param(parent, "data", ",".join(names))
    for key in ("max_epochs", "seed", "n_individuals", "n_runs", "n_boot", "confidence"):
        client.log_param(parent, key, getattr(args, key))
    client.log_param(parent, "lambda_energy", ",".join(f"{v:g}" for v in args.lambda_energy))
    status = "FAILED"
    try:
        rows, plots = [], []
        for i, data in enumerate(names):
            reuse = {key: (ids[i] or None) if ids else None for key, ids in reuse_lists.items()}
            row, row_plots = compare_data(data, reuse, args, client, parent, out_dir)
            rows.append(row)
            plots += row_plots
            for key in ("ip", "ip_star", "cost"):
                for suffix in ("reduction_pct", "se"):
                    value = row[f"{key}_{suffix}"]
                    if value == value:  # not NaN
                        client.log_metric(parent, f"{row['data']}/{key}_{suffix}", float(value))
        table = markdown_table(rows)
        summary = {"parent_run_id": parent, "tracking_uri": args.tracking_uri, "command": command,
                   "evaluation": protocol_config(args).__dict__, "training": {"max_epochs": args.max_epochs,
                                                                              "seed": args.seed, "nce": args.nce},
                   "rows": rows, "table_markdown": table, "plots": [str(p) for p in plots]}
        (out_dir / "table.md").write_text(table)
        write_csv(rows, out_dir / "table.csv")
        summary_path = Path(args.summary_json or out_dir / "summary.json")
        write_json_atomic(summary_path, summary)
        for path in (out_dir / "table.md", out_dir / "table.csv", summary_path):
            client.log_artifact(parent, str(path))
        for path in plots:
            client.log_artifact(parent, str(path), artifact_path="plots")
        status = "FINISHED"
    finally:
        client.set_terminated(parent, status)
    print(table)
    print("IP/IP*: all features mutable; Cost: protected features immutable in training and evaluation.")
    print("± bootstrap standard error; * 99% bootstrap interval of the difference in means excludes zero;")
    print("† fewer than 30 valid counterfactuals on one side (n BL/CT): not a reliable comparison.")
    print(f"MLflow parent run: {parent}; outputs in {out_dir}")
    return summary


if __name__ == "__main__":
    main()
