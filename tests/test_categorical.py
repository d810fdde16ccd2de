"""Categorical (one-hot) and integer features stay valid in every generator's counterfactuals.

``Constraints.snap`` is checked against a row-by-row Python reference; every registered generator, on an
Adult-like frame whose classifier leans on its categories, returns points whose one-hot groups are exactly one
category (in the encoded units) and whose integer feature is a whole number in original units, with convergence
judged at those points; without feature types the same searches return mixtures (so the checks can fail);
training's own pool is valid; ``increase``/``decrease`` on a categorical feature is a one-line error.
"""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ct_lightning import CTModule
from ct_lightning.constraints import Constraints, FeatureTypes, invalid_rows, parse_mutability
from ct_lightning.generators import (GENERATORS, CounterfactualGenerator, FitContext, SearchResult,
                                     generate_counterfactuals, make_generator, prepare_standalone)
from datamodules.real import AdultDataModule

TINY_OPTIONS = {
    "revise": dict(latent_dim=3, vae_hidden_sizes=[16], vae_epochs=3, use_cache=False),
    "amortised": dict(initial_epochs=3, batch_size=64, hidden_sizes=[16], max_fit_samples=400),
    "sns": dict(steps=5),
}
# age (integer, standardised), income (continuous), home (3 categories), purpose (2), flag (one 0/1 column).
NAMES = ["age", "income", "home=own", "home=rent", "home=mortgage", "purpose=car", "purpose=edu", "flag=1"]
AGE_MEAN, AGE_STD = 40.0, 12.0


def reference_snap(points, x, types, codes=None):
    """Row by row, group by group, in plain Python: the rule that ``Constraints.snap`` vectorises."""
    out = points.clone()
    offset = types.offset if types.offset is not None else torch.zeros(types.n_features)
    scale = types.scale if types.scale is not None else torch.ones(types.n_features)
    for i in range(len(points)):
        for group in types.groups:
            on = [(1 - offset[c]) / scale[c] for c in group]
            off = [(0 - offset[c]) / scale[c] for c in group]
            share = [float((points[i, c] - off[k]) / (on[k] - off[k])) for k, c in enumerate(group)]
            if len(group) == 1:
                chosen = [share[0] >= 0.5]
            else:
                best = max(share)
                first = share.index(best)
                chosen = [k == first for k in range(len(group))]
            for k, c in enumerate(group):
                out[i, c] = on[k] if chosen[k] else off[k]
        for c in types.integers:
            out[i, c] = (round(float(points[i, c] * scale[c] + offset[c])) - offset[c]) / scale[c]
        if codes is not None:
            for c in range(types.n_features):
                if codes[c] == 3:
                    out[i, c] = x[i, c]
    return out


def frame(n: int = 400, seed: int = 0):
    """An Adult-like frame: the label depends mostly on the categories, so searches want to change them."""
    rng = torch.Generator().manual_seed(seed)
    age = torch.randint(18, 80, (n,), generator=rng).float()
    income = torch.randn(n, generator=rng)
    home = F.one_hot(torch.randint(3, (n,), generator=rng), 3).float()
    purpose = F.one_hot(torch.randint(2, (n,), generator=rng), 2).float()
    flag = (torch.rand(n, generator=rng) < 0.5).float()[:, None]
    x = torch.cat([((age - AGE_MEAN) / AGE_STD)[:, None], income[:, None], home, purpose, flag], 1)
    score = 2.0 * home[:, 0] - 1.5 * home[:, 1] + purpose[:, 1] + flag[:, 0] + 0.3 * income
    y = (score + 0.3 * torch.randn(n, generator=rng) > 0.8).long()
    return x, y


def feature_types() -> FeatureTypes:
    offset = torch.zeros(len(NAMES))
    scale = torch.ones(len(NAMES))
    offset[0], scale[0] = AGE_MEAN, AGE_STD
    return FeatureTypes.from_names(NAMES, integer_features=["age"], offset=offset, scale=scale)


