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
  .venv/bin/python recipes/train.py --resume                     # continue the newest interrupted run that has a checkpoint
  .venv/bin/python recipes/train.py --resume RUN_ID --max-epochs 200   # extend a run to 200 epochs in total
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.cpu_math import apply_cpu_math
from ct_lightning.experiment.preflight import apply_threads, preflight_training, threads_for
from ct_lightning.experiment.settings import add_arguments
from ct_lightning.experiment.tracking import store_location
from ct_lightning.experiment.validation import KNOWN_ERRORS, Parser, console_entry, exit_on_error


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/train.py``, one option per row of the settings table."""
    parser = Parser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,  # only what the command line gives overrides the config file
        epilog="Precedence: SPEC defaults < the data set's Table 2 values [Table 2] < --config file < command line.")
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse and check the arguments, train, and print where to find the run.

    Every input is checked before torch, Lightning or MLflow is imported and before anything is written;
    a bad one ends with a one-line error (exit code 2 for a value, 1 for the environment).
    """
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    for key in ("limit_train_batches", "limit_val_batches"):
        if key in args and float(args[key]).is_integer() and (args[key] >= 1 or args[key] == 0):
            args[key] = int(args[key])
    try:
        checked = preflight_training(args)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    args = checked.overrides
    print(f"MLflow store: {store_location(args['tracking_uri'])}", flush=True)
    print(apply_cpu_math(args.get("cpu_math") or "native"), flush=True)  # before torch is imported
    from ct_lightning.experiment.train import announce, train  # noqa: PLC0415 - heavy: only after the checks

    given = checked.given
    print(apply_threads(threads_for(given.get("threads"), given.get("model"), given.get("accelerator"))), flush=True)
    try:
        summary = train(args)
    except (ValueError, OSError) as error:  # OSError: e.g. a checkpoint folder that filled up (one line, exit 1)
        exit_on_error(error, parser)
    print(announce(summary))
    return summary


cli = console_entry(main)  # the console script ct-train

if __name__ == "__main__":
    sys.exit(cli())
