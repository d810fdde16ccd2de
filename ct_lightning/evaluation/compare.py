"""BL vs CT comparison with bootstrap statistics (paper Table 1 and Table 3).

For a metric where lower is better (IP, IP*, cost) the effect of CT is the percentage
reduction ``100·(BL − CT)/BL`` of the means. Its standard error is the standard deviation of
that reduction over bootstrap rounds (100 by default), in which the BL and CT samples are
resampled with replacement independently. The difference in means ``CT − BL`` gets a
percentile bootstrap confidence interval (99% by default, as in Table 3); the effect is
``significant`` when that interval excludes zero (the asterisks of Table 1).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np

from ct_lightning.metrics.names import METRICS, evaluation_metrics, table_label, table_metrics


def __getattr__(name: str):
    if name == "METRIC_LABELS":  # Table 1's reduction headers, from the metric table (a registered row included)
        return {key: table_label(key) for key in table_metrics()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reduction_pct(bl_mean: float, ct_mean: float) -> float:
    """Percentage reduction ``100·(BL − CT)/BL``; NaN when BL's mean is zero or missing."""
    if bl_mean is None or ct_mean is None or not math.isfinite(bl_mean) or not math.isfinite(ct_mean) or bl_mean == 0:
        return math.nan
    return 100.0 * (bl_mean - ct_mean) / bl_mean


def _finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float).reshape(-1)
    return values[np.isfinite(values)]


