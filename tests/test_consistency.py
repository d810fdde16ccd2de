"""The invalidation rate (functional and torchmetrics) and the RS/LOO consistency recipe."""

import json
import math

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from ct_lightning.experiment.studies.consistency import ConsistencyConfig, flat_metrics
from ct_lightning.metrics import InvalidationRate, invalidation_rate

from recipe_loader import load_recipe


def test_invalidation_rate_is_zero_for_identical_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    copies = [nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(4)]
    for copy in copies:
        copy.load_state_dict(model.state_dict())
    x_cf = torch.randn(50, 3)
    with torch.no_grad():
        base = model(x_cf)
        others = torch.stack([copy(x_cf) for copy in copies])
    assert invalidation_rate(base, others) == 0
    assert torch.equal(invalidation_rate(base, others, reduction="per_model"), torch.zeros(4))
    metric = InvalidationRate()
    metric.update(base, others)
    assert metric.compute() == 0


def test_invalidation_rate_matches_a_hand_count():
    base = torch.tensor([0, 1, 1, 0])
    others = torch.tensor([[0, 1, 0, 0],   # 1 of 4 changed
                           [1, 1, 1, 1]])  # 2 of 4 changed
    assert invalidation_rate(base, others).item() == pytest.approx(3 / 8)
    assert invalidation_rate(base, others, reduction="per_model").tolist() == [0.25, 0.5]
    assert invalidation_rate(base, others, reduction="per_counterfactual").tolist() == [0.5, 0.0, 0.5, 0.5]
    valid = torch.tensor([True, True, False, True])  # the third counterfactual is not counted
    assert invalidation_rate(base, others, valid).item() == pytest.approx(2 / 6)
    assert invalidation_rate(base, others[1]).item() == pytest.approx(0.5)  # one related model
    logits = torch.nn.functional.one_hot(others, 2).float()  # (M, N, K) logits give the same answer
    assert invalidation_rate(base, logits).item() == pytest.approx(3 / 8)
    assert math.isnan(invalidation_rate(base, others, torch.zeros(4, dtype=torch.bool)).item())
    metric = InvalidationRate()
    metric.update(base[:2], others[:, :2])  # 1 of 4
    metric.update(base[2:], others[:, 2:])  # 2 of 4
    assert metric.compute().item() == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="do not match"):
        invalidation_rate(base, torch.zeros(2, 3, dtype=torch.long))


def test_config_validates():
    with pytest.raises(ValueError, match="mode"):
        ConsistencyConfig(mode="bootstrap")
    with pytest.raises(ValueError, match="kinds"):
        ConsistencyConfig(kinds=("XX",))


@pytest.mark.parametrize("mode", ["rs", "loo"])
def test_consistency_recipe_end_to_end(tmp_path, mode):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "consistency.json"
    summary = load_recipe("consistency").main([
        "--data", "moons", "--mode", mode, "--n-models", "2", "--max-epochs", "1", "--limit-train-batches", "4",
        "--nce", "30", "--n-counterfactuals", "20", "--max-steps", "20", "--sns-steps", "5",
        "--tracking-uri", uri, "--summary-json", str(out), "--quiet"])
    saved = json.loads(out.read_text())
    assert saved["run_id"] == summary["run_id"] and saved["mode"] == mode and saved["n_models"] == 2
    for kind in ("BL", "CT"):
        for generator in ("ecco", "ecco+sns"):
            rate = saved["invalidation_rate"][kind][generator]
            assert rate is None or 0.0 <= rate <= 1.0
            assert set(saved["cost"][kind][generator]) == {"l1", "l2"}
            assert 0.0 <= saved["validity"][kind][generator] <= 1.0
    if mode == "loo":
        assert len(saved["excluded_rows"]) == 2
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    expected = {k for k in flat_metrics(saved) if k.startswith(("validity/", "acc/"))}
    assert expected and expected <= set(run.data.metrics)
    assert run.data.params["mode"] == mode
