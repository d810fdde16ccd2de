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

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe
from ct_lightning.experiment.configuration.validation import Rule
from ct_lightning.experiment.workflows.consistency import DEFAULTS as D, KINDS, MODES, run


def _number(kind: str, low: float, low_open: bool = False):
    return Rule(kind, low=low, low_open=low_open).argtype()


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/consistency.py``."""
    parser = recipe_parser(__doc__)
    add_arguments(parser, ["data", "data_dir"], data=D["data"])
    parser.add_argument("--mode", choices=MODES, default=D["mode"], help="rs: other seeds; loo: one training point left out (default %(default)s)")
    parser.add_argument("--n-models", type=_number("int", 1), default=D["n_models"], help="related models per kind (default %(default)s; the paper used 100)")
    parser.add_argument("--kinds", default=",".join(D["kinds"]), help=f"model kinds, from {','.join(KINDS)} (default %(default)s)")
    add_arguments(parser, ["max_epochs", "seed", "nce", "batch_size", "limit_train_batches", "protect"],
                  max_epochs=D["max_epochs"], seed=D["seed"])
    cf = parser.add_argument_group("counterfactuals")
    cf.add_argument("--n-counterfactuals", type=_number("int", 1), default=D["n_counterfactuals"], help="test factuals (default %(default)s)")
    add_arguments(cf, ["generator", "lambda_energy", "tau", "max_steps"], generator=D["generator"],
                  lambda_energy=D["lambda_energy"], tau=D["tau"], max_steps=D["max_steps"])
    cf.add_argument("--sns-delta", type=_number("float", 0.0), default=D["sns_delta"], help="SNS ℓ2 radius δ (default %(default)s)")
    cf.add_argument("--sns-steps", type=_number("int", 0), default=D["sns_steps"], help="SNS ascent steps (default %(default)s)")
    cf.add_argument("--sns-lr", type=_number("float", 0.0, True), help="SNS step length (default 2·δ/steps)")
    cf.add_argument("--sns-n-grid", type=_number("int", 1), default=D["sns_n_grid"], help="Riemann-sum points of SNS (default %(default)s)")
    out = parser.add_argument_group("tracking and output")
    add_arguments(out, ["tracking_uri", "experiment", "run_name", "summary_json", "accelerator"],
                  accelerator=D["accelerator"])
    add_arguments(out, ["overwrite", "progress", "threads"])
    out.add_argument("--quiet", dest="progress", action="store_false", help="the same as --no-progress (older name)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, run the experiment, log it and print the invalidation rates."""
    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-consistency

if __name__ == "__main__":
    sys.exit(cli())
