"""Tables 4-6, the grid figures and the evidence for App. D.1.2's findings, from the grids' results.

Reads every ``<out_dir>/<grid>*.json`` written by :func:`ct_lightning.experiment.studies.grids.run_grid`
and writes the generated part of ``docs/appendix.md`` (between the markers) plus PNG figures.

- Tables: test accuracy and F1 by data set and objective, mean and standard deviation over the grid's
  points (every point counts once, as in the paper's averages; vanilla points share one training).
- % change from BL (Figures 6-38): for every CT point and evaluation group ``(run, λ_egy)``,
  ``100 · (m_CT − m_BL) / m_BL`` for the mean IP or cost of its valid counterfactuals, where BL is the
  vanilla point with the same settings (the shared BL training) and the same group.
- Maturity (Figures 39-47): ``train/cf_converged`` per epoch of each CT point.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections import defaultdict
from pathlib import Path

import numpy as np

BEGIN, END = "<!-- BEGIN GENERATED (recipes/appendix.py --report) -->", "<!-- END GENERATED -->"
METRICS = ("ip", "cost")
TIE = 2.0  # percentage points of median % change within which two settings count as no clear difference


def _order(value):
    """Numbers in numeric order, then text."""
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def load_results(out_dir: Path) -> dict[str, dict]:
    """Results by file stem (``note7``, ``note9-moons``, ...)."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("*.json"))}
    return {stem: r for stem, r in found.items() if isinstance(r, dict) and "points" in r and "grid" in r}


def point_rows(results: dict) -> list[dict]:
    """One row per grid point with a finished evaluation: data, params, evaluation."""
    rows = []
    for point in results["points"]:
        model = results["models"].get(point["key"])
        if model and model.get("evaluation"):
            rows.append({**point, "evaluation": model["evaluation"]})
    return rows


def performance_table(rows: list[dict]) -> dict:
    """``{(data, objective): {"accuracy": (mean, std, n), "f1": (...)}}`` over the points."""
    values = defaultdict(lambda: defaultdict(list))
    for row in rows:
        cell = values[(row["data"], row["params"].get("objective", "full"))]
        cell["accuracy"].append(row["evaluation"]["accuracy"])
        cell["f1"].append(row["evaluation"]["f1"])
    return {k: {m: (float(np.mean(v)), float(np.std(v)), len(v)) for m, v in cell.items()}
            for k, cell in values.items()}


def with_baselines(rows: list[dict]):
    """Each CT (``full``) point of ``rows`` with its BL: the vanilla point with the same other settings (points
    without one are left out)."""
    by_params = {(r["data"], json.dumps(r["params"], sort_keys=True)): r for r in rows}
    for row in rows:
        if row["params"].get("objective") != "full":
            continue
        baseline = by_params.get((row["data"], json.dumps({**row["params"], "objective": "vanilla"}, sort_keys=True)))
        if baseline is not None:
            yield row, baseline


def percent_changes(rows: list[dict], metric: str) -> list[dict]:
    """Per CT point and evaluation group: % change of ``metric`` from its BL (see the module docstring)."""
    out = []
    for row, baseline in with_baselines(rows):
        base_groups = {(g["run"], g["lambda_energy"]): g[metric] for g in baseline["evaluation"]["groups"]}
        for group in row["evaluation"]["groups"]:
            reference = base_groups.get((group["run"], group["lambda_energy"]))
            value = group[metric]
            if value is None or reference is None or reference == 0 or not math.isfinite(value):
                continue
            out.append({"data": row["data"], "params": row["params"], "lambda_energy": group["lambda_energy"],
                        "change": 100.0 * (value - reference) / reference})
    return out


