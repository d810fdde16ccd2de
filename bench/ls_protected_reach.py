"""Can any counterfactual on LS reach the other class with x1 frozen? (issue 24)

For each protected LS model of a multi-seed reproduction (summary.json of ``compare.py --seeds``), every test
factual keeps its x1 and x2 is scanned over a grid: inside the model's domain and far beyond it (±100). The
share of factuals whose predicted class flips somewhere on the grid says whether a search that moves x2 only
can become valid at all: if not inside the domain, the n 0/0 cell is a property of the trained model and the
domain, not of the search's step size or budget. The same scan with the Bayes boundary of the two blobs (the
perpendicular bisector of the two centres: the boundary of two isotropic Gaussians with equal spread) says
whether the data themselves allow it.

    python -m bench.ls_protected_reach outputs/table1_seeds/agg/summary.json sqlite:///outputs/table1_seeds/mlflow.db
"""

from __future__ import annotations

import json
import sys

import torch

from ct_lightning.evaluation import evaluation_constraints
from ct_lightning.experiment.runs.loading import load_run
from ct_lightning.experiment.configuration.data import build_datamodule


def reach(predict, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Per factual: whether some x2 on ``grid`` (x1 kept) gives a class other than the factual's."""
    n, m = len(x), len(grid)
    points = x[:, None, :].expand(n, m, 2).clone()
    points[:, :, 1] = grid[None, :]
    classes = predict(points.reshape(-1, 2)).reshape(n, m)
    return (classes != predict(x)[:, None]).any(1)


def main() -> None:
    summary, uri = json.load(open(sys.argv[1])), sys.argv[2]
    report = {}
    for seed, block in summary["per_seed"].items():
        row = next(r for r in block["rows"] if r["data"] == "ls")
        for role in ("bl_protected", "ct_protected"):
            loaded = load_run(row["runs"][role], uri)
            dm = build_datamodule(loaded.config)
            lower, upper = evaluation_constraints(loaded.module, dm, protect=True).lower, \
                evaluation_constraints(loaded.module, dm, protect=True).upper
            model = loaded.module.eval()
            with torch.no_grad():
                predict = lambda z: model(z).argmax(1)  # noqa: E731
                inside = reach(predict, dm.x_test, torch.linspace(float(lower[1]), float(upper[1]), 2001))
                far = reach(predict, dm.x_test, torch.linspace(-100.0, 100.0, 20001))
                # the slope of the learned boundary: where the logit difference is 0 along x1 and x2
                x = dm.x_test.clone().requires_grad_(True)
            with torch.enable_grad():
                logits = model(x)
                (logits[:, 1] - logits[:, 0]).sum().backward()
            grad = x.grad.abs().mean(0)
            report[f"s{seed} {role}"] = {"reach_inside_domain": float(inside.float().mean()),
                                         "reach_within_100": float(far.float().mean()),
                                         "domain_x2": [float(lower[1]), float(upper[1])],
                                         "mean_abs_grad_x1_x2": [float(grad[0]), float(grad[1])]}
            print(seed, role, json.dumps(report[f"s{seed} {role}"]), flush=True)
    dm = build_datamodule(loaded.config)
    centers = torch.as_tensor(dm.centers, dtype=torch.float32) if hasattr(dm, "centers") else None
    x, y = dm.x_train, dm.y_train
    c0, c1 = x[y == 0].mean(0), x[y == 1].mean(0)
    mid, normal = (c0 + c1) / 2, c1 - c0
    bayes = lambda z: ((z - mid) @ normal > 0).long()  # noqa: E731
    inside = reach(bayes, dm.x_test, torch.linspace(float(lower[1]), float(upper[1]), 2001))
    report["bayes boundary (class means)"] = {"reach_inside_domain": float(inside.float().mean()),
                                              "class_means": [c0.tolist(), c1.tolist()],
                                              "generator_centres": None if centers is None else centers.tolist()}
    print("bayes", json.dumps(report["bayes boundary (class means)"]))
    json.dump(report, open("docs/ls_protected_reach.json", "w"), indent=1)


if __name__ == "__main__":
    main()
