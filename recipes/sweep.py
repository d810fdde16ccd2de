"""Grid or random search over any training option, on Ray Tune, one MLflow child run per trial.

Examples:
  # the paper's penalty grid (App. D, Note 5) on Moons, 2 trials at a time on this machine
  python recipes/sweep.py --data moons --param lambda_adv=0.1,0.25,1.0 --param lambda_div=0.01,0.1,1.0 \\
      --param lambda_reg=0.0,0.01,0.1,0.25,0.5 --param generator=ecco,generic,revise \\
      --param objective=full,vanilla --max-concurrent 2 --metric val/ip --mode min --eval-every 100
  # 20 random combinations on a Ray cluster, 1 GPU per trial
  python recipes/sweep.py --data adult --search random --num-samples 20 --param tau=0.5,0.75,0.9 \\
      --param lambda_reg=0.01,0.1,0.5 --address auto --gpus-per-trial 1
  # without Ray: local processes
  python recipes/sweep.py --executor local --jobs 2 --param nce=100,1000 --max-epochs 10

Every training option of recipes/train.py sets the base of all trials. Re-run the same command to
resume an interrupted sweep: finished trials are reused. Needs the sweep extra for Ray:
pip install -e ".[sweep]".
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.configuration.sweep_space import EXECUTORS, MODES, SEARCHES
from ct_lightning.experiment.configuration.validation import Rule
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe

# checked as they are parsed: --num-samples 0 is refused at once, with what is allowed
POSITIVE, COUNT, AMOUNT = (Rule(kind, low=low).argtype() for kind, low in (("int", 1), ("int", 0), ("float", 0)))


def build_parser() -> argparse.ArgumentParser:
    """The training options (base of every trial) plus the sweep's own."""
    parser = recipe_parser(__doc__, argument_default=argparse.SUPPRESS)
    add_arguments(parser)
    group = parser.add_argument_group("sweep")
    group.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2,...",
                       help="a training setting that defines the model, and its values (repeat for more; ';' "
                            "separates values that contain commas, e.g. hidden_sizes=32;64,64)")
    group.add_argument("--search", choices=SEARCHES, default="grid", help="grid: every combination (default); "
                       "random: --num-samples combinations drawn at random")
    group.add_argument("--num-samples", type=POSITIVE, default=10,
                       help="combinations for --search random (default 10)")
    group.add_argument("--sweep-seed", type=int, default=0, help="seed of the random draw of combinations")
    group.add_argument("--metric", default="val/acc", help="objective: any metric logged on the trial runs, "
                       "e.g. val/acc, val/ip, val/ip_star (with --eval-every) (default val/acc)")
    group.add_argument("--mode", choices=MODES, default="max", help="maximise or minimise --metric (default max)")
    group.add_argument("--executor", choices=EXECUTORS, default="ray",
                       help="ray: Ray Tune trials (default); local: --jobs local processes, no Ray needed")
    group.add_argument("--address", default=None, help="Ray cluster to join (auto, ray://HOST:10001); "
                       "default: start a local Ray")
    group.add_argument("--cpus-per-trial", type=AMOUNT, default=1, help="CPUs per trial (default 1; also its "
                       "torch threads)")
    group.add_argument("--gpus-per-trial", type=AMOUNT, default=0, help="GPUs per trial (default 0)")
    group.add_argument("--max-concurrent", type=COUNT, default=0, help="most trials at once (default 0: as many "
                       "as the resources allow)")
    add_arguments(group, ["jobs"])
    group.add_argument("--sweep-name", default=None, help="name of the parent MLflow run")
    group.add_argument("--sweep-json", default=None, help="also write the sweep summary here")
    group.add_argument("--storage-path", default=None, help="Ray Tune's experiment folder (default: ray/ beside "
                       "a local SQLite store)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, run or resume the sweep, print the best trial."""
    from ct_lightning.experiment.workflows.sweep import run  # noqa: PLC0415

    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-sweep

if __name__ == "__main__":
    sys.exit(cli())
