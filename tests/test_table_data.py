"""A user's table: the reversible codec, the stratified split fitted on training rows only, inferred kinds,
the data spec, the one-line errors for bad data, and a real training from a CSV file."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.codec import TabularCodec, infer_kind
from datamodules.table import TableDataModule, stratified_split, table_defaults

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"


@pytest.fixture(scope="module")
def loans() -> pd.DataFrame:
    return pd.read_csv(LOANS)


def test_kinds_are_inferred_from_the_dtypes(loans):
    kinds = {name: infer_kind(loans[name]) for name in loans.columns}
    assert kinds == {"age": "integer", "income": "integer", "debt": "integer", "years_employed": "integer",
                     "home_ownership": "categorical", "purpose": "categorical", "sex": "binary", "approved": "binary"}
    assert infer_kind(pd.Series([0.5, 1.25])) == "continuous" and infer_kind(pd.Series([True, False])) == "binary"
    assert infer_kind(pd.Series([0, 1, 1])) == "binary" and infer_kind(pd.Series(["a", "b", "c"])) == "categorical"


def test_encoding_by_hand_and_round_trip(loans):
    codec = TabularCodec.fit(loans, "approved")
    assert codec.classes == ["no", "yes"] and codec.positive == "yes"
    homes = sorted(loans["home_ownership"].unique())
    assert codec.feature_names[:4] == ["age", "income", "debt", "years_employed"]
    assert codec.feature_names[4:7] == [f"home_ownership={h}" for h in homes]
    features = loans.drop(columns="approved")
    x = codec.encode(features)
    # the standardisation, by hand (population sd of the fitted rows)
    age = loans["age"].to_numpy(float)
    np.testing.assert_allclose(x[:, 0], (age - age.mean()) / age.std(), rtol=1e-5, atol=1e-5)
    # one 1 per one-hot group, at the row's own category
    group = x[:, 4:7]
    assert (group.sum(1) == 1).all() and (np.array(homes)[group.argmax(1)] == loans["home_ownership"]).all()
    assert set(np.unique(x[:, codec.feature_names.index("sex")])) == {0.0, 1.0}
    back = codec.decode(x)
    pd.testing.assert_frame_equal(back, features, check_dtype=False)
    assert codec.encode_target(loans["approved"]).tolist() == (loans["approved"] == "yes").astype(int).tolist()
    assert codec.decode_target([0, 1]) == ["no", "yes"]


def test_decode_gives_real_categories_and_integers_for_any_input(loans):
    codec = TabularCodec.fit(loans, "approved")
    x = codec.encode(loans.drop(columns="approved").head(5))
    noisy = x + np.random.default_rng(0).normal(0, 0.3, x.shape).astype(np.float32)
    decoded = codec.decode(noisy)
    for column in ("home_ownership", "purpose", "sex"):
        assert set(decoded[column]) <= set(loans[column])
    assert all(float(v).is_integer() for v in decoded["income"])
    again = codec.decode(codec.encode(decoded))
    pd.testing.assert_frame_equal(again, decoded, check_dtype=False)


def test_codec_survives_json(loans):
    codec = TabularCodec.fit(loans, "approved", {"columns": {"age": {"mutability": "none"}}, "positive": "no"})
    again = TabularCodec.from_dict(json.loads(json.dumps(codec.to_dict())))
    assert again == codec and again.classes == ["yes", "no"] and again.mutability() == {"age": "none"}
    assert np.array_equal(again.encode(loans.drop(columns="approved")), codec.encode(loans.drop(columns="approved")))


def test_split_is_seeded_stratified_and_the_codec_sees_training_rows_only(loans):
    y = loans["approved"].to_numpy()
    rows = stratified_split(y, 0)
    assert sum(len(r) for r in rows.values()) == len(y)
    assert not set(rows["train"]) & set(rows["test"]) and not set(rows["val"]) & set(rows["test"])
    share = (y == "yes").mean()
    for split in rows.values():
        assert abs((y[split] == "yes").mean() - share) < 0.03
    assert all(np.array_equal(a, b) for a, b in zip(rows.values(), stratified_split(y, 0).values()))
    data = TableDataModule(LOANS, target="approved")
    data.setup()
    trained = loans.iloc[data.rows["train"]]["income"].to_numpy(float)
    column = data.codec.columns[1]
    assert column.name == "income" and column.mean == pytest.approx(trained.mean())
    assert column.mean != pytest.approx(loans["income"].mean())  # fails if the codec is fitted on all rows
    assert len(data.y_train) == len(data.rows["train"]) and data.n_classes == 2


def test_spec_declares_kinds_mutability_bounds_and_positive_class(tmp_path, loans):
    spec = tmp_path / "spec.yaml"
    spec.write_text("positive: 'yes'\ncolumns:\n  age: {mutability: none}\n  income: {kind: continuous, lower: 0}\n"
                    "  years_employed: {mutability: increase}\n")
    data = TableDataModule(LOANS, target="approved", spec=spec)
    data.setup()
    kinds = {c.name: (c.kind, c.mutability) for c in data.codec.columns}
    assert kinds["income"] == ("continuous", "both") and kinds["age"] == ("integer", "none")
    assert data.protected == ["age"]
    lower, upper = data.domain()
    income = data.codec.columns[1]
    assert lower[1].item() == pytest.approx((0 - income.mean) / income.scale)
    onehot = [i for i, n in enumerate(data.feature_names) if "=" in n]
    assert (lower[onehot] == 0).all() and (upper[onehot] == 1).all()


STRICTNESS = {"both": {"both", "increase", "decrease", "none"}, "increase": {"increase", "none"},
              "decrease": {"decrease", "none"}, "none": {"none"}}  # a data spec's kind → the kinds that keep to it


@pytest.mark.parametrize("held", ["increase", "decrease", "none"])
def test_the_command_line_may_hold_a_data_spec_kind_fixed_but_never_loosen_it(tmp_path, held):
    from ct_lightning.experiment.configuration.data import mutability_spec

    spec = tmp_path / "facts.yaml"
    spec.write_text(f"columns:\n  age: {{mutability: {held}}}\n")
    data = TableDataModule(LOANS, target="approved", spec=spec)
    data.setup()
    for kind in ("both", "increase", "decrease", "none"):
        config = {"mutability": f"age={kind}", "data_spec": str(spec)}
        if kind in STRICTNESS[held]:
            assert mutability_spec(config, data)["age"] == kind
        else:
            with pytest.raises(ValueError, match=f"mutability: got 'age={kind}' \\('age' is {held} in the data "
                                                 "spec facts.yaml"):
                mutability_spec(config, data)
    assert mutability_spec({"immutable": ["age"]}, data)["age"] == "none"
    assert mutability_spec({}, data)["age"] == held


def test_data_frames_take_the_same_path(loans):
    from_frame, from_file = TableDataModule(loans, target="approved"), TableDataModule(LOANS, target="approved")
    from_frame.setup(), from_file.setup()
    assert torch.equal(from_frame.x_train, from_file.x_train) and from_frame.codec == from_file.codec


def test_defaults_follow_the_training_size():
    assert table_defaults(210) == {"tau": 0.5, "lambda_reg": 0.25, "nce": 210, "batch_size": 32}
    assert table_defaults(20000)["nce"] == 5000 and table_defaults(20000)["batch_size"] == 1000


def test_train_from_a_csv_logs_the_preprocessing_with_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from ct_lightning import CTModule
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = train({"data": str(LOANS), "target": "approved", "immutable": ["age", "sex"], "max_epochs": 1,
                     "nce": 16, "tracking_uri": uri, "progress": False, "checkpoint_dir": str(tmp_path / "ckpt")})
    assert summary["config"]["data"] == str(LOANS) and summary["config"]["target"] == "approved"
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["run_id"])
    assert run.info.run_name.startswith("loans-full-") and run.data.tags["data"] == "loans"
    logged = json.loads(Path(client.download_artifacts(summary["run_id"], "preprocessing.json", str(tmp_path)))
                        .read_text())
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert json.loads(checkpoint["ct_preprocessing"]) == logged  # JSON text: one object to pickle per save
    codec = TabularCodec.from_dict(logged)
    assert codec.feature_names == checkpoint["hyper_parameters"]["feature_names"]
    module = CTModule.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert module.preprocessing == logged
    assert {k for k, v in dict(module.hparams.mutability).items() if v == "none"} == {"age", "sex"}


def test_the_search_sees_the_tables_categories_binaries_and_integers():
    from ct_lightning.constraints import Constraints

    data = TableDataModule(LOANS, target="approved")
    data.setup()
    types = data.feature_types()
    names = data.feature_names
    assert [[names[i] for i in group] for group in types.groups] == \
        [[n for n in names if n.startswith("home_ownership=")], [n for n in names if n.startswith("purpose=")],
         ["sex"]]
    assert [names[i] for i in types.integers] == ["age", "income", "debt", "years_employed"]
    # a point between categories and off the integer grid snaps to a row the codec decodes exactly
    x = data.x_train[:8]
    noisy = x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    lower, upper = data.domain()
    snapped = Constraints(torch.zeros(len(names), dtype=torch.long), lower, upper, types=types).snap(noisy, x)
    decoded = data.codec.decode(snapped)
    np.testing.assert_allclose(data.codec.encode(decoded), snapped.numpy(), atol=1e-4)


def with_non_features(loans: pd.DataFrame) -> pd.DataFrame:
    """The loans table with an identifier, a free-text column and a constant one, as real exports have."""
    return loans.assign(applicant_id=np.arange(1000, 1000 + len(loans)), branch="main",
                        notes=[f"called on day {i}" for i in range(len(loans))])


def test_drop_columns_leaves_identifiers_free_text_and_constants_out(loans):
    frame = with_non_features(loans)
    with pytest.raises(ValueError, match=r"^data: 2 problems in DataFrame, each with its fix: \(1\) column 'branch' is "
                                         r"constant in DataFrame .*; leave it out with --drop-columns branch \| \(2\) "
                                         r"column 'notes' has 300 categories"):
        TableDataModule(frame, "approved")
    with pytest.raises(ValueError, match=r"'notes' has 300 categories; .*leave it out with --drop-columns notes"):
        TableDataModule(frame.drop(columns="branch"), "approved")
    with pytest.raises(ValueError, match=r"^drop_columns: got 'nope', not a column of DataFrame; allowed: age, "):
        TableDataModule(frame, "approved", drop_columns=["nope"])
    with pytest.raises(ValueError, match=r"^drop_columns: got 'approved', the target"):
        TableDataModule(frame, "approved", drop_columns=["approved"])
    hinted = TableDataModule(frame.drop(columns=["branch", "notes"]), "approved")
    assert hinted.identifier_like() == ["applicant_id"] and "leave it out with --drop-columns applicant_id" in \
        hinted.describe()
    assert TableDataModule(loans, "approved").identifier_like() == []
    module = TableDataModule(frame, "approved", drop_columns=["applicant_id", "branch", "notes"])
    plain = TableDataModule(loans, "approved")
    assert module.codec.feature_names == plain.codec.feature_names
    assert module.codec.dropped == ["applicant_id", "branch", "notes"]
    assert TabularCodec.from_dict(json.loads(json.dumps(module.codec.to_dict()))) == module.codec
    assert "left out (--drop-columns): applicant_id, branch, notes" in module.describe()
    module.setup("fit")
    plain.setup("fit")
    assert torch.equal(module.x_train, plain.x_train) and torch.equal(module.y_train, plain.y_train)
    # a codec pickled before --drop-columns existed (a registered predictor) has no such attribute of its own
    import pickle

    old = pickle.loads(pickle.dumps(plain.codec))
    del old.__dict__["dropped"]
    assert old.without_dropped(frame) is frame and "dropped" not in old.to_dict()
    # a trained model's codec drops them from a file to evaluate, which may also lack them
    again = TableDataModule(frame, "approved", codec=module.codec.to_dict())
    assert again.codec == module.codec
    TableDataModule(loans, "approved", codec=module.codec)


def test_a_model_trained_without_some_columns_explains_and_serves_rows_that_carry_them(tmp_path, loans):
    from ct_lightning.experiment.runs.explanations import explain_loaded, load_explainable, search_settings
    from ct_lightning.experiment.runs.request_checks import check_rows
    from ct_lightning.experiment.runs.train import train

    frame = with_non_features(loans)
    frame.to_csv(tmp_path / "export.csv", index=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = train({"data": str(tmp_path / "export.csv"), "target": "approved", "drop_columns": "applicant_id, notes,"
                     "branch", "max_epochs": 1, "nce": 16, "tracking_uri": uri, "progress": False})
    assert summary["config"]["drop_columns"] == ["applicant_id", "notes", "branch"]
    loaded = load_explainable(summary["run_id"], None, uri)
    assert loaded.codec.dropped == ["applicant_id", "notes", "branch"]
    rows = frame.drop(columns="approved").head(3)
    result = explain_loaded(loaded, rows, "yes", search_settings(loaded.module, {"max_steps": 10}))
    assert len(result) == 3 and "applicant_id" not in result["factual"][0]
    import mlflow

    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri

    with _tracking_uri(uri):  # the served predictor: its metadata names them, and it answers rows that carry them
        info = mlflow.models.get_model_info(f"models:/{summary['models']['predictor']}")
        served = mlflow.pyfunc.load_model(f"models:/{summary['models']['predictor']}").predict(rows)
    assert info.metadata["ignored_columns"] == ["applicant_id", "notes", "branch"]
    assert list(served["prediction"]) == list(result["prediction"])
    checked = check_rows(loaded.codec, rows, 10)
    assert list(checked.columns) == [c.name for c in loaded.codec.columns]
    with pytest.raises(ValueError, match="unknown column 'zip'"):
        check_rows(loaded.codec, rows.assign(zip=1), 10)


def test_snapping_keeps_whole_numbers_at_the_bounds_of_their_domain():
    # Payments: mostly 0, some large. The encoded bounds are rounded inward in float32, so for some columns the lower
    # bound decodes to +0.0004 and the declared upper bound to 49 999.996: whole numbers at either bound must stay
    # allowed, so snapping a valid row changes nothing (a row at 0 used to come back as 1: "PAY_AMT4: 0 → 1" for an
    # applicant who needed no change).
    from ct_lightning.constraints import Constraints

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({f"paid{i}": np.where(rng.random(400) < 0.4, 0, rng.integers(1, 50_001, 400))
                          for i in range(12)})
    frame.iloc[0], frame.iloc[1] = 0, 50_000
    frame["y"] = rng.integers(0, 2, 400)
    codec = TabularCodec.fit(frame, "y", spec={"columns": {f"paid{i}": {"upper": 50_000} for i in range(12)}})
    lower, upper = (torch.from_numpy(b) for b in codec.encoded_bounds())
    types = codec.feature_types()
    decoded_low, decoded_high = (b * types.scale + types.offset for b in (lower, upper))
    assert (decoded_low > 0).any() and (decoded_high < 50_000).any()  # the case this test is about occurs
    limits = Constraints(None, lower, upper, types=types)
    x = torch.from_numpy(codec.encode(frame.drop(columns="y")))
    snapped = limits.snap(limits.project(x, x), x)
    pd.testing.assert_frame_equal(codec.decode(snapped), frame.drop(columns="y"), check_dtype=False)
    # and a point pushed past the bounds lands on them, not one inside
    pushed = limits.snap(limits.project(x[:2] + torch.tensor([[-5.0], [5.0]]), x[:2]), x[:2])
    assert (codec.decode(pushed).to_numpy() == np.array([[0], [50_000]])).all()


def test_impute_median_fills_as_the_training_rows_say_and_the_codec_keeps_the_fills(loans):
    frame = loans.copy()
    frame["income"] = frame["income"].astype(float)
    frame.loc[frame.index[:7], "income"] = np.nan  # float dtype now, whole numbers otherwise
    frame.loc[frame.index[3:9], "home_ownership"] = None
    data = TableDataModule(frame, target="approved", impute="median")
    train = frame.iloc[data.rows["train"]]
    fills = {c.name: c.fill for c in data.codec.columns}
    # independent: the median of the training rows (rounded: income holds whole numbers), the most frequent category
    assert fills["income"] == round(float(np.median(train["income"].dropna())))
    assert fills["home_ownership"] == train["home_ownership"].value_counts().idxmax()
    assert fills["sex"] == train["sex"].value_counts().idxmax() and fills["age"] == round(float(train["age"].median()))
    assert {c.name: c.kind for c in data.codec.columns}["income"] == "integer"  # not turned continuous by a .5 median
    assert TabularCodec.from_dict(json.loads(json.dumps(data.codec.to_dict()))) == data.codec
    # the training rows were filled with the same values
    assert (data.frame.loc[frame.index[:7], "income"] == fills["income"]).all()
    # rows to explain or serve are completed the same way, with one note per column
    rows = loans.drop(columns="approved").head(3).astype({"income": float})
    rows.loc[rows.index[1], "income"] = np.nan
    filled, notes = data.codec.fill_missing(rows)
    assert filled["income"].tolist() == [rows["income"].iloc[0], fills["income"], rows["income"].iloc[2]]
    assert rows["income"].isna().sum() == 1  # the caller's frame is left as it was
    assert notes == [f"income: missing in 1 row(s), filled with {fills['income']}, the training rows' median "
                     "(the model was trained with --impute median)"]
    from ct_lightning.experiment.runs.request_checks import check_rows

    assert check_rows(data.codec, rows, 10)["income"].tolist() == filled["income"].tolist()
    strict = TableDataModule(loans, target="approved").codec  # trained without --impute median: still refused
    with pytest.raises(ValueError, match="rows: column 'income': missing value in row 2"):
        check_rows(strict, rows, 10)


def test_rows_to_explain_may_carry_the_target_and_must_lie_in_the_domain(loans):
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows

    codec = TableDataModule(loans, target="approved").codec
    loaded = Explainable(None, codec, {}, None, True)
    rows, notes, skipped = check_rows(loans.head(2).copy(), loaded, "--rows")  # rows straight from the training file
    assert skipped == []
    assert list(rows.columns) == [c.name for c in codec.columns]
    assert notes == ["--rows: the target column 'approved' is left out (the model predicts it)"]
    low, high = next(c for c in codec.columns if c.name == "income").domain()
    assert low == 0  # no negative income in the file: the domain stops at 0
    for income in (high + 1_000, -5):
        with pytest.raises(InputError, match=rf"^--row: got 'income={income:g}' \(outside the model's domain in "
                                             rf"row 0\); allowed: 0 to {high:.6g} \(the training rows' range"):
            check_rows(loans.head(1).assign(income=income).drop(columns="approved"), loaded, "--row")


def test_skip_bad_rows_explains_the_rows_it_can_read_and_lists_the_others_with_their_problem(loans):
    from ct_lightning.experiment.configuration.validation import InputError
    from ct_lightning.experiment.runs.explanations import Explainable, check_rows, explain_loaded
    from ct_lightning.experiment.workflows.explain import numbered_records

    codec = TableDataModule(loans, target="approved").codec
    high = next(c for c in codec.columns if c.name == "income").domain()[1]
    rows = loans.head(6).astype({"debt": object})
    rows.loc[1, "income"] = high * 2  # outside the domain
    rows.loc[3, "purpose"] = "wedding"  # an unseen category
    rows.loc[4, "debt"] = "lots"  # not a number
    loaded = Explainable(None, codec, {}, None, True)
    with pytest.raises(InputError, match=r"^--rows: got 'income=.*' \(outside the model's domain in row 1\); "
                                         r"allowed: .*; --skip-bad-rows explains the other rows and lists this one "
                                         r"and the 2 more with a problem$"):
        check_rows(rows.copy(), loaded, "--rows")
    # the first row in the file is named, not the first column's (a purpose column before income: still row 1)
    with pytest.raises(InputError, match=r"^--rows: got 'purpose=wedding' \(unseen category in row 3\); allowed: .*"
                                         r"lists this one and the 1 more with a problem$"):
        check_rows(rows.loc[[0, 3, 4]].copy(), loaded, "--rows")
    kept, _, skipped = check_rows(rows.copy(), loaded, "--rows", skip_bad_rows=True)
    assert kept.index.tolist() == [0, 2, 5] and [row for row, _ in skipped] == [1, 3, 4]
    assert "outside the model's domain" in skipped[0][1] and "'purpose=wedding': unseen category; allowed: one of" \
        in skipped[1][1] and skipped[2][1] == "'debt=lots': not a number; allowed: a number for debt"
    assert kept["debt"].dtype.kind in "if"  # the column is numbers again once its text row is out
    with pytest.raises(InputError, match=r"every row has a problem, e.g. row 3: 'purpose=wedding'"):
        check_rows(rows.loc[[3, 4]].copy(), loaded, "--rows", skip_bad_rows=True)
    from ct_lightning.module import CTModule
    from ct_lightning.experiment.configuration.settings import DEFAULTS, module_kwargs

    names = list(codec.feature_names)
    torch.manual_seed(0)
    loaded.module = CTModule(**module_kwargs(DEFAULTS, len(names), len(codec.classes), names, None)).eval()  # untrained
    explained = explain_loaded(loaded, kept, "yes", {"max_steps": 5})
    assert explained.index.tolist() == [0, 2, 5]  # the rows keep their numbers in the input
    records = numbered_records(explained, skipped)
    assert [(r["row"], r["explained"]) for r in records] == [(0, True), (1, False), (2, True), (3, False),
                                                              (4, False), (5, True)]
    assert records[1]["problem"] == skipped[0][1] and records[2]["factual"]["age"] == loans["age"].iloc[2]


def test_decoded_continuous_values_drop_float32_noise_and_keep_the_inputs_digits():
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"ratio": np.round(rng.gamma(0.5, 800.0, 300), 3), "y": rng.integers(0, 2, 300)})
    frame.loc[0, "ratio"], frame.loc[1, "ratio"] = 0.0, 0.803
    codec = TabularCodec.fit(frame, "y", spec={"columns": {"ratio": {"lower": 0, "upper": 10}}})
    lower, upper = codec.encoded_bounds()
    # the bounds as the search reaches them: float32 values whose exact decoding is a hair inside 0 and 10
    decoded = codec.decode(np.array([[lower[0]], [upper[0]]], dtype=np.float32))["ratio"].tolist()
    exact = [float(b) * codec.columns[0].scale + codec.columns[0].mean for b in (lower[0], upper[0])]
    assert exact[0] != 0 and exact[1] != 10 and decoded == [0.0, 10.0]
    # every value of the file comes back with its three decimals
    back = codec.decode(codec.encode(frame.drop(columns="y")))["ratio"]
    np.testing.assert_allclose(back, frame["ratio"], rtol=0, atol=5e-4)


def test_balance_undersample_cuts_every_class_to_the_smallest_before_the_split(loans):
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.settings import resolve_config

    rare = pd.concat([loans[loans["approved"] == "no"], loans[loans["approved"] == "yes"].head(20)], ignore_index=True)
    counts = rare["approved"].value_counts()
    data = TableDataModule(rare, target="approved", balance="undersample")
    assert data.frame["approved"].value_counts().to_dict() == {"no": 20, "yes": 20} and data.rows_read == len(rare)
    # the kept rows are rows of the file, unchanged, and the same ones again for the same data seed
    merged = data.frame.merge(rare.drop_duplicates(), how="left", indicator=True)
    assert (merged["_merge"] == "both").all()
    pd.testing.assert_frame_equal(TableDataModule(rare, target="approved", balance="undersample").frame, data.frame)
    assert not TableDataModule(rare, target="approved", balance="undersample", data_seed=1).frame.equals(data.frame)
    assert len(TableDataModule(rare, target="approved").frame) == counts.sum()
    # the model's preprocessing (a checkpoint's, explain.py --data with no config.json) gives its training rows again
    again = TableDataModule(rare, target="approved", codec=data.codec.to_dict())
    pd.testing.assert_frame_equal(again.frame, data.frame)
    again.setup("fit"), data.setup("fit")
    assert again.balance == "undersample" and torch.equal(again.x_train, data.x_train)
    assert TableDataModule(rare, target="approved").codec.to_dict().get("balance") is None  # kept payloads unchanged
    # through the settings (train, evaluate and explain rebuild the table from the run's configuration)
    config = resolve_config({"data": str(LOANS), "target": "approved", "balance": "undersample"})
    assert config["balance"] == "undersample"
    built = build_datamodule(config)
    assert built.frame["approved"].value_counts().nunique() == 1
    with pytest.raises(ValueError, match="balance: got 'smote'; allowed: none, undersample"):
        TableDataModule(rare, target="approved", balance="smote")


def test_the_start_up_lines_show_plain_classes_and_bounds_in_words(tmp_path, loans):
    """An integer target's classes as 0, 1 (not np.int64(0)); a bound on one side as "at least" / "at most"."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  income: {kind: integer, lower: 0}\n  years_employed: {upper: 50}\n"
                    "  debt: {lower: 0, upper: 100000}\n")
    frame = loans.assign(approved=(loans["approved"] == "yes").astype("int64"))
    lines = TableDataModule(frame, "approved", spec=spec).describe().splitlines()
    assert lines[0].endswith("target 'approved' with classes 0, 1 (positive: 1)"), lines[0]
    assert "  income: integer, at least 0" in lines and "  years_employed: integer, at most 50" in lines
    assert "  debt: integer, from 0 to 100000" in lines
    assert "with classes 'no', 'yes' (positive: 'yes')" in TableDataModule(loans, "approved").describe()


