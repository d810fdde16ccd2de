"""The published Tables 1 and 3, and tables that put a reproduction beside them.

Two versions of Table 1 exist (see ``PUBLISHED``):

- ``arxiv``: the July 2025 arXiv preprint, transcribed from ``papers/counterfactual-training-2025-07.txt``
  (Table 1: reduction in % ± spread, ``*`` significant; Table 3: mean outcomes of CT and BL with the 99%
  interval of the difference). The authors generated it from the ``final_run`` configurations
  (``paper/experiments/configs/final_run/`` of CounterfactualTraining.jl).
- ``satml``: the authors' final table ``paper/tables/main.tex`` at CounterfactualTraining.jl commit
  94e80a16a2a1f05cd118d6304c7d8d8550755095 (HEAD, 2026-02-19; the file last changed in 29c7ef74 "final
  runs", 2026-01-14), from the January 2026 ``satml`` runs (``paper/experiments/configs/satml/``,
  ``evaluations/satml/``; ``FINAL_MAIN_RESULTS`` in the repository's ``.env``), which ``--protocol
  reference`` follows. Numbers transcribed by hand (values, "±" and stars only).
"""

from __future__ import annotations

import math

from ct_lightning.metrics.names import METRICS as METRIC_TABLE, table_label


def paper_label(data: str) -> str:
    """The paper's row label of data set ``data``: its data module's ``paper_label`` (else the name; a table
    file's stem, and its sheet: :func:`datamodules.workbook.table_label`)."""
    from datamodules import get_datamodule_class  # noqa: PLC0415 - the data modules hold the facts
    from datamodules.table import is_table_path  # noqa: PLC0415
    from datamodules.workbook import table_label as file_label  # noqa: PLC0415

    try:
        return get_datamodule_class(data).label()
    except ValueError:
        return file_label(data) if is_table_path(data) else data


def published_label(row: dict) -> str | None:
    """The paper's row label of a Table 1 row of a built-in data set, ``None`` for any other (a user's table
    named like a built-in set, ``credit.csv``, is not the paper's data). Rows written before ``built_in`` was
    recorded count as built-in."""
    return paper_label(row["data"]) if row.get("built_in", True) else None


def row_label(row: dict) -> str:
    """The label a table shows for ``row``: the paper's for a built-in set, else the row's own name."""
    return published_label(row) or row["data"]


# Table 1: (reduction %, ± , significant) for IP, IP*, cost
PAPER_TABLE1 = {
    "LS": {"ip": (29.05, 0.67, True), "ip_star": (55.33, 2.03, True), "cost": (14.07, 0.60, True)},
    "Circ": {"ip": (56.29, 0.44, True), "ip_star": (89.38, 9.30, True), "cost": (45.55, 0.76, True)},
    "Moon": {"ip": (20.62, 0.69, True), "ip_star": (19.26, 8.12, True), "cost": (2.86, 1.03, True)},
    "OL": {"ip": (-1.13, 0.88, False), "ip_star": (-24.52, 14.52, False), "cost": (38.39, 2.21, True)},
    "Adult": {"ip": (0.77, 1.34, False), "ip_star": (32.29, 6.87, True), "cost": (-2.82, 4.88, False)},
    "CH": {"ip": (12.05, 1.41, True), "ip_star": (70.27, 3.72, True), "cost": (40.71, 1.55, True)},
    "Cred": {"ip": (12.31, 1.84, True), "ip_star": (54.89, 11.21, True), "cost": (-17.43, 5.17, True)},
    "GMSC": {"ip": (23.44, 1.99, True), "ip_star": (73.31, 4.83, True), "cost": (62.64, 2.04, True)},
    "MNIST": {"ip": (7.05, 1.80, True), "ip_star": (-25.09, 109.05, False), "cost": (-12.34, 6.52, False)},
}

