"""CT loss terms and constraint rules against hand-worked numbers on a tiny linear model."""

import math

import pytest
import torch
from torch import nn

from ct_lightning.constraints import enforce, infer_domain, mask_gradient, parse_mutability, protect_positive
from ct_lightning.generators import ECCo, Generic, energy_decay, make_generator
from ct_lightning.losses import (adversarial_loss, check_objective, contrast_pairs, contrastive_divergence,
                                 energy_ridge, target_energy)
from ct_lightning.training.pool import ClassSampler, random_targets


def linear_model() -> nn.Linear:
    """M(x) = W x with W = [[1, 0], [0, 2]] and no bias: logits are (x1, 2·x2)."""
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    return model


def test_energy_is_negative_target_logit():
    logits = torch.tensor([[1.0, -3.0], [0.5, 2.0]])
    assert target_energy(logits, torch.tensor([1, 0])).tolist() == [3.0, -0.5]


def test_divergence_and_ridge_by_hand():
    model = linear_model()
    x_pos = torch.tensor([[1.0, 1.0], [4.0, 0.0]])  # logits (1, 2) and (4, 0)
    x_cf = torch.tensor([[2.0, 0.0], [1.0, 3.0]])   # logits (2, 0) and (1, 6)
    target = torch.tensor([1, 0])
    lp, lc = model(x_pos), model(x_cf)
    # row 1: M(x')[1] − M(x⁺)[1] = 0 − 2 = −2; row 2: M(x')[0] − M(x⁺)[0] = 1 − 4 = −3
    assert contrastive_divergence(lp, lc, target).item() == pytest.approx((-2 - 3) / 2)
    # row 1: 2² + 0² = 4; row 2: 4² + 1² = 17
    assert energy_ridge(lp, lc, target).item() == pytest.approx((4 + 17) / 2)


def test_divergence_gradient_matches_proposition_proof():
    """∂div/∂θ[y⁺, d] = x'_d − x⁺_d for a linear model (App., Eq. grad)."""
    model = linear_model()
    x_pos, x_cf, target = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, -1.0]]), torch.tensor([1])
    contrastive_divergence(model(x_pos), model(x_cf), target).backward()
    assert model.weight.grad[1].tolist() == pytest.approx([2.0 - 1.0, -1.0 - 1.0])
    assert model.weight.grad[0].tolist() == [0.0, 0.0]


def test_adversarial_loss_by_hand():
    logits = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    labels = torch.tensor([1, 0])
    expected = (math.log(1 + math.e) + math.log(2)) / 2  # −log(1/(e+1)), −log(1/2)
    assert adversarial_loss(logits, labels).item() == pytest.approx(expected)


def test_empty_pool_gives_zero_terms_with_gradient_path():
    logits = torch.zeros(0, 2, requires_grad=True)
    empty = torch.zeros(0, dtype=torch.long)
    for value in (contrastive_divergence(logits, logits, empty), energy_ridge(logits, logits, empty),
                  adversarial_loss(logits, empty)):
        assert value.item() == 0.0
        value.backward()


@pytest.mark.parametrize("kind, x_pos, x_cf, expected", [
    ("none", 3.0, 0.5, 0.5),       # rule 1: immutable → x'
    ("none", -3.0, 0.5, 0.5),
    ("decrease", 3.0, 0.5, 0.5),   # rule 2: x⁺ > x' but only decreases → x'
    ("decrease", -3.0, 0.5, -3.0),  # allowed direction: keep x⁺
    ("increase", -3.0, 0.5, 0.5),  # rule 3: x⁺ < x' but only increases → x'
    ("increase", 3.0, 0.5, 3.0),   # allowed direction: keep x⁺
    ("both", -3.0, 0.5, -3.0),
])
def test_protection_rules(kind, x_pos, x_cf, expected):
    codes = parse_mutability([kind], 1)
    out = protect_positive(torch.tensor([[x_pos]]), torch.tensor([[x_cf]]), codes)
    assert out.item() == expected


@pytest.mark.parametrize("kinds", [["both"] * 4, ["none", "both", "both", "none"], ["increase", "decrease", "both", "both"],
                                   ["none", "increase", "decrease", "both"], ["decrease"] * 4])
