"""The contract of every metric in the names table: class equals functional, batches accumulate, reset works."""

import pytest
import torch
from torch import nn

from ct_lightning.attacks import fgsm
from ct_lightning.metrics.names import EVALUATION_METRICS, METRICS, TABLE_METRICS, logged_name, logged_values

torch.manual_seed(0)
X = torch.randn(40, 4)
Y = (X[:, 0] > 0).long()
CF = X + 0.3 * torch.randn(40, 4)
TARGET = 1 - Y
LOGITS = torch.randn(40, 2)
MODEL = nn.Sequential(nn.Linear(4, 2))
GROUPS = [[2, 3]]


def _batches(n_batches: int):
    return [slice(i * 40 // n_batches, (i + 1) * 40 // n_batches) for i in range(n_batches)]


# key -> (make the metric, update arguments of a slice, the functional value over all rows)
CASES = {
    "ip": (lambda: METRICS["ip"].metric_class(X, Y), lambda s: (CF[s], TARGET[s]),
           lambda: METRICS["ip"].functional(CF, TARGET, X, Y).mean()),
    "ip_star": (lambda: METRICS["ip_star"].metric_class(X, Y, seed=3), lambda s: (CF[s], TARGET[s]),
                lambda: METRICS["ip_star"].functional(CF, TARGET, X, Y, generator=torch.Generator().manual_seed(3))),
    "cost": (lambda: METRICS["cost"].metric_class(), lambda s: (CF[s], X[s]),
             lambda: METRICS["cost"].functional(CF, X).mean()),
    "validity": (lambda: METRICS["validity"].metric_class(), lambda s: (LOGITS[s], TARGET[s]),
                 lambda: METRICS["validity"].functional(LOGITS, TARGET)),
    "accuracy": (lambda: METRICS["accuracy"].metric_class(), lambda s: (LOGITS[s], Y[s]),
                 lambda: METRICS["accuracy"].functional(LOGITS, Y)),
    "robust_accuracy": (lambda: METRICS["robust_accuracy"].metric_class(),
                        lambda s: (MODEL(fgsm(MODEL, X[s], Y[s], 0.3)).detach(), Y[s]),
                        lambda: METRICS["robust_accuracy"].functional(MODEL, X, Y, epsilon=0.3)),
    "invalidation_rate": (lambda: METRICS["invalidation_rate"].metric_class(),
                          lambda s: (Y[s], torch.stack([Y[s], TARGET[s], (X[s, 1] > 0).long()])),
                          lambda: METRICS["invalidation_rate"].functional(
                              Y, torch.stack([Y, TARGET, (X[:, 1] > 0).long()]))),
    "sparsity": (lambda: METRICS["sparsity"].metric_class(GROUPS), lambda s: (CF[s], X[s]),
                 lambda: METRICS["sparsity"].functional(CF, X, GROUPS)["l0"].mean()),
}


def test_every_metric_of_the_table_has_a_contract_case():
    assert set(CASES) == set(METRICS)


@pytest.mark.parametrize("key", sorted(METRICS))
def test_metric_class_equals_functional_accumulates_and_resets(key):
    make, arguments, functional = CASES[key]
    expected = float(functional())
    one = make()
    one.update(*arguments(slice(None)))
    assert float(one.compute()) == pytest.approx(expected, rel=1e-5)
    two = make()
    for part in _batches(2):
        two.update(*arguments(part))
    assert float(two.compute()) == pytest.approx(expected, rel=1e-5)
    two.reset()
    two.update(*arguments(_batches(2)[0]))
    first_half = make()
    first_half.update(*arguments(_batches(2)[0]))
    assert float(two.compute()) == pytest.approx(float(first_half.compute()), rel=1e-5, nan_ok=True)


def test_names_table_spells_each_metric_once():
    assert logged_name("robust_accuracy", "eval") == "eval/robust_acc"
    assert logged_name("accuracy", "val") == "val/acc"
    assert set(TABLE_METRICS) <= set(EVALUATION_METRICS) <= set(METRICS)
    assert len({m.logged for m in METRICS.values()}) == len(METRICS)
    summary = {"ip": 1.0, "ip_star": float("nan"), "cost": 2.0, "validity": 0.5, "accuracy": 0.9,
               "robust_accuracy": None}
    assert logged_values(summary, "eval") == {"eval/ip": 1.0, "eval/cost": 2.0, "eval/validity": 0.5,
                                              "eval/acc": 0.9}
