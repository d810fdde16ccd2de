"""Fewer changes: each change a valid counterfactual does not need is given back, smallest first."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from ct_lightning.evaluation.explanation import FeatureCodec, explain
from ct_lightning.evaluation.fewer_changes import column_masks, revert_needless_changes

NAMES = ["a", "b", "c", "home=rent", "home=own"]


def linear(weights: list[float]) -> nn.Module:
    """Two classes, logit of class 1 minus class 0 = weights · x (an independent model to reason about by hand)."""
    model = nn.Linear(len(weights), 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.0] * len(weights), weights]))
    return model


def test_column_masks_group_one_hot_inputs():
    masks = column_masks(NAMES, ["a", "b", "c", "home"])
    assert masks.tolist() == [[True, False, False, False, False], [False, True, False, False, False],
                              [False, False, True, False, False], [False, False, False, True, True]]
    assert column_masks(NAMES, ["a", "b", "c"]) is None  # the home inputs belong to no column: nothing is reverted


def test_only_the_change_that_flips_the_decision_is_left():
    """By hand: logit = 3a + 0.1b + 0.1c + 0.5·own. From the factual (all 0, rent) the search moved a by 1, b and c by
    0.5 and home to own: logit 3.6. Smallest first: b (0.5) and c (0.5) go back (logit 3.5), a (1.0) stays (it would
    leave logit 0.5, σ < 0.75), home (two inputs moved by 1) goes back (logit 3.0, σ > 0.75). Only a changes."""
    model = linear([3.0, 0.1, 0.1, 0.0, 0.5])
    factual = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    moved = torch.tensor([[1.0, 0.5, 0.5, 0.0, 1.0]])
    masks = column_masks(NAMES, ["a", "b", "c", "home"])
    out = revert_needless_changes(model, factual, moved, torch.tensor([1]), torch.tensor([0.75]), masks,
                                  torch.tensor([True]))
    assert out.tolist() == [[1.0, 0.0, 0.0, 1.0, 0.0]]
    # a floor above σ(3) (logit 3.02) keeps home too: without it the logit would be 3.0
    high = revert_needless_changes(model, factual, moved, torch.tensor([1]), torch.tensor([0.9535]), masks,
                                   torch.tensor([True]))
    assert torch.sigmoid(torch.tensor(3.0)) < 0.9535 < torch.sigmoid(torch.tensor(3.5))
    assert high.tolist() == [[1.0, 0.0, 0.0, 0.0, 1.0]]


def test_rows_without_a_valid_counterfactual_and_batches_of_other_rows_change_nothing():
    model = linear([3.0, 0.1, 0.1, 0.0, 0.5])
    masks = column_masks(NAMES, ["a", "b", "c", "home"])
    factual = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0], [0.2, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
    moved = torch.tensor([[1.0, 0.5, 0.5, 0.0, 1.0], [0.9, 0.3, 0.0, 0.0, 1.0], [1.0, 0.5, 0.5, 0.0, 1.0]])
    out = revert_needless_changes(model, factual, moved, torch.tensor([1, 1, 1]), torch.tensor([0.75, 0.75, 0.75]),
                                  masks, torch.tensor([True, True, False]))
    assert out[2].tolist() == moved[2].tolist()  # not eligible: left as the search found it
    for i in (0, 1):  # each row as it comes out alone
        alone = revert_needless_changes(model, factual[i:i + 1], moved[i:i + 1], torch.tensor([1]),
                                        torch.tensor([0.75]), masks, torch.tensor([True]))
        torch.testing.assert_close(out[i:i + 1], alone)


def test_explain_gives_back_what_the_decision_does_not_need():
    """explain(): logit = 3a + 0.3(b + c + d); one generic step of η = 1 from 0 moves every feature (by 1.5, 0.15,
    0.15, 0.15: logit 4.6, past τ). With fewer changes only a is left, still valid above τ; with --all-changes all
    four. Every change left is one the search made, and none can go back without losing the target."""
    model = linear([3.0, 0.3, 0.3, 0.3])
    codec = FeatureCodec(["a", "b", "c", "d"], n_classes=2)
    rows = pd.DataFrame({"a": [0.0, 0.1], "b": [0.0, 0.0], "c": [0.0, -0.1], "d": [0.0, 0.0]})
    settings = {"target": 1, "codec": codec, "generator": "generic", "tau": 0.6, "max_steps": 5, "lr": 1.0,
                "lambda_cost": 0.0}
    every = explain(model, rows, fewer_changes=False, **settings)
    fewer = explain(model, rows, **settings)
    assert [len(c) for c in every["changes"]] == [4, 4]
    assert [[c["feature"] for c in changes] for changes in fewer["changes"]] == [["a"], ["a"]]
    for (_, all_row), (_, few_row) in zip(every.iterrows(), fewer.iterrows()):
        assert few_row["valid"] and few_row["probability"] >= 0.6
        assert few_row["counterfactual"]["a"] == pytest.approx(all_row["counterfactual"]["a"])
        for k in "bcd":  # given back: the row's own value (float32 as the model reads it)
            assert few_row["counterfactual"][k] == pytest.approx(few_row["factual"][k], abs=1e-7)
