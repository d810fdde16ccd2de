"""Reproduce rows of the paper's Table 1: BL (objective vanilla) vs CT (objective full).

Per data set four models are trained with identical seeds and data (or reused by run id):
  plausibility pair   BL, CT with all features mutable, evaluated all mutable      → IP, IP*
  actionability pair  BL, CT trained with the protected features immutable
                      (train(protect=True)) and evaluated with them immutable      → cost
A table's data spec (its mutability and domain: facts about the data) holds in the training and evaluation of both
pairs, as in train.py; --immutable adds to the actionability pair only (adding none, it reuses the plausibility
pair's models). table.md lists the constraints each pair was evaluated under (evaluated_under).
Each is evaluated with the paper's protocol (recipes/evaluate.py); CT's effect is the percentage reduction
100·(BL − CT)/BL with bootstrap standard errors (100 rounds) and an asterisk when the 99% bootstrap interval of the
difference in means excludes zero (never with one evaluation run or a zero-width interval: no interval, no star).
Only built-in data sets are put beside the paper's rows (paper_comparison.md); a table file is not, whatever its name.

Outputs in --out-dir (default outputs/compare/): table.md, table.csv, summary.json (or --summary-json) and plots/,
also logged to an MLflow parent run (compare-loans-s0-immutable-age-...-SHORTID) whose children are the training
runs. --model/--from-checkpoint/--model-inputs: every role trains that network (beside given runs of one's own model:
theirs, with their epochs and lr). Every model is keyed by its fully resolved training configuration (--model's
module file and --from-checkpoint by content too); a re-run of the same command reuses finished trainings and
evaluations from the MLflow store and continues where it stopped, so an interrupted reproduction loses at most the
models in progress. Rows are written as soon as their four models are evaluated.

Examples:
  .venv/bin/python recipes/compare.py --data all --jobs 2                        # all nine rows, the paper's budget
  .venv/bin/python recipes/compare.py --data ls,circles,moons,ol                 # the synthetic rows
  .venv/bin/python recipes/compare.py --data circles --max-epochs 5 --n-runs 1 --n-individuals 20
  .venv/bin/python recipes/compare.py --bl-run-id ID1 --ct-run-id ID2 --no-actionability  # data, table options: the runs'
  .venv/bin/python recipes/compare.py --data loans.csv --target approved --immutable age --model hiring_net:Net
  .venv/bin/python recipes/compare.py --data all --jobs 2 --seeds 0,1,2,3,4      # Table 1 over five training seeds

With --seeds (or --n-seeds) the reproduction runs once per training seed, each resumable as above and written to
OUT_DIR/sSEED (a seed's trainings and evaluations are keyed by their configuration, which holds the seed, so seeds
already in the store are reused); OUT_DIR then gets the table over seeds (ct_lightning.evaluation.seeds: mean, SD,
min-max, starred seeds, an across-seed t-test, agreement with both published tables, a seed-robust verdict)."""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.configuration.protocol_options import add_protocol_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe
from ct_lightning.experiment.workflows.compare import OPTION_HINTS, ROLES, run
from ct_lightning.experiment.workflows.compare_runs import MODEL_KEYS


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/compare.py``."""
    parser = recipe_parser(__doc__)
    parser.hints = OPTION_HINTS
    add_arguments(parser, ["data_sets", "jobs", "threads", "accelerator", "cpu_math"], recipe="compare")
    budget = parser.add_argument_group("training (--search-lr unset: 0.1 with --protocol reference, as the authors' "
                                       "code ran; train.py's 0.25 with --protocol paper; --max-epochs unset: 100)")
    add_arguments(budget, ["max_epochs", "seed"], seed=0)
    add_arguments(parser.add_argument_group("a model of your own, as train.py's, for every role trained (with given "
                  "runs: theirs, and their --max-epochs and --lr)"), [*MODEL_KEYS[:3], "lr", *MODEL_KEYS[3:]])
    add_arguments(budget, ["seeds", "n_seeds", "nce", "search_lr", "limit_train_batches", "data_dir", "target",
                           "data_spec", "impute", "balance", "drop_columns", "immutable"], search_lr=None)  # a table's, as in train.py
    reuse = parser.add_argument_group("reuse trained runs (comma-separated, aligned with --data; empty = train; "
                                      "--data and a table's --target ... --balance default to the runs')")
    for key, _, _ in ROLES:
        reuse.add_argument(f"--{key.replace('_', '-')}-run-id", dest=f"{key}_run_id", help=f"run id(s) of {key}")
    add_arguments(parser, ["actionability"])
    add_arguments(parser.add_argument_group("bootstrap"), ["n_boot", "confidence", "statistic"])
    add_arguments(parser.add_argument_group("tracking and output"), ["tracking_uri", "experiment", "out_dir",
                  "summary_json", "progress", "verbose"], out_dir="outputs/compare")
    add_protocol_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Train or reuse, evaluate, compare; print and save the table; log everything to a parent run."""
    return run_recipe(build_parser(), argv, lambda args: run(args, argv))


cli = console_entry(main)  # the console script ct-compare

if __name__ == "__main__":
    sys.exit(cli())
