"""REVISE (VAE + latent search), conditional generative counterfactuals, SNS, and their recipes."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from ct_lightning import CTModule
from ct_lightning.generators.amortised import Amortised, CounterfactualNetworkModule, one_hot_groups
from ct_lightning.metrics.functional import sparsity
from ct_lightning.constraints import parse_mutability
from ct_lightning.generators import GENERATORS, FitContext, make_generator, prepare_standalone
from ct_lightning.generators.revise import Revise, latent_search
from ct_lightning.generators.search import search_counterfactuals
from ct_lightning.generators.sns import SNSRefined, path_probability, stable_neighbor_search
from ct_lightning.generators.revise.vae import VAEModule, VAESettings, cache_path, default_cache_dir, load_or_train_vae
from datamodules import get_datamodule

from recipe_loader import load_recipe


def linear_model(n_features: int, scale: float = 3.0) -> nn.Module:
    """Class 1 iff the first feature is positive (a separable problem)."""
    model = nn.Linear(n_features, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
        model.weight[0, 0], model.weight[1, 0] = -scale, scale
    return model


def small_mlp(seed: int = 0) -> nn.Module:
    """A fixed, untrained 3-feature MLP (non-linear boundary) for constraint tests."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 2))


@pytest.fixture(scope="module")
def moons():
    dm = get_datamodule("moons")
    dm.setup()
    return dm


def quiet_trainer(**kwargs) -> L.Trainer:
    options = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu")
    return L.Trainer(**{**options, **kwargs})


# ------------------------------------------------------------------------------------ REVISE
def test_generators_are_registered():
    assert {"revise", "amortised"} <= set(GENERATORS)
    assert isinstance(make_generator("revise", latent_dim=3), Revise)
    assert isinstance(make_generator("amortised", refit_every=2), Amortised)
    with pytest.raises(ValueError, match="generator_options: revise"):
        make_generator("revise", no_such_option=1)


def test_batched_revise_respects_mutability_and_domain():
    torch.manual_seed(0)
    model, vae = small_mlp(), VAEModule(3, latent_dim=2, hidden_sizes=[8]).eval()
    x = torch.randn(24, 3)
    target = 1 - model(x).argmax(1)
    codes = parse_mutability(["none", "increase", "decrease"], 3)
    lower, upper = torch.full((3,), -1.5), torch.full((3,), 1.5)
    result = latent_search(model, vae, x, target, lambda_cost=0.01, lr=0.5, tau=0.99, max_steps=15, epsilon=0.3,
                           mutability=codes, lower=lower, upper=upper)
    for out in (result.counterfactual, result.nascent):
        assert torch.equal(out[:, 0], x[:, 0]), "immutable features must be bit-identical"
        assert (out[:, 1] >= x[:, 1]).all() and (out[:, 2] <= x[:, 2]).all()
    inside = (x.abs() <= 1.5)
    assert ((result.counterfactual >= lower) & (result.counterfactual <= upper) | ~inside).all()
    assert (result.steps <= 15).all() and (result.nascent_steps <= result.steps).all()
    # Batched rows get exactly what they would get alone (converged rows are frozen, not dragged along).
    alone = torch.cat([latent_search(model, vae, x[i:i + 1], target[i:i + 1], 0.01, 0.5, 0.99, 15, 0.3, codes,
                                     lower, upper).counterfactual for i in range(4)])
    torch.testing.assert_close(alone, result.counterfactual[:4], rtol=1e-5, atol=1e-5)


def test_revise_finds_valid_counterfactuals_with_a_trained_vae(tmp_path, moons):
    torch.manual_seed(0)
    model = linear_model(2, scale=4.0)
    x = moons.x_train[:1000]
    generator = Revise(lambda_cost=0.01, lr=0.5, latent_dim=2, vae_hidden_sizes=(32,), vae_epochs=2,
                       vae_batch_size=100, cache_dir=str(tmp_path))
    assert generator.fit_vae(x, "moons")["loaded"] is False
    factuals = moons.x_test[:100]
    target = 1 - model(factuals).argmax(1)
    result = generator.generate(model, factuals, target, tau=0.9, max_steps=60)
    valid = (model(result.counterfactual).argmax(1) == target).float().mean()
    assert valid >= 0.8 and (result.steps <= 60).all()


