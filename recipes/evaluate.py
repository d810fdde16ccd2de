"""Evaluate a trained model with the paper's protocol (SPEC §3) and log the results to its MLflow run.

Counterfactuals are searched faithfully with ECCo for random factuals of the test split and random
targets (λ_cst = 0.001, λ_egy ∈ {0.1, 0.5, 1, 5, 10}, η = 0.25, τ = 0.95, T = 50, 100 individuals
× 5 runs by default). Logged to the run: eval/ip, eval/ip_star, eval/cost, eval/validity, eval/acc,
eval/robust_acc, and the plots as artifacts under plots/.

Examples:
  .venv/bin/python recipes/evaluate.py --run-id 1a6d42...                       # default local store
  .venv/bin/python recipes/evaluate.py --run-id 1a6d42... --protect --summary-json eval.json
  .venv/bin/python recipes/evaluate.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --n-runs 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ct_lightning.experiment import catalogue
from ct_lightning.experiment.preflight import apply_threads, evaluation_device, threads_for
from ct_lightning.experiment.protocol_options import add_protocol_arguments, protocol_config
from ct_lightning.experiment.settings import DEFAULTS, SETTINGS_BY_NAME, add_arguments, datasets_and_aliases, is_table_file
from ct_lightning.experiment.tracking import DEFAULT_TRACKING_URI, anchor_tracking_uri, write_json_atomic
from ct_lightning.experiment.validation import (KNOWN_ERRORS, InputError, Parser, Rule, check_accelerator, check_checkpoint_file,
                                                check_model_fits, check_output_file, check_run_ids, check_writable_folder,
                                                console_entry, exit_on_error)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/evaluate.py``."""
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-id", help="MLflow run of recipes/train.py (its checkpoints/ and config.json artifacts)")
    source.add_argument("--checkpoint", help="what train.py --from-checkpoint accepts: a checkpoint of this project "
                        "(its config.json beside it, else pass --data), a plain state_dict (pass --data, and "
                        "--model/--hidden-sizes where they cannot be inferred), runs:/RUN_ID/model, models:/NAME/VERSION")
    parser.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    parser.add_argument("--which", choices=("last", "best"), default="last",
                        help="checkpoint of the run: last (end of training) or best val/acc (default %(default)s)")
    parser.add_argument("--data", type=data_argument,
                        help="data set, or your table (.csv/.parquet with --target), when it cannot be inferred from "
                        "the run or checkpoint; a table is split as in training (seeded by its data seed)")
    add_arguments(parser, ["target", "data_spec", "impute", "model", "hidden_sizes", "activation"],
                  impute=None, model=None, hidden_sizes=None, activation=None)
    parser.add_argument("--protect", action="store_true", help="make the data set's protected features immutable")
    parser.add_argument("--all-mutable", action="store_true", help="ignore the mutability constraints the model was trained with")
    parser.add_argument("--split", choices=("test", "val"), default="test", help="split of the factuals (default %(default)s)")
    parser.add_argument("--seed", type=Rule("int", low=0).argtype(), help="alias of --eval-seed")
    parser.add_argument("--summary-json", help="write the summary, robust curve and per-sample results here")
    parser.add_argument("--out-dir", help="folder for the plots (default: a temporary folder)")
    parser.add_argument("--no-log", dest="log", action="store_false", help="do not log to the MLflow run")
    parser.add_argument("--unsafe-load", action="store_true",
                        help="load checkpoints with weights_only=False (only for checkpoints you trust)")
    add_arguments(parser, ["threads", "accelerator", "search_compile"])
    add_protocol_arguments(parser)
    return parser


def data_argument(text: str) -> str:
    """``--data``: a data set (or alias), a table file or ``package.module:Class``, checked while parsing."""
    try:
        return SETTINGS_BY_NAME["data"].checked(text.lower() if text.lower() in datasets_and_aliases() else text, "")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)[2:]) from None


def check_inputs(args: argparse.Namespace) -> None:
    """Every check that needs no model: output paths, the checkpoint file or the run id in its store."""
    check_accelerator("--accelerator", args.accelerator)
    check_output_file("--summary-json", args.summary_json)
    if args.out_dir:
        check_writable_folder("--out-dir", args.out_dir)
    if args.checkpoint:
        check_checkpoint_file("--checkpoint", args.checkpoint)
    else:
        check_run_ids("--run-id", [args.run_id], args.tracking_uri)


