"""A model trained on its own encoding of a table (scikit-learn, pandas) fine-tunes with ``--model-inputs``.

The user's encodings here are real scikit-learn and pandas pipelines fitted on ``tests/fixtures/loans.csv``; the
frozen input layer must reproduce their output from ct-lightning's encoding of the same rows, the fine-tuned
network must go back into the user's own ``nn.Module`` and pipeline, and explanations stay in the table's units.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from preloaded import run_script
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
NUMBERS, CATEGORIES = ["age", "income", "debt", "years_employed"], ["home_ownership", "purpose", "sex"]
COLUMNS = ["age", "income", "debt", "years_employed", "home_ownership", "purpose", "sex"]  # the fixture's, in order
APPLICANT = {"age": 29, "income": 31000, "debt": 21000, "years_employed": 2, "home_ownership": "rent",
             "purpose": "small_business", "sex": "female"}


def frame() -> tuple[pd.DataFrame, np.ndarray]:
    table = pd.read_csv(LOANS)
    return table.drop(columns="approved"), (table["approved"] == "yes").to_numpy().astype(np.int64)


def our_codec(features: pd.DataFrame, labels: np.ndarray):
    from datamodules.codec import TabularCodec

    return TabularCodec.fit(features.assign(approved=np.where(labels == 1, "yes", "no")), "approved")


def pipelines():
    """Fitted-to-be preprocessings a user may have, each another encoding of the same table."""
    from sklearn.compose import ColumnTransformer, make_column_selector
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import (MaxAbsScaler, MinMaxScaler, OneHotEncoder, OrdinalEncoder, RobustScaler,
                                       StandardScaler)

    return {
        "categories first, drop first": ColumnTransformer([
            ("cat", OneHotEncoder(drop="first", handle_unknown="ignore"), CATEGORIES),
            ("num", StandardScaler(), NUMBERS)]),
        "imputer and scaler, ordinal, raw remainder": ColumnTransformer([
            ("num", Pipeline([("fill", SimpleImputer(strategy="median")), ("scale", StandardScaler())]),
             ["income", "debt"]),
            ("cat", OneHotEncoder(sparse_output=False), ["purpose", "sex"]),
            ("ord", OrdinalEncoder(), ["home_ownership"])], remainder="passthrough"),
        "min-max, infrequent categories, robust, max-abs": ColumnTransformer([
            ("minmax", MinMaxScaler(), ["age", "years_employed"]),
            ("rare", OneHotEncoder(min_frequency=50, handle_unknown="infrequent_if_exist"), ["purpose"]),
            ("robust", RobustScaler(), ["income"]), ("maxabs", MaxAbsScaler(), ["debt"]),
            ("sex", OneHotEncoder(drop="if_binary"), ["sex"]), ("home", OneHotEncoder(), ["home_ownership"])]),
        "columns by mask, position, slice and selector": ColumnTransformer([
            ("mask", StandardScaler(), np.array([c in ("age", "income") for c in COLUMNS])),
            ("position", OneHotEncoder(), [4]), ("slice", "passthrough", slice(2, 4)),
            ("selector", OneHotEncoder(drop="first"), make_column_selector(dtype_include=object))]),
    }


def explain_applicant(tmp_path: Path) -> dict:
    """``explain.py --checkpoint ct/last.ckpt`` on APPLICANT with target yes, in a fresh interpreter: its JSON record."""
    out = tmp_path / "explained.json"
    done = run_script(ROOT / "recipes" / "explain.py", ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--row",
                      json.dumps(APPLICANT), "--target", "yes", "--json", str(out), "--no-log"], cwd=tmp_path,
                      timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())[0]


@pytest.mark.parametrize("name", list(pipelines()))
def test_the_input_layer_reproduces_a_fitted_column_transformer(name):
    from ct_lightning.model_inputs import affine_map, model_inputs_from_sklearn, read_model_inputs

    features, labels = frame()
    preprocess = pipelines()[name].fit(features)
    theirs = np.asarray(preprocess.transform(features), dtype=np.float64)
    entries = read_model_inputs(json.loads(json.dumps(model_inputs_from_sklearn(preprocess))))  # as a file holds it
    codec = our_codec(features, labels)
    weight, bias, unused = affine_map(entries, codec)
    mapped = codec.encode(features).astype(np.float64) @ np.asarray(weight).T + np.asarray(bias)
    assert mapped.shape == theirs.shape and unused == []
    np.testing.assert_allclose(mapped, theirs, rtol=1e-5, atol=1e-5)


def test_the_input_layer_reproduces_get_dummies_with_own_scaling():
    from ct_lightning.model_inputs import affine_map, model_inputs_from_dummies

    features, labels = frame()
    dummies = pd.get_dummies(features[["debt", "purpose", "age", "home_ownership"]], drop_first=True, dtype=float)
    center, scale = features[["debt", "age"]].mean(), features[["debt", "age"]].std()
    dummies[["debt", "age"]] = (dummies[["debt", "age"]] - center) / scale
    entries = model_inputs_from_dummies(list(dummies.columns), list(features.columns), center.to_dict(),
                                        scale.to_dict())
    weight, bias, unused = affine_map(entries, our_codec(features, labels))
    mapped = our_codec(features, labels).encode(features).astype(np.float64) @ np.asarray(weight).T + bias
    np.testing.assert_allclose(mapped, dummies.to_numpy(), rtol=1e-5, atol=1e-5)
    assert unused == ["income", "years_employed", "sex"]  # the model ignores them: allowed, and said at start-up
    assert model_inputs_from_dummies(list(dummies.columns), list(features.columns), center.to_dict(), scale.to_dict(),
                                     classes=np.array(["yes", "no"])) == {"inputs": entries, "outputs": ["yes", "no"]}


def test_a_code_the_data_spec_declares_categorical_may_be_a_number_in_the_users_pipeline():
    """--write-data-spec's advice (EDUCATION 1-6 is a code: kind categorical) and a pipeline that scaled the code as
    a number: one weight per category, the scaled number it stands for."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import StandardScaler

    from ct_lightning.model_inputs import affine_map, model_inputs_from_sklearn
    from datamodules.codec import TabularCodec

    features, labels = frame()
    features = features.assign(grade=features["age"] % 4 + 1)  # a code of categories, written as numbers
    preprocess = ColumnTransformer([("num", StandardScaler(), ["grade", "income"])]).fit(features)
    codec = TabularCodec.fit(features.assign(approved=labels), "approved",
                             spec={"columns": {"grade": {"kind": "categorical"}}})
    weight, bias, _ = affine_map(model_inputs_from_sklearn(preprocess), codec)
    mapped = codec.encode(features).astype(np.float64) @ np.asarray(weight).T + np.asarray(bias)
    np.testing.assert_allclose(mapped, preprocess.transform(features), rtol=1e-5, atol=1e-5)