def accuracy_drops(rows: list[dict], params: list[str]) -> dict:
    """``{data: {param: {value: (sum, n)}}}`` of each CT point's drop in test accuracy from its BL, grouped by
    each setting's values (sums, so that the drop of the points outside a group can be formed too)."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0])))
    for row, baseline in with_baselines(rows):
        drop = baseline["evaluation"]["accuracy"] - row["evaluation"]["accuracy"]
        for param in params:
            cell = out[row["data"]][param][row["params"][param]]
            cell[0] += drop
            cell[1] += 1
    return {d: {p: {v: tuple(c) for v, c in sorted(g.items(), key=lambda kv: _order(kv[0]))}
                for p, g in by.items()} for d, by in out.items()}


def largest_drop_setting(drops: dict) -> tuple[str, object, float, float] | None:
    """Of one data set's :func:`accuracy_drops`, the setting value whose points drop most on average:
    ``(param, value, its mean drop, the mean drop of all other points)``, or ``None``."""
    best = None
    for param, groups in drops.items():
        total, count = sum(c[0] for c in groups.values()), sum(c[1] for c in groups.values())
        for value, (drop, n) in groups.items():
            if n and count > n and (best is None or drop / n > best[2]):
                best = (param, value, drop / n, (total - drop) / (count - n))
    return best


def medians_by(changes: list[dict], param: str) -> dict:
    """``{data: {value: (median % change, n)}}`` of the changes grouped by one setting."""
    grouped = defaultdict(lambda: defaultdict(list))
    for c in changes:
        grouped[c["data"]][c["params"][param]].append(c["change"])
    return {d: {v: (float(np.median(x)), len(x)) for v, x in sorted(g.items(), key=lambda kv: _order(kv[0]))}
            for d, g in grouped.items()}


def plot_changes(changes: list[dict], params: list[str], path: Path, title: str) -> Path | None:
    """Box plots of the % change per value of each setting (columns) for each data set (rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({c["data"] for c in changes})
    if not datasets or not params:
        return None
    fig, axes = plt.subplots(len(datasets), len(params), figsize=(3.2 * len(params), 2.6 * len(datasets)),
                             squeeze=False)
    for i, data in enumerate(datasets):
        subset = [c for c in changes if c["data"] == data]
        for j, param in enumerate(params):
            values = sorted({c["params"][param] for c in subset}, key=_order)
            ax = axes[i][j]
            ax.boxplot([[c["change"] for c in subset if c["params"][param] == v] for v in values],
                       showfliers=False)
            ax.set_xticks(range(1, len(values) + 1), [str(v) for v in values], fontsize=8)
            ax.axhline(0.0, color="grey", lw=0.8, ls="--")
            ax.set_title(f"{data}: {param}", fontsize=9)
            if j == 0:
                ax.set_ylabel("% change from BL", fontsize=8)
    fig.suptitle(textwrap.fill(title, 80), fontsize=10)  # a grid over five sets has a long name
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_maturity(rows: list[dict], params: list[str], path: Path) -> Path | None:
    """Share of mature counterfactuals per epoch of every CT point, one panel per data set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ct = [r for r in rows if r["params"].get("objective") == "full" and r["evaluation"].get("mature")]
    datasets = sorted({r["data"] for r in ct})
    if not datasets:
        return None
    columns = min(3, len(datasets))
    lines = math.ceil(len(datasets) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.0 * lines), squeeze=False)
    for ax, data in zip(axes.flat, datasets):
        for row in (r for r in ct if r["data"] == data):
            label = ", ".join(f"{p}={row['params'][p]}" for p in params)
            ax.plot(range(1, len(row["evaluation"]["mature"]) + 1), row["evaluation"]["mature"], label=label, lw=1)
        ax.set_title(data, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_ylabel("share mature", fontsize=8)
    for ax in list(axes.flat)[len(datasets):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def grid_section(stem: str, results: dict, paper: dict | None, docs_dir: Path, rel: str) -> tuple[list[str], dict]:
    """The markdown of one grid's results and the numbers behind the findings."""
    rows = point_rows(results)
    varied = [p for p in results["space"] if p != "objective"]
    lines = [f"### {results['title']} — `{stem}`", "",
             f"{len(rows)} of {results['n_points']} points evaluated; {results['n_models']} distinct trainings "
             f"({len(results['models'])} finished); wall time of the last invocation "
             f"{results['wall_seconds'] / 60:.1f} min; failures: {len(results['failures'])}.", ""]
    table = performance_table(rows)
    if table:
        lines += ["| data | objective | accuracy (ours) | F1 (ours) | accuracy (paper) | F1 (paper) | points |",
                  "|---|---|---|---|---|---|---|"]
        for (data, objective), cell in sorted(table.items()):
            ref = ((paper or {}).get(data) or {}).get(objective) or {}
            acc, f1 = ref.get("accuracy"), ref.get("f1")
            lines.append(f"| {data} | {objective} | {_fmt(cell['accuracy'][0])} ± {_fmt(cell['accuracy'][1])} | "
                         f"{_fmt(cell['f1'][0])} ± {_fmt(cell['f1'][1])} | "
                         f"{'–' if not acc else f'{acc[0]} ± {acc[1]}'} | {'–' if not f1 else f'{f1[0]} ± {f1[1]}'} "
                         f"| {cell['accuracy'][2]} |")
        lines.append("")
    evidence = {"table": {f"{d}/{o}": v for (d, o), v in table.items()}, "accuracy_drop": accuracy_drops(rows, varied)}
    for metric in METRICS:
        changes = percent_changes(rows, metric)
        evidence[metric] = {p: medians_by(changes, p) for p in varied}
        name = "implausibility (IP)" if metric == "ip" else "cost"
        path = plot_changes(changes, varied, docs_dir / f"{stem}_{metric}.png",
                            f"{stem}: % change from BL in {name} (boxes: points × runs × λ_egy)")
        if path:
            lines += [f"![{stem} {metric}]({rel}/{path.name})", ""]
            lines += [f"Median % change from BL in {name} by setting:", "",
                      "| data | " + " | ".join(varied) + " |", "|---|" + "---|" * len(varied)]
            for data in sorted(evidence[metric][varied[0]]):
                cells = []
                for p in varied:
                    cells.append(", ".join(f"{v}: {m:+.1f}" for v, (m, _) in evidence[metric][p][data].items()))
                lines.append(f"| {data} | " + " | ".join(cells) + " |")
            lines.append("")
    if any(r["data"] not in ("ls", "ol", "circles", "moons") for r in rows) or stem.startswith(("note9", "note11")):
        path = plot_maturity(rows, varied, docs_dir / f"{stem}_mature.png")
        if path:
            lines += [f"![{stem} maturity]({rel}/{path.name})", ""]
    return lines, evidence


def _median_of(evidence: dict, stem_prefix: str, metric: str, param: str) -> dict:
    """``{data: {value: median}}`` of one setting over the grids whose name starts with ``stem_prefix``."""
    out = {}
    for stem, grid in evidence.items():
        if stem.startswith(stem_prefix) and param in grid.get(metric, {}):
            for data, values in grid[metric][param].items():
                out[data] = {v: m for v, (m, _) in values.items()}
    return out


PENALTIES = ("lambda_reg", "lambda_div", "lambda_adv")


def _lambda_reg_finding(evidence: dict) -> str:
    """The row of "λ_reg is the key penalty; too little of it hurts Circles": per data set the spread (largest minus
    smallest median % change in IP) over each penalty's values, and Circles' medians at small and large λ_reg."""
    spreads = {p: {d: max(v.values()) - min(v.values()) for d, v in _median_of(evidence, "note5", "ip", p).items()
                   if len(v) > 1} for p in PENALTIES}
    reg = _median_of(evidence, "note5", "ip", "lambda_reg")
    if not reg:
        return "| λ_reg is the key penalty; too little hurts Circles | – | not tested (note5 did not run) |"
    cells = [f"{d}: " + ", ".join(f"{v} {m:+.1f}%" for v, m in values.items()) for d, values in reg.items()]
    key_in = [d for d in spreads["lambda_reg"]
              if all(spreads["lambda_reg"][d] > spreads[p].get(d, float("inf")) for p in PENALTIES[1:])]
    compared = [d for d in spreads["lambda_reg"] if all(d in spreads[p] for p in PENALTIES[1:])]
    spread_cells = [f"{d}: " + ", ".join(f"{p} {spreads[p][d]:.1f}" for p in PENALTIES) for d in compared]
    key = (f"λ_reg moves IP most in {len(key_in)} of {len(compared)} data sets" if compared else
           "no data set with all three penalties")
    circles = reg.get("circles")
    if circles is None:
        hurt = "Circles not run yet"
    else:
        low = [m for v, m in circles.items() if float(v) <= 0.01]
        high = [m for v, m in circles.items() if float(v) >= 0.1]
        hurt = f"Circles: λ_reg ≤ 0.01 {'worse' if low and high and min(low) > max(high) else 'not worse'} than ≥ 0.1"
    supported = compared and len(key_in) == len(compared) and circles is not None and "not worse" not in hurt
    partly = key_in or (circles is not None and "not worse" not in hurt)
    verdict = "supported" if supported else "partly supported" if partly else "not supported"
    return (f"| λ_reg is the key penalty; too little hurts Circles | median % change in IP by λ_reg: {'; '.join(cells)}; "
            f"spread of the medians (points) by penalty: {'; '.join(spread_cells) or '–'} | {verdict}: {key}; {hurt} |")


def findings(evidence: dict) -> list[str]:
    """App. D.1.2's findings, each with the numbers that decide it (lower % change in IP = better)."""
    lines = ["| finding (App. D.1.2) | evidence from our runs | verdict |", "|---|---|---|"]
    # 1. REVISE gives the worst outcomes (largest, i.e. least negative, % change in IP).
    cells, worst, total = [], 0, 0
    for stem in ("note3", "note5", "note7"):
        for data, values in _median_of(evidence, stem, "ip", "generator").items():
            if len(values) < 3:
                continue
            total += 1
            is_worst = max(values, key=values.get) == "revise"
            worst += is_worst
            cells.append(f"{stem}/{data}: " + ", ".join(f"{g} {m:+.1f}%" for g, m in values.items()))
    verdict = "not tested (no grid with the three generators finished)" if not total else (
        f"{'supported' if worst == total else 'partly supported' if worst else 'not supported'}: "
        f"REVISE worst in {worst} of {total}")
    lines.append(f"| REVISE gives the worst outcomes | median % change in IP by generator: {'; '.join(cells) or '–'} "
                 f"| {verdict} |")
    # 2. λ_reg is key (its values move IP the most of Note 5's three penalties); too little of it hurts Circles.
    lines.append(_lambda_reg_finding(evidence))
    # 3. More counterfactuals per epoch and more epochs help.
    for param, small, large in (("nce", 100, 1000), ("max_epochs", 50, 100)):
        values = _median_of(evidence, "note7", "ip", param)
        cells, better, worse = [], 0, 0
        for data, medians in values.items():
            a, b = medians.get(str(small), medians.get(small)), medians.get(str(large), medians.get(large))
            if a is None or b is None:
                continue
            better += b < a - TIE
            worse += b > a + TIE
            cells.append(f"{data}: {small} {a:+.1f}% vs {large} {b:+.1f}%")
        verdict = "not tested (note7 did not run)" if not cells else (
            f"{'supported' if better == len(cells) else 'partly supported' if better else 'not supported'}: "
            f"better in {better}, worse in {worse}, within ±{TIE:g} points in {len(cells) - better - worse} "
            f"of {len(cells)} data sets")
        lines.append(f"| more {param} helps | median % change in IP: {'; '.join(cells)} | {verdict} |")
    # 4. Accuracy drops by at most about one point: App. D.1.1 states it for the synthetic sets only, so the
    # real sets of Notes 9 and 11 are shown beside it but do not decide the verdict.
    from ct_lightning.experiment.studies.reproduce import is_synthetic  # noqa: PLC0415

    drops, real_drops = [], []
    for stem, grid in evidence.items():
        table = grid.get("table", {})
        for key, cell in table.items():
            data, objective = key.split("/")
            if objective == "full" and f"{data}/vanilla" in table:
                drop = (table[f"{data}/vanilla"]["accuracy"][0] - cell["accuracy"][0], stem, data)
                (drops if is_synthetic(data) else real_drops).append(drop)
    if drops:
        worst_drop = max(drops)
        cells = [f"{s}/{d}: {100 * x:+.2f} pt" for x, s, d in sorted(drops, reverse=True)]
        verdict = (f"{'supported' if worst_drop[0] <= 0.015 else 'not supported'}: largest drop "
                   f"{100 * worst_drop[0]:.2f} points ({worst_drop[1]}/{worst_drop[2]})")
        source = largest_drop_setting(evidence[worst_drop[1]].get("accuracy_drop", {}).get(worst_drop[2], {}))
        if source and worst_drop[0] > 0.015:  # where the drop comes from
            param, value, drop, rest = source
            verdict += (f"; its points with {param} = {value} drop {100 * drop:.2f} points on average, "
                        f"the others {100 * rest:.2f}")
    else:
        cells, verdict = [], "not tested"
    if real_drops:
        cells.append("real sets, outside the finding's scope: " + ", ".join(
            f"{s}/{d}: {100 * x:+.2f} pt" for x, s, d in sorted(real_drops, reverse=True)))
    lines.append(f"| test accuracy drops by at most ~1 point | BL − CT mean test accuracy: {'; '.join(cells)} "
                 f"| {verdict} |")
    return lines


def compact(results: dict) -> dict:
    """A small copy of a grid's results for the repository: per model its accuracy, F1, mean IP/cost per
    ``λ_egy`` over the runs, and the share of mature counterfactuals per epoch (3 decimals)."""
    def mean(values):
        values = [v for v in values if v is not None and math.isfinite(v)]
        return round(float(np.mean(values)), 4) if values else None

    models = {}
    for key, model in results["models"].items():
        evaluation = model.get("evaluation") or {}
        per_lambda = defaultdict(lambda: {"ip": [], "cost": []})
        for group in evaluation.get("groups", []):
            for metric in METRICS:
                per_lambda[group["lambda_energy"]][metric].append(group[metric])
        models[key] = {"data": model["data"], "overrides": model["overrides"], "run_id": model["run_id"],
                       "accuracy": evaluation.get("accuracy"), "f1": evaluation.get("f1"),
                       "per_lambda": {f"{lam:g}": {m: mean(v) for m, v in d.items()} for lam, d in per_lambda.items()},
                       "mature": [round(v, 3) for v in evaluation.get("mature", [])],
                       "seconds": round(model.get("seconds", 0.0), 1)}
    return {k: results[k] for k in ("grid", "title", "data", "space", "n_points", "n_models", "parent_run_id",
                                    "points", "failures")} | {"models": models}


def write_report(out_dir: Path, docs_dir: Path, doc: Path | None = None) -> dict:
    """Write the figures into ``docs_dir`` and the generated section of ``doc`` (default docs/appendix.md)."""
    from ct_lightning.experiment.studies.grids import load_grid
    from ct_lightning.experiment.runs.atomic_files import write_json_atomic, write_text_atomic

    doc = doc or docs_dir.parent / "appendix.md"
    rel = docs_dir.name
    lines, evidence = [BEGIN, ""], {}
    for stem, results in load_results(out_dir).items():
        try:
            paper = load_grid(results["grid"]).paper
        except ValueError:  # a grid from a YAML file elsewhere (tests): no paper values
            paper = None
        section, evidence[stem] = grid_section(stem, results, paper, docs_dir, rel)
        write_json_atomic(docs_dir / f"{stem}_models.json", compact(results))
        lines += section
    lines += ["### App. D.1.2's findings against our runs", "",
              "Generated from the finished points only; a grid that did not run says so.", ""]
    lines += findings(evidence) + [""]
    lines.append(END)
    write_json_atomic(docs_dir / "evidence.json", evidence)
    text = doc.read_text() if doc.exists() else f"# Appendix D/E\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    write_text_atomic(doc, head + "\n".join(lines) + tail)
    return evidence
