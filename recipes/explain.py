"""Explain single decisions of a trained model in the rows' own units: the prediction and the changes that flip it.

Examples:
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --row '{"age": 53, "income": 54600, "sex": "female", ...}'
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --target approved --json out.json
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --target approved --csv out.csv   # a spreadsheet
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --skip-bad-rows   # list rows it cannot read
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --only-predicted no --csv advice.csv
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --only-predicted no --letters letters/
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --immutable age,sex --mutability debt=decrease
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows applicants.csv --step income=1000 --max-change income=10000
  .venv/bin/python recipes/explain.py --run-id 1a6d42... --rows candidates.csv --target interview --target-order rejected,interview,offer
  .venv/bin/python recipes/explain.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --row '{"x1": 0.3, "x2": -1}'
  .venv/bin/python recipes/explain.py --checkpoint copied/last.ckpt --data loans.csv --rows applicants.csv --generator revise

--data: the data the model was trained on, for a checkpoint copied without the config.json train.py writes beside it
(revise and amortised learn from it); it wins over the data a config.json names. A table's label column comes from the
model itself, as do the columns it was trained without (--drop-columns) and its rows (--balance undersample): here
--target is the class to reach.

--immutable and --mutability: what the explanation may not change (or only in one direction), by the model's column
names, on top of the constraints the model was trained under (for the same column, the one given here holds, but it
may not loosen what the model's data spec says, e.g. age: increase).
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe
from ct_lightning.experiment.workflows.explain import (OPTION_HINTS, SEARCH, add_explanation_limits,
                                                      add_explanation_outputs, run)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/explain.py``; search settings default to the model's own."""
    parser = recipe_parser(__doc__)
    parser.hints = OPTION_HINTS  # train.py's options for a model of your own, typed here
    add_arguments(parser.add_mutually_exclusive_group(required=True), ["run_id", "checkpoint"], recipe="explain")
    rows = parser.add_mutually_exclusive_group(required=True)
    rows.add_argument("--rows", help="a CSV file of rows in original units, with the model's columns")
    rows.add_argument("--row", help="one row as a JSON object of column: value, in original units")
    parser.add_argument("--target", help="the class to reach (default: the most likely other class; of an ordered "
                        "outcome, target: {order: [...]} in the data spec, at least the class one place above)")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="--rows: leave out rows the model cannot read (a missing value, an unseen category, a "
                        "non-number, a number outside the model's domain), list them with their problem and explain "
                        "the others (default: such a row stops the run before any search)")
    parser.add_argument("--only-predicted", metavar="CLASS",
                        help="explain only the rows the model predicts as CLASS (e.g. Rejected: the applicants to "
                        "advise); the others are not searched, and --json/--csv give their prediction")
    parser.add_argument("--all-changes", dest="fewer_changes", action="store_false",
                        help="keep every change the search made (default: give back each change the counterfactual "
                        "does not need, smallest first, while the target stays as likely as required)")
    add_explanation_outputs(parser)  # --json, --csv, --letters
    add_arguments(parser, ["immutable", "mutability"])  # checked against the model's columns before any search
    add_explanation_limits(parser)  # --step, --max-change, --target-order
    add_arguments(parser, ["data"], data=None)  # the training data of a checkpoint copied without its config.json
    add_arguments(parser, ["tracking_uri", "which", "log", "overwrite"])
    add_arguments(parser, SEARCH + ["seed"], **{name: None for name in SEARCH}, seed=0)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Check the inputs, load the model, explain every row, print, write ``--json`` and ``--csv`` and log to the
    run."""
    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-explain

if __name__ == "__main__":
    sys.exit(cli())