def fit_users_model(tmp_path: Path, epochs: int = 300, units: int = 2, classes: list | None = None):
    """The user's own work: a ColumnTransformer (categories first, 13 outputs: as many as ct-lightning's encoding
    of the table, in another order) and a plain PyTorch MLP trained on its output; the weights and the inputs list
    are saved as files. ``classes``: the user's labels 0, 1 (e.g. ``["yes", "no"]``: label 1 is a rejection; the
    default is ct-lightning's order), written as ``"outputs"`` of the inputs file where given; ``units`` 1: one
    output unit trained with ``BCEWithLogitsLoss`` (the log-odds of ``classes[1]``)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from ct_lightning.model_inputs import model_inputs_from_sklearn

    features, labels = frame()
    preprocess = ColumnTransformer([("cat", OneHotEncoder(drop="if_binary"), CATEGORIES),
                                    ("num", StandardScaler(), NUMBERS)]).fit(features)
    own = labels if classes in (None, ["no", "yes"]) else 1 - labels  # the user's label of each row
    x, y = torch.tensor(preprocess.transform(features), dtype=torch.float32), torch.from_numpy(own)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, units))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) if units > 1 else \
            nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y.float())
        loss.backward()
        optimiser.step()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    entries = model_inputs_from_sklearn(preprocess)
    spec = entries if classes is None else {"inputs": entries, "outputs": classes}
    (tmp_path / "model-inputs.json").write_text(json.dumps(spec, indent=1))
    return preprocess, model


def settings(tmp_path: Path, **extra) -> dict:
    return {"data": str(LOANS), "target": "approved", "from_checkpoint": str(tmp_path / "model.pt"), "nce": 16,
            "max_epochs": 1, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False, "seed": 0,
            **extra}


def users_accuracy_on(preprocess, model, rows: np.ndarray, classes: list | None = None) -> float:
    """The user's model's accuracy on ``rows``, read in the user's own way (``classes``: its labels 0, 1)."""
    features, labels = frame()
    with torch.no_grad():
        outputs = model(torch.tensor(preprocess.transform(features.iloc[rows]), dtype=torch.float32))
    own = outputs.argmax(1).numpy() if outputs.shape[1] > 1 else (outputs[:, 0] > 0).long().numpy()
    approved = np.asarray(classes or ["no", "yes"])[own] == "yes"
    return float((approved == labels[rows].astype(bool)).mean())