# Table 1 of the satml runs: CounterfactualTraining.jl paper/tables/main.tex at 94e80a16 (see the docstring)
SATML_TABLE1 = {
    "LS": {"ip": (26.26, 0.67, True), "ip_star": (51.28, 2.01, True), "cost": (16.41, 0.57, True)},
    "Circ": {"ip": (58.88, 0.37, True), "ip_star": (93.84, 6.70, True), "cost": (42.99, 0.85, True)},
    "Moon": {"ip": (19.59, 0.73, True), "ip_star": (8.00, 9.44, False), "cost": (5.16, 1.00, True)},
    "OL": {"ip": (-1.93, 1.12, False), "ip_star": (-27.70, 14.59, False), "cost": (40.86, 2.30, True)},
    "Adult": {"ip": (0.19, 1.05, False), "ip_star": (34.35, 5.61, True), "cost": (4.03, 4.03, False)},
    "CH": {"ip": (10.65, 1.47, True), "ip_star": (63.06, 4.25, True), "cost": (44.23, 1.43, True)},
    "Cred": {"ip": (10.14, 1.59, True), "ip_star": (50.35, 12.26, True), "cost": (-18.17, 4.40, True)},
    "GMSC": {"ip": (10.65, 2.28, True), "ip_star": (24.75, 4.84, True), "cost": (66.01, 1.41, True)},
    "MNIST": {"ip": (6.36, 1.70, True), "ip_star": (-70.31, 217.60, False), "cost": (-35.11, 6.96, True)},
}

# The published versions of Table 1: key → (title, table, where it came from)
PUBLISHED = {
    "arxiv": ("arXiv July 2025", PAPER_TABLE1,
              "papers/counterfactual-training-2025-07.txt, Table 1; generated from the final_run configurations "
              "(CounterfactualTraining.jl paper/experiments/configs/final_run/)"),
    "satml": ("authors' final table (satml runs)", SATML_TABLE1,
              "CounterfactualTraining.jl paper/tables/main.tex at 94e80a16; generated from the satml "
              "configurations (paper/experiments/configs/satml/, evaluations/satml/)"),
}

# Table 3: (CT mean, BL mean, LB, UB) per metric
PAPER_TABLE3 = {
    "cost": {"Adult": (2.26, 2.2, -0.22, 0.28), "CH": (1.46, 2.46, -1.1, -0.89), "Circ": (0.67, 1.23, -0.58, -0.53),
             "Cred": (2.68, 2.29, 0.16, 0.63), "GMSC": (1.14, 3.05, -2.45, -1.77), "LS": (3.82, 4.44, -0.7, -0.56),
             "MNIST": (77.04, 68.67, -3.47, 18.34), "Moon": (1.55, 1.6, -0.08, -0.01), "OL": (1.62, 2.63, -1.15, -0.81)},
    "ip_star": {"Adult": (0.07, 0.11, -0.06, -0.01), "CH": (0.02, 0.06, -0.06, -0.04), "Circ": (0.0, 0.0, -0.01, -0.0),
                "Cred": (0.03, 0.06, -0.05, -0.01), "GMSC": (0.02, 0.07, -0.06, -0.04), "LS": (0.1, 0.23, -0.14, -0.12),
                "MNIST": (0.04, 0.04, -0.1, 0.09), "Moon": (0.02, 0.02, -0.01, -0.0), "OL": (0.12, 0.09, -0.01, 0.05)},
    "ip": {"Adult": (15.03, 15.15, -0.68, 0.26), "CH": (6.61, 7.52, -1.17, -0.63), "Circ": (1.03, 2.36, -1.37, -1.29),
           "Cred": (19.31, 22.03, -3.69, -1.74), "GMSC": (6.19, 8.09, -2.4, -1.49), "LS": (2.41, 3.4, -1.04, -0.94),
           "MNIST": (258.83, 278.54, -30.49, -7.64), "Moon": (1.36, 1.71, -0.38, -0.32), "OL": (4.49, 4.44, -0.03, 0.13)},
}

# The columns the published tables have (a fact of the papers; their labels come from the metric table).
METRICS = ("ip", "ip_star", "cost")


