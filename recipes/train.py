"""Train a classifier with counterfactual training (CT) and track it in MLflow.

Examples:
  .venv/bin/python recipes/train.py                              # CT on the embedded circles data
  .venv/bin/python recipes/train.py --data moons --objective vanilla --max-epochs 20
  .venv/bin/python recipes/train.py --data ls --protect          # feature x1 immutable, as in the paper
  .venv/bin/python recipes/train.py --data adult --immutable age --mutability hours_per_week=increase
  .venv/bin/python recipes/train.py --config configs/adult.yaml --max-epochs 10
  .venv/bin/python recipes/train.py --data moons --from-checkpoint vanilla.ckpt --max-epochs 50   # fine-tune with CT
  .venv/bin/python recipes/train.py --data moons --from-checkpoint runs:/RUN_ID/model       # fine-tune a logged MLflow model
  .venv/bin/python recipes/train.py --config config.yaml         # repeat a run from its logged config (a new run, own outputs)
  .venv/bin/python recipes/train.py --data loans.csv --target approved --write-data-spec spec.yaml   # a spec to edit
  .venv/bin/python recipes/train.py --resume                     # continue the newest interrupted run that has a checkpoint
  .venv/bin/python recipes/train.py --resume RUN_ID --max-epochs 200   # extend a run to 200 epochs in total
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/train.py``, one option per row of the settings table."""
    parser = recipe_parser(
        __doc__, argument_default=argparse.SUPPRESS,  # only what the command line gives overrides the config file
        epilog="Precedence: SPEC defaults < the data set's Table 2 values [Table 2] < --config file < command line.")
    add_arguments(parser)
    add_arguments(parser.add_argument_group("table files: a data spec to start from"), ["write_data_spec"])
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse and check the arguments, train, and print where to find the run.

    Every input is checked before torch, Lightning or MLflow is imported and before anything is written;
    a bad one ends with a one-line error (exit code 2 for a value, 1 for the environment).
    """
    from ct_lightning.experiment.workflows.train import run  # noqa: PLC0415

    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-train

if __name__ == "__main__":
    sys.exit(cli())