def bootstrap_comparison(bl, ct, n_boot: int = 100, confidence: float = 0.99, seed: int = 0) -> dict:
    """Compare per-sample outcomes of BL and CT (lower is better) by bootstrap.

    Returns ``bl_mean``, ``ct_mean``, ``reduction_pct`` (point estimate from the full samples),
    ``se`` (standard deviation of the bootstrapped reductions), ``diff`` (``CT − BL``),
    ``ci_low``/``ci_high`` (percentile interval of the bootstrapped ``CT − BL`` at ``confidence``),
    ``significant`` (the interval excludes zero), and the sample sizes. Non-finite values are
    dropped; with an empty side every statistic is NaN and ``significant`` is ``False``; when every bootstrap
    round gives the same difference (one value a side, or constant samples) there is no interval to judge by and
    ``significant`` is ``False``.
    """
    bl, ct = _finite(bl), _finite(ct)
    out = {"bl_mean": math.nan, "ct_mean": math.nan, "reduction_pct": math.nan, "se": math.nan,
           "diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "significant": False,
           "n_bl": int(bl.size), "n_ct": int(ct.size), "n_boot": n_boot, "confidence": confidence}
    if bl.size == 0 or ct.size == 0:
        return out
    rng = np.random.default_rng(seed)
    bl_means = bl[rng.integers(0, bl.size, (n_boot, bl.size))].mean(1)
    ct_means = ct[rng.integers(0, ct.size, (n_boot, ct.size))].mean(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        reductions = 100.0 * (bl_means - ct_means) / bl_means
    diffs = ct_means - bl_means
    alpha = (1.0 - confidence) / 2.0
    ci_low, ci_high = np.quantile(diffs, [alpha, 1.0 - alpha])
    finite = reductions[np.isfinite(reductions)]
    out.update({
        "bl_mean": float(bl.mean()), "ct_mean": float(ct.mean()),
        "reduction_pct": reduction_pct(float(bl.mean()), float(ct.mean())),
        "se": float(finite.std(ddof=1)) if finite.size > 1 else math.nan,
        "diff": float(ct.mean() - bl.mean()), "ci_low": float(ci_low), "ci_high": float(ci_high),
        "significant": excludes_zero(ci_low, ci_high),
    })
    return out


def excludes_zero(ci_low: float, ci_high: float) -> bool:
    """Whether the interval ``[ci_low, ci_high]`` excludes zero; ``False`` when it has no width (one run, or every
    bootstrap round alike): a point says nothing about the spread, so nothing can be marked significant."""
    if not ci_high > ci_low:
        return False
    return bool(ci_low > 0 or ci_high < 0)


def per_run_means(result, name: str) -> np.ndarray:
    """Per evaluation run: the mean over ``λ_egy`` of the per-(run, λ) means of metric ``name`` (valid CEs).

    A per-counterfactual metric (``ip``, ``cost``) averages the valid counterfactuals of each (run, λ); a
    per-group one takes the (run, λ) value, ``ip_star`` clamped at 0 (the unbiased MMD² can be negative),
    as the authors' tables do. A (run, λ) without a value is left out of its run's mean; a run without any is NaN.
    """
    table = result.groups if METRICS[name].scope == "group" else result.samples
    runs, lams = table["run"], table["lambda_energy"]
    column = METRICS[name].source()
    values = np.asarray(table[column], dtype=float) if column in table else np.full(len(runs), math.nan)
    if name == "ip_star":
        values = np.maximum(values, 0.0)
    out = []
    for run in np.unique(runs):
        cells = [values[(runs == run) & (lams == lam)] for lam in np.unique(lams)]
        means = [cell[np.isfinite(cell)].mean() for cell in cells if np.isfinite(cell).any()]
        out.append(float(np.mean(means)) if means else math.nan)
    return np.asarray(out, dtype=float)


def fewest_runs(confidence: float) -> int:
    """The fewest paired evaluation runs from which :func:`run_comparison` can call a difference significant at
    ``confidence``. Its central quantile interval of ``n`` per-run differences is about their range (the 0.5 % and
    99.5 % quantiles of a few values lie next to the smallest and the largest), so it excludes zero when all ``n``
    differences share a sign: where BL and CT do not differ that happens by chance with probability ``2 · 0.5ⁿ``,
    which must be at most ``1 − confidence``: 8 runs at 99 %, 6 at 95 % (2 runs: a coin toss)."""
    if confidence >= 1.0:  # no number of runs gives certainty
        return sys.maxsize
    return max(2, math.ceil(math.log2(2.0 / (1.0 - confidence)) - 1e-9))


def run_comparison(bl_runs, ct_runs, confidence: float = 0.99) -> dict:
    """Table 1 arithmetic of the authors' code over paired evaluation runs (lower is better).

    Per run ``r``: ``ratio_r = CT_r / BL_r`` and ``delta_r = CT_r − BL_r``. The reduction is
    ``−100·(mean ratio − 1)``, ``se`` is ``100·sd(ratio)`` (the spread over runs, as the paper's
    "±"), ``se_mean`` divides it by ``√runs``; ``significant`` when the central ``confidence``
    quantile interval of the per-run deltas excludes zero (``False`` with one run or equal deltas: no interval), and
    never with fewer runs than :func:`fewest_runs` (``too_few_runs``: too few for a test at ``confidence``).
    Runs with a missing side are dropped.
    """
    bl_runs, ct_runs = np.asarray(bl_runs, dtype=float), np.asarray(ct_runs, dtype=float)
    keep = np.isfinite(bl_runs) & np.isfinite(ct_runs) & (bl_runs != 0)
    bl_runs, ct_runs = bl_runs[keep], ct_runs[keep]
    out = {"bl_mean": math.nan, "ct_mean": math.nan, "reduction_pct": math.nan, "se": math.nan,
           "se_mean": math.nan, "diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "significant": False,
           "n_runs": int(keep.sum()), "confidence": confidence, "statistic": "runs",
           "too_few_runs": int(keep.sum()) < fewest_runs(confidence)}
    if bl_runs.size == 0:
        return out
    ratios, deltas = ct_runs / bl_runs, ct_runs - bl_runs
    tail = (1.0 - confidence) / 2.0
    ci_low, ci_high = np.quantile(deltas, [tail, 1.0 - tail]) if deltas.size > 1 else (math.nan, math.nan)
    sd = float(ratios.std(ddof=1)) if ratios.size > 1 else math.nan
    out.update({"bl_mean": float(bl_runs.mean()), "ct_mean": float(ct_runs.mean()),
                "reduction_pct": float(-100.0 * (ratios.mean() - 1.0)), "se": 100.0 * sd,
                "se_mean": 100.0 * sd / math.sqrt(ratios.size), "diff": float(deltas.mean()),
                "ci_low": float(ci_low), "ci_high": float(ci_high),
                "significant": excludes_zero(ci_low, ci_high) and not out["too_few_runs"]})
    return out


STATISTICS = ("runs", "bootstrap")


def valid_behind(result, name: str) -> int:
    """How many valid counterfactuals the values of metric ``name`` rest on: those with a value (a
    per-counterfactual metric), or all of the (run, λ_egy) groups with a value (a per-group metric such as IP*,
    whose one value per group is computed from that group's valid counterfactuals)."""
    values = result.metric_values(name)
    if values is None:
        return 0
    finite = np.isfinite(values)
    if METRICS[name].scope == "group":
        return int(np.asarray(result.groups["n_valid"])[finite].sum()) if "n_valid" in result.groups else 0
    return int(finite.sum())


def compare_evaluations(bl, ct, metrics=None, n_boot: int = 100, confidence: float = 0.99,
                        seed: int = 0, statistic: str = "bootstrap") -> dict[str, dict]:
    """Compare two :class:`~ct_lightning.evaluation.EvaluationResult` per metric (default: Table 1's reductions).

    ``statistic="bootstrap"``: :func:`bootstrap_comparison` of the pooled per-sample values (the
    paper's text); ``"runs"``: :func:`run_comparison` of per-run means (the authors' code). Each
    entry also carries the other statistic under ``"alternative"``, and ``valid_bl``/``valid_ct``: the valid
    counterfactuals behind each side's values (:func:`valid_behind`).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic: unknown {statistic!r}; allowed: {', '.join(STATISTICS)}")
    out = {}
    for i, name in enumerate(table_metrics() if metrics is None else metrics):
        boot = bootstrap_comparison(bl.metric_samples(name), ct.metric_samples(name), n_boot, confidence, seed + i)
        runs = run_comparison(per_run_means(bl, name), per_run_means(ct, name), confidence)
        main, other = (runs, boot) if statistic == "runs" else (boot, runs)
        out[name] = {**main, "n_bl": boot["n_bl"], "n_ct": boot["n_ct"], "valid_bl": valid_behind(bl, name),
                     "valid_ct": valid_behind(ct, name), "alternative": other}
    return out


def _model_block(summary: dict) -> dict:
    return {k: summary.get(k) for k in evaluation_metrics()}


def table_row(data: str, plausibility: dict[str, dict], actionability: dict[str, dict],
              bl_summary: dict, ct_summary: dict, bl_protected: dict | None = None,
              ct_protected: dict | None = None) -> dict:
    """One Table 1 row: each reduction column from its pair (the table's ``table1``): IP and IP* from the
    all-mutable pair (``plausibility``), cost from the protected pair (``actionability``).

    ``plausibility``/``actionability`` are :func:`compare_evaluations` outputs; the ``*_summary``
    arguments are :meth:`EvaluationResult.summary` dicts. The ``bl``/``ct`` blocks hold the raw
    means (``cost`` from the protected pair, ``cost_all_mutable`` from the other), accuracy and
    robust accuracy of the all-mutable models (every evaluated metric of the table).
    """
    pairs = {"all_mutable": plausibility, "protected": actionability}
    sources = {name: pairs[METRICS[name].table1] for name in table_metrics()}
    row: dict = {"data": data}
    for name, source in sources.items():
        stats = source.get(name, {}) if source else {}
        row[f"{name}_reduction_pct"] = stats.get("reduction_pct", math.nan)
        row[f"{name}_se"] = stats.get("se", math.nan)
        row[f"{name}_ci_low"] = stats.get("ci_low", math.nan)
        row[f"{name}_ci_high"] = stats.get("ci_high", math.nan)
        row[f"{name}_n_bl"], row[f"{name}_n_ct"] = stats.get("n_bl", 0), stats.get("n_ct", 0)
        row[f"{name}_valid_bl"], row[f"{name}_valid_ct"] = stats.get("valid_bl"), stats.get("valid_ct")
    row["significant"] = {name: bool((source or {}).get(name, {}).get("significant", False))
                          for name, source in sources.items()}
    row["too_few_runs"] = {name: bool((source or {}).get(name, {}).get("too_few_runs", False))
                           for name, source in sources.items()}  # the runs statistic only: no test, no star
    for label, summary, protected in (("bl", bl_summary, bl_protected), ("ct", ct_summary, ct_protected)):
        block = _model_block(summary)
        for name in table_metrics("protected"):  # e.g. cost: the protected pair's value, the other kept beside it
            block[f"{name}_all_mutable"] = block.pop(name)
            block[name] = protected.get(name) if protected else None
        if protected:
            block["protected"] = _model_block(protected)
        row[label] = block
    return row


def _fmt(value, digits: int = 2) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}f}"


MIN_SAMPLES = 30


def format_cell(row: dict, metric: str) -> str:
    """``reduction ± se`` with an asterisk when significant, e.g. ``29.05 ± 0.67*``, or ``(too few runs for a test)``
    where the runs statistic had fewer runs than :func:`fewest_runs`.

    A dagger and the counts are added when either side rests on fewer than ``MIN_SAMPLES`` valid
    counterfactuals (``valid_bl``/``valid_ct``: for IP*, the valid counterfactuals of the groups it was computed
    from). A row written before those counts has them only for a per-counterfactual metric (``n_bl``/``n_ct``).
    """
    text = f"{_fmt(row[f'{metric}_reduction_pct'])} ± {_fmt(row[f'{metric}_se'])}"
    text += " (too few runs for a test)" if row.get("too_few_runs", {}).get(metric) else \
        "*" if row["significant"].get(metric) else ""
    n_bl, n_ct = row.get(f"{metric}_valid_bl"), row.get(f"{metric}_valid_ct")
    if (n_bl is None or n_ct is None) and METRICS[metric].scope != "group":
        n_bl, n_ct = row.get(f"{metric}_n_bl"), row.get(f"{metric}_n_ct")
    if n_bl is not None and n_ct is not None and min(n_bl, n_ct) < MIN_SAMPLES:
        text += f" † (n {n_bl}/{n_ct})"
    return text


def markdown_table(rows: list[dict]) -> str:
    """Table 1 as Markdown: the reduction columns, then the level columns of BL and CT (all-mutable pair):
    validity, accuracy and robust accuracy (FGSM ε = 0.03), as the metric table places them."""
    reductions, levels = table_metrics(), table_metrics("level")
    header = ["Data", *(table_label(m) for m in reductions),
              *(f"{METRICS[m].label} {side}" for m in levels for side in ("BL", "CT"))]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["data"], *(format_cell(row, m) for m in reductions),
                 *(_fmt(row[side].get(m), 3) for m in levels for side in ("bl", "ct"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PAIRS = (("all_mutable", ("bl", "ct")), ("protected", ("bl_protected", "ct_protected")))  # Table 1's two pairs


def constraint_notes(rows: list[dict]) -> str:
    """Under the table: per row and pair, the constraints its BL and CT counterfactuals were searched under
    (``row["evaluated_under"]``, by role), e.g. ``- loans, IP/IP*: immutable: age; within the data domain``."""
    lines = []
    for row in rows:
        under = row.get("evaluated_under") or {}
        for place, roles in PAIRS:
            said = {role: under[role] for role in roles if role in under}
            if not said:
                continue
            columns = "/".join(METRICS[m].label for m in table_metrics(place))
            texts = list(dict.fromkeys(said.values()))
            text = texts[0] if len(texts) == 1 else \
                " | ".join(f"{'CT' if role.startswith('ct') else 'BL'}: {words}" for role, words in said.items())
            lines.append(f"- {row['data']}, {columns}: {text}")
    return "Evaluated under (BL and CT of each pair):\n" + "\n".join(lines) + "\n" if lines else ""


def flat_row(row: dict) -> dict:
    """A row with nested blocks flattened to ``bl_ip``, ``significant_cost``, ... (for CSV)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                if isinstance(inner, dict):
                    for k, v in inner.items():
                        out[f"{key}_{sub}_{k}"] = v
                else:
                    out[f"{key}_{sub}"] = inner
        else:
            out[key] = value
    return out


def _plain(value):
    """``value`` as plain JSON data: NumPy scalars as Python numbers, NaN and infinities as ``None``, tuples as lists."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _plain(inner) for key, inner in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(inner) for inner in value]
    return value


def csv_cell(value):
    """A cell of ``table.csv``: a number or text as it is; a dict, list or tuple (a comparison's details, the
    per-λ values, a protocol's λ list, a robustness curve) as JSON, with a missing number as ``null``, so that any
    program reads it with a JSON parser (not Python's repr, which needs Python and fails on ``nan``)."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(_plain(value), default=str)
    return value


def write_csv(rows: list[dict], path) -> None:
    """Write the flattened rows as CSV (columns: union of all rows' keys, first-seen order); nested values as JSON
    (:func:`csv_cell`)."""
    flat = [{key: csv_cell(value) for key, value in flat_row(r).items()} for r in rows]
    columns: list[str] = []
    for r in flat:
        columns += [k for k in r if k not in columns]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