def test_a_model_of_the_same_width_is_read_right_only_with_its_inputs_list(tmp_path):
    """The silent failure: weights of a 13-input model load onto ct-lightning's 13 inputs, in another order. With
    --model-inputs the model as loaded scores what it scores in the user's pipeline, on the same rows."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.runs.train import train

    preprocess, model = fit_users_model(tmp_path)
    val_rows = build_datamodule({"data": str(LOANS), "target": "approved"}).rows["val"]
    own = users_accuracy_on(preprocess, model, val_rows)
    lines: list[str] = []
    echo = lambda *parts, **_: lines.append(" ".join(map(str, parts)))  # noqa: E731
    mapped = train(settings(tmp_path, limit_train_batches=0, model_inputs=str(tmp_path / "model-inputs.json")),
                   echo=echo)
    assert mapped["metrics"]["val/acc"] == pytest.approx(own)
    loaded = next(line for line in lines if "as loaded, before any training" in line)
    assert f"validation accuracy {own:.3f} on the inputs of --model-inputs" in loaded
    unmapped = train(settings(tmp_path, limit_train_batches=0), echo=echo)
    assert own > 0.85 and unmapped["metrics"]["val/acc"] < own - 0.15, "misread, the same weights lose their skill"


def test_a_model_no_better_than_the_majority_class_as_loaded_is_warned_about(tmp_path):
    from ct_lightning.experiment.runs.train import train

    fit_users_model(tmp_path)
    state = torch.load(tmp_path / "model.pt")
    state["2.weight"].zero_()
    state["2.bias"].copy_(torch.tensor([5.0, -5.0]))  # always "no", the minority class of the fixture
    torch.save(state, tmp_path / "model.pt")
    lines: list[str] = []
    train(settings(tmp_path, limit_train_batches=0, model_inputs=str(tmp_path / "model-inputs.json")),
          echo=lambda *parts, **_: lines.append(" ".join(map(str, parts))))
    warning = [line for line in lines if line.startswith("warning:")]
    assert len(warning) == 1 and "predicts no better than the majority class before training" in warning[0]
    assert "check that --model-inputs lists the inputs it was trained on" in warning[0]


@pytest.mark.parametrize("units", [2, 1])
def test_a_model_trained_with_another_label_order_is_told_which_outputs_to_write(tmp_path, units):
    """A credit model trained with label 1 for the rejection ("no") and fine-tuned without "outputs" (or, for one
    unit, with them the wrong way round) scored far below the majority class as loaded; the warning said only that
    the outputs "must be the classes no, yes, in this order", and the training went on with them misread. Read the
    other way round it scores what it scored in the user's pipeline: the warning now says so and gives the
    "outputs" to write."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.runs.train import train

    preprocess, model = fit_users_model(tmp_path, epochs=150, units=units, classes=["yes", "no"])
    spec = json.loads((tmp_path / "model-inputs.json").read_text())
    # the mistake: the inputs alone (two outputs read as ct-lightning's no, yes), or a unit read as the log-odds of yes
    written = spec["inputs"] if units == 2 else {**spec, "outputs": ["no", "yes"]}
    (tmp_path / "model-inputs.json").write_text(json.dumps(written))
    val_rows = build_datamodule({"data": str(LOANS), "target": "approved"}).rows["val"]
    own = users_accuracy_on(preprocess, model, val_rows, classes=["yes", "no"])
    lines: list[str] = []
    train(settings(tmp_path, limit_train_batches=0, model_inputs=str(tmp_path / "model-inputs.json")),
          echo=lambda *parts, **_: lines.append(" ".join(map(str, parts))))
    warning = [line for line in lines if line.startswith("warning:") and "before training" in line]
    assert len(warning) == 1, lines
    assert f'read as the classes ["yes", "no"], in the model\'s order, its outputs score {own:.3f}' in warning[0]
    assert 'write "outputs": ["yes", "no"] in --model-inputs FILE' in warning[0]


