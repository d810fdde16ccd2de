"""``recipes/appendix.py``: run (or resume) one grid of the paper's hyperparameter study (``experiment.grids``),
or write the report of the finished grids (``experiment.appendix_report``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ct_lightning.experiment.runner import checking

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "grids"


def grid_names() -> list[str]:
    """The grids in ``configs/grids/``."""
    return sorted(path.stem for path in CONFIGS.glob("*.yaml"))


# The whole study (``--grid all``): the grids in the order the study runs them, smallest first, so that the larger
# grids reuse the trainings they share with the smaller ones (the BL, the default-setting points).
STUDY = ("note9", "note11", "note7", "note5", "note3")


def run(args: argparse.Namespace) -> dict:
    """Run (or resume) the grid of ``--grid`` on its data sets (``all``: every grid of the study, one after the
    other), or write the report (``--report``)."""
    from ct_lightning.experiment.configuration.preflight import check_raw_data  # noqa: PLC0415
    from ct_lightning.experiment.studies.grids import load_grid, run_grid  # noqa: PLC0415

    if args.report:
        from ct_lightning.experiment.studies.appendix_report import write_report  # noqa: PLC0415

        return write_report(Path(args.out_dir), Path(args.docs_dir))
    with checking():
        if not args.grid:
            raise ValueError("--grid: give a grid to run (or all), or --report")
        grids = [load_grid(name) for name in (STUDY if args.grid == "all" else [args.grid])]
        known = list(dict.fromkeys(d for grid in grids for d in grid.data))
        wanted = known if not args.data_sets else [d.strip() for d in args.data_sets.split(",") if d.strip()]
        unknown = [d for d in wanted if d not in known]
        if unknown:
            raise ValueError(f"--data: {', '.join(unknown)} not in grid {args.grid}; allowed: {', '.join(known)}")
        check_raw_data(wanted)  # a missing raw file stops here, not at each of the data set's trainings
    extra = {"max_epochs": args.max_epochs} if args.max_epochs else None
    started = time.perf_counter()
    results, failed = {}, False
    for grid in grids:
        datasets = [d for d in wanted if d in grid.data]  # in --data's order, as the results file is named
        if not datasets:
            continue
        suffix = "" if datasets == grid.data else "-" + "-".join(datasets)
        grid_started = time.perf_counter()
        results[grid.name] = run_grid(grid, datasets, args.tracking_uri,
                                      Path(args.out_dir) / f"{grid.name}{suffix}.json", jobs=args.jobs,
                                      experiment=args.experiment, extra=extra, n_runs=args.n_runs,
                                      n_individuals=args.n_individuals, stack=args.stack)
        failed = failed or bool(results[grid.name]["failures"])
        if len(grids) > 1:
            print(f"study: grid {grid.name} on {', '.join(datasets)} done in {time.perf_counter() - grid_started:.0f} s;"
                  f" {time.perf_counter() - started:.0f} s so far", flush=True)
    if failed:
        sys.exit(1)
    return results if len(grids) > 1 else results[grids[0].name]
