"""``recipes/appendix.py``: run (or resume) one grid of the paper's hyperparameter study (``experiment.grids``),
or write the report of the finished grids (``experiment.appendix_report``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ct_lightning.experiment.runner import checking

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "grids"


def grid_names() -> list[str]:
    """The grids in ``configs/grids/``."""
    return sorted(path.stem for path in CONFIGS.glob("*.yaml"))


def run(args: argparse.Namespace) -> dict:
    """Run (or resume) the grid of ``--grid`` on its data sets, or write the report (``--report``)."""
    from ct_lightning.experiment.configuration.preflight import check_raw_data  # noqa: PLC0415
    from ct_lightning.experiment.studies.grids import load_grid, run_grid  # noqa: PLC0415

    if args.report:
        from ct_lightning.experiment.studies.appendix_report import write_report  # noqa: PLC0415

        return write_report(Path(args.out_dir), Path(args.docs_dir))
    with checking():
        if not args.grid:
            raise ValueError("--grid: give a grid to run, or --report")
        grid = load_grid(args.grid)
        datasets = grid.data if not args.data_sets else [d.strip() for d in args.data_sets.split(",") if d.strip()]
        unknown = [d for d in datasets if d not in grid.data]
        if unknown:
            raise ValueError(f"--data: {', '.join(unknown)} not in grid {grid.name}; allowed: {', '.join(grid.data)}")
        check_raw_data(datasets)  # a missing raw file stops here, not at each of the data set's trainings
    extra = {"max_epochs": args.max_epochs} if args.max_epochs else None
    suffix = "" if datasets == grid.data else "-" + "-".join(datasets)
    results = run_grid(grid, datasets, args.tracking_uri, Path(args.out_dir) / f"{grid.name}{suffix}.json",
                       jobs=args.jobs, experiment=args.experiment, extra=extra, n_runs=args.n_runs,
                       n_individuals=args.n_individuals, stack=args.stack)
    if results["failures"]:
        sys.exit(1)
    return results
