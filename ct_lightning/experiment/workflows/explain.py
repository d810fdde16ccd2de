"""``recipes/explain.py``: explain rows in their own units with a trained model (``experiment.explanations``),
print the explanations, write them as JSON and log them to the model's run."""

from __future__ import annotations

import argparse
from pathlib import Path

from ct_lightning.experiment.runs.atomic_files import write_json_atomic
from ct_lightning.experiment.runner import checking
from ct_lightning.experiment.configuration.validation import (EnvironmentProblem, check_checkpoint_file, check_output_file,
                                                check_run_ids)

SEARCH = ["generator", "tau", "max_steps", "epsilon", "lambda_cost", "lambda_energy", "search_lr", "generator_options"]


def run(args: argparse.Namespace) -> list[dict]:
    """Check the inputs, load the model, explain every row, print, write ``--json`` and log to the run."""
    with checking():
        check_output_file("--json", args.json, args.overwrite)
        check_checkpoint_file("--checkpoint", args.checkpoint)
        if args.rows and not Path(args.rows).is_file():
            raise EnvironmentProblem(f"--rows: no file at {args.rows}")
        if args.run_id:
            check_run_ids("--run-id", [args.run_id], args.tracking_uri)
        from ct_lightning.experiment.runs.explanations import (check_rows, explain_loaded, load_explainable,  # noqa: PLC0415
                                                          log_explanations, read_rows, search_settings)

        rows = read_rows(args.rows, args.row)
        loaded = load_explainable(args.run_id, args.checkpoint, args.tracking_uri, args.which)
        rows, notes = check_rows(rows, loaded, "--rows" if args.rows else "--row")
        for note in notes:
            print(f"note: {note}")
        settings = search_settings(loaded.module, {k: getattr(args, k) for k in SEARCH})
        explanations = explain_loaded(loaded, rows, args.target, settings, args.seed)
    from ct_lightning.evaluation.explanation import describe, to_records  # noqa: PLC0415

    print(describe(explanations))
    records = to_records(explanations)
    if args.json:
        write_json_atomic(args.json, records)
    if args.run_id and args.log:
        print(f"logged {log_explanations(args.tracking_uri, args.run_id, explanations)}/ to run {args.run_id}")
    return records
