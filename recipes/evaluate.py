"""Evaluate a trained model with the paper's protocol (SPEC §3) and log the results to its MLflow run.

Counterfactuals are searched faithfully with ECCo for random factuals of the test split and random
targets, λ_egy ∈ {0.1, 0.5, 1, 5, 10}, τ = 0.95, T = 50, as --protocol says: by default "reference", what the
authors' code ran for Table 1 (η = 0.1, λ_cst = 0, 100 runs of 100 individuals balanced over the predicted classes);
"paper", what the paper's text states (η = 0.25, λ_cst = 0.001, 5 runs × 100 individuals). Logged to the run: eval/ip, eval/ip_star, eval/cost, eval/validity, eval/acc,
eval/robust_acc, and the plots as artifacts under plots/.

Examples:
  .venv/bin/python recipes/evaluate.py --run-id 1a6d42...                       # default local store
  .venv/bin/python recipes/evaluate.py --run-id 1a6d42... --protect --summary-json eval.json
  .venv/bin/python recipes/evaluate.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --n-runs 2
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.configuration.protocol_options import add_protocol_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe
from ct_lightning.experiment.workflows.evaluate import GIVEN, run


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/evaluate.py``."""
    parser = recipe_parser(__doc__)
    add_arguments(parser.add_mutually_exclusive_group(required=True), ["run_id", "checkpoint"], recipe="evaluate")
    add_arguments(parser, ["tracking_uri", "which", "data", *GIVEN, "protect", "all_mutable"],
                  data=None, impute=None, drop_columns=None, balance=None, model=None, hidden_sizes=None, activation=None)
    parser.add_argument("--split", choices=("test", "val", "all"), default=None,
                        help="rows of the factuals: a split, or all labelled rows (default: test; all for a --data "
                             "table other than the model's own)")
    add_arguments(parser, ["seed", "summary_json", "out_dir", "log", "overwrite"], seed=None)
    parser.add_argument("--unsafe-load", action="store_true",
                        help="load checkpoints with weights_only=False (only for checkpoints you trust)")
    add_arguments(parser, ["threads", "accelerator", "search_compile", "progress"])
    add_protocol_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Load, evaluate, log to the run, plot, and write the JSON summary."""
    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-evaluate

if __name__ == "__main__":
    sys.exit(cli())
