"""Counterfactual consistency of BL and CT models: invalidation rates under RS or LOO retraining.

For each model kind (BL = vanilla objective, CT = full objective) a base model and N related
models are trained (RS: seeds seed+1..seed+N; LOO: the base seed with one random training point
left out each). Counterfactuals of test factuals with random targets are searched on the base
model (ECCo, τ = 0.95, T = 50 by default) and refined with Stable Neighbor Search; the invalidation
rate is the share of valid counterfactuals whose predicted class changes on the related models.
The N related models are trained without logging; the summary goes to one MLflow run.

Examples:
  .venv/bin/python recipes/consistency.py --data moons                       # RS, N = 5, 10 epochs
  .venv/bin/python recipes/consistency.py --data moons --mode loo --summary-json loo.json
  .venv/bin/python recipes/consistency.py --data adult --n-models 5 --max-epochs 5
  .venv/bin/python recipes/consistency.py --data moons --n-models 100 --max-epochs 100   # the paper's N
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ct_lightning.experiment.atomic_files import write_json_atomic
from ct_lightning.experiment import catalogue
from ct_lightning.experiment.preflight import apply_threads, threads_for
from ct_lightning.experiment.settings import ACCELERATORS, add_arguments, datasets_and_aliases
from ct_lightning.experiment.tracking import (DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI, anchor_tracking_uri,
                                              check_tracking_reachable, store_location)
from ct_lightning.experiment.validation import (KNOWN_ERRORS, Parser, Rule, InputError, check_accelerator,
                                                check_output_file, console_entry, exit_on_error)

CONSISTENCY = "ct_lightning.experiment.consistency"  # read without importing torch (see catalogue)
KINDS = catalogue.constant(CONSISTENCY, "KINDS")
MODES = catalogue.constant(CONSISTENCY, "MODES")


def _int(low: int):
    return Rule("int", low=low).argtype()


def _float(low: float | None = None, high: float | None = None, low_open: bool = False):
    return Rule("float", low, high, low_open).argtype()


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/consistency.py``."""
    d = argparse.Namespace(**catalogue.class_defaults(CONSISTENCY, "ConsistencyConfig"))
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=d.data, type=Rule(choices=datasets_and_aliases, lower=True).argtype(), help="data set (default %(default)s)")
    parser.add_argument("--data-dir", help="folder with the raw data files (default: $CT_DATA_DIR)")
    parser.add_argument("--mode", choices=MODES, default=d.mode, help="rs: other seeds; loo: one training point left out (default %(default)s)")
    parser.add_argument("--n-models", type=_int(1), default=d.n_models, help="related models per kind (default %(default)s; the paper used 100)")
    parser.add_argument("--kinds", default=",".join(d.kinds), help=f"model kinds, from {','.join(KINDS)} (default %(default)s)")
    parser.add_argument("--max-epochs", type=_int(1), default=d.max_epochs, help="training epochs per model (default %(default)s)")
    parser.add_argument("--seed", type=_int(0), default=d.seed, help="seed of the base models (default %(default)s)")
    parser.add_argument("--nce", type=_int(1), help="counterfactuals per CT epoch [Table 2]")
    parser.add_argument("--batch-size", type=_int(1), help="training batch size [Table 2]")
    parser.add_argument("--limit-train-batches", type=_float(0.0), help="Lightning limit_train_batches (quick runs)")
    parser.add_argument("--protect", action="store_true", help="make the data set's protected features immutable")
    cf = parser.add_argument_group("counterfactuals")
    cf.add_argument("--n-counterfactuals", type=_int(1), default=d.n_counterfactuals, help="test factuals (default %(default)s)")
    cf.add_argument("--generator", type=Rule(choices=catalogue.generators).argtype(), default=d.generator, help="search on the base model (default %(default)s)")
    cf.add_argument("--lambda-energy", type=_float(0.0), default=d.lambda_energy, help="ECCo λ_egy (default %(default)s)")
    cf.add_argument("--tau", type=_float(0.0, 1.0, True), default=d.tau, help="search threshold τ (default %(default)s)")
    cf.add_argument("--max-steps", type=_int(1), default=d.max_steps, help="search steps T (default %(default)s)")
    cf.add_argument("--sns-delta", type=_float(0.0), default=d.sns_delta, help="SNS ℓ2 radius δ (default %(default)s)")
    cf.add_argument("--sns-steps", type=_int(0), default=d.sns_steps, help="SNS ascent steps (default %(default)s)")
    cf.add_argument("--sns-lr", type=_float(0.0, low_open=True), help="SNS step length (default 2·δ/steps)")
    cf.add_argument("--sns-n-grid", type=_int(1), default=d.sns_n_grid, help="Riemann-sum points of SNS (default %(default)s)")
    out = parser.add_argument_group("tracking and output")
    out.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    out.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default %(default)s)")
    out.add_argument("--run-name", help="MLflow run name (default consistency-DATA-MODE)")
    out.add_argument("--summary-json", help="write invalidation rates, costs and settings here")
    out.add_argument("--accelerator", default="cpu", type=Rule(choices=ACCELERATORS).argtype(), help="Lightning accelerator (default %(default)s)")
    out.add_argument("--quiet", action="store_true", help="no progress lines")
    add_arguments(parser, ["threads"])
    return parser


