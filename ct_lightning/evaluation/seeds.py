"""Table 1 over several training seeds: per-cell mean and spread, agreement with a published table, verdicts.

Each training seed gives one Table 1 row per data set (:func:`ct_lightning.evaluation.compare.table_row`):
BL and CT trained with that seed, evaluated with the same protocol. Per cell (data set × IP, IP*, cost)
this module reports, over the seeds with a finite value:

- ``mean``, ``sd`` (sample SD, ddof 1), ``min``, ``max`` of the per-seed reductions (%), and how many
  seeds carry a star (``n_significant``) and a positive sign (``n_positive``);
- ``t``/``p``: a two-sided one-sample t-test of the per-seed reductions against 0. A training seed is
  the unit that replicates CT's effect (the per-seed star only measures the evaluation runs' noise
  around one trained pair), so ``p < 1 − confidence`` says CT's effect has that sign across trainings;
- per published table: in how many seeds the sign, the significance and both (the per-seed verdict
  ``same``) agree with the published cell;
- ``robust``: the seed-robust verdict against that table: the per-seed verdict (same, direction only,
  significance only, opposite) that at least ``ceil(share · n_seeds)`` seeds give (share 0.8: 4 of 5),
  else ``seed-dependent``; ``n/a`` when fewer than two seeds have a value. With 5 seeds, a cell whose
  per-seed verdict were a coin flip would reach 4 of 5 in 19% of cases, so the rule tolerates one
  outlying seed without calling noise robust.
"""

from __future__ import annotations

import math

import numpy as np

from ct_lightning.evaluation.paper import METRICS, PUBLISHED, published_label, row_label, verdict
from ct_lightning.metrics.names import table_label

ROBUST_SHARE = 0.8
VERDICTS = ("same", "direction only", "significance only", "opposite")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def t_test(values) -> tuple[float, float]:
    """Two-sided one-sample t-test of ``values`` against 0: ``(t, p)``; NaN for fewer than two values.

    Zero spread gives ``t = ±inf, p = 0`` for a non-zero mean and ``p = 1`` for a zero mean.
    """
    from scipy import stats  # noqa: PLC0415 - installed with MLflow; only needed here

    values = np.asarray([v for v in values if _finite(v)], dtype=float)
    if values.size < 2:
        return math.nan, math.nan
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if sd == 0.0:
        return (math.copysign(math.inf, mean), 0.0) if mean != 0.0 else (0.0, 1.0)
    t = mean / (sd / math.sqrt(values.size))
    return float(t), float(2.0 * stats.t.sf(abs(t), values.size - 1))


def robust_verdict(per_seed: list[str], share: float = ROBUST_SHARE) -> str:
    """The verdict given by at least ``ceil(share · n)`` of the per-seed verdicts (``n/a`` ones left out),
    else ``seed-dependent``; ``n/a`` with fewer than two seeds."""
    known = [v for v in per_seed if v != "n/a"]
    if len(known) < 2:
        return "n/a"
    need = math.ceil(share * len(known) - 1e-9)
    for name in VERDICTS:
        if known.count(name) >= need:
            return name
    return "seed-dependent"


def aggregate_cell(values: list[float], significant: list[bool], confidence: float = 0.99,
                   share: float = ROBUST_SHARE, label: str | None = None, metric: str | None = None) -> dict:
    """Aggregate one cell over seeds (``values[i]``, ``significant[i]`` of seed ``i``; see the module docstring)."""
    keep = [i for i, v in enumerate(values) if _finite(v)]
    vals = np.asarray([values[i] for i in keep], dtype=float)
    sigs = [bool(significant[i]) for i in keep]
    t, p = t_test(vals)
    cell = {"values": [v if _finite(v) else None for v in values], "significant": [bool(s) for s in significant],
            "n_seeds": len(keep), "n_significant": sum(sigs), "n_positive": int((vals > 0).sum()),
            "mean": float(vals.mean()) if vals.size else math.nan,
            "sd": float(vals.std(ddof=1)) if vals.size > 1 else math.nan,
            "min": float(vals.min()) if vals.size else math.nan, "max": float(vals.max()) if vals.size else math.nan,
            "t": t, "p": p, "t_significant": bool(_finite(p) and p < 1.0 - confidence), "published": {}}
    if label is None or metric is None:
        return cell
    for key, (_, table, _) in PUBLISHED.items():
        if label not in table:
            continue
        value, _, paper_sig = table[label][metric]
        per_seed = [verdict(float(v), s, value, paper_sig) for v, s in zip(vals, sigs)]
        cell["published"][key] = {
            "value": value, "significant": paper_sig, "per_seed": per_seed,
            "sign_agrees": sum((v > 0) == (value > 0) for v in vals),
            "significance_agrees": sum(s == paper_sig for s in sigs),
            "same": per_seed.count("same"), "robust": robust_verdict(per_seed, share),
            "t_verdict": verdict(cell["mean"], cell["t_significant"], value, paper_sig) if vals.size > 1 else "n/a"}
    return cell