def test_protection_with_any_mix_of_kinds_matches_the_rules_element_by_element(kinds):
    generator = torch.Generator().manual_seed(3)
    x_pos, x_cf = torch.randn(6, 4, generator=generator), torch.randn(6, 4, generator=generator)
    rules = {"none": lambda p, c: c, "increase": max, "decrease": min, "both": lambda p, c: p}
    expected = [[rules[kinds[j]](float(x_pos[i, j]), float(x_cf[i, j])) for j in range(4)] for i in range(6)]
    out = protect_positive(x_pos, x_cf, parse_mutability(kinds, 4))
    assert out.tolist() == expected


def test_protection_removes_divergence_gradient_of_immutable_feature():
    """With feature 0 immutable, the divergence no longer pushes θ[y⁺, 0] (Prop. 3.1)."""
    model = linear_model()
    x_pos, x_cf, target = torch.tensor([[3.0, 1.0]]), torch.tensor([[0.0, -1.0]]), torch.tensor([1])
    codes = parse_mutability({"age": "none"}, 2, ["age", "debt"])
    x_pos, x_neg = contrast_pairs(x_pos, x_cf, torch.tensor([True]), codes)
    contrastive_divergence(model(x_pos), model(x_neg), target).backward()
    assert model.weight.grad[1].tolist() == pytest.approx([0.0, -2.0])


def test_non_converged_counterfactuals_contribute_zero_divergence():
    model = linear_model()
    x_pos = torch.tensor([[1.0, 1.0], [4.0, 5.0]])
    x_cf = torch.tensor([[2.0, 0.0], [-7.0, 9.0]])
    target = torch.tensor([1, 1])
    codes = parse_mutability(None, 2)
    x_pos_used, x_neg = contrast_pairs(x_pos, x_cf, torch.tensor([True, False]), codes)
    assert torch.equal(x_neg[1], x_pos_used[1])
    # only row 1 contributes: (0 − 2) / 2 rows
    assert contrastive_divergence(model(x_pos_used), model(x_neg), target).item() == pytest.approx(-1.0)
    alone, _ = contrast_pairs(x_pos[1:], x_cf[1:], torch.tensor([False]), codes)
    assert contrastive_divergence(model(alone), model(alone), target[1:]).item() == 0.0


def test_random_targets_never_equal_prediction_and_cover_other_classes():
    predicted = torch.randint(0, 4, (4000,), generator=torch.Generator().manual_seed(0))
    targets = random_targets(predicted, 4, torch.Generator().manual_seed(1))
    assert not (targets == predicted).any()
    for cls in range(4):
        others = targets[predicted == cls]
        assert set(others.unique().tolist()) == set(range(4)) - {cls}
        # uniform over the other three classes
        shares = torch.bincount(others, minlength=4).float()[torch.arange(4) != cls] / len(others)
        assert (shares - 1 / 3).abs().max() < 0.05


def test_class_sampler_draws_only_requested_class():
    labels = torch.tensor([0, 1, 1, 2, 0, 2, 2, 1])
    sampler = ClassSampler(labels, 3)
    classes = torch.tensor([2, 0, 1] * 50)
    drawn = sampler.sample(classes, torch.Generator().manual_seed(0))
    assert torch.equal(labels[drawn], classes)
    assert set(drawn[classes == 2].tolist()) == {3, 5, 6}
    with pytest.raises(ValueError, match="no training samples"):
        ClassSampler(labels, 4).sample(torch.tensor([3]))


def test_generic_and_ecco_penalties_by_hand():
    model = linear_model()
    x, x_cf, target = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, -2.0]]), torch.tensor([1])
    logits = model(x_cf)  # (1, −4): energy for y⁺=1 is +4
    generic = Generic(lambda_cost=0.1)
    assert generic.penalty(x_cf, x, logits, target, 0, 30).item() == pytest.approx(0.1 * 3)
    ecco = ECCo(lambda_cost=0.1, lambda_energy=5.0)
    phi = 0.1 * (1 + 1) ** -0.9  # T = 30: b = round(30/25) = 1, a = 0.1; step 0 is t = 1 (as in the reference)
    assert ecco.penalty(x_cf, x, logits, target, 0, 30).item() == pytest.approx(0.3 + 5 * phi * (4 + 1e-3 * 16))
    # T = 100: b = 4, a = 0.4; t = 6 → 0.4 · 10^−0.9
    assert energy_decay(6, 100) == pytest.approx(0.4 * 10 ** -0.9)
    with pytest.raises(ValueError, match="generator.*allowed: amortised, ecco, generic, revise, sns"):
        make_generator("dice")