def test_vae_cache_is_reused(tmp_path, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    context = FitContext(model=linear_model(3), x_train=x, y_train=None, n_classes=2, feature_names=None)
    options = dict(latent_dim=2, vae_hidden_sizes=(8,), vae_epochs=1, vae_batch_size=32, cache_dir=str(tmp_path))
    first = Revise(**options)
    first.fit(context)
    path = Path(first.vae_info["path"])
    assert first.vae_info["loaded"] is False and path.is_file() and path.parent == tmp_path
    mtime = path.stat().st_mtime_ns
    second = Revise(**options)
    second.fit(context)
    assert second.vae_info["loaded"] is True and path.stat().st_mtime_ns == mtime
    for a, b in zip(first.vae.state_dict().values(), second.vae.state_dict().values()):
        assert torch.equal(a, b)
    # The key covers the data and the settings; no temporary files are left behind.
    assert cache_path("data", x + 1, VAESettings(latent_dim=2, hidden_sizes=[8], epochs=1, batch_size=32), tmp_path) != path
    assert cache_path("data", x, VAESettings(latent_dim=3, hidden_sizes=[8], epochs=1, batch_size=32), tmp_path) != path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    # No counterfactual terms (the baseline): CTModule does not fit the generator, so no VAE.
    idle = CTModule(n_features=3, n_classes=2, objective="vanilla", generator="revise", generator_options=options)
    labels = (x[:, 0] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, labels), batch_size=32)
    L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, limit_val_batches=0).fit(idle, loader)
    assert idle.generator.vae is None
    # Default folder: $CT_CACHE_DIR/vae, else $XDG_CACHE_HOME/ct-lightning/vae.
    monkeypatch.setenv("CT_CACHE_DIR", str(tmp_path / "ct"))
    assert default_cache_dir() == tmp_path / "ct" / "vae"
    monkeypatch.delenv("CT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ct-lightning" / "vae"
    _, info = load_or_train_vae(x, "data", VAESettings(latent_dim=2, hidden_sizes=[8], epochs=1, batch_size=32))
    assert info["path"].startswith(str(tmp_path / "xdg" / "ct-lightning" / "vae"))


# ------------------------------------------------------------------- conditional generator
@pytest.mark.parametrize("variant", ["mmd", "gan"])
def test_conditional_generator_is_valid_in_one_forward_pass(variant):
    torch.manual_seed(0)
    x = torch.randn(1024, 2)
    model = linear_model(2)
    net = CounterfactualNetworkModule(2, 2, model, variant=variant, hidden_sizes=(32, 32), d_hidden_sizes=(32,), lr=3e-3, lr_d=3e-3)
    net.fit_epochs(x, epochs=8, batch_size=128, rng=torch.Generator().manual_seed(0))
    factuals = torch.randn(500, 2)
    target = 1 - model(factuals).argmax(1)
    calls = []
    handle = net.network.register_forward_hook(lambda *args: calls.append(1))
    x_cf = net.generate(factuals, target)
    handle.remove()
    assert len(calls) == 1, "the whole batch is generated by one forward pass"
    validity = (model(x_cf).argmax(1) == target).float().mean()
    assert validity >= 0.9, f"{variant}: validity {validity:.3f}"
    assert all(p.grad is None or not p.requires_grad for p in model.parameters())


def test_conditional_generator_keeps_one_hot_groups_and_constraints():
    names = ["age", "job=a", "job=b", "job=c", "hours"]
    groups = one_hot_groups(names)
    assert groups == [[1, 2, 3]]
    torch.manual_seed(0)
    x = torch.cat([torch.randn(256, 1), torch.eye(3)[torch.randint(3, (256,))], torch.randn(256, 1)], 1)
    model = linear_model(5)
    codes = parse_mutability({"age": "none", "hours": "increase"}, 5, names)
    net = CounterfactualNetworkModule(5, 2, model, groups=groups, mutability=codes, lower=[-2.0] * 5, upper=[2.0] * 5)
    net.fit_epochs(x, epochs=2, batch_size=64)
    target = 1 - model(x).argmax(1)
    x_cf = net.generate(x, target)
    assert torch.equal(x_cf[:, 0], x[:, 0]) and (x_cf[:, 4] >= x[:, 4]).all()
    block = x_cf[:, 1:4]
    assert torch.equal(block.sum(1), torch.ones(256)) and set(block.unique().tolist()) <= {0.0, 1.0}
    stats = sparsity(x_cf, x, groups)
    assert (stats["l0_categorical"] <= 1).all() and (stats["l0"] <= 3).all()


# ------------------------------------------------------------------------------------- SNS
def test_sns_never_lowers_the_target_probability_and_stays_in_the_ball():
    torch.manual_seed(0)
    model = small_mlp(1)
    x = torch.randn(64, 3)
    target = 1 - model(x).argmax(1)
    codes = parse_mutability(["none", "both", "increase"], 3)
    found = search_counterfactuals(model, x, target, make_generator("generic", lr=0.5), tau=0.6, max_steps=40,
                                   mutability=codes)
    start = found.counterfactual
    delta = 0.4
    result = stable_neighbor_search(model, start, target, delta=delta, steps=25, n_grid=10, mutability=codes,
                                    return_result=True)
    refined = result.counterfactual
    with torch.no_grad():
        before = model(start).softmax(1).gather(1, target[:, None]).squeeze(1)
        after = model(refined).softmax(1).gather(1, target[:, None]).squeeze(1)
        valid_before = model(start).argmax(1) == target
        valid_after = model(refined).argmax(1) == target
    assert (after >= before - 1e-6).all()
    assert ((refined - start).norm(dim=1) <= delta + 1e-5).all()
    assert (valid_after | ~valid_before).all(), "valid counterfactuals stay valid"
    assert torch.equal(refined[:, 0], start[:, 0]) and (refined[:, 2] >= start[:, 2]).all()
    assert (result.score >= result.start_score - 1e-6).all() and result.improved.any()
    integral, end = path_probability(model, refined, target, n_grid=10)
    torch.testing.assert_close(end, after)
    torch.testing.assert_close(integral, result.score)
    wrapped = SNSRefined(make_generator("generic", lr=0.5), delta=delta, steps=5)
    assert wrapped.generate(model, x, target, tau=0.6, max_steps=40).counterfactual.shape == x.shape


# ------------------------------------------------------------------------------ CT training
@pytest.mark.parametrize("generator,options", [
    ("revise", {"latent_dim": 2, "vae_hidden_sizes": [16], "vae_epochs": 1, "vae_batch_size": 256}),
    ("amortised", {"initial_epochs": 1, "refit_every": 1, "refit_epochs": 1, "max_fit_samples": 256,
                   "hidden_sizes": [16, 16]}),
])
def test_ctmodule_trains_with_extra_generators(moons, tmp_path, generator, options):
    if generator == "revise":
        options = {**options, "cache_dir": str(tmp_path)}
    L.seed_everything(0, verbose=False)
    module = CTModule(n_features=2, n_classes=2, generator=generator, generator_options=options, nce=60, tau=0.9,
                      mutability={"x1": "none"}, feature_names=["x1", "x2"])
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=1)
    trainer.fit(module, moons)
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/div", "train/cf_converged"):
        assert torch.isfinite(metrics[key]), key
    pool = module.pool
    assert torch.equal(pool.x_neg[:, 0], pool.x_pos[:, 0]), "protected x1 is copied from x' into x⁺ and kept in x'"
    if generator == "amortised":
        assert module.generator.n_fits == 2 and module.generator.fitted_epoch == 1
    else:
        assert module.generator.vae_info["loaded"] is False


