"""Regression: evaluate_model gives a learning generator the feature names, so one-hot groups stay one-hot."""

import torch
from torch import nn

from ct_lightning.evaluation import EvaluationConfig, evaluate_model

FEATURES = ["income", "debt", "job=a", "job=b", "job=c"]


def test_amortised_evaluation_keeps_one_hot_groups_one_hot():
    rng = torch.Generator().manual_seed(0)
    n = 300
    continuous = torch.randn(n, 2, generator=rng)
    job = torch.randint(0, 3, (n,), generator=rng)
    x = torch.cat([continuous, nn.functional.one_hot(job, 3).float()], 1)
    y = ((continuous[:, 0] + (job == 2).float()) > 0.5).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    config = EvaluationConfig(n_individuals=40, n_runs=1, generator="amortised")
    result = evaluate_model(model, x[:100], y[:100], 2, config, robust=False, x_train=x, feature_names=FEATURES)
    group = result.counterfactuals[:, 2:]
    # With the names the network generates the group as a category; without them (the old bug) it adds a
    # continuous perturbation, so the columns are no longer a one-hot vector.
    assert torch.isin(group, torch.tensor([0.0, 1.0])).all()
    assert torch.equal(group.sum(1), torch.ones(len(group)))
