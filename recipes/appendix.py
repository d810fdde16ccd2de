"""The paper's hyperparameter study (App. D and E), one grid per call, resumable.

Examples:
  # the whole study (all five grids, each on its data sets), 2 processes; re-run to resume
  python recipes/appendix.py --grid all --jobs 2
  # Note 7 (other parameters) on the four synthetic sets, 2 processes; re-run to resume
  python recipes/appendix.py --grid note7 --jobs 2
  # Note 9 on Moons only, into its own store
  python recipes/appendix.py --grid note9 --data moons --tracking-uri sqlite:///outputs/appendix/mlflow.db
  # the report (tables, box plots, maturity curves) from the finished grids' results
  python recipes/appendix.py --report

Each grid point trains on Note 1's defaults plus the grid's settings; vanilla points share one
training per data set (and per epoch count); --max-epochs sets the epochs of every point a grid does not
vary (tests; default Note 1's 100). Results go to <out-dir>/<grid>.json.
"""

from __future__ import annotations

import argparse
import sys

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.runner import console_entry, recipe_parser, run_recipe
from ct_lightning.experiment.workflows.appendix import grid_names, run


def build_parser() -> argparse.ArgumentParser:
    """The grid, data sets, store and size options."""
    parser = recipe_parser(__doc__)
    parser.add_argument("--grid", help=f"grid to run: {', '.join(grid_names())}, a grid YAML file, or all (the whole "
                        "study: note9, note11, note7, note5, note3, each on its data sets)")
    add_arguments(parser, ["data_sets", "jobs", "stack", "tracking_uri", "experiment", "out_dir", "max_epochs", "n_runs",
                           "n_individuals", "progress"], tracking_uri="sqlite:///outputs/appendix/mlflow.db",
                  experiment="ct-appendix", out_dir="outputs/appendix", max_epochs=None, recipe="appendix")
    parser.add_argument("--report", action="store_true", help="write docs/appendix.md's tables and plots from "
                        "the results in --out-dir")
    parser.add_argument("--docs-dir", default="docs/appendix", help="plot folder of --report (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run (or resume) one grid, or write the report."""
    return run_recipe(build_parser(), argv, run)


cli = console_entry(main)  # the console script ct-appendix

if __name__ == "__main__":
    sys.exit(cli())
