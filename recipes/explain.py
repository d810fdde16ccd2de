"""Explain single decisions of a trained model in the rows' own units: the prediction and the changes that flip it.

Examples:
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --row '{"age": 53, "income": 54600, "sex": "female", ...}'
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --target approved --json out.json
  .venv/bin/python recipes/explain.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --row '{"x1": 0.3, "x2": -1}'
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.atomic_files import write_json_atomic
from ct_lightning.experiment.settings import add_arguments
from ct_lightning.experiment.tracking import DEFAULT_TRACKING_URI, anchor_tracking_uri
from ct_lightning.experiment.validation import (KNOWN_ERRORS, EnvironmentProblem, Parser, check_checkpoint_file,
                                                check_output_file, check_run_ids, console_entry, exit_on_error)

SEARCH = ["generator", "tau", "max_steps", "epsilon", "lambda_cost", "lambda_energy", "search_lr", "generator_options"]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/explain.py``; search settings default to the model's own."""
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-id", help="MLflow run of recipes/train.py")
    source.add_argument("--checkpoint", help="a checkpoint file of recipes/train.py")
    rows = parser.add_mutually_exclusive_group(required=True)
    rows.add_argument("--rows", help="a CSV file of rows in original units, with the model's columns")
    rows.add_argument("--row", help="one row as a JSON object of column: value, in original units")
    parser.add_argument("--target", help="the class to reach (default: the most likely other class)")
    parser.add_argument("--json", help="write the explanations here, one object per row")
    parser.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    parser.add_argument("--which", choices=("last", "best"), default="last", help="checkpoint of the run (default last)")
    parser.add_argument("--no-log", dest="log", action="store_false", help="do not log the explanations to the run")
    add_arguments(parser, SEARCH + ["seed"], **{name: None for name in SEARCH}, seed=0)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Check the inputs, load the model, explain every row, print, write ``--json`` and log to the run."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.tracking_uri = anchor_tracking_uri(args.tracking_uri)
    try:
        check_output_file("--json", args.json)
        check_checkpoint_file("--checkpoint", args.checkpoint)
        if args.rows and not __import__("pathlib").Path(args.rows).is_file():
            raise EnvironmentProblem(f"--rows: no file at {args.rows}")
        if args.run_id:
            check_run_ids("--run-id", [args.run_id], args.tracking_uri)
        from ct_lightning.experiment.explanations import (check_rows, explain_loaded, load_explainable,  # noqa: PLC0415
                                                          log_explanations, read_rows, search_settings)

        rows = read_rows(args.rows, args.row)
        loaded = load_explainable(args.run_id, args.checkpoint, args.tracking_uri, args.which)
        check_rows(rows, loaded, "--rows" if args.rows else "--row")
        settings = search_settings(loaded.module, {k: getattr(args, k) for k in SEARCH})
        explanations = explain_loaded(loaded, rows, args.target, settings, args.seed)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    from ct_lightning.evaluation.explanation import describe, to_records  # noqa: PLC0415

    print(describe(explanations))
    records = to_records(explanations)
    if args.json:
        write_json_atomic(args.json, records)
    if args.run_id and args.log:
        print(f"logged {log_explanations(args.tracking_uri, args.run_id, explanations)}/ to run {args.run_id}")
    return records


cli = console_entry(main)  # the console script ct-explain

if __name__ == "__main__":
    sys.exit(cli())
