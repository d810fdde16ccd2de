"""Why the cost column of Table 1 fails on the synthetic sets: one run per hypothesis (issue 24).

Each variant trains (or finds in the store) a protected BL/CT pair on one synthetic data set with one
training seed, evaluates both with the reference protocol plus the variant's change, and compares the
cost with the per-run Table 1 arithmetic (``compare_evaluations(..., statistic="runs")``). Variants:

  reference     what ``compare.py`` runs: x1 immutable in training and evaluation, domain μ ± 3σ, CT trained
                with λ_reg = λ_adv = 0 (the satml configs), evaluation τ 0.5
  domain2       the authors' domain width: μ ± 2σ (``infer_domain_constraints(X; nstd=2)``)
  adv           CT trained with Table 2's λ_adv 0.25 and λ_reg (the July final_run configs leave them blank)
  advonly       CT trained with λ_adv 0.25 and λ_reg 0
  regonly       CT trained with Table 2's λ_reg and λ_adv 0
  x2            x2 immutable instead of x1
  tau95         the reference models evaluated with τ 0.95 (the search runs on to p ≥ 0.95)
  steps500      the reference models evaluated with T 500 instead of 50 (is no-validity a budget artefact?)
  nodomain      the reference models evaluated without the domain clamp
  allces        the reference evaluations, cost counted over every counterfactual (valid or not)
  valid95       the reference evaluations, cost counted over counterfactuals with p(target) ≥ 0.95 only
  july          the July 2025 (final_run) cost runs: λ_adv 0.25 and Table 2's λ_reg, and the cost pooled
                over three mutability settings (all mutable, x1 immutable, x2 immutable), as
                evaluations/final_run/mutability/mlp/*/evaluation/grid_config.toml ran them

Trainings and evaluations are keyed like the reproduction's and found again in the store, so a re-run
only does what is missing. Writes one JSON per (data, variant) and a Markdown table.

    nice -n 5 python -m bench.actionability_synthetic --data circles,moons,ol,ls --variants reference,domain2
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from mlflow.tracking import MlflowClient

from ct_lightning.constraints import parse_mutability
from ct_lightning.evaluation import EvaluationConfig, evaluate_model, evaluation_constraints
from ct_lightning.evaluation.compare import compare_evaluations
from ct_lightning.evaluation.protocol import protocol_settings
from ct_lightning.experiment.studies.reproduce import (CONFIG_KEY_TAG, REFERENCE_PROTECTED_CT, REFERENCE_TRAINING,
                                               evaluation_key, find_evaluation, find_finished_training,
                                               save_evaluation, stable_key, training_key)
from ct_lightning.experiment.configuration.protocol_options import reference_individuals
from ct_lightning.experiment.runs.loading import load_run
from ct_lightning.experiment.configuration.data import build_datamodule
from ct_lightning.experiment.configuration.settings import resolve_config
from ct_lightning.experiment.runs.atomic_files import write_json_atomic, write_text_atomic
from ct_lightning.experiment.runs.tracking import prepare_store
from ct_lightning.experiment.runs.train import train

VARIANTS = ("reference", "domain2", "adv", "advonly", "regonly", "x2", "tau95", "steps500", "nodomain", "july",
            "allces", "valid95")
PAPER_COST = {"ls": (14.07, 16.41), "circles": (45.55, 42.99), "moons": (2.86, 5.16), "ol": (38.39, 40.86)}


def evaluate(run_id: str, tracking_uri: str, protocol: dict, immutable: list[str], eval_domain: bool = True):
    """Evaluate a trained run with ``immutable`` features frozen (keyed; found again when stored)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    key = stable_key({"protocol": protocol, "immutable": sorted(immutable), "domain": eval_domain})
    found = find_evaluation(client, run_id, key)
    if found is not None:
        return found
    loaded = load_run(run_id, tracking_uri)
    datamodule = build_datamodule(loaded.config)
    constraints = evaluation_constraints(loaded.module, datamodule, all_mutable=True)  # the model's domain
    names = list(datamodule.feature_names)
    mutability = parse_mutability({n: "none" for n in immutable} or None, datamodule.n_features, names)
    lower, upper = (constraints.lower, constraints.upper) if eval_domain else (None, None)
    result = evaluate_model(loaded.module, datamodule.x_test, datamodule.y_test, datamodule.n_classes,
                            EvaluationConfig(**protocol), mutability, lower, upper, x_train=datamodule.x_train,
                            feature_names=names, y_train=datamodule.y_train, data_name=datamodule.name)
    with tempfile.TemporaryDirectory(prefix="ct-eval-") as folder:
        path = save_evaluation(result, Path(folder) / f"{key}.pt")
        client.log_artifact(run_id, str(path), artifact_path="evaluations")
    return result


