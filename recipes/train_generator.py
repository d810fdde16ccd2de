"""Train a conditional counterfactual generator (Van Looveren et al.) for a trained classifier.

The classifier comes from an MLflow run of recipes/train.py (its checkpoints/last.ckpt artifact)
or a checkpoint file. The generator G(x, y_M, y_T, z) is trained against the frozen classifier on
the training split (MMD or conditional-GAN in-distribution loss), then evaluated on the test split
like the paper: MMD² overall and per class, ℓ1, ℓ0 (one-hot groups count as one feature) and
validity, side by side with a gradient search (ECCo by default) on the same factuals and targets.
Everything is logged to a new MLflow run tagged with the classifier's run id.

Examples:
  .venv/bin/python recipes/train_generator.py --data moons --run-id 1a6d42...
  .venv/bin/python recipes/train_generator.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --variant gan
  .venv/bin/python recipes/train_generator.py --run-id 1a6d42... --max-epochs 50 --summary-json gen.json
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe
from ct_lightning.experiment.configuration.validation import Rule

VARIANTS = catalogue.constant("ct_lightning.generators.amortised.training", "VARIANTS")


def _number(kind: str, low: float, low_open: bool = False):
    return Rule(kind, low=low, low_open=low_open).argtype()


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/train_generator.py``."""
    parser = recipe_parser(__doc__)
    add_arguments(parser.add_argument_group("classifier (one of)"), ["run_id", "checkpoint"])
    add_arguments(parser, ["data", "which", "tracking_uri", "experiment", "run_name"], data=None)
    gen = parser.add_argument_group("generator")
    gen.add_argument("--variant", choices=VARIANTS, default="mmd", help="in-distribution loss (default %(default)s)")
    add_arguments(gen, ["max_epochs", "batch_size", "hidden_sizes"], max_epochs=30, batch_size=256,
                  hidden_sizes=[64, 64])
    gen.add_argument("--noise-dim", type=_number("int", 0), default=4, help="size of the injected noise z (default %(default)s)")
    gen.add_argument("--w-m", type=_number("float", 0.0), default=1.0, help="weight of the prediction loss (default %(default)s)")
    gen.add_argument("--w-l1", type=_number("float", 0.0), default=0.1, help="weight of the ℓ1 sparsity loss (default %(default)s)")
    gen.add_argument("--w-chi", type=_number("float", 0.0), default=1.0, help="weight of the MMD / GAN loss (default %(default)s)")
    add_arguments(gen, ["lr", "seed", "protect", "all_mutable"], lr=1e-3, seed=0)
    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--n-eval", type=_number("int", 1), default=1000, help="test factuals evaluated (default %(default)s)")
    ev.add_argument("--baseline", default="ecco", type=Rule(choices=lambda: [*catalogue.generators(), "none"], lower=True).argtype(),
                    help="gradient search compared on the same factuals, or 'none' (default %(default)s)")
    add_arguments(ev, ["summary_json", "overwrite", "accelerator", "progress", "threads"], accelerator="cpu")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, train and evaluate the generator, log everything to MLflow."""
    from ct_lightning.experiment.workflows.train_generator import run  # noqa: PLC0415

    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-train-generator

if __name__ == "__main__":
    sys.exit(cli())