def test_a_suggested_drop_columns_value_can_be_pasted(loans):
    """pandas' index column 'Unnamed: 0' is suggested quoted for the shell."""
    hinted = TableDataModule(loans.assign(**{"Unnamed: 0": range(len(loans))}), "approved")
    assert "leave it out with --drop-columns 'Unnamed: 0'" in hinted.describe()
    with pytest.raises(ValueError, match="leave it out with --drop-columns 'bank id'$"):
        TableDataModule(loans.assign(**{"bank id": "same"}), "approved")


def test_drop_columns_left_unset_or_empty_in_a_config_file_still_works(tmp_path):
    from ct_lightning.experiment.configuration.settings import load_config_file, resolve_config

    config = tmp_path / "c.yaml"
    config.write_text(f"data: {LOANS}\ntarget: approved\ndrop_columns: []\n")
    assert resolve_config(load_config_file(config))["drop_columns"] == []
    assert resolve_config({"data": str(LOANS), "target": "approved"})["drop_columns"] == []


def test_the_start_up_message_names_balancing_rows_outside_declared_bounds_and_code_like_integers(loans):
    rng = np.random.default_rng(2)
    frame = loans.assign(grade=rng.integers(1, 7, len(loans)))  # number-coded categories, 6 levels
    spec = {"columns": {"income": {"upper": 100_000}, "debt": {"lower": 5_000}}}
    data = TableDataModule(frame, target="approved", spec=spec, balance="undersample")
    text = data.describe()
    smallest = int(loans["approved"].value_counts().min())
    assert f"balanced (--balance undersample): kept {2 * smallest} of {len(loans)} rows, {smallest} of each class" in text
    above = int((data.frame["income"] > 100_000).sum())
    below = int((data.frame["debt"] < 5_000).sum())
    assert above and below  # the fixture has such rows: the notes below are not vacuous
    assert (f"note: income: rows of the file lie outside the data spec's bounds ({above} above the declared upper "
            f"bound 100000)") in text
    assert f"note: debt: rows of the file lie outside the data spec's bounds ({below} below the declared lower bound 5000)" in text
    levels = {c: data.frame[c].nunique() for c in ("age", "income", "debt", "years_employed", "grade")}
    expected = [c for c, n in levels.items() if n <= 10]
    assert "grade" in expected and data.code_like() == expected
    assert f"note: {', '.join(expected)} hold at most 10 different whole numbers each" in text if len(expected) > 1 \
        else f"note: {expected[0]} holds at most 10 different whole numbers:" in text
    declared = TableDataModule(frame, target="approved", spec={"columns": {"grade": {"kind": "categorical"}}})
    assert "grade" not in declared.code_like()
    assert "balanced" not in declared.describe() and "outside the data spec's bounds" not in declared.describe()


