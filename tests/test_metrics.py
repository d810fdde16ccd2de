"""Tests for ct_lightning.metrics and ct_lightning.attacks."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning.attacks import fgsm, pgd
from ct_lightning.metrics import (
    CounterfactualCost,
    Implausibility,
    MMDImplausibility,
    RobustAccuracy,
    Validity,
    counterfactual_cost,
    implausibility,
    mmd2_unbiased,
    mmd_implausibility,
    robust_accuracy,
    validity,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- MMD


def mmd2_double_loop(x, y, length_scale):
    """Plain-Python reference implementation of the unbiased MMD^2 (Gretton et al. 2012, Eq. 3)."""
    def k(a, b):
        return math.exp(-sum((ai - bi) ** 2 for ai, bi in zip(a, b)) / (2 * length_scale**2))

    x, y = x.tolist(), y.tolist()
    m, n = len(x), len(y)
    kxx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    kyy = sum(k(y[i], y[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    kxy = sum(k(x[i], y[j]) for i in range(m) for j in range(n)) / (m * n)
    return kxx + kyy - 2 * kxy


@pytest.mark.parametrize("length_scale", [0.5, 1.3])
def test_mmd2_matches_double_loop_with_and_without_chunking(length_scale):
    g = gen(1)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64) * 0.7
    y = torch.randn(9, 3, generator=g, dtype=torch.float64) * 0.7 + 0.3
    expected = mmd2_double_loop(x, y, length_scale)
    full = mmd2_unbiased(x, y, length_scale=length_scale)
    assert full.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
    for chunk in (1, 2, 3, 1024):
        chunked = mmd2_unbiased(x, y, length_scale=length_scale, chunk_size=chunk)
        assert chunked.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-14)


def test_mmd2_flattens_images():
    g = gen(2)
    x = torch.randn(4, 1, 2, 2, generator=g, dtype=torch.float64)
    y = torch.randn(5, 1, 2, 2, generator=g, dtype=torch.float64)
    expected = mmd2_double_loop(x.reshape(4, -1), y.reshape(5, -1), 0.5)
    assert mmd2_unbiased(x, y).item() == pytest.approx(expected, rel=1e-10)


def test_mmd2_unbiased_for_same_distribution_and_positive_for_shift():
    g = gen(3)
    same = torch.stack([
        mmd2_unbiased(torch.randn(20, 2, generator=g, dtype=torch.float64),
                      torch.randn(25, 2, generator=g, dtype=torch.float64))
        for _ in range(200)
    ])
    # Std of a single draw is ~0.025, so the mean of 200 draws has std ~0.002; the
    # biased (V-statistic) estimator would be ~0.08 here.
    assert abs(same.mean().item()) < 0.01
    shifted = torch.stack([
        mmd2_unbiased(torch.randn(20, 2, generator=g, dtype=torch.float64),
                      torch.randn(25, 2, generator=g, dtype=torch.float64) + 1.5)
        for _ in range(10)
    ])
    assert shifted.min().item() > 0.03
    assert shifted.mean().item() > 10 * abs(same.mean().item())


def test_mmd2_needs_two_samples():
    with pytest.raises(ValueError, match="at least 2"):
        mmd2_unbiased(torch.randn(1, 2), torch.randn(5, 2))
    with pytest.raises(ValueError, match="at least 2"):
        mmd2_unbiased(torch.randn(5, 2), torch.randn(1, 2))


def test_mmd_implausibility_weighting_skipping_and_subsampling():
    g = gen(4)
    ref_x = torch.randn(30, 2, generator=g, dtype=torch.float64)
    ref_y = torch.tensor([0] * 10 + [1] * 12 + [2] * 8)
    cf = torch.randn(8, 2, generator=g, dtype=torch.float64)
    targets = torch.tensor([0, 1, 0, 1, 0, 2, 1, 1])  # class 0: 3, class 1: 4, class 2: 1 (skipped)
    m0 = mmd2_double_loop(cf[targets == 0], ref_x[ref_y == 0], 0.5)
    m1 = mmd2_double_loop(cf[targets == 1], ref_x[ref_y == 1], 0.5)
    got = mmd_implausibility(cf, targets, ref_x, ref_y, max_samples=None)
    assert got.item() == pytest.approx((3 * m0 + 4 * m1) / 7, rel=1e-10)

    # Subsampling without replacement, reproducible with the generator.
    a = mmd_implausibility(cf, targets, ref_x, ref_y, max_samples=5, generator=gen(7))
    b = mmd_implausibility(cf, targets, ref_x, ref_y, max_samples=5, generator=gen(7))
    assert a.item() == b.item()
    # max_samples >= class size changes nothing.
    assert mmd_implausibility(cf, targets, ref_x, ref_y, max_samples=12).item() == pytest.approx(got.item())

    # Only singleton classes -> NaN.
    assert math.isnan(mmd_implausibility(cf[:2], targets[:2], ref_x, ref_y).item())


# ---------------------------------------------------------------- IP, cost, validity


def test_implausibility_hand_computed():
    ref_x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, 0.0], [1.0, 2.0]])
    ref_y = torch.tensor([0, 0, 1, 1])
    cf = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    targets = torch.tensor([1, 0])
    # cf0 -> class 1: distances 1 and sqrt(5) = 2.2360680; cf1 -> class 0: distances 3 and 4.
    ip = implausibility(cf, targets, ref_x, ref_y)
    torch.testing.assert_close(ip, torch.tensor([1.6180340, 3.5]))
    # l1: cf0 -> 1 and 3; cf1 -> 3 and 4.
    ip1 = implausibility(cf, targets, ref_x, ref_y, p=1.0)
    torch.testing.assert_close(ip1, torch.tensor([2.0, 3.5]))


@pytest.mark.parametrize("n, m, d, chunk", [(1, 5, 2, 1 << 22), (300, 200, 3, 1 << 22), (257, 64, 784, 1000),
                                         (50, 40, 4, 7), (0, 10, 2, 1 << 22)])
def test_mean_l1_distances_equal_cdist(n, m, d, chunk):
    """The sorted-prefix-sum form of the mean l1 distance (the reference protocol's IP) against cdist in float64,
    with repeated reference rows and points that sit on reference values (ties), in one chunk and in many."""
    from ct_lightning.metrics.functional import mean_l1_distances

    g = torch.Generator().manual_seed(n + d)
    points = torch.randn(n, d, generator=g) * 3
    reference = torch.randn(m, d, generator=g)
    reference[::3] = reference[0]
    points[: min(n, 4)] = reference[: min(n, 4)]
    expected = torch.cdist(points.double(), reference.double(), p=1).mean(1)
    got = mean_l1_distances(points, reference, chunk_values=chunk)
    assert got.dtype == torch.float32 and got.shape == (n,)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-5)


def test_l1_implausibility_equals_the_cdist_form():
    g = torch.Generator().manual_seed(3)
    ref_x, ref_y = torch.randn(400, 5, generator=g), torch.randint(0, 3, (400,), generator=g)
    cf, targets = torch.randn(120, 5, generator=g) * 2, torch.randint(0, 3, (120,), generator=g)
    expected = torch.stack([torch.cdist(cf[i:i + 1].double(), ref_x[ref_y == t].double(), p=1).mean()
                            for i, t in enumerate(targets.tolist())])
    torch.testing.assert_close(implausibility(cf, targets, ref_x, ref_y, p=1.0).double(), expected, rtol=1e-6,
                               atol=1e-5)


def test_implausibility_missing_class():
    ref_x = torch.zeros(3, 2)
    ref_y = torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match="class 2"):
        implausibility(torch.zeros(2, 2), torch.tensor([0, 2]), ref_x, ref_y)


def test_cost_and_validity_hand_computed():
    cf = torch.tensor([[1.0, 2.0, -2.0], [0.0, 3.0, 4.0]])
    fact = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(counterfactual_cost(cf, fact), torch.tensor([5.0, 7.0]))
    torch.testing.assert_close(counterfactual_cost(cf, fact, p=2.0), torch.tensor([3.0, 5.0]))

    logits = torch.tensor([[2.0, 1.0], [0.0, 1.0], [5.0, -1.0], [0.0, 3.0]])
    targets = torch.tensor([0, 0, 0, 1])  # predictions 0, 1, 0, 1 -> 3 of 4 correct
    assert validity(logits, targets).item() == pytest.approx(0.75)


# ---------------------------------------------------------------- attacks


class ModeRecorder(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.modes = []

    def forward(self, x):
        self.modes.append(self.training)
        return self.inner(x)


def linear_model():
    lin = nn.Linear(3, 3).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, -1.0], [-0.8, 0.2, 1.5]]))
        lin.bias.copy_(torch.tensor([0.1, -0.2, 0.05]))
    return lin


def test_fgsm_linear_model_analytic_gradient():
    model = linear_model()
    W, b = model.weight.detach(), model.bias.detach()
    x = torch.tensor([[0.2, -0.1, 0.4], [1.0, 0.5, -0.3], [-0.6, 0.9, 0.1]], dtype=torch.float64)
    y = torch.tensor([0, 2, 1])
    eps = 0.1
    grad = (torch.softmax(x @ W.T + b, dim=1) - F.one_hot(y, 3).double()) @ W
    assert (grad.abs() > 1e-6).all()
    adv = fgsm(model, x, y, eps)
    torch.testing.assert_close(adv - x, eps * grad.sign())
    assert model.weight.grad is None and model.bias.grad is None

    # Clamping to a domain.
    lb, ub = torch.full((3,), -0.5, dtype=torch.float64), torch.full((3,), 0.95, dtype=torch.float64)
    adv_c = fgsm(model, x, y, eps, domain=(lb, ub))
    torch.testing.assert_close(adv_c, torch.clamp(x + eps * grad.sign(), -0.5, 0.95))


def test_fgsm_inside_inference_mode_restores_mode_and_leaves_no_grads():
    model = ModeRecorder(linear_model())
    model.train()
    x = torch.tensor([[0.2, -0.1, 0.4], [1.0, 0.5, -0.3]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    expected = fgsm(model, x, y, 0.05)
    with torch.inference_mode():
        x_inf, y_inf = x.clone(), y.clone()
        assert x_inf.is_inference()
        adv = fgsm(model, x_inf, y_inf, 0.05)
        acc = robust_accuracy(model, x_inf, y_inf, epsilon=0.05, attack="pgd", steps=3)
    torch.testing.assert_close(adv, expected)
    assert 0.0 <= acc.item() <= 1.0
    with torch.no_grad():
        torch.testing.assert_close(fgsm(model, x, y, 0.05), expected)
    assert model.training and model.inner.training
    assert model.modes and not any(model.modes)  # forward passes of the attack ran in eval mode
    assert all(p.grad is None for p in model.parameters())


def test_pgd_stays_in_ball_and_domain_and_increases_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    model.train()
    g = gen(5)
    x = torch.rand(32, 4, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    eps = 0.1
    domain = (torch.zeros(4), torch.ones(4))
    for random_start in (False, True):
        adv = pgd(model, x, y, eps, steps=5, domain=domain, random_start=random_start, generator=gen(6))
        assert (adv - x).abs().max().item() <= eps + 1e-6
        assert adv.min().item() >= 0.0 and adv.max().item() <= 1.0
        model.eval()
        with torch.no_grad():
            assert F.cross_entropy(model(adv), y) > F.cross_entropy(model(x), y)
        model.train()
    assert model.training and all(m.training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_robust_accuracy_matches_manual_and_validates_attack():
    model = linear_model()
    g = gen(8)
    x = torch.randn(20, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (20,), generator=g)
    adv = fgsm(model, x, y, 0.3)
    with torch.no_grad():
        manual = (model(adv).argmax(1) == y).double().mean().item()
        clean = (model(x).argmax(1) == y).double().mean().item()
    assert robust_accuracy(model, x, y, epsilon=0.3).item() == pytest.approx(manual)
    assert robust_accuracy(model, x, y, epsilon=0.0).item() == pytest.approx(clean)
    with pytest.raises(ValueError, match="fgsm, pgd"):
        robust_accuracy(model, x, y, attack="cw")


# ---------------------------------------------------------------- metric classes


def reference_set():
    g = gen(9)
    ref_x = torch.randn(40, 2, generator=g)
    ref_y = torch.arange(40) % 2
    cf = torch.randn(12, 2, generator=g)
    targets = torch.tensor([0, 1] * 6)
    return ref_x, ref_y, cf, targets


def test_implausibility_class_two_batches_and_reset():
    ref_x, ref_y, cf, targets = reference_set()
    metric = Implausibility(ref_x, ref_y, p=2.0)
    assert "reference_x" not in metric.state_dict()
    metric.update(cf[:5], targets[:5])
    metric.update(cf[5:], targets[5:])
    expected = implausibility(cf, targets, ref_x, ref_y).mean()
    torch.testing.assert_close(metric.compute(), expected)
    metric.reset()
    metric.update(cf[:3], targets[:3])
    torch.testing.assert_close(metric.compute(), implausibility(cf[:3], targets[:3], ref_x, ref_y).mean())


def test_mmd_implausibility_class_two_batches_and_reset():
    ref_x, ref_y, cf, targets = reference_set()
    metric = MMDImplausibility(ref_x, ref_y, length_scale=0.5, max_samples=15, seed=3)
    metric.update(cf[:5], targets[:5])
    metric.update(cf[5:], targets[5:])
    expected = mmd_implausibility(cf, targets, ref_x, ref_y, 0.5, 15, generator=gen(3))
    torch.testing.assert_close(metric.compute(), expected)
    metric.reset()
    metric.update(cf[:6], targets[:6])
    expected = mmd_implausibility(cf[:6], targets[:6], ref_x, ref_y, 0.5, 15, generator=gen(3))
    torch.testing.assert_close(metric.compute(), expected)


def test_cost_validity_robust_accuracy_classes():
    g = gen(10)
    cf, fact = torch.randn(10, 3, generator=g), torch.randn(10, 3, generator=g)
    logits, targets = torch.randn(10, 4, generator=g), torch.randint(0, 4, (10,), generator=g)
    for p in (1.0, 2.0):
        cost = CounterfactualCost(p=p)
        cost.update(cf[:4], fact[:4])
        cost.update(cf[4:], fact[4:])
        torch.testing.assert_close(cost.compute(), counterfactual_cost(cf, fact, p=p).mean())
        cost.reset()
        cost.update(cf[:2], fact[:2])
        torch.testing.assert_close(cost.compute(), counterfactual_cost(cf[:2], fact[:2], p=p).mean())
    for cls in (Validity, RobustAccuracy):
        metric = cls()
        metric.update(logits[:3], targets[:3])
        metric.update(logits[3:], targets[3:])
        torch.testing.assert_close(metric.compute(), validity(logits, targets))
        metric.reset()
        metric.update(logits[:5], targets[:5])
        torch.testing.assert_close(metric.compute(), validity(logits[:5], targets[:5]))


def test_metrics_logged_in_lightning_validation():
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    ref_x, ref_y, _, _ = reference_set()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(2, 2)
            self.ip = Implausibility(ref_x, ref_y)
            self.ip_star = MMDImplausibility(ref_x, ref_y, max_samples=10)
            self.cost = CounterfactualCost()
            self.validity = Validity()
            self.robust = RobustAccuracy()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            target = 1 - y
            cf = x + 0.5  # stand-in for generated counterfactuals
            adv = fgsm(self, x, y, 0.03)  # runs under inference mode here
            self.robust(self(adv), y)
            self.validity(self(cf), target)
            self.cost(cf, x)
            self.ip(cf, target)
            self.ip_star(cf, target)
            for name in ("ip", "ip_star", "cost", "validity", "robust"):
                self.log(f"val/{name}", getattr(self, name), on_step=False, on_epoch=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(16, 2), torch.randint(0, 2, (16,)))
    loader = DataLoader(data, batch_size=8)
    trainer = L.Trainer(
        fast_dev_run=True, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    module = Module()
    trainer.fit(module, loader, loader)
    trainer.validate(module, loader, verbose=False)
    for name in ("ip", "ip_star", "cost", "validity", "robust"):
        assert f"val/{name}" in trainer.callback_metrics
        assert torch.isfinite(trainer.callback_metrics[f"val/{name}"])