# --------------------------------------------------------------------------------- recipes
@pytest.mark.slow  # a recipe end to end
def test_train_generator_recipe_end_to_end(tmp_path):
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    classifier = train({"data": "moons", "objective": "vanilla", "max_epochs": 1, "limit_train_batches": 5,
                        "limit_val_batches": 1, "tracking_uri": uri, "progress": False})
    out = tmp_path / "generator.json"
    summary = load_recipe("train_generator").main([
        "--run-id", classifier["run_id"], "--tracking-uri", uri, "--max-epochs", "2", "--n-eval", "100",
        "--variant", "mmd", "--summary-json", str(out), "--no-progress"])
    saved = json.loads(out.read_text())
    assert saved["run_id"] == summary["run_id"] and saved["classifier_run_id"] == classifier["run_id"]
    for method in ("generator", "ecco"):
        metrics = saved["metrics"][method]
        for key in ("validity", "mmd2", "mmd2_class_0", "mmd2_class_1", "l1", "l0"):
            assert key in metrics
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["run_id"])
    assert {"eval/validity", "eval/mmd2", "eval/l1", "eval/l0", "eval_ecco/mmd2", "fit_seconds"} <= set(run.data.metrics)
    assert run.data.tags["classifier_run_id"] == classifier["run_id"]
    artifacts = {a.path for a in client.list_artifacts(summary["run_id"], "checkpoints")}
    assert "checkpoints/last.ckpt" in artifacts


def test_generators_prepare_standalone_for_evaluation(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(512, 2)
    model = linear_model(2)
    target = 1 - model(x[:100]).argmax(1)
    amortised = make_generator("amortised", initial_epochs=10, batch_size=64, gen_lr=3e-3)
    prepare_standalone(amortised, FitContext(model=model, x_train=x, y_train=None, n_classes=2, feature_names=None))
    result = amortised.generate(model, x[:100], target, tau=0.5, epsilon=0.3)
    assert (model(result.counterfactual).argmax(1) == target).float().mean() >= 0.9
    assert ((result.nascent - x[:100]).abs().amax(1) <= 0.3 + 1e-6).all() and (result.steps == 1).all()
    revise = make_generator("revise", latent_dim=2, vae_hidden_sizes=[8], vae_epochs=1, cache_dir=str(tmp_path))
    prepare_standalone(revise, FitContext(model=model, x_train=x, y_train=None, n_classes=2, feature_names=None,
                                          name="blobs"))
    assert revise.vae_info["path"].startswith(str(tmp_path / "blobs-2f-"))
    assert revise.generate(model, x[:100], target, max_steps=5).counterfactual.shape == (100, 2)