def test_a_class_too_rare_for_every_split_is_refused_as_a_likely_misspelt_label(loans):
    """A label written 'Rejectd' once beside 'Rejected' trained a model with a class of its own that no validation
    or test row held (stratified_split's 'every split sees every class' did not hold), with no word said."""
    typos = loans.copy()
    typos.loc[[3], "approved"] = "yse"
    typos.loc[[5, 8, 13], "approved"] = "maybe"
    with pytest.raises(ValueError, match=r"^data: target 'approved': classes 'maybe' \(3 rows\), 'yse' \(1 row\) of "
                                         r"DataFrame have too few rows for the training, validation and test splits "
                                         r"\(allowed: at least 4 rows per class\); a misspelt label\? write it as one "
                                         r"of the other classes \('yes', 'no'\), or leave those rows out$"):
        TableDataModule(typos, target="approved")
    tiny = loans.head(6)  # no class of 4 rows: no other class to write a label as
    with pytest.raises(ValueError, match=r"\(allowed: at least 4 rows per class\); no class has 4 rows: the table is "
                                         r"too small to train on; give it more rows$"):
        TableDataModule(tiny, target="approved")
    typos.loc[[3], "approved"] = "maybe"  # four rows: a class each split sees
    data = TableDataModule(typos, target="approved")
    assert len(data.codec.classes) == 3
    for rows in data.rows.values():
        assert set(typos["approved"].iloc[rows]) == {"yes", "no", "maybe"}


