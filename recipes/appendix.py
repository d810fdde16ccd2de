"""The paper's hyperparameter study (App. D and E), one grid per call, resumable.

Examples:
  # Note 7 (other parameters) on the four synthetic sets, 2 processes; re-run to resume
  python recipes/appendix.py --grid note7 --jobs 2
  # Note 9 on Moons only, into its own store
  python recipes/appendix.py --grid note9 --data moons --tracking-uri sqlite:///outputs/appendix/mlflow.db
  # the report (tables, box plots, maturity curves) from the finished grids' results
  python recipes/appendix.py --report

Each grid point trains on Note 1's defaults plus the grid's settings; vanilla points share one
training per data set (and per epoch count). Results go to <out-dir>/<grid>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ct_lightning.experiment.validation import Rule, console_entry


def build_parser() -> argparse.ArgumentParser:
    """The grid, data sets, store and size options."""
    grids = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs" / "grids").glob("*.yaml"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", help=f"grid to run: {', '.join(grids)}, or a grid YAML file")
    parser.add_argument("--data", default=None, help="comma-separated data sets (default: the grid's)")
    parser.add_argument("--jobs", type=Rule("int", low=1).argtype(), default=1, help="worker processes (default 1)")
    parser.add_argument("--tracking-uri", default="sqlite:///outputs/appendix/mlflow.db",
                        help="MLflow store (default %(default)s)")
    parser.add_argument("--experiment", default="ct-appendix", help="MLflow experiment (default %(default)s)")
    parser.add_argument("--out-dir", default="outputs/appendix", help="results folder (default %(default)s)")
    parser.add_argument("--max-epochs", type=Rule("int", low=1).argtype(), default=None,
                        help="epochs of every point a grid does not vary (tests; default Note 1's 100)")
    parser.add_argument("--n-runs", type=Rule("int", low=1).argtype(), default=None,
                        help="evaluation runs per model (default: the reference protocol's 100)")
    parser.add_argument("--n-individuals", type=Rule("int", low=1).argtype(), default=None,
                        help="factuals per run (default: the reference protocol's)")
    parser.add_argument("--report", action="store_true", help="write docs/appendix.md's tables and plots from "
                        "the results in --out-dir")
    parser.add_argument("--docs-dir", default="docs/appendix", help="plot folder of --report (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run (or resume) one grid, or write the report."""
    from ct_lightning.experiment.grids import load_grid, run_grid

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.report:
        from ct_lightning.experiment.appendix_report import write_report

        return write_report(Path(args.out_dir), Path(args.docs_dir))
    if not args.grid:
        parser.error("--grid: give a grid to run, or --report")
    try:
        grid = load_grid(args.grid)
    except ValueError as error:
        parser.error(f"--{error}")
    datasets = grid.data if not args.data else [d.strip() for d in args.data.split(",") if d.strip()]
    unknown = [d for d in datasets if d not in grid.data]
    if unknown:
        parser.error(f"--data: {', '.join(unknown)} not in grid {grid.name}; allowed: {', '.join(grid.data)}")
    extra = {"max_epochs": args.max_epochs} if args.max_epochs else None
    suffix = "" if datasets == grid.data else "-" + "-".join(datasets)
    results = run_grid(grid, datasets, args.tracking_uri, Path(args.out_dir) / f"{grid.name}{suffix}.json",
                       jobs=args.jobs, experiment=args.experiment, extra=extra, n_runs=args.n_runs,
                       n_individuals=args.n_individuals)
    if results["failures"]:
        sys.exit(1)
    return results


cli = console_entry(main)  # the console script ct-appendix

if __name__ == "__main__":
    sys.exit(cli())
