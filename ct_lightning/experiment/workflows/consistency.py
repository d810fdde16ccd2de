"""``recipes/consistency.py``: the RS/LOO consistency experiment (``experiment.consistency``) from the command line,
its summary logged to one new MLflow run and the invalidation rates printed."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.runs.atomic_files import write_json_atomic
from ct_lightning.experiment.runner import batches, checking, open_store, start, trained_batches
from ct_lightning.experiment.configuration.store import check_tracking_reachable
from ct_lightning.experiment.configuration.validation import InputError, check_accelerator, check_output_file

CONSISTENCY = "ct_lightning.experiment.studies.consistency"  # read without importing torch (see catalogue)
KINDS = catalogue.constant(CONSISTENCY, "KINDS")
MODES = catalogue.constant(CONSISTENCY, "MODES")
DEFAULTS = catalogue.class_defaults(CONSISTENCY, "ConsistencyConfig")


def config_from_args(args: argparse.Namespace):
    """The :class:`ConsistencyConfig` of parsed arguments."""
    from ct_lightning.experiment.studies.consistency import ConsistencyConfig  # noqa: PLC0415 - heavy

    train = {"nce": args.nce, "batch_size": args.batch_size, "data_dir": args.data_dir, "protect": args.protect,
             "limit_train_batches": batches(args.limit_train_batches)}
    return ConsistencyConfig(
        data=args.data, mode=args.mode, n_models=args.n_models, kinds=tuple(k for k in args.kinds.split(",") if k),
        max_epochs=args.max_epochs, seed=args.seed, n_counterfactuals=args.n_counterfactuals, generator=args.generator,
        lambda_energy=args.lambda_energy, tau=args.tau, max_steps=args.max_steps, sns_delta=args.sns_delta,
        sns_steps=args.sns_steps, sns_lr=args.sns_lr, sns_n_grid=args.sns_n_grid, accelerator=args.accelerator,
        train={k: v for k, v in train.items() if v is not None and v is not False})


def log_summary(summary: dict, args: argparse.Namespace) -> str:
    """Log the settings, flat metrics and the summary JSON to one new MLflow run; returns its id."""
    from ct_lightning.experiment.studies.consistency import flat_metrics  # noqa: PLC0415 - heavy

    from ct_lightning.experiment.runs.tracking import new_run  # noqa: PLC0415

    client, experiment_id, _ = open_store(args.tracking_uri, args.experiment)
    run = new_run(client, experiment_id, run_name=args.run_name or f"consistency-{summary['data']}-{summary['mode']}",
                  tags={"recipe": "consistency"})
    run_id = run.info.run_id
    params = {k: v for k, v in vars(args).items() if k not in ("summary_json", "progress")}
    for key, value in params.items():
        client.log_param(run_id, key, str(value))
    for key, value in flat_metrics(summary).items():
        client.log_metric(run_id, key, value)
    path = Path(tempfile.mkdtemp(prefix="ct-consistency-")) / "consistency_summary.json"
    write_json_atomic(path, {**summary, "run_id": run_id})
    client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
    return run_id


def run(args: argparse.Namespace) -> dict:
    """Check the inputs, run the experiment, log it and print the invalidation rates; returns the summary."""
    with checking():
        args.limit_train_batches = trained_batches(args.limit_train_batches)
        kinds = [k.strip().upper() for k in args.kinds.split(",") if k.strip()]
        if not kinds or any(k not in KINDS for k in kinds):
            raise InputError("--kinds", args.kinds, "comma-separated kinds from " + ", ".join(KINDS))
        check_tracking_reachable(args.tracking_uri)
        check_output_file("--summary-json", args.summary_json, args.overwrite)
        check_accelerator("--accelerator", args.accelerator)
    start(args)
    from ct_lightning.experiment.studies.consistency import run_consistency  # noqa: PLC0415 - heavy

    with checking():
        summary = run_consistency(config_from_args(args), log=print if args.progress else (lambda *a: None))
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