def test_encoding_a_table_holds_its_inputs_in_memory_once():
    """A 200 000-row table of 252 inputs was encoded whole and then split: 200 MiB twice at once. Split by split, the
    peak of what numpy allocates stays near the encoded splits themselves (tracemalloc counts numpy's memory)."""
    import tracemalloc

    rows = 20000
    frame = pd.DataFrame({"grade": [f"L{i % 60:02d}" for i in range(rows)], "income": [1000 + i % 977 for i in range(rows)],
                          "y": ["yes" if i % 3 else "no" for i in range(rows)]})
    data = TableDataModule(frame, target="y")
    tracemalloc.start()
    try:
        data.setup("fit")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    encoded = sum(x.numel() * x.element_size() for x in (data.x_train, data.x_val, data.x_test))
    assert data.n_features == 61 and peak < 1.5 * encoded, f"peak {peak / encoded:.2f} x the encoded splits"


def test_a_numeric_target_gives_writable_labels_without_a_warning():
    """The target 0/1 (numbers, looked up per row) came back as a read-only array from pandas, and torch warned at
    every start: 'The given NumPy array is not writable'."""
    import warnings

    data = TableDataModule(pd.DataFrame({"age": range(40), "default": [0, 1] * 20}), target="default")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data.setup("fit")
    assert len(data.y_train) == 28 and int(data.y_train.sum()) == 14