def trained(overrides: dict, tracking_uri: str) -> str:
    """Run id of a finished training with this configuration (trained now if missing)."""
    overrides = {**overrides, "tracking_uri": tracking_uri, "experiment": "actionability", "progress": False}
    key = training_key(resolve_config(overrides))
    client = MlflowClient(tracking_uri=tracking_uri)
    return find_finished_training(client, "actionability", key) or \
        train(overrides, tags={CONFIG_KEY_TAG: key})["run_id"]


class Recounted:
    """An evaluation whose cost is counted over another set of counterfactuals (``allces``, ``valid95``)."""

    def __init__(self, result, run_id: str, tracking_uri: str, how: str):
        cost = (result.counterfactuals - result.factuals).abs().sum(1).double().numpy()
        if how == "valid95":
            model = load_run(run_id, tracking_uri).module.eval()
            with torch.no_grad():
                probs = torch.softmax(model(result.counterfactuals), 1)
            target = torch.as_tensor(result.samples["target"]).long()
            keep = (probs.gather(1, target[:, None])[:, 0] >= 0.95).numpy()
            cost = np.where(keep, cost, np.nan)
        self.samples = {**result.samples, "cost": cost, "valid": np.isfinite(cost)}

    def metric_samples(self, name):
        values = self.samples[name]
        return values[np.isfinite(values)]


class Pooled:
    """Several evaluations' per-sample values side by side (the authors pool mutability settings)."""

    def __init__(self, results):
        self.samples = {k: np.concatenate([r.samples[k] for r in results]) for k in ("run", "lambda_energy",
                                                                                  "cost", "valid")}

    def metric_samples(self, name):
        values = self.samples[name]
        return values[np.isfinite(values)]