def config_from_args(args: argparse.Namespace):
    """The :class:`ConsistencyConfig` of parsed arguments."""
    from ct_lightning.experiment.consistency import ConsistencyConfig  # noqa: PLC0415 - heavy

    train = {"nce": args.nce, "batch_size": args.batch_size, "data_dir": args.data_dir, "protect": args.protect}
    if args.limit_train_batches is not None:
        value = args.limit_train_batches
        train["limit_train_batches"] = int(value) if float(value).is_integer() and value >= 1 else value
    return ConsistencyConfig(
        data=args.data, mode=args.mode, n_models=args.n_models, kinds=tuple(k for k in args.kinds.split(",") if k),
        max_epochs=args.max_epochs, seed=args.seed, n_counterfactuals=args.n_counterfactuals, generator=args.generator,
        lambda_energy=args.lambda_energy, tau=args.tau, max_steps=args.max_steps, sns_delta=args.sns_delta,
        sns_steps=args.sns_steps, sns_lr=args.sns_lr, sns_n_grid=args.sns_n_grid, accelerator=args.accelerator,
        train={k: v for k, v in train.items() if v is not None and v is not False})


def log_summary(summary: dict, args: argparse.Namespace) -> str:
    """Log the settings, flat metrics and the summary JSON to one new MLflow run; returns its id."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.consistency import flat_metrics
    from ct_lightning.experiment.tracking import ensure_experiment, prepare_store

    artifact_location = prepare_store(args.tracking_uri)  # the store, created once under a file lock
    client = MlflowClient(tracking_uri=args.tracking_uri)
    experiment_id = ensure_experiment(client, args.experiment, artifact_location)
    run = client.create_run(experiment_id, run_name=args.run_name or f"consistency-{summary['data']}-{summary['mode']}",
                            tags={"recipe": "consistency"})
    run_id = run.info.run_id
    params = {k: v for k, v in vars(args).items() if k not in ("summary_json", "quiet")}
    for key, value in params.items():
        client.log_param(run_id, key, str(value))
    for key, value in flat_metrics(summary).items():
        client.log_metric(run_id, key, value)
    path = Path(tempfile.mkdtemp(prefix="ct-consistency-")) / "consistency_summary.json"
    write_json_atomic(path, {**summary, "run_id": run_id})
    client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
    return run_id


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, run the experiment, log it and print the invalidation rates."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.tracking_uri = anchor_tracking_uri(args.tracking_uri)
    try:
        kinds = [k.strip().upper() for k in args.kinds.split(",") if k.strip()]
        if not kinds or any(k not in KINDS for k in kinds):
            raise InputError("--kinds", args.kinds, "comma-separated kinds from " + ", ".join(KINDS))
        check_tracking_reachable(args.tracking_uri)
        check_output_file("--summary-json", args.summary_json)
        check_accelerator("--accelerator", args.accelerator)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    print(f"MLflow store: {store_location(args.tracking_uri)}", flush=True)
    print(apply_threads(threads_for(args.threads, accelerator=args.accelerator)), flush=True)
    from ct_lightning.experiment.consistency import run_consistency  # noqa: PLC0415 - heavy

    try:
        config = config_from_args(args)
        summary = run_consistency(config, log=(lambda *a: None) if args.quiet else print)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    summary["run_id"] = log_summary(summary, args)
    summary["tracking_uri"] = args.tracking_uri
    if args.summary_json:
        write_json_atomic(args.summary_json, summary)
    for kind, per_generator in summary["invalidation_rate"].items():
        cells = ", ".join(f"{name}: IR {value if value is None else round(value, 3)} "
                          f"(ℓ1 {summary['cost'][kind][name]['l1'] or float('nan'):.3f})"
                          for name, value in per_generator.items())
        print(f"{kind} [{summary['mode']}, N={summary['n_models']}] {cells}")
    print(f"MLflow run id: {summary['run_id']}")
    return summary


cli = console_entry(main)  # the console script ct-consistency

if __name__ == "__main__":
    sys.exit(cli())