def trained_model(x, y, hidden=(16,)) -> nn.Module:
    """A small ReLU MLP for two classes, trained from seed 0 (150 full-batch Adam steps)."""
    from ct_lightning.models import build_mlp

    torch.manual_seed(0)
    model = build_mlp(x.shape[1], 2, list(hidden), "relu")
    optimiser = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(150):
        optimiser.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimiser.step()
    return model.eval()


def assert_valid(points, types, what):
    offset, scale = types.offset, types.scale
    for group in types.groups:
        cols = torch.tensor(group)
        unit = points[:, cols] * scale[cols] + offset[cols]  # 0/1 in original units
        assert torch.allclose(unit, unit.round(), atol=1e-5), f"{what}: a one-hot value is not 0 or 1"
        if len(group) > 1:
            assert torch.allclose(unit.round().sum(1), torch.ones(len(points))), f"{what}: not exactly one category"
    for c in types.integers:
        raw = points[:, c] * scale[c] + offset[c]
        assert torch.allclose(raw, raw.round(), atol=1e-3), f"{what}: an integer feature is off its grid"


def test_snap_matches_a_row_by_row_reference():
    torch.manual_seed(3)
    offset = torch.tensor([40.0, 0.0, 0.3, 0.5, 0.2, 0.6, 0.4, 0.5])  # one-hot columns standardised too
    scale = torch.tensor([12.0, 1.0, 0.46, 0.5, 0.4, 0.49, 0.49, 0.5])
    types = FeatureTypes.from_names(NAMES, integer_features=["age"], offset=offset, scale=scale)
    points = torch.randn(64, len(NAMES))
    points[:5, 2:5] = 0.7  # ties: the first column wins
    codes = parse_mutability({"purpose": "none"}, len(NAMES), NAMES)
    x = torch.randn(64, len(NAMES))
    got = Constraints(codes, types=types).snap(points, x)
    torch.testing.assert_close(got, reference_snap(points, x, types, codes), rtol=0, atol=1e-5)
    assert torch.equal(got[:, 5:7], x[:, 5:7])  # an immutable group is the factual's, bit for bit
    assert not invalid_rows(types, reference_snap(points, x, types)).any()
    assert invalid_rows(types, points).all()


def test_snap_keeps_integers_inside_the_domain_and_without_types_changes_nothing():
    types = FeatureTypes.from_names(["n", "m"], integer_features=["n"])
    lower, upper = torch.tensor([0.4, -1.0]), torch.tensor([2.6, 1.0])
    limits = Constraints(None, lower, upper, types=types)
    points = torch.tensor([[0.45, 0.3], [2.55, 0.3], [1.4, 0.3]])
    assert limits.snap(points, points)[:, 0].tolist() == [1.0, 2.0, 1.0]
    plain = Constraints(None, lower, upper, types=FeatureTypes.from_names(["a", "b"]))
    assert not plain.snaps and plain.snap(points, points) is points


def test_feature_types_from_names_and_bad_declarations():
    types = feature_types()
    assert types.groups == [[2, 3, 4], [5, 6], [7]] and types.integers == [0]
    assert FeatureTypes.from_names(["x1", "x2"]).empty
    with pytest.raises(ValueError, match="integer_features: unknown feature 'nope'"):
        FeatureTypes.from_names(NAMES, integer_features=["nope"])
    with pytest.raises(ValueError, match="is a one-hot column"):
        FeatureTypes.from_names(NAMES, integer_features=["home=own"])


@pytest.mark.parametrize("kind", ["increase", "decrease"])
def test_a_monotone_categorical_feature_is_a_one_line_error(kind):
    with pytest.raises(ValueError, match=f"mutability: 'home' is categorical .*{kind}.*allowed for a categorical "
                                         "feature: both, none"):
        parse_mutability({"home": kind}, len(NAMES), NAMES)
    with pytest.raises(ValueError, match="categorical"):
        parse_mutability({"home=own": kind}, len(NAMES), NAMES)
    codes = parse_mutability({3: kind}, len(NAMES))  # by index, the names are not known here
    with pytest.raises(ValueError, match="mutability: a categorical feature .* cannot be 'increase' or 'decrease'"):
        Constraints(codes, types=feature_types())
    assert parse_mutability({"home": "none"}, len(NAMES), NAMES)[2:5].tolist() == [3, 3, 3]


