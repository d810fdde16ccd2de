"""The table over training seeds of ``recipes/compare.py --seeds``: the per-seed tables aggregated
(``evaluation.seeds``), beside both published tables, written and logged to a parent run of the per-seed runs."""

from __future__ import annotations

import math
from pathlib import Path

from ct_lightning.experiment.runs.atomic_files import atomic_file, write_json_atomic, write_text_atomic


def write_seed_outputs(summaries: dict[int, dict], args, names: list[str], client, artifact_location,
                       command: str, out_dir: Path) -> dict:
    """Aggregate the per-seed tables; write table.md, table.csv, summary.json and paper_comparison.md to
    ``out_dir`` and log them to a parent run whose children are the per-seed parent runs. On a tracking server
    its writes (and the per-seed runs' ``mlflow.parentRunId`` tags) survive an outage in
    ``out_dir/mlflow-outbox``, as the per-seed parents' do (:mod:`.parent_outbox`)."""
    import csv  # noqa: PLC0415

    from ct_lightning.evaluation.compare import constraint_notes  # noqa: PLC0415
    from ct_lightning.evaluation.paper import PUBLISHED  # noqa: PLC0415
    from ct_lightning.evaluation.seeds import (ROBUST_SHARE, aggregate_rows, aggregate_table,  # noqa: PLC0415
                                               beside_published_table, flat_aggregates, per_seed_table,
                                               robust_counts)
    from ct_lightning.experiment.studies.reproduce import find_or_create_parent, stable_key  # noqa: PLC0415
    from ct_lightning.experiment.workflows.parent_outbox import (end_pending, log_metrics_once,  # noqa: PLC0415
                                                                  parent_client)

    seeds = sorted(summaries)
    key = stable_key({"seeds": {str(s): summaries[s]["reproduction_key"] for s in seeds}})
    from ct_lightning.experiment.workflows.compare import parent_run_name  # noqa: PLC0415

    parent = find_or_create_parent(client, args.experiment, artifact_location, key,
                                   parent_run_name(names, args, seeds))
    client = parent_client(client, args.tracking_uri, parent, out_dir)
    for seed in seeds:
        client.set_tag(summaries[seed]["parent_run_id"], "mlflow.parentRunId", parent)
    client.log_param(parent, "seeds", ",".join(map(str, seeds)))
    client.log_param(parent, "data", ",".join(names))
    client.log_param(parent, "protocol", args.protocol)
    rows_by_seed = {s: summaries[s]["rows"] for s in seeds}
    aggregates = aggregate_rows(rows_by_seed, args.confidence)
    need = f"{math.ceil(ROBUST_SHARE * len(seeds) - 1e-9)} of {len(seeds)}"
    table = ("## Table 1 over training seeds " + ", ".join(map(str, seeds)) + "\n\n" + aggregate_table(aggregates)
             + f"\nmean ± SD over seeds of the per-seed reductions [min, max], k*/n: seeds with a star (the "
               f"per-seed 99% interval of per-run differences excludes 0); p: two-sided one-sample t-test of "
               f"the per-seed reductions against 0.\n\n## Every seed\n\n" + per_seed_table(rows_by_seed))
    notes = constraint_notes(rows_by_seed[seeds[0]])  # every seed evaluates each pair under the same constraints
    table += f"\n{notes}" if notes else ""
    comparison = []
    for published, (title, _, source) in PUBLISHED.items():
        listed = {kind: ", ".join(f"{v} {k}" for k, v in sorted(robust_counts(aggregates, published, kind).items(),
                                                               key=lambda kv: -kv[1]))
                  for kind in ("robust", "t_verdict")}
        comparison.append(f"## Beside the {title}\n\nSource: {source}.\n\n"
                          + beside_published_table(aggregates, published)
                          + f"\nk*/n: seeds with a star; p: t-test of the per-seed reductions against 0; "
                            f"sign/sig/both: in how many seeds our cell has the published sign, significance, "
                            f"and both; robust verdict: the per-seed verdict of at least {need} seeds, else "
                            f"seed-dependent; t-test verdict: the verdict of the mean over seeds, significant when "
                            f"p < {1 - args.confidence:.2g}.\n\nRobust verdicts: {listed['robust']}. "
                            f"t-test verdicts: {listed['t_verdict']}.\n")
    metrics = {}
    for metric in ("ip", "ip_star", "cost"):
        for row in aggregates:
            cell = row[metric]
            if cell["n_seeds"]:
                metrics[f"{row['data']}/{metric}_mean"] = float(cell["mean"])
                if cell["n_seeds"] > 1:
                    metrics[f"{row['data']}/{metric}_sd"] = float(cell["sd"])
    log_metrics_once(client, parent, metrics)
    summary = {"parent_run_id": parent, "tracking_uri": args.tracking_uri, "command": command, "seeds": seeds,
               "protocol": args.protocol, "confidence": args.confidence, "robust_share": ROBUST_SHARE,
               "aggregate": aggregates,
               "robust_counts": {k: robust_counts(aggregates, k) for k in PUBLISHED},
               "t_verdict_counts": {k: robust_counts(aggregates, k, "t_verdict") for k in PUBLISHED},
               "per_seed": {str(s): {"parent_run_id": summaries[s]["parent_run_id"],
                                     "out_dir": str(out_dir / f"s{s}"),
                                     "rows": [{k: v for k, v in row.items() if k not in ("robust_curves", "details", "protocol")}
                                              for row in summaries[s]["rows"]]} for s in seeds},
               "table_markdown": table}
    write_text_atomic(out_dir / "table.md", table)
    write_text_atomic(out_dir / "paper_comparison.md", "\n".join(comparison))
    flat = flat_aggregates(aggregates)
    columns: list[str] = []
    for entry in flat:
        columns += [k for k in entry if k not in columns]
    with atomic_file(out_dir / "table.csv") as temporary, open(temporary, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
    summary_path = Path(args.summary_json or out_dir / "summary.json")
    write_json_atomic(summary_path, summary, strict=True)
    for path in (out_dir / "table.md", out_dir / "paper_comparison.md", out_dir / "table.csv", summary_path):
        client.log_artifact(parent, str(path))
    client.set_terminated(parent, "FINISHED")  # kept in the outbox if the server went away
    end_pending(client, summary, args, out_dir)
    print(table)
    print("\n".join(comparison))
    print(f"MLflow parent run: {parent} (per-seed parent runs are its children); outputs in {out_dir}")
    return summary