def test_objectives_and_errors():
    assert check_objective("full") == (True, True)
    assert check_objective("vanilla") == (False, False)
    assert check_objective("energy") == (True, False)
    assert check_objective("adversarial") == (False, True)
    with pytest.raises(ValueError, match="objective.*allowed: full, vanilla, energy, adversarial"):
        check_objective("jem")


def test_parse_mutability_by_name_group_index_and_string():
    names = ["age", "sex=female", "sex=male", "hours"]
    codes = parse_mutability("age=none,hours=increase", 4, names)
    assert codes.tolist() == [3, 0, 0, 1]
    assert parse_mutability({"sex": "none", 3: "decrease"}, 4, names).tolist() == [0, 3, 3, 2]
    with pytest.raises(ValueError, match=r"got 'height' \(unknown feature\); allowed: the features: age, sex, hours$"):
        parse_mutability({"height": "none"}, 4, names)  # a one-hot group once, by its column
    with pytest.raises(ValueError, match=r"got 'SEX' \(unknown feature; did you mean 'sex'\? names are case-sensitive\)"):
        parse_mutability({"SEX": "none"}, 4, names)
    with pytest.raises(ValueError, match="unknown kind 'fixed'.*both, increase, decrease, none"):
        parse_mutability({"age": "fixed"}, 4, names)
    with pytest.raises(ValueError, match="out of range"):
        parse_mutability({7: "none"}, 4, names)


def test_gradient_mask_and_enforce():
    codes = parse_mutability(["both", "increase", "decrease", "none"], 4)
    grad = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])
    # descent moves against the gradient: +grad decreases a feature, −grad increases it
    assert mask_gradient(grad, codes).tolist() == [[1, 0, 1, 0], [-1, -1, 0, 0]]
    x = torch.tensor([[0.0, 0.0, 0.0, 0.3]])
    moved = torch.tensor([[5.0, -1.0, 1.0, 0.7]])
    out = enforce(moved, x, codes, lower=torch.full((4,), -2.0), upper=torch.full((4,), 2.0))
    assert out.tolist() == [[2.0, 0.0, 0.0, pytest.approx(0.3)]]
    assert out[0, 3].item() == x[0, 3].item()


def test_infer_domain_formula():
    x = torch.tensor([[0.0, 10.0], [1.0, 10.0], [2.0, 40.0]])
    lower, upper = infer_domain(x, n_std=3.0)
    mean, std = x.mean(0), x.std(0)
    assert lower.tolist() == pytest.approx(torch.minimum(mean - 3 * std, x.min(0).values).tolist())
    assert upper.tolist() == pytest.approx(torch.maximum(mean + 3 * std, x.max(0).values).tolist())
    lower1, upper1 = infer_domain(x, n_std=0.1)  # narrow band: the observed range wins
    assert lower1.tolist() == [0.0, 10.0] and upper1.tolist() == [2.0, 40.0]


@pytest.mark.parametrize("seed", range(5))
def test_energy_terms_gradient_by_hand(seed):
    """For a·div + b·ridge over m rows, the gradient at the target logit is −a/m + 2b·M(x⁺)[y⁺]/m for x⁺
    and a/m + 2b·M(x')[y⁺]/m for x'; every other logit gets none."""
    from ct_lightning.losses import energy_terms

    generator = torch.Generator().manual_seed(seed)
    m, a, b = 40, 0.3, 0.7
    logits_pos = torch.randn(m, 5, generator=generator, requires_grad=True)
    logits_cf = torch.randn(m, 5, generator=generator, requires_grad=True)
    target = torch.randint(0, 5, (m,), generator=generator)
    divergence, ridge = energy_terms(logits_pos, logits_cf, target)
    (a * divergence + b * ridge).backward()
    rows = torch.arange(m)
    expected_pos, expected_cf = torch.zeros(m, 5), torch.zeros(m, 5)
    expected_pos[rows, target] = (-a + 2 * b * logits_pos.detach()[rows, target]) / m
    expected_cf[rows, target] = (a + 2 * b * logits_cf.detach()[rows, target]) / m
    assert torch.allclose(logits_pos.grad, expected_pos, atol=1e-7)
    assert torch.allclose(logits_cf.grad, expected_cf, atol=1e-7)
    empty = torch.zeros(0, dtype=torch.long)
    assert [v.item() for v in energy_terms(logits_pos[:0], logits_cf[:0], empty)] == [0.0, 0.0]