_PROBLEM = {}


def problem():
    if not _PROBLEM:
        x, y = frame()
        model = trained_model(x, y)
        with torch.no_grad():
            target = 1 - model(x).argmax(1)
        lower, upper = x.min(0).values - 1.0, x.max(0).values + 1.0
        _PROBLEM.update(x=x, y=y, model=model, target=target, lower=lower, upper=upper)
    return _PROBLEM


def generate(name, types, tau=0.7, steps=40):
    p = problem()
    codes = parse_mutability({"income": "increase"}, len(NAMES), NAMES)
    torch.manual_seed(0)
    generator = make_generator(name, lr=0.5, **TINY_OPTIONS.get(name, {}))
    prepare_standalone(generator, FitContext(model=p["model"], x_train=p["x"], y_train=p["y"], n_classes=2,
                                             feature_names=NAMES, mutability=codes, lower=p["lower"],
                                             upper=p["upper"], name="categorical"))
    x, target = p["x"][:96], p["target"][:96]
    with torch.inference_mode():
        result = generate_counterfactuals(generator, p["model"], x, target, tau, steps, 0.3, codes, p["lower"],
                                          p["upper"], types)
    return x, target, result


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_returns_real_categories_and_integers(name):
    types = feature_types()
    x, target, result = generate(name, types)
    assert_valid(result.counterfactual, types, f"{name} counterfactual")
    assert_valid(result.nascent, types, f"{name} nascent")
    assert not invalid_rows(types, result.counterfactual).any() and not invalid_rows(types, result.nascent).any()
    # Convergence is that of the valid point itself.
    with torch.no_grad():
        probability = problem()["model"](result.counterfactual).softmax(1).gather(1, target[:, None]).squeeze(1)
    assert torch.equal(result.converged, probability >= 0.7)
    assert (result.counterfactual[:, 1] >= x[:, 1]).all()  # mutability still holds


@pytest.mark.parametrize("name", ["ecco", "generic", "revise"])
def test_without_feature_types_the_same_searches_return_mixtures(name):
    """The checks above can fail: the plain searches leave one-hot groups between categories here."""
    _, _, result = generate(name, None)
    assert invalid_rows(feature_types(), result.counterfactual).float().mean() > 0.2


def test_categories_do_change_and_the_search_still_finds_counterfactuals():
    types = feature_types()
    x, _, result = generate("ecco", types)
    moved = (result.counterfactual[:, 2:5] != x[:, 2:5]).any(1)
    assert moved.float().mean() > 0.1, "no category ever changed"
    assert result.converged.float().mean() > 0.5


class PlainGenerator(CounterfactualGenerator):
    """A generator that knows nothing of feature types: moves every feature half-way to a fixed point."""

    def config(self):
        return {"generator": "plain"}

    def generate(self, model, x, target, tau=0.75, max_steps=30, epsilon=0.3, mutability=None, lower=None,
                 upper=None):
        x_cf = x + 0.5 * (torch.full_like(x, 0.4) - x)
        zeros = torch.zeros(len(x), dtype=torch.long)
        return SearchResult(x_cf, x_cf.clone(), torch.ones(len(x), dtype=torch.bool), zeros, zeros)


def test_a_generator_without_feature_types_is_snapped_and_judged_again():
    p, types = problem(), feature_types()
    x, target = p["x"][:50], p["target"][:50]
    result = generate_counterfactuals(PlainGenerator(), p["model"], x, target, 0.7, 5, 0.3, None, None, None, types)
    assert not invalid_rows(types, result.counterfactual).any() and not invalid_rows(types, result.nascent).any()
    with torch.no_grad():
        probability = p["model"](result.counterfactual).softmax(1).gather(1, target[:, None]).squeeze(1)
    assert torch.equal(result.converged, probability >= 0.7)