def __getattr__(name: str):
    if name == "HEADERS":  # Table 1's headers of the published columns, e.g. ``IP* (−%)``
        return {metric: table_label(metric) for metric in METRICS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def verdict(ours: float, ours_significant: bool, paper: float, paper_significant: bool) -> str:
    """Per-cell agreement: ``same`` (direction and significance), ``direction only``, ``significance only``
    (both insignificant cells count as the same direction), ``opposite`` or ``n/a``."""
    if not _finite(ours):
        return "n/a"
    same_direction = (ours > 0) == (paper > 0) or (not ours_significant and not paper_significant)
    if same_direction and ours_significant == paper_significant:
        return "same"
    if same_direction:
        return "direction only"
    return "opposite" if ours_significant and paper_significant else "significance only"


def _cell(value, se, significant) -> str:
    if not _finite(value):
        return "n/a"
    return f"{value:.2f} ± {f'{se:.2f}' if _finite(se) else 'n/a'}{'*' if significant else ''}"


def beside_paper_table(rows: list[dict], published: str = "arxiv") -> str:
    """Markdown: our Table 1 cells beside a published Table 1 (``PUBLISHED`` key), with a verdict per cell."""
    table = PUBLISHED[published][1]
    header = ["Data"]
    for metric in METRICS:
        header += [f"{table_label(metric)} ours", "paper", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        paper = table.get(published_label(row))
        cells = [row_label(row)]
        for metric in METRICS:
            ours = row.get(f"{metric}_reduction_pct")
            sig = bool(row.get("significant", {}).get(metric))
            cells.append(_cell(ours, row.get(f"{metric}_se"), sig))
            if paper:
                value, se, paper_sig = paper[metric]
                cells += [_cell(value, se, paper_sig), verdict(ours, sig, value, paper_sig)]
            else:
                cells += ["—", "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean(row: dict, side: str, metric: str):
    block = row.get(side, {})
    return block.get("cost") if metric == "cost" else block.get(metric)


def table3_beside_paper(rows: list[dict]) -> str:
    """Markdown: Table 3's mean outcomes (CT, BL) and the interval of CT − BL, ours beside the paper's."""
    header = ["Variable", "Data", "CT ours", "BL ours", "CT−BL interval ours", "CT paper", "BL paper",
              "interval paper"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric in METRICS:
        for row in rows:
            label = row_label(row)
            ct, bl = _mean(row, "ct", metric), _mean(row, "bl", metric)
            low, high = row.get(f"{metric}_ci_low"), row.get(f"{metric}_ci_high")
            paper = PAPER_TABLE3[metric].get(published_label(row))
            fmt = (lambda v: f"{v:.3g}" if _finite(v) else "n/a")  # noqa: E731
            cells = [METRIC_TABLE[metric].label, label, fmt(ct), fmt(bl), f"[{fmt(low)}, {fmt(high)}]"]
            cells += [fmt(paper[0]), fmt(paper[1]), f"[{fmt(paper[2])}, {fmt(paper[3])}]"] if paper else ["—"] * 3
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def agreement_counts(rows: list[dict], published: str = "arxiv") -> dict[str, int]:
    """How many cells of :func:`beside_paper_table` got each verdict."""
    counts: dict[str, int] = {}
    for row in rows:
        paper = PUBLISHED[published][1].get(published_label(row))
        if not paper:
            continue
        for metric in METRICS:
            value, _, paper_sig = paper[metric]
            key = verdict(row.get(f"{metric}_reduction_pct"), bool(row.get("significant", {}).get(metric)), value,
                          paper_sig)
            counts[key] = counts.get(key, 0) + 1
    return counts


def paper_comparison(rows: list[dict]) -> str:
    """Markdown of one seed's rows beside both published Tables 1 (with verdict counts) and Table 3."""
    parts = []
    for key, (title, _, source) in PUBLISHED.items():
        counts = agreement_counts(rows, key)
        listed = ", ".join(f"{counts.get(v, 0)} {v}" for v in ("same", "direction only", "significance only",
                                                                  "opposite", "n/a"))
        parts.append(f"## Table 1 beside the {title}\n\nSource: {source}.\n\n" + beside_paper_table(rows, key)
                     + f"\nVerdicts over {sum(counts.values())} cells: {listed}.\n")
    parts.append("## Table 3 means beside the paper's (arXiv July 2025)\n\n" + table3_beside_paper(rows))
    return "\n".join(parts)