def test_reordered_outputs_tries_every_order_and_keeps_the_given_one_on_a_tie():
    from ct_lightning.model_inputs import reordered_outputs

    counts = [[0, 5, 1], [1, 0, 7], [6, 0, 0]]  # [p][t]: rows predicted a are mostly b, b mostly c, c mostly a
    assert reordered_outputs(counts, ["a", "b", "c"], ["a", "b", "c"]) == (["b", "c", "a"], 18 / 20)
    # outputs read now as b, a, c (an "outputs" list given): the first output's predictions (b) are mostly c
    assert reordered_outputs(counts, ["b", "a", "c"], ["a", "b", "c"]) == (["c", "b", "a"], 18 / 20)
    assert reordered_outputs([[2, 2], [2, 2]], ["a", "b"], ["a", "b"]) == (["a", "b"], 0.5)


def test_fine_tuned_model_explains_in_table_units_and_its_weights_go_back_to_the_users_pipeline(tmp_path):
    """CSV → the user's scikit-learn encoding and plain PyTorch model → CT with --model-inputs → explain.py on the
    checkpoint → model-weights.pt in the user's own nn.Module on the user's own encoding predicts as the
    CT-trained model does on ct-lightning's."""
    from ct_lightning.experiment.runs.loading import load_checkpoint
    from ct_lightning.experiment.runs.train import train
    from ct_lightning.models import AdaptedModel
    from datamodules.codec import TabularCodec

    preprocess, model = fit_users_model(tmp_path)
    run = train(settings(tmp_path, max_epochs=2, immutable=["age", "sex"], checkpoint_dir=str(tmp_path / "ct"),
                         model_inputs=str(tmp_path / "model-inputs.json")))
    weights = tmp_path / "ct" / "model-weights.pt"
    assert run["model_weights"] == str(weights)

    trained = load_checkpoint(tmp_path / "ct" / "last.ckpt")  # weights_only, as explain.py and evaluate.py load it
    assert isinstance(trained.model, AdaptedModel) and not list(trained.model.inputs.parameters())
    features, _ = frame()
    ours = torch.from_numpy(TabularCodec.from_dict(trained.preprocessing).encode(features))
    model.load_state_dict(torch.load(weights, weights_only=True))  # the user's own module, strictly
    with torch.no_grad():
        in_their_pipeline = model(torch.tensor(preprocess.transform(features), dtype=torch.float32))
        composite = trained.model(ours)
    torch.testing.assert_close(in_their_pipeline, composite, rtol=1e-4, atol=1e-4)
    assert not torch.equal(trained.model.network[0].weight, torch.load(tmp_path / "model.pt")["0.weight"]), \
        "CT changed the network"

    explained = explain_applicant(tmp_path)
    assert explained["counterfactual"]["age"] == 29 and explained["counterfactual"]["sex"] == "female"
    assert explained["counterfactual"]["home_ownership"] in ("rent", "mortgage", "own")
    assert float(explained["counterfactual"]["income"]).is_integer()

    lines: list[str] = []
    again = train(settings(tmp_path, from_checkpoint=str(tmp_path / "ct" / "last.ckpt"),
                           checkpoint_dir=str(tmp_path / "again")),  # its inputs list comes with the checkpoint
                  echo=lambda *parts, **_: lines.append(" ".join(map(str, parts))))
    assert any("reading the 13 inputs of the --model-inputs list it was trained with" in line for line in lines)
    assert again["config"]["model_inputs"] == json.loads((tmp_path / "model-inputs.json").read_text())
    assert (tmp_path / "again" / "model-weights.pt").is_file()