def test_adult_describes_its_groups_and_integers(fixture_dir, tmp_path):
    datamodule = AdultDataModule(data_dir=fixture_dir, cache_dir=tmp_path, n_train=200, n_test=50, n_val=50)
    datamodule.setup()
    types = datamodule.feature_types()
    names = datamodule.feature_names
    assert len(types.groups) == 8 and {names[g[0]].split("=")[0] for g in types.groups} == {
        "workclass", "education", "marital_status", "occupation", "relationship", "race", "sex", "native_country"}
    assert [names[i] for i in types.integers] == list(AdultDataModule.integer_features)
    assert not invalid_rows(types, datamodule.x_train).any()  # the data themselves are valid points


def test_training_pool_is_valid_on_adult(fixture_dir, tmp_path):
    datamodule = AdultDataModule(data_dir=fixture_dir, cache_dir=tmp_path, n_train=200, n_test=50, n_val=50,
                                 batch_size=50)
    datamodule.setup()
    module = CTModule(n_features=datamodule.n_features, n_classes=2, nce=100, max_steps=10, search_lr=1.0,
                      feature_names=datamodule.feature_names, seed=0)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    types = module.feature_types
    assert len(types.groups) == 8 and len(types.integers) == 6
    pool = module.pool
    for points, what in ((pool.x_neg, "x'"), (pool.nascent, "nascent"), (pool.x_pos, "x+")):
        assert not invalid_rows(types, points).any(), what


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "masked"])
def test_compiled_step_gives_the_same_valid_points(packed):
    """With feature types the compiled step (cost sign, step, projection) still advances the continuous variable;
    its distances are not used, the snapped points' are: the same results compiled and eager."""
    from ct_lightning.generators import ECCo
    from ct_lightning.generators import compiled_step, native_search
    from ct_lightning.generators.search import search_counterfactuals

    p, types = problem(), feature_types()
    codes = parse_mutability({"income": "increase"}, len(NAMES), NAMES)
    arguments = (p["model"], p["x"], p["target"], ECCo(lr=0.5), 0.7, 20, 0.3, codes, p["lower"], p["upper"])
    previous = compiled_step.search_compile()
    try:
        results = []
        for mode in ("off", "on"):
            compiled_step.set_search_compile(mode)
            with native_search.python_loop_only():  # the compiled step is the PyTorch loop's
                results.append(search_counterfactuals(*arguments, packed=packed, feature_types=types))
    finally:
        compiled_step.set_search_compile(previous)
    eager, compiled = results
    assert torch.equal(eager.converged, compiled.converged) and torch.equal(eager.steps, compiled.steps)
    torch.testing.assert_close(compiled.counterfactual, eager.counterfactual, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled.nascent, eager.nascent, rtol=1e-5, atol=1e-5)
    assert not invalid_rows(types, compiled.counterfactual).any()


def test_a_users_table_gets_real_categories_and_integers_in_original_units():
    """tests/fixtures/loans.csv through the codec's data module: the search's counterfactuals decode to the
    table's own categories and whole numbers (the codec standardises integers; snapping is in original units)."""
    from pathlib import Path

    from ct_lightning.generators import ECCo
    from ct_lightning.generators.search import search_counterfactuals
    from datamodules.table import TableDataModule

    data = TableDataModule(Path(__file__).parent / "fixtures" / "loans.csv", target="approved")
    data.setup()
    types = data.feature_types()
    assert len(types.groups) == 3 and len(types.integers) == 4  # home_ownership, purpose, sex (binary: one column); age, income, debt, years_employed
    assert not invalid_rows(types, data.x_train).any()
    model = trained_model(data.x_train, data.y_train)
    x = data.x_test[:40]
    with torch.no_grad():
        target = 1 - model(x).argmax(1)
    lower, upper = data.domain()
    found = search_counterfactuals(model, x, target, ECCo(lr=0.5), 0.7, 40, 0.3, None, lower, upper,
                                   feature_types=types)
    assert not invalid_rows(types, found.counterfactual).any()
    plain = search_counterfactuals(model, x, target, ECCo(lr=0.5), 0.7, 40, 0.3, None, lower, upper)
    assert invalid_rows(types, plain.counterfactual).any()
    decoded = data.codec.decode(found.counterfactual.numpy())
    encoded_again = torch.as_tensor(data.codec.encode(decoded), dtype=torch.float32)
    torch.testing.assert_close(encoded_again, found.counterfactual, rtol=0, atol=1e-4)  # a real row, exactly
