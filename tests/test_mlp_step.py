"""A training step by hand (training.mlp_step) gives autograd's loss terms and gradients, and a CTModule trained by
hand ends with the weights it would have with autograd."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning import CTModule
from ct_lightning.generators.input_gradient import autograd_only
from ct_lightning.losses import adversarial_loss, energy_terms
from ct_lightning.training.epoch_block import EpochBlockLoader
from ct_lightning.training.mlp_step import conventional_step, counterfactual_step
from ct_lightning.training.pool import CounterfactualPool
from datamodules import get_datamodule

CLOSE = {"rtol": 1e-5, "atol": 1e-6}
MODELS = {
    "relu": lambda: nn.Sequential(nn.Linear(4, 9), nn.ReLU(), nn.Linear(9, 3)),
    "tanh-sigmoid-deep": lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6), nn.Sigmoid(),
                                               nn.Linear(6, 3)),
    "no-bias": lambda: nn.Sequential(nn.Linear(4, 5, bias=False), nn.ReLU(), nn.Linear(5, 3, bias=False)),
}


def _grad_buffers(model):
    return {p: torch.full_like(p, float("nan")) for p in model.parameters()}  # every value must be written


def _autograd_grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad for p in model.parameters()]


def _data(seed, rows=11, pool_rows=6):
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, 4, generator=generator) * 2, torch.randint(0, 3, (rows,), generator=generator)
    pool = CounterfactualPool(*(torch.randn(pool_rows, 4, generator=generator) for _ in range(3)),
                              torch.randint(0, 3, (pool_rows,), generator=generator),
                              torch.randint(0, 3, (pool_rows,), generator=generator))
    return x, y, pool


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("lambda_clf", [1.0, 0.7])
def test_conventional_step_is_autograds(name, lambda_clf):
    torch.manual_seed(0)
    model = MODELS[name]()
    x, y, _ = _data(1)
    grads = _grad_buffers(model)
    loss, clf, logits = conventional_step(list(model), x, y, lambda_clf, grads)
    reference_logits = model(x)
    reference_clf = F.cross_entropy(reference_logits, y)
    reference_loss = reference_clf if lambda_clf == 1.0 else lambda_clf * reference_clf
    torch.testing.assert_close(logits, reference_logits.detach(), **CLOSE)
    torch.testing.assert_close(clf, reference_clf.detach(), **CLOSE)
    torch.testing.assert_close(loss, reference_loss.detach(), **CLOSE)
    for p, expected in zip(model.parameters(), _autograd_grads(model, reference_loss)):
        torch.testing.assert_close(grads[p], expected, **CLOSE)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("energy,adversarial", [(True, True), (True, False), (False, True)],
                         ids=["full", "energy", "adversarial"])
def test_counterfactual_step_is_autograds(name, energy, adversarial):
    """Eq. 2 as CTModule writes it for autograd (one forward over [x, x⁺, x', x'_tε]; a left-out term logged as 0)."""
    torch.manual_seed(0)
    model = MODELS[name]()
    x, y, pool = _data(2)
    lambdas = (1.0, 0.5, 0.3, 0.8)
    grads = _grad_buffers(model)
    loss, terms, logits = counterfactual_step(list(model), x, y, pool, lambdas, energy, adversarial, grads)
    m = len(pool)
    all_logits = model(torch.cat([x, pool.x_pos, pool.x_neg, pool.nascent]))
    ref_logits, logits_pos, logits_neg, logits_adv = all_logits.split([len(x), m, m, m])
    clf = F.cross_entropy(ref_logits, y)
    div, ridge = energy_terms(logits_pos, logits_neg, pool.target)
    adv = adversarial_loss(logits_adv, pool.labels)
    if not energy:
        div, ridge = div.detach() * 0.0, ridge.detach() * 0.0
    if not adversarial:
        adv = adv.detach() * 0.0
    reference_loss = lambdas[0] * clf + lambdas[1] * div + lambdas[2] * ridge + lambdas[3] * adv
    torch.testing.assert_close(logits, ref_logits.detach(), **CLOSE)
    for value, expected in zip((loss, *terms), (reference_loss, clf, div, ridge, adv)):
        torch.testing.assert_close(value, expected.detach(), **CLOSE)
    assert float(terms[1]) != 0.0 if energy else float(terms[1]) == 0.0
    for p, expected in zip(model.parameters(), _autograd_grads(model, reference_loss)):
        torch.testing.assert_close(grads[p], expected, **CLOSE)


def _fit(objective, pool, hidden=(32,)):
    L.seed_everything(0, verbose=False)
    data = get_datamodule("circles", batch_size=50)
    data.setup()
    module = CTModule(n_features=2, n_classes=2, objective=objective, pool=pool, nce=120, seed=0,
                      hidden_sizes=list(hidden))
    module.fuse_epochs()
    trainer = L.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", limit_val_batches=0)
    trainer.fit(module, train_dataloaders=EpochBlockLoader(data.train_dataloader()))
    grads = [p.grad for p in module.model.parameters()]
    return module, dict(trainer.callback_metrics), grads


@pytest.mark.slow  # six short real Trainer fits
@pytest.mark.parametrize("objective,pool", [("full", "epoch"), ("vanilla", "epoch"), ("energy", "step")])
def test_a_module_trained_by_hand_is_the_module_trained_by_autograd(objective, pool):
    by_hand, by_hand_metrics, hand_grads = _fit(objective, pool, hidden=(16, 8))
    with autograd_only():
        reference, reference_metrics, autograd_grads = _fit(objective, pool, hidden=(16, 8))
    # The by-hand steps ran: they write the gradients into the optimiser's one flat buffer, autograd does not.
    assert len({g.untyped_storage().data_ptr() for g in hand_grads}) == 1
    assert len({g.untyped_storage().data_ptr() for g in autograd_grads}) == len(autograd_grads)
    for p, q in zip(by_hand.model.parameters(), reference.model.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)
    for key in ("train/loss", "train/clf", "train/div", "train/ridge", "train/adv", "train/acc"):
        torch.testing.assert_close(by_hand_metrics[key], reference_metrics[key], rtol=1e-4, atol=1e-5)