def test_a_model_with_its_classes_in_another_order_keeps_its_accuracy_only_with_outputs(tmp_path):
    """A model trained with label 1 = "no" (a rejection): read in ct-lightning's class order it is as wrong as it is
    right in the user's; with "outputs" it scores as loaded what it scores in the user's pipeline."""
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.runs.train import train

    preprocess, model = fit_users_model(tmp_path, classes=["yes", "no"])
    val_rows = build_datamodule({"data": str(LOANS), "target": "approved"}).rows["val"]
    own = users_accuracy_on(preprocess, model, val_rows, ["yes", "no"])
    spec = json.loads((tmp_path / "model-inputs.json").read_text())
    assert spec["outputs"] == ["yes", "no"]
    (tmp_path / "inputs-only.json").write_text(json.dumps(spec["inputs"]))
    mapped = train(settings(tmp_path, limit_train_batches=0, model_inputs=str(tmp_path / "model-inputs.json")),
                   echo=lambda *_, **__: None)
    assert own > 0.85 and mapped["metrics"]["val/acc"] == pytest.approx(own)
    misread = train(settings(tmp_path, limit_train_batches=0, model_inputs=str(tmp_path / "inputs-only.json")),
                    echo=lambda *_, **__: None)
    assert misread["metrics"]["val/acc"] == pytest.approx(1 - own), "its classes read in ct-lightning's order"
    from ct_lightning.model_inputs import model_inputs_from_sklearn

    encoder_classes = np.array(["yes", "no"], dtype=object)  # a LabelEncoder's classes_, in the model's order
    assert model_inputs_from_sklearn(preprocess, classes=encoder_classes) == spec


def test_the_output_layer_of_one_unit_gives_softmax_the_sigmoid_and_cross_entropy_the_bce():
    from ct_lightning.models import OutputAdapter

    z, y = torch.tensor([[-2.0], [0.3], [4.0]]), torch.tensor([0, 1, 1])
    layer = OutputAdapter([1], 2)
    assert not list(layer.parameters())
    torch.testing.assert_close(layer(z).softmax(1)[:, 1], torch.sigmoid(z[:, 0]))
    torch.testing.assert_close(nn.functional.cross_entropy(layer(z), y),
                               nn.functional.binary_cross_entropy_with_logits(z[:, 0], y.float()))
    torch.testing.assert_close(layer(z), torch.cat([-z / 2, z / 2], 1))  # centred: both classes' energies move
    torch.testing.assert_close(OutputAdapter([0], 2)(z), torch.cat([z / 2, -z / 2], 1))  # "no"'s log-odds
    # a unit scoring "no" is the negated unit scoring "yes": the same logits, whichever class the user called positive
    torch.testing.assert_close(OutputAdapter([0], 2)(-z), layer(z))
    torch.testing.assert_close(OutputAdapter([2, 0, 1], 3)(torch.tensor([[1.0, 2.0, 3.0]])),
                               torch.tensor([[2.0, 3.0, 1.0]]))


def test_ct_fine_tunes_a_single_logit_alike_whichever_class_it_scores(tmp_path):
    """A user's one-logit model (the log-odds of "yes") and the same model negated (the log-odds of "no") are one
    classifier: CT must fine-tune them alike. With logits 0 and z the class without the unit had a constant energy,
    its counterfactuals added no penalty and the ridge term pulled the decision towards it (a one-logit HR model fell
    from 0.85 to 0.72 in 5 epochs; on the lending table 0.78 to 0.53, predicting 'yes' for 18 % of rows, 55 % true)."""
    from ct_lightning.experiment.runs.train import train

    fit_users_model(tmp_path, epochs=150, units=1, classes=["no", "yes"])
    spec = json.loads((tmp_path / "model-inputs.json").read_text())
    weights = torch.load(tmp_path / "model.pt", weights_only=True)
    torch.save({k: -v if k.startswith("2.") else v for k, v in weights.items()}, tmp_path / "negated.pt")
    (tmp_path / "negated.json").write_text(json.dumps({**spec, "outputs": ["yes", "no"]}))
    runs = [train(settings(tmp_path, max_epochs=2, lambda_reg=0.5, from_checkpoint=str(tmp_path / model),
                           model_inputs=str(tmp_path / inputs), checkpoint_dir=str(tmp_path / model[:-3])),
                  echo=lambda *_, **__: None) for model, inputs in (("model.pt", "model-inputs.json"),
                                                                    ("negated.pt", "negated.json"))]
    scores, negated = (torch.load(run["model_weights"], weights_only=True) for run in runs)
    assert not torch.allclose(scores["2.weight"], weights["2.weight"], atol=1e-3), "CT changed the model"
    for name, value in scores.items():
        torch.testing.assert_close(negated[name], -value if name.startswith("2.") else value, rtol=1e-4, atol=1e-5)
    assert runs[0]["metrics"]["train/ridge"] > 0 and runs[0]["metrics"]["train/div"] != 0
    assert runs[1]["metrics"]["val/acc"] == pytest.approx(runs[0]["metrics"]["val/acc"])


