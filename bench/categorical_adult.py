"""Adult: how many counterfactuals are invalid one-hot mixtures (or off the integer grid) before and after the
searches snap to valid points, and what that does to validity, cost and IP (docs/categorical.md).

Before = the searches with no feature types (the code before this change); after = with the data module's types
(one-hot groups from ``feature=value`` names, Adult's six integer features). One BL model (vanilla) is evaluated
both ways on the same factuals and targets; two CT models are trained for the same epochs, one with the old
training search (no types) and one with the new one, and each is evaluated in its own regime. The evaluation is
the paper protocol (ECCo, λ_egy ∈ {0.1, 0.5, 1, 5, 10}, τ = 0.95, T = 50, 5 runs × 100 test factuals; no FGSM).

    CT_DATA_DIR=/work/shared/data/raw python bench/categorical_adult.py --epochs 10 --out bench/categorical_adult.json
"""

from __future__ import annotations

import argparse
import json
import time
from unittest import mock

import lightning as L
import torch

import ct_lightning.module as module_file
from ct_lightning import CTModule
from ct_lightning.constraints import Constraints, FeatureTypes, invalid_rows
from ct_lightning.evaluation.protocol import EvaluationConfig, evaluate_model
from datamodules.real import AdultDataModule


def train_model(datamodule, objective: str, epochs: int, with_types: bool, seed: int) -> CTModule:
    """A model trained for ``epochs`` epochs with Adult's Table 2 settings; ``with_types=False``: the old search."""
    torch.manual_seed(seed)
    module = CTModule(n_features=datamodule.n_features, n_classes=2, objective=objective, tau=0.75, nce=5000,
                      lambda_reg=0.25, feature_names=datamodule.feature_names, seed=seed)
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    if with_types:
        trainer.fit(module, datamodule=datamodule)
    else:
        with mock.patch.object(module_file, "resolve_feature_types",
                               lambda dm, names, n: FeatureTypes(n)):
            trainer.fit(module, datamodule=datamodule)
    return module.eval()


def shares(points: torch.Tensor, types: FeatureTypes) -> dict:
    """Share of rows with some one-hot group not exactly one category, and with an integer feature off its grid."""
    one_hot = FeatureTypes(types.n_features, types.groups, [], types.offset, types.scale)
    integers = FeatureTypes(types.n_features, [], types.integers, types.offset, types.scale)
    return {"invalid_one_hot": float(invalid_rows(one_hot, points).float().mean()),
            "invalid_integer": float(invalid_rows(integers, points).float().mean())}


def evaluate(model, datamodule, types: FeatureTypes, config: EvaluationConfig, full: FeatureTypes) -> dict:
    """The protocol's summary plus the invalid shares (judged by the full types) of all counterfactuals."""
    lower, upper = datamodule.domain(3.0)
    result = evaluate_model(model, datamodule.x_test, datamodule.y_test, 2, config, None, lower, upper,
                            robust=False, feature_names=datamodule.feature_names, feature_types=types)
    summary = result.summary()
    out = {key: summary[key] for key in ("validity", "cost", "ip", "ip_star", "converged", "n_counterfactuals")}
    out.update(shares(result.counterfactuals, full))
    valid = torch.as_tensor(result.samples["valid"])
    out["invalid_one_hot_among_valid"] = shares(result.counterfactuals[valid], full)["invalid_one_hot"]
    targets = torch.as_tensor(result.samples["target"])
    with torch.no_grad():
        probability = model(result.counterfactuals).softmax(1).gather(1, targets[:, None]).squeeze(1)
        # What a user does with the old output: decode to the nearest real point afterwards, then predict again.
        decoded = Constraints(None, types=full).snap(result.counterfactuals, result.factuals)
        decoded_probability = model(decoded).softmax(1).gather(1, targets[:, None]).squeeze(1)
    out["target_probability"] = float(probability.mean())
    out["decoded_afterwards"] = {"validity": float((model(decoded).argmax(1) == targets).float().mean()),
                                 "target_probability": float(decoded_probability.mean())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/categorical_adult.json")
    args = parser.parse_args()
    datamodule = AdultDataModule(seed=args.seed)
    datamodule.setup()
    full = datamodule.feature_types()
    none = FeatureTypes(datamodule.n_features)
    one_hot_only = FeatureTypes.from_names(datamodule.feature_names, datamodule.n_features)
    config = EvaluationConfig(seed=args.seed)
    report = {"epochs": args.epochs, "seed": args.seed, "n_groups": len(full.groups),
              "n_integer_features": len(full.integers), "protocol": "paper (EvaluationConfig defaults), no FGSM"}
    started = time.perf_counter()
    bl = train_model(datamodule, "vanilla", args.epochs, True, args.seed)
    report["BL"] = {"before": evaluate(bl, datamodule, none, config, full),
                    "after_one_hot_only": evaluate(bl, datamodule, one_hot_only, config, full),
                    "after": evaluate(bl, datamodule, full, config, full)}
    ct_before = train_model(datamodule, "full", args.epochs, False, args.seed)
    ct_after = train_model(datamodule, "full", args.epochs, True, args.seed)
    report["CT"] = {"before": evaluate(ct_before, datamodule, none, config, full),
                    "after": evaluate(ct_after, datamodule, full, config, full)}
    report["seconds"] = round(time.perf_counter() - started, 1)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