def main(argv: list[str] | None = None) -> dict:
    """Load, evaluate, log to the run, plot, and write the JSON summary."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seed is not None:
        args.eval_seed = args.seed
    args.tracking_uri = anchor_tracking_uri(args.tracking_uri)
    try:
        check_inputs(args)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    print(apply_threads(threads_for(args.threads, accelerator=args.accelerator)), flush=True)
    from ct_lightning.evaluation import evaluate_model, evaluation_constraints  # noqa: PLC0415 - heavy
    from ct_lightning.generators.compiled_step import set_search_compile  # noqa: PLC0415

    set_search_compile(args.search_compile or DEFAULTS["search_compile"])
    from ct_lightning.evaluation.plots import evaluation_figures, metric_history  # noqa: PLC0415
    from ct_lightning.experiment.runs import load_any_checkpoint, load_run, log_evaluation  # noqa: PLC0415
    from ct_lightning.experiment.data import build_datamodule  # noqa: PLC0415

    given = {"target": args.target, "data_spec": args.data_spec, "impute": args.impute, "model": args.model,
             "hidden_sizes": args.hidden_sizes, "activation": args.activation}
    try:
        if args.run_id:
            loaded = load_run(args.run_id, args.tracking_uri, args.which, weights_only=not args.unsafe_load)
            if args.data:
                loaded.config["data"] = args.data
            loaded.config.update({k: given[k] for k in ("target", "data_spec", "impute") if given[k] is not None})
        else:
            loaded = load_any_checkpoint(args.checkpoint, args.data, given, args.tracking_uri,
                                         weights_only=not args.unsafe_load)
        if is_table_file(loaded.config.get("data")) and not loaded.config.get("target"):
            raise InputError("--target", None, "the column to predict in the table " + str(loaded.config["data"]))
        codec = getattr(loaded.module, "preprocessing", None) if is_table_file(loaded.config.get("data")) else None
        datamodule = loaded.extra.get("datamodule") or build_datamodule(loaded.config, codec=codec)
        if codec is not None:
            print(f"encoding {loaded.config['data']} with the model's own preprocessing (ct_preprocessing of the "
                  f"checkpoint: {len(datamodule.feature_names)} inputs)", flush=True)
        check_model_fits("--checkpoint" if args.checkpoint else "--run-id", args.checkpoint or args.run_id,
                         loaded.module, datamodule)
        known = catalogue.canonical_dataset(datamodule.name) is not None  # else a table file or package.module:Class
        config = protocol_config(args, datamodule.name if known else loaded.config["data"], cost_pair=args.protect)
        constraints = evaluation_constraints(loaded.module, datamodule, args.protect, args.all_mutable)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    loaded.module.to(evaluation_device(args.accelerator))  # the data follow the model's device
    x, y = (datamodule.x_test, datamodule.y_test) if args.split == "test" else (datamodule.x_val, datamodule.y_val)
    result = evaluate_model(loaded.module, x, y, datamodule.n_classes, config, constraints.mutability,
                            constraints.lower, constraints.upper, x_train=datamodule.x_train,
                            feature_names=list(datamodule.feature_names), y_train=datamodule.y_train,
                            data_name=datamodule.name, feature_types=constraints.feature_types)
    summary = result.summary()

    client = None
    convergence = None
    if loaded.run_id:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=args.tracking_uri)
        history = metric_history(client, loaded.run_id)
        convergence = {"CT" if loaded.config.get("objective") != "vanilla" else "BL": history} if history else None
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="ct-eval-plots-"))
    label = "BL" if loaded.config.get("objective") == "vanilla" else f"CT ({loaded.config.get('objective', 'full')})"
    plots = evaluation_figures({label: {"module": loaded.module, "result": result, "constraints": constraints}},
                               datamodule, out_dir, convergence)
    logged = {}
    if client is not None and args.log:
        logged = log_evaluation(client, loaded.run_id, summary)
        for path in plots:
            client.log_artifact(loaded.run_id, str(path), artifact_path="plots")

    payload = {"run_id": loaded.run_id, "checkpoint": loaded.checkpoint, "data": datamodule.name,
               "split": args.split, "immutable": constraints.immutable, "logged": logged,
               "plots": [str(p) for p in plots], **result.to_dict(include_samples=True)}
    if args.summary_json:
        write_json_atomic(args.summary_json, payload)
    shown = {k: v for k, v in summary.items() if k != "per_lambda"}
    print(f"data {datamodule.name} ({args.split} split), immutable: {constraints.immutable or 'none'}")
    for key, value in shown.items():
        print(f"  {key:>18}: {value:.4f}" if isinstance(value, float) else f"  {key:>18}: {value}")
    if logged:
        print(f"logged {', '.join(logged)} to run {loaded.run_id}")
    print(f"plots: {out_dir}")
    return payload


cli = console_entry(main)  # the console script ct-evaluate

if __name__ == "__main__":
    sys.exit(cli())
