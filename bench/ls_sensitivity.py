"""Sensitivity of CT's IP reduction on LS to the distance between the two blob centres.

For each centre distance (``default``: the data set's own random centres, 10.03 apart) a BL
(objective vanilla) and a CT (objective full) model are trained with LS's Table 2 settings and
the authors' training-time search step (η 0.1, ``role_training_overrides("reference", ...)``),
then evaluated with the reference protocol (``PROTOCOLS["reference"]``) and compared with the
per-run Table 1 arithmetic (``compare_evaluations(..., statistic="runs")``). The distance is set
with the data option ``center_distance``: the default centres moved about their midpoint along
the line through them; every sample keeps its noise draw.

Resumable twice over: trainings and evaluations are found in the MLflow store by their keys
(``ct_lightning.experiment.studies.reproduce``), and a point whose ``points/<label>.json`` exists is
skipped. Runs one model at a time. Writes docs/ls_sensitivity.{md,png,json} from every point
found.

    OMP_NUM_THREADS=1 python -m bench.ls_sensitivity --distances default,2,4,6,8,10,14
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from mlflow.tracking import MlflowClient

from ct_lightning.evaluation.compare import compare_evaluations
from ct_lightning.experiment.configuration.protocol_options import add_protocol_arguments, protocol_config
from ct_lightning.experiment.studies.reproduce import ROLES, Task, find_evaluation, role_training_overrides, run_task
from ct_lightning.experiment.runs.atomic_files import write_json_atomic, write_text_atomic
from ct_lightning.experiment.runs.tracking import prepare_store
from datamodules.synthetic import LinearlySeparable

REPO = Path(__file__).resolve().parent.parent
PAPER = {"ip_reduction": 29.05, "ip_se": 0.67, "bl_ip": 3.40, "ct_ip": 2.41}


def parse_distances(text: str) -> list[float | None]:
    """``"default,2,4"`` → ``[None, 2.0, 4.0]`` (``default``: the data set's own centres)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part == "default":
            out.append(None)
            continue
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--distances: {part!r} is not a number or 'default'") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"--distances: {part!r} is not allowed; allowed: numbers > 0, default")
        out.append(value)
    return out


def label(distance: float | None) -> str:
    return "default" if distance is None else f"d{distance:g}"


def default_distance() -> float:
    """Distance between the default LS centres (scikit-learn's draw from (−10, 10)² with seed 42)."""
    dm = LinearlySeparable()
    dm.setup()
    return float(np.linalg.norm(dm.centers[1] - dm.centers[0]))


def point_tasks(distance: float | None, args) -> list[Task]:
    """The BL and CT tasks of one centre distance."""
    protocol = asdict(protocol_config(args, "ls"))
    tasks = []
    for role, objective, protected in ROLES[:2]:
        training = {**role_training_overrides("reference", "ls", role), "max_epochs": args.max_epochs,
                    "seed": args.seed, "center_distance": distance}
        if args.limit_train_batches is not None:
            training["limit_train_batches"] = args.limit_train_batches
        tasks.append(Task("ls", role, objective, protected, training, protocol, args.tracking_uri,
                          args.experiment, threads=args.threads))
    return tasks


def _final_metric(client, run_id: str, name: str) -> float | None:
    value = client.get_run(run_id).data.metrics.get(name)
    return None if value is None or not math.isfinite(value) else float(value)


def run_point(distance: float | None, args, client) -> dict:
    """Train/evaluate (or reuse) BL and CT at one distance and compare them."""
    started = time.perf_counter()
    results, runs, mature, accuracy = {}, {}, {}, {}
    for task in point_tasks(distance, args):
        outcome = run_task(task)
        print(f"  {label(distance)} {task.role}: run {outcome['run_id']} "
              f"({'trained' if outcome['trained'] else 'reused'}, {outcome['seconds']:.0f}s)", flush=True)
        runs[task.role] = outcome["run_id"]
        results[task.role] = find_evaluation(client, outcome["run_id"], task.eval_key())
        mature[task.role] = _final_metric(client, outcome["run_id"], "train/cf_converged")
        accuracy[task.role] = _final_metric(client, outcome["run_id"], "test/acc")
    stats = compare_evaluations(results["bl"], results["ct"], ("ip", "ip_star"), args.n_boot, 0.99, args.seed,
                                "runs")
    summaries = {role: result.summary() for role, result in results.items()}
    return {
        "label": label(distance), "center_distance": default_distance() if distance is None else distance,
        "default_centres": distance is None, "max_epochs": args.max_epochs, "seed": args.seed, "runs": runs,
        "ip": stats["ip"], "ip_star": stats["ip_star"],
        "validity": {role: s["validity"] for role, s in summaries.items()},
        "accuracy": accuracy, "mature_share_end_of_training": mature["ct"],
        "n_valid": {role: s["n_valid"] for role, s in summaries.items()},
        "protocol": {"name": "reference", **point_tasks(distance, args)[0].protocol},
        "seconds": time.perf_counter() - started,
    }


def _f(value, digits=2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def markdown(points: list[dict], with_seed: bool = False) -> str:
    """The results table (``with_seed``: a column with the training seed after the distance)."""
    lines = ["| Centre distance |" + (" Seed |" if with_seed else "") + " BL IP | CT IP | IP (−%) ± sd | 99% interval of CT − BL (per run) | BL IP* | CT IP* "
             "| IP* (−%) ± sd | Val BL | Val CT | Mature CEs (CT, last epoch) | Acc BL | Acc CT |",
             "|---" * (14 if with_seed else 13) + "|"]
    for p in points:
        ip, star = p["ip"], p["ip_star"]
        name = f"{p['center_distance']:.2f}" + (" (default LS)" if p["default_centres"] else "")
        name += f" | {p['seed']}" if with_seed else ""
        lines.append(
            f"| {name} | {_f(ip['bl_mean'])} | {_f(ip['ct_mean'])} | {_f(ip['reduction_pct'])} ± {_f(ip['se'])}"
            f"{'*' if ip['significant'] else ''} | [{_f(ip['ci_low'])}, {_f(ip['ci_high'])}] | "
            f"{_f(star['bl_mean'], 3)} | {_f(star['ct_mean'], 3)} | {_f(star['reduction_pct'])} ± {_f(star['se'])}"
            f"{'*' if star['significant'] else ''} | {_f(p['validity']['bl'], 3)} | {_f(p['validity']['ct'], 3)} | "
            f"{_f(p['mature_share_end_of_training'], 3)} | {_f(p['accuracy']['bl'], 3)} | {_f(p['accuracy']['ct'], 3)} |")
    return "\n".join(lines)


def distance_for_bl_ip(points: list[dict], target: float = PAPER["bl_ip"]) -> float | None:
    """Centre distance at which BL's IP equals ``target``, by linear interpolation over the sweep."""
    sweep = sorted((p["center_distance"], p["ip"]["bl_mean"]) for p in points if not p["default_centres"])
    for (d0, ip0), (d1, ip1) in zip(sweep, sweep[1:]):
        if min(ip0, ip1) <= target <= max(ip0, ip1) and ip0 != ip1:
            return d0 + (target - ip0) * (d1 - d0) / (ip1 - ip0)
    return None


def plot(points: list[dict], path: Path) -> None:
    """IP reduction (± sd over runs) and BL/CT IP against the centre distance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sorted((p for p in points if not p["default_centres"]), key=lambda p: p["center_distance"])
    default = [p for p in points if p["default_centres"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 6.5), sharex=True)
    for ax, series in ((top, "reduction"), (bottom, "means")):
        for group, style in ((sweep, dict(marker="o", linestyle="-")), (default, dict(marker="*", markersize=12,
                                                                                     linestyle="none"))):
            if not group:
                continue
            d = [p["center_distance"] for p in group]
            tag = " (default LS)" if group is default else ""
            if series == "reduction":
                ax.errorbar(d, [p["ip"]["reduction_pct"] for p in group], yerr=[p["ip"]["se"] for p in group],
                            color="C0", capsize=3, label=f"ours{tag}", **style)
            else:
                ax.plot(d, [p["ip"]["bl_mean"] for p in group], color="C1", label=f"BL IP{tag}", **style)
                ax.plot(d, [p["ip"]["ct_mean"] for p in group], color="C2", label=f"CT IP{tag}", **style)
    top.axhline(0, color="grey", linewidth=0.8)
    top.axhline(PAPER["ip_reduction"], color="C3", linestyle="--", linewidth=1, label="paper LS (29.05)")
    top.set_ylabel("IP reduction (−%)")
    top.legend(fontsize=8)
    bottom.axhline(PAPER["bl_ip"], color="C1", linestyle="--", linewidth=1, label="paper BL IP (3.40)")
    bottom.axhline(PAPER["ct_ip"], color="C2", linestyle="--", linewidth=1, label="paper CT IP (2.41)")
    bottom.set_xlabel("distance between the blob centres")
    bottom.set_ylabel("mean IP (ℓ1)")
    bottom.legend(fontsize=8)
    fig.suptitle(f"LS: IP reduction vs centre distance ({points[0]['max_epochs']} epochs, seed {points[0]['seed']})",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def load_points(folder: Path, max_epochs: int, seed: int | None) -> list[dict]:
    """The finished points of this budget and seed (``None``: every seed), by distance."""
    pattern = f"*_e{max_epochs}_s{'*' if seed is None else seed}.json"
    points = [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]
    return sorted(points, key=lambda p: p["center_distance"])


def write_report(points: list[dict], args) -> None:
    """docs/ls_sensitivity.json and .png; the table into docs/ls_sensitivity.md between markers."""
    docs = Path(args.docs_dir)
    write_json_atomic(docs / "ls_sensitivity.json", {"points": points})
    plot(points, docs / "ls_sensitivity.png")
    md = docs / "ls_sensitivity.md"
    table = markdown(points)
    repeats = [q for q in load_points(Path(args.out_dir) / "points", args.max_epochs, None) if q["seed"] != args.seed]
    if repeats:
        table += (f"\n\nRepeats with other training seeds (the table above: seed {args.seed}):\n\n"
                  + markdown(repeats, with_seed=True))
    crossing = distance_for_bl_ip(points)
    table += (f"\n\nThe paper's BL IP of {PAPER['bl_ip']:.2f} corresponds to a centre distance of about "
              f"{_f(crossing, 1)} (linear interpolation of BL IP between the sweep's points)."
              if crossing is not None else "")
    begin, end = "<!-- table begin -->", "<!-- table end -->"
    if md.is_file() and begin in md.read_text():
        text = md.read_text()
        text = text[:text.index(begin) + len(begin)] + "\n" + table + "\n" + text[text.index(end):]
    else:
        text = f"# LS: IP reduction against the centre distance\n\n{begin}\n{table}\n{end}\n"
    write_text_atomic(md, text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distances", type=parse_distances, default=parse_distances("default,2,4,6,8,10,14"),
                        help="centre distances, comma-separated; 'default' = the data set's own centres")
    parser.add_argument("--max-epochs", type=int, default=100, help="training epochs (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="training seed of BL and CT (default %(default)s)")
    parser.add_argument("--limit-train-batches", type=float, help="Lightning limit_train_batches (smoke runs)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    parser.add_argument("--n-boot", type=int, default=100, help="bootstrap rounds of the alternative statistic")
    parser.add_argument("--out-dir", default="outputs/ls_sensitivity", help="points/*.json and the MLflow store")
    parser.add_argument("--tracking-uri", help="MLflow store (default sqlite:///OUT_DIR/mlflow.db)")
    parser.add_argument("--experiment", default="ls-sensitivity", help="MLflow experiment (default %(default)s)")
    parser.add_argument("--docs-dir", default=str(REPO / "docs"), help="where ls_sensitivity.{md,png,json} go")
    parser.add_argument("--no-report", dest="report", action="store_false", help="do not write the report")
    add_protocol_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.protocol != "reference":
        raise SystemExit(f"--protocol: {args.protocol!r} is not allowed here; allowed: reference")
    torch.set_num_threads(max(1, args.threads))
    out = Path(args.out_dir)
    folder = out / "points"
    folder.mkdir(parents=True, exist_ok=True)
    args.tracking_uri = args.tracking_uri or f"sqlite:///{(out / 'mlflow.db').resolve()}"
    prepare_store(args.tracking_uri)
    client = MlflowClient(tracking_uri=args.tracking_uri)
    for distance in args.distances:
        path = folder / f"{label(distance)}_e{args.max_epochs}_s{args.seed}.json"
        if path.is_file():
            print(f"{label(distance)}: done before ({path})", flush=True)
            continue
        print(f"{label(distance)}: training and evaluating BL and CT", flush=True)
        point = run_point(distance, args, client)
        write_json_atomic(path, point)
        print(f"{label(distance)}: IP {point['ip']['bl_mean']:.2f} → {point['ip']['ct_mean']:.2f} "
              f"({point['ip']['reduction_pct']:.1f}%), {point['seconds']:.0f}s", flush=True)
        if args.report:
            write_report(load_points(folder, args.max_epochs, args.seed), args)
    points = load_points(folder, args.max_epochs, args.seed)
    if args.report and points:
        write_report(points, args)


if __name__ == "__main__":
    main()
