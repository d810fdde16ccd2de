"""Train a classifier with counterfactual training (CT) and track it in MLflow.

Examples:
  python recipes/train.py                              # CT on the embedded circles data
  python recipes/train.py --data moons --objective vanilla --max-epochs 20
  python recipes/train.py --data ls --protect          # feature x1 immutable, as in the paper
  python recipes/train.py --data adult --immutable age --mutability hours_per_week=increase
  python recipes/train.py --config configs/adult.yaml --max-epochs 10
  python recipes/train.py --data moons --from-checkpoint vanilla.ckpt --max-epochs 50   # fine-tune with CT
  python recipes/train.py --data moons --from-checkpoint runs:/RUN_ID/model       # fine-tune a logged MLflow model
  python recipes/train.py --config config.yaml         # repeat a run from its logged config (a new run, own outputs)
  python recipes/train.py --resume                     # continue the newest interrupted run that has a checkpoint
  python recipes/train.py --resume RUN_ID --max-epochs 200   # extend a run to 200 epochs in total
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.settings import add_arguments
from ct_lightning.experiment.train import announce, train


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/train.py``, one option per row of the settings table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,  # only what the command line gives overrides the config file
        epilog="Precedence: SPEC defaults < the data set's Table 2 values [Table 2] < --config file < command line.")
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, train, and print where to find the run."""
    args = vars(build_parser().parse_args(argv))
    for key in ("limit_train_batches", "limit_val_batches"):
        if key in args and float(args[key]).is_integer() and (args[key] >= 1 or args[key] == 0):
            args[key] = int(args[key])
    try:
        summary = train(args)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(announce(summary))
    return summary


if __name__ == "__main__":
    main()