def aggregate_rows(rows_by_seed: dict[int, list[dict]], confidence: float = 0.99,
                   share: float = ROBUST_SHARE) -> list[dict]:
    """One aggregate row per data set (in the first seed's order) from each seed's Table 1 rows."""
    seeds = sorted(rows_by_seed)
    names = [row["data"] for row in rows_by_seed[seeds[0]]]
    out = []
    for name in names:
        rows = [next((r for r in rows_by_seed[s] if r["data"] == name), None) for s in seeds]
        first = next(r for r in rows if r)
        aggregate = {"data": name, "label": row_label(first), "seeds": seeds}
        for metric in METRICS:
            values = [r.get(f"{metric}_reduction_pct", math.nan) if r else math.nan for r in rows]
            sigs = [bool(r.get("significant", {}).get(metric)) if r else False for r in rows]
            aggregate[metric] = aggregate_cell(values, sigs, confidence, share, published_label(first), metric)
        out.append(aggregate)
    return out


def _num(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if _finite(value) else "n/a"


def format_aggregate(cell: dict) -> str:
    """``mean ± SD [min, max] k*/n``, e.g. ``24.50 ± 3.10 [20.1, 29.0] 5*/5``."""
    if not cell["n_seeds"]:
        return "n/a"
    return (f"{_num(cell['mean'])} ± {_num(cell['sd'])} [{_num(cell['min'], 1)}, {_num(cell['max'], 1)}] "
            f"{cell['n_significant']}*/{cell['n_seeds']}")


def _p(value) -> str:
    if not _finite(value):
        return "n/a"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def aggregate_table(aggregates: list[dict]) -> str:
    """Markdown: per cell the mean ± SD [min, max] over seeds, starred seeds, and the across-seed t-test p."""
    header = ["Data"]
    for metric in METRICS:
        header += [f"{table_label(metric)} over seeds", "p (t-test)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in aggregates:
        cells = [row["label"]]
        for metric in METRICS:
            cells += [format_aggregate(row[metric]), _p(row[metric]["p"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"




def _published_cell(value, se, significant) -> str:
    return f"{value:.2f} ± {se:.2f}{'*' if significant else ''}"


def beside_published_table(aggregates: list[dict], published: str) -> str:
    """Markdown: per cell our mean over seeds (starred seeds, t-test p), the published cell, sign/significance/
    both agreement counts (of n seeds), the seed-robust verdict and the verdict of the across-seed t-test."""
    title, table, _ = PUBLISHED[published]
    header = ["Data"]
    for metric in METRICS:
        header += [f"{table_label(metric)} ours: mean (k*/n; p)", title, "sign/sig/both agree", "robust verdict",
                   "t-test verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in aggregates:
        cells = [row["label"]]
        for metric in METRICS:
            cell = row[metric]
            ours = (f"{_num(cell['mean'])} ({cell['n_significant']}*/{cell['n_seeds']}; {_p(cell['p'])})"
                    if cell["n_seeds"] else "n/a")
            entry = cell["published"].get(published)
            if entry is None:
                cells += [ours, "—", "—", "n/a", "n/a"]
                continue
            paper = _published_cell(*table[row["label"]][metric])
            n = cell["n_seeds"]
            agree = f"{entry['sign_agrees']}/{entry['significance_agrees']}/{entry['same']} of {n}" if n else "n/a"
            cells += [ours, paper, agree, entry["robust"], entry["t_verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def robust_counts(aggregates: list[dict], published: str, kind: str = "robust") -> dict[str, int]:
    """How many cells got each verdict against ``published`` (``kind``: ``robust`` or ``t_verdict``)."""
    counts: dict[str, int] = {}
    for row in aggregates:
        for metric in METRICS:
            entry = row[metric]["published"].get(published)
            if entry is not None:
                counts[entry[kind]] = counts.get(entry[kind], 0) + 1
    return counts


def per_seed_table(rows_by_seed: dict[int, list[dict]]) -> str:
    """Markdown: every seed's cell (reduction and star) side by side, one line per data set and metric."""
    seeds = sorted(rows_by_seed)
    header = ["Data", "metric", *(f"seed {s}" for s in seeds)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows_by_seed[seeds[0]]:
        name = row["data"]
        for metric in METRICS:
            cells = [row_label(row), table_label(metric)]
            for seed in seeds:
                other = next((r for r in rows_by_seed[seed] if r["data"] == name), None)
                value = other.get(f"{metric}_reduction_pct") if other else None
                star = "*" if other and other.get("significant", {}).get(metric) else ""
                cells.append(f"{_num(value)}{star}" if _finite(value) else "n/a")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def flat_aggregates(aggregates: list[dict]) -> list[dict]:
    """CSV rows: one per data set and metric, with the seed statistics and each published table's counts."""
    out = []
    for row in aggregates:
        for metric in METRICS:
            cell = row[metric]
            flat = {"data": row["data"], "metric": metric, "seeds": ",".join(map(str, row["seeds"]))}
            flat.update({k: cell[k] for k in ("n_seeds", "n_significant", "n_positive", "mean", "sd", "min",
                                              "max", "t", "p", "t_significant")})
            for i, (seed, value) in enumerate(zip(row["seeds"], cell["values"])):
                flat[f"seed{seed}"] = value
                flat[f"seed{seed}_significant"] = cell["significant"][i]
            for key, entry in cell["published"].items():
                for name in ("value", "significant", "sign_agrees", "significance_agrees", "same", "robust",
                             "t_verdict"):
                    flat[f"{key}_{name}"] = entry[name]
            out.append(flat)
    return out