def run_variant(data: str, variant: str, seed: int, epochs: int, tracking_uri: str) -> dict:
    """Train/evaluate the protected pair of ``variant`` and compare its cost."""
    started = time.perf_counter()
    base = {"data": data, "seed": seed, "max_epochs": epochs, **REFERENCE_TRAINING}
    protocol = {**protocol_settings("reference", cost_pair=True), "n_individuals": reference_individuals(data),
                "lambda_energies": (0.1, 0.5, 1.0, 5.0, 10.0), "generator": "ecco", "max_steps": 50, "seed": 0}
    ct_extra = dict(REFERENCE_PROTECTED_CT)
    immutable = ["x1"]
    eval_domain = True
    if variant == "domain2":
        base["domain_std"] = 2.0
    elif variant in ("adv", "july"):
        ct_extra = {}
    elif variant == "advonly":
        ct_extra = {"lambda_reg": 0.0}
    elif variant == "regonly":
        ct_extra = {"lambda_adv": 0.0}
    elif variant == "x2":
        immutable = ["x2"]
    elif variant == "tau95":
        protocol["tau"] = 0.95
    elif variant == "steps500":
        protocol["max_steps"] = 500
    elif variant == "nodomain":
        eval_domain = False
    settings = [[], ["x1"], ["x2"]] if variant == "july" else [immutable]
    results = {"bl": [], "ct": []}
    runs = {"bl": [], "ct": []}
    for frozen in settings:
        for role, objective, extra in (("bl", "vanilla", {}), ("ct", "full", ct_extra)):
            run_id = trained({**base, **extra, "objective": objective, "immutable": frozen}, tracking_uri)
            runs[role].append(run_id)
            results[role].append(evaluate(run_id, tracking_uri, protocol, frozen, eval_domain))
    if variant in ("allces", "valid95"):
        results = {role: [Recounted(results[role][0], runs[role][0], tracking_uri, variant)] for role in results}
    bl = results["bl"][0] if len(settings) == 1 else Pooled(results["bl"])
    ct = results["ct"][0] if len(settings) == 1 else Pooled(results["ct"])
    stats = compare_evaluations(bl, ct, ("cost",), statistic="runs")["cost"]
    validity = {role: float(np.mean(np.concatenate([r.samples["valid"] for r in results[role]])))
                for role in results}
    means = {role: float(np.nanmean(np.concatenate([r.samples["cost"] for r in results[role]])))
             if validity[role] > 0 else math.nan for role in results}
    return {"data": data, "variant": variant, "seed": seed, "max_epochs": epochs, "runs": runs,
            "immutable": settings, "protocol": protocol, "ct_extra": ct_extra, "domain_std": base.get("domain_std", 3.0),
            "eval_domain": eval_domain, "reduction_pct": stats["reduction_pct"], "se": stats["se"],
            "significant": stats["significant"], "ci": [stats["ci_low"], stats["ci_high"]],
            "n_valid": [stats["n_bl"], stats["n_ct"]], "validity": validity, "cost_mean": means,
            "seconds": time.perf_counter() - started}


def _fmt(value, digits=2):
    return f"{value:.{digits}f}" if isinstance(value, float) and math.isfinite(value) else "n/a"


def markdown(points: list[dict]) -> str:
    """One line per (data, variant)."""
    lines = ["| data | variant | cost (−%) | n valid BL/CT | validity BL/CT | mean cost BL/CT | arXiv / satml |",
             "|---|---|---|---|---|---|---|"]
    for p in points:
        cell = f"{_fmt(p['reduction_pct'])} ± {_fmt(p['se'])}{'*' if p['significant'] else ''}"
        arxiv, satml = PAPER_COST[p["data"]]
        lines.append(f"| {p['data']} | {p['variant']} | {cell} | {p['n_valid'][0]}/{p['n_valid'][1]} | "
                     f"{_fmt(p['validity']['bl'], 3)}/{_fmt(p['validity']['ct'], 3)} | "
                     f"{_fmt(p['cost_mean']['bl'], 3)}/{_fmt(p['cost_mean']['ct'], 3)} | {arxiv}* / {satml}* |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="circles,moons,ol,ls")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-epochs", type=int, default=100)
    parser.add_argument("--tracking-uri", default="sqlite:///outputs/actionability/mlflow.db")
    parser.add_argument("--out", default="docs/actionability_synthetic")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {','.join(unknown)}; allowed: {','.join(VARIANTS)}")
    Path("outputs/actionability").mkdir(parents=True, exist_ok=True)
    prepare_store(args.tracking_uri, "actionability")
    out = Path(args.out)
    for data in [d for d in args.data.split(",") if d]:
        for variant in variants:
            path = out / f"{data}_{variant}_s{args.seed}.json"
            if path.exists():
                continue
            point = run_variant(data, variant, args.seed, args.max_epochs, args.tracking_uri)
            write_json_atomic(path, point)
            print(json.dumps({k: point[k] for k in ("data", "variant", "reduction_pct", "significant", "n_valid",
                                                     "validity", "seconds")}, default=str), flush=True)
    points = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    order = {v: i for i, v in enumerate(VARIANTS)}
    points.sort(key=lambda p: (p["data"], p["seed"], order.get(p["variant"], 99)))
    write_text_atomic(out / "table.md", markdown(points))
    print(markdown(points))


if __name__ == "__main__":
    main()