def test_two_defaults_in_sixty_rows_are_refused_before_splits_without_them():
    """60 loans with 2 defaults: validation and test held none (val/acc measured one class), and under --balance
    undersample 4 rows were kept, with empty validation and test loaders. Such a class is refused first: the splits
    of a class of at least 4 rows each hold one."""
    frame = pd.DataFrame({"income": [20000 + 731 * i for i in range(60)], "default": [1] * 2 + [0] * 58})
    for balance in ("none", "undersample"):
        with pytest.raises(ValueError, match=r"class 1 \(2 rows\) of DataFrame has too few rows"):
            TableDataModule(frame, target="default", balance=balance)
    frame.loc[2:3, "default"] = 1
    data = TableDataModule(frame, target="default", balance="undersample")
    assert all(set(data.frame["default"].iloc[rows]) == {0, 1} for rows in data.rows.values())


def _messy(kind: str, folder: Path) -> list[str]:
    """A copy of the loans table with one kind of mess, and the options that train on it."""
    frame = pd.read_csv(LOANS)
    if kind == "gap":
        frame["income"] = frame["income"].astype(object)
        frame.loc[3, "income"] = None
    if kind == "dates and %":  # two problems: one line lists both
        frame["applied"] = [f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(len(frame))]
        frame["rate"] = [f"{4 + i % 10}%" for i in range(len(frame))]
        frame.loc[5, "rate"] = "0.075"
    frame.to_csv(folder / "loans.csv", index=False)
    specs = {"spec key": "columns:\n  age: {kind: integer, mutabilty: none}\n", "spec column": "columns:\n  agee: {}\n"}
    if kind in specs:
        (folder / "spec.yaml").write_text(specs[kind])
        return ["--data-spec", "spec.yaml"]
    return []