def test_a_ct_fine_tuning_that_loses_accuracy_says_what_to_try_and_a_vanilla_one_does_not(tmp_path):
    """A user's model fell from 0.85 to 0.72 validation accuracy in 5 CT epochs at the defaults and nothing said why:
    the result is followed by a note naming the fall and what to try (a lower --lr, a smaller --lambda-reg, more
    epochs, --objective vanilla); a fine-tuning that keeps its accuracy gets none."""
    from ct_lightning.experiment.runs.train import result_lines, train

    fit_users_model(tmp_path, epochs=150, units=1, classes=["no", "yes"])
    common = settings(tmp_path, max_epochs=2, model_inputs=str(tmp_path / "model-inputs.json"))
    fell = train({**common, "lr": 0.05, "lambda_reg": 1.0}, echo=lambda *_, **__: None)
    loaded, ended = fell["loaded_val_acc"], fell["metrics"]["val/acc"]
    assert loaded > 0.85 and loaded - ended >= 0.05, (loaded, ended)
    notes = [line for line in result_lines(fell) if line.startswith("note: validation accuracy fell")]
    assert notes == [f"note: validation accuracy fell from {loaded:.3f} as loaded to {ended:.3f}: CT's penalties "
                     "reshape the logits of a model trained without them, most in the first epochs (the ridge term, "
                     "λ_reg 1.0, grows with their square); to keep more of it try a lower --lr (e.g. 0.005; it is "
                     "0.05), a smaller --lambda-reg or more --max-epochs, and --objective vanilla for what "
                     "fine-tuning alone costs (docs/guide.md, \"Fine-tune a model you already have\")"]
    kept = train({**common, "objective": "vanilla", "lr": 1e-4}, echo=lambda *_, **__: None)
    assert abs(kept["metrics"]["val/acc"] - kept["loaded_val_acc"]) < 0.05
    assert not [line for line in result_lines(kept) if "fell" in line]


@pytest.mark.parametrize("units", [2, 1], ids=["classes flipped", "one BCE unit, the log-odds of no"])
def test_a_model_of_its_own_class_order_or_one_unit_trains_explains_and_goes_back_to_the_users_pipeline(tmp_path,
                                                                                                        units):
    """A model whose outputs are ["yes", "no"] (two units, or one: the log-odds of "no") → CT with "outputs" →
    explain.py predicts and scores as the user's model does → model-weights.pt is the user's bare network (its own
    outputs, its own width) predicting as the composite does → a further --from-checkpoint keeps the order."""
    from ct_lightning.experiment.runs.loading import load_checkpoint
    from ct_lightning.experiment.runs.train import train
    from datamodules.codec import TabularCodec

    preprocess, model = fit_users_model(tmp_path, epochs=150, units=units, classes=["yes", "no"])
    run = train(settings(tmp_path, max_epochs=1, checkpoint_dir=str(tmp_path / "ct"),
                         model_inputs=str(tmp_path / "model-inputs.json")), echo=lambda *_, **__: None)
    trained = load_checkpoint(tmp_path / "ct" / "last.ckpt")  # weights_only, as explain.py and evaluate.py load it
    assert trained.hparams.output_order == ([1, 0] if units == 2 else [0])
    assert not list(trained.model.outputs.parameters())
    features, labels = frame()
    ours = torch.from_numpy(TabularCodec.from_dict(trained.preprocessing).encode(features))
    model.load_state_dict(torch.load(run["model_weights"], weights_only=True))  # the user's own module, strictly
    with torch.no_grad():
        theirs = model(torch.tensor(preprocess.transform(features), dtype=torch.float32))
        composite = trained.model(ours)
    assert theirs.shape[1] == units
    expected = theirs[:, [1, 0]] if units == 2 else torch.cat([theirs / 2, -theirs / 2], 1)
    torch.testing.assert_close(composite, expected, rtol=1e-4, atol=1e-4)
    assert (composite.argmax(1).numpy() == labels).mean() > 0.85

    explained = explain_applicant(tmp_path)
    applicant = torch.tensor(preprocess.transform(pd.DataFrame([APPLICANT])), dtype=torch.float32)
    with torch.no_grad():
        yes = model(applicant).softmax(1)[0, 0] if units == 2 else 1 - torch.sigmoid(model(applicant)[0, 0])
    assert explained["factual_probability"] == pytest.approx(float(yes), abs=1e-4)
    assert explained["prediction"] == ("yes" if yes > 0.5 else "no")

    again = train(settings(tmp_path, from_checkpoint=str(tmp_path / "ct" / "last.ckpt"), limit_train_batches=0,
                           checkpoint_dir=str(tmp_path / "again")), echo=lambda *_, **__: None)
    assert again["config"]["model_inputs"] == json.loads((tmp_path / "model-inputs.json").read_text())
    assert again["metrics"]["val/acc"] == pytest.approx(run["metrics"]["val/acc"])
    assert torch.load(again["model_weights"], weights_only=True)["2.weight"].shape[0] == units