@pytest.mark.parametrize("kind", ["gap", "dates and %", "spec key", "spec column"])
def test_train_refuses_a_messy_table_before_torch_is_imported(tmp_path, kind):
    """A gap without --impute, dates, numbers with and without '%', a data spec's misspelt key or unknown column:
    train.py said so only once its data module was built, after torch and Lightning were imported (about 10 s a try
    on a shared 2-core machine). The data module's own checks now run on the table read with pandas alone: the same
    one line (every problem at once), exit code 2, and torch never imported."""
    options = _messy(kind, tmp_path)
    with pytest.raises(ValueError) as caught:  # the data module's message, in this process
        TableDataModule(str(tmp_path / "loans.csv"), target="approved",
                        spec=str(tmp_path / "spec.yaml") if options else None)
    option, said = str(caught.value).split(": ", 1)
    code = ("import runpy, sys\nsys.argv = ['train.py', '--data', 'loans.csv', '--target', 'approved', *sys.argv[1:], "
            f"'--tracking-uri', 'sqlite:///{tmp_path}/store/mlflow.db']\n"
            f"try:\n    runpy.run_path({str(ROOT / 'recipes' / 'train.py')!r}, run_name='__main__')\n"
            "except SystemExit as stop:\n    print('exit', stop.code, 'torch imported:', 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, *options], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "exit 2 torch imported: False", done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [f"error: --{option.replace('_', '-')}: {said}"], done.stderr
    assert (kind == "dates and %") == said.startswith("2 problems in "), said
    assert not (tmp_path / "store").exists(), "nothing was written"


def test_the_example_row_writes_a_whole_number_column_stored_as_floats_as_whole_numbers(loans, tmp_path):
    """A database's Parquet export stores amounts as floats (20900.0); the column trains as integer, but the explain
    command printed after training showed ``"debt": 20900.0``. Now the row writes ``20900``, as the column is read."""
    loans.astype({"debt": float}).to_parquet(tmp_path / "loans.parquet", index=False)
    module = TableDataModule(tmp_path / "loans.parquet", target="approved")
    assert {c.name: c.kind for c in module.codec.columns}["debt"] == "integer"
    row = module.example_row()
    assert type(row["debt"]) is int and type(row["income"]) is int, row
    assert json.dumps(row["debt"]) == str(row["debt"])


def test_the_example_row_writes_categorical_and_ordinal_codes_as_the_file_does(tmp_path):
    """A table of numbers whose categorical and ordinal columns hold integer codes (EDUCATION 1/2/3, a repayment
    status -1/0/2): a row of it is all floats, and the explain command printed after training showed ``"education":
    3.0`` where the file says 3. Now each value is read from its own column and written as the file writes it."""
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"rate": rng.uniform(0, 1, 80).round(3), "education": rng.choice([1, 2, 3], 80),
                          "status": rng.choice([-1, 0, 2], 80), "approved": rng.choice(["yes", "no"], 80)})
    table.to_csv(tmp_path / "codes.csv", index=False)
    (tmp_path / "spec.yaml").write_text("columns:\n  education: {kind: categorical}\n"
                                        "  status: {kind: ordinal, order: [-1, 0, 2]}\n")
    module = TableDataModule(tmp_path / "codes.csv", target="approved", spec=tmp_path / "spec.yaml")
    assert {c.name: c.kind for c in module.codec.columns} == {"rate": "continuous", "education": "categorical",
                                                              "status": "ordinal"}
    row = module.example_row()
    first = table.iloc[module.rows["test"][0]]
    assert json.dumps(row) == json.dumps({"rate": float(first["rate"]), "education": int(first["education"]),
                                          "status": int(first["status"])})