README_SIZES = {"examples/make_lending_csv.py": "--rows 600", "examples/train_plain_pytorch.py": "--epochs 30",
                "recipes/train.py": "--max-epochs 2 --nce 32 --no-progress"}


@pytest.mark.slow  # four fresh interpreters
def test_the_readme_walk_through_runs_as_written(tmp_path):
    """README "Your data, your model, ...": its commands in order, at a tiny size (the only change), from a folder
    that holds the repository's programs as the README's set-up leaves them."""
    import os
    import re
    import subprocess

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Your data, your model"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert [c.split()[1] for c in commands] == ["examples/make_lending_csv.py", "examples/train_plain_pytorch.py",
                                                "recipes/train.py", "recipes/explain.py"]
    assert "--model-inputs model-inputs.json" in commands[2]
    for name in (".venv", "examples", "recipes"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = "\n".join(re.sub(r"\s+#.*$", "", c) + " " + README_SIZES.get(c.split()[1], "") for c in commands)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "as loaded, before any training: validation accuracy" in output and "warning:" not in output
    assert (tmp_path / "loans-ct" / "model-weights.pt").is_file()
    assert "row 1: predicted" in output and "(not allowed to change: age, sex)" in output


def test_a_deferred_end_rebuilds_a_model_with_its_own_outputs_as_trained(tmp_path):
    """A run whose end found the tracking server down (the upload command's finish_deferred_end) rebuilds the
    model from the kept weights and its settings alone: a one-unit model with "outputs" ["yes", "no"] must come
    back with its frozen output layer, and its predictor must answer as the run's own predictor does."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.outbox import FINAL_STATE, Outbox
    from ct_lightning.experiment.runs.train import train
    from ct_lightning.experiment.runs.upload import finish_deferred_end

    fit_users_model(tmp_path, epochs=150, units=1, classes=["yes", "no"])
    run = train(settings(tmp_path, checkpoint_dir=str(tmp_path / "ct"),
                         model_inputs=str(tmp_path / "model-inputs.json")), echo=lambda *_, **__: None)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    deferred = client.create_run(run["experiment_id"]).info.run_id  # the run the server could not end
    outbox = Outbox(tmp_path / "outbox")
    outbox.folder.mkdir()
    state = torch.load(tmp_path / "ct" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    torch.save(state, outbox.folder / FINAL_STATE)
    record = {"op": "end", "run_id": deferred, "experiment_id": run["experiment_id"], "tracking_uri": uri,
              "config": run["config"], "metrics": run["metrics"], "state": FINAL_STATE}
    models = finish_deferred_end(client, record, outbox, uri)
    assert client.get_run(deferred).info.status == "FINISHED"
    mlflow.set_tracking_uri(uri)
    rows = frame()[0].head(20)
    original = mlflow.pyfunc.load_model(f"runs:/{run['run_id']}/predictor").predict(rows)
    rebuilt = mlflow.pyfunc.load_model(f"models:/{models['registered']}/{models['version']}").predict(rows)
    pd.testing.assert_frame_equal(rebuilt, original)
    assert set(original["prediction"]) <= {"yes", "no"}


def test_a_model_exactly_as_good_as_the_majority_class_is_warned_about_too():
    """36 of 60 right with a majority of 36: the accuracy was a float32 mean, 0.6000000238 > 0.6, and the warning
    ("no better than the majority class", <=) stayed silent for a misread model (two swapped inputs)."""
    from types import SimpleNamespace

    from ct_lightning.experiment.runs.train import echo_loaded_accuracy

    y = torch.tensor([1] * 36 + [0] * 24)
    always_one = torch.nn.Linear(1, 2)
    with torch.no_grad():
        always_one.weight.zero_()
        always_one.bias.copy_(torch.tensor([0.0, 1.0]))
    lines: list[str] = []
    echo_loaded_accuracy({"from_checkpoint": "model.pt", "data": "moons"}, SimpleNamespace(model=always_one),
                         SimpleNamespace(x_val=torch.zeros(60, 1), y_val=y),
                         lambda *parts, **_: lines.append(" ".join(map(str, parts))))
    assert "validation accuracy 0.600 (the majority class alone: 0.600)" in lines[0]
    assert lines[1].startswith("warning: model.pt predicts no better than the majority class before training "
                               "(0.600 <= 0.600)")


def test_a_trained_model_no_better_than_the_most_frequent_class_is_named_in_the_result():
    """A model fine-tuned with its outputs in reversed order ended at test accuracy 0.100 against a majority of 0.6,
    was registered as the latest version, and the result line gave no sign of it."""
    from ct_lightning.experiment.runs.train import result_lines

    summary = {"metrics": {"test/acc": 0.1, "val/acc": 0.083, "epochs": 3}, "data": {"class_balance": [0.4, 0.6]}}
    lines = result_lines(summary)
    assert lines[0] == "result after 3 epoch(s): test accuracy 0.100, validation accuracy 0.083"
    assert lines[1].startswith("warning: test accuracy 0.100 is no better than always predicting the most frequent "
                               "class (0.600 of the training rows)")
    fine = result_lines({**summary, "metrics": {**summary["metrics"], "test/acc": 0.82}})
    assert not [line for line in fine if line.startswith("warning:")]


def test_a_model_that_never_predicts_a_rare_class_is_named_although_its_accuracy_reads_a_hair_higher():
    """A table with 3 % defaults: the model predicted 'no' for every row, test accuracy 582/600 = 0.97 against 0.97 of
    the training rows, but the logged float32 read 0.9700000286 > 0.97, and no warning came. Up to a row per class
    of the test split (its shares differ from the training rows' by their rounding) is still no better."""
    import numpy as np

    from ct_lightning.experiment.runs.train import result_lines

    summary = {"metrics": {"test/acc": float(np.float32(582 / 600)), "val/acc": 0.97, "epochs": 5},
               "data": {"class_balance": [0.97, 0.03], "n_test": 600, "n_classes": 2},
               "config": {"data": "/data/rare.csv", "balance": "none"}}
    warning = [line for line in result_lines(summary) if line.startswith("warning:")]
    assert warning and warning[0].startswith("warning: test accuracy 0.970 is no better than always predicting the "
                                             "most frequent class (0.970 of the training rows): train longer, or, "
                                             "for a rare class, --balance undersample, or check the data")
    better = {**summary, "metrics": {**summary["metrics"], "test/acc": 590 / 600}}
    assert not [line for line in result_lines(better) if line.startswith("warning:")]


def test_the_weights_of_a_run_that_trained_nothing_are_not_called_trained():
    """The worked example's "before" run (--from-checkpoint with --limit-train-batches 0) logs the user's network as it
    was loaded; its result named the file 'your network's weights after training'."""
    from ct_lightning.experiment.runs.train import result_lines

    summary = {"metrics": {"test/acc": 0.8, "epochs": 1}, "data": {"class_balance": [0.4, 0.6]},
               "model_weights": "mlruns/w.pt", "config": {"limit_train_batches": 0}}
    assert "your network's weights as loaded (nothing was trained), without the input layer" in \
        "\n".join(result_lines(summary))
    trained = result_lines({**summary, "config": {"limit_train_batches": 1.0}})
    assert "your network's weights after training, without the input layer" in "\n".join(trained)


def test_an_inputs_file_is_refused_with_its_categories_and_classes_written_as_in_it(tmp_path):
    """German categories and classes in a bad --model-inputs file were quoted as JSON's ASCII escapes
    (``codes {"Hauptschule": 0, "Universit\\u00e4t": "eins"}``): the message should show what the file says."""
    from ct_lightning.model_inputs import output_order, read_model_spec

    (tmp_path / "codes.json").write_text(json.dumps([{"feature": "Abschluss", "codes": {"Hauptschule": 0,
                                                                                      "Universität": "eins"}}]),
                                         encoding="utf-8")
    with pytest.raises(ValueError, match='codes {"Hauptschule": 0, "Universität": "eins"}'):
        read_model_spec(str(tmp_path / "codes.json"))
    with pytest.raises(ValueError, match=r'"outputs" \["nein", "jä"\]: unknown class'):
        output_order(["nein", "jä"], ["ja", "nein"], 2, "inputs.json")
