"""A table column whose name holds '=' (a CSV's continuous `ratio=debt/income`) is no one-hot category: where a table
codec knows the columns, the one-hot groups are its categorical columns, not a guess from `feature=value` names."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from ct_lightning.constraints import (DECREASE, NONE, FeatureTypes, mutability_pairs, one_hot_features,
                                      one_hot_groups, parse_mutability)
from ct_lightning.evaluation.eval_constraints import evaluation_constraints
from ct_lightning.experiment.configuration.data import command_line_mutability, mutability_spec

RATIO = "ratio=debt/income"


@pytest.fixture(scope="module")
def table():
    from datamodules.table import TableDataModule

    rng = np.random.default_rng(0)
    ratio = rng.uniform(0.0, 2.0, 200).round(3)
    frame = pd.DataFrame({RATIO: ratio, "region": rng.choice(["north", "south", "east"], 200),
                          "y": np.where(ratio + rng.normal(0.0, 0.3, 200) > 1.0, "no", "yes")})
    datamodule = TableDataModule(frame, target="y")
    datamodule.setup("fit")
    return datamodule


def test_the_codec_knows_a_continuous_column_named_with_equals_is_no_category(table):
    assert [(c.name, c.kind) for c in table.codec.columns] == [(RATIO, "continuous"), ("region", "categorical")]
    assert table.feature_names == [RATIO, "region=east", "region=north", "region=south"]
    assert one_hot_groups(table) == one_hot_groups(table.codec) == {"region": [1, 2, 3]}
    assert one_hot_features(table.feature_names, one_hot_groups(table)) == [None, "region", "region", "region"]
    assert table.feature_types().groups == [[1, 2, 3]]  # the search's own structure agrees


def test_mutability_of_a_column_named_with_equals_splits_at_the_last_equals_and_may_decrease(table):
    """`train.py --mutability 'ratio=debt/income=decrease'`: once refused as "'ratio=debt/income' is categorical
    (one-hot columns), so 'decrease' has no meaning"."""
    assert mutability_pairs(f"{RATIO}=decrease,region=none") == {RATIO: "decrease", "region": "none"}
    spec = mutability_spec({"mutability": f"{RATIO}=decrease", "immutable": ["region"]}, table)
    assert spec == {RATIO: "decrease", "region": "none"}
    codes = parse_mutability(spec, table.n_features, table.feature_names, groups=one_hot_groups(table))
    assert codes.tolist() == [DECREASE, NONE, NONE, NONE]
    assert command_line_mutability({"mutability": f"{RATIO}=increase"}, table.feature_names,
                                   one_hot_groups(table)) == {RATIO: "increase"}


def test_a_real_category_is_still_refused_a_direction_and_a_name_prefix_is_no_feature(table):
    with pytest.raises(ValueError, match="mutability: 'region' is categorical .* allowed for a categorical feature: "
                                         "both, none"):
        mutability_spec({"mutability": "region=decrease"}, table)
    with pytest.raises(ValueError, match="mutability: 'region=north' is categorical"):
        mutability_spec({"mutability": "region=north=increase"}, table)
    # 'ratio' is no categorical feature of this table: the column's name holds '=', no group is made of it
    with pytest.raises(ValueError, match=r"mutability: got 'ratio' \(unknown feature\); allowed: the features: "
                                         r"ratio=debt/income, region$"):
        mutability_spec({"mutability": "ratio=none"}, table)


def test_evaluation_constraints_use_the_tables_groups_and_name_the_column_in_words(table):
    class Trained:  # a trained module's hparams, as evaluation_constraints reads them
        hparams = type("HParams", (dict,), {"__getattr__": dict.__getitem__})(
            mutability={RATIO: "decrease", "region": "none"}, domain="infer", domain_std=3.0)

    constraints = evaluation_constraints(Trained(), table)
    assert constraints.mutability.tolist() == [DECREASE, NONE, NONE, NONE]
    assert constraints.in_words() == f"immutable: region; decrease only: {RATIO}; within the data domain"


def test_the_served_model_and_explain_accept_a_direction_on_a_continuous_column_named_with_equals(table):
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability

    assert requested_mutability(table.codec, {"mutability": f"{RATIO}=decrease"}) == {RATIO: "decrease"}
    with pytest.raises(MutabilityRefused, match="'region' is categorical"):
        requested_mutability(table.codec, {"mutability": "region=increase"})


def test_without_a_codec_the_names_still_say_which_columns_are_one_hot():
    """Data without a table codec (model inputs only, a hand-made list of names) keeps the `feature=value` guess."""
    from ct_lightning.evaluation.explanation import FeatureCodec

    names = ["age", "home=own", "home=rent"]
    assert one_hot_groups(None) is None and one_hot_groups(FeatureCodec(names)) is None
    assert one_hot_features(names) == [None, "home", "home"]
    with pytest.raises(ValueError, match="'home' is categorical"):
        parse_mutability({"home": "increase"}, 3, names)
    assert parse_mutability({"home": "none"}, 3, names).tolist() == [0, NONE, NONE]
    # a structure that does not describe these columns is not used
    assert one_hot_features(names, {"home": [5, 6]}) == [None, "home", "home"]


def test_built_in_tables_keep_their_one_hot_groups():
    """Credit's `sex=1` style columns: the codec's groups are the ones the names give, and the checks are as before."""
    from small_credit import SmallCredit

    credit = SmallCredit()
    credit.setup("fit")
    groups = one_hot_groups(credit)
    names = credit.feature_names
    assert groups == {"sex": [1, 2], "education": [3, 4, 5, 6], "marriage": [7, 8, 9]}
    assert one_hot_features(names, groups) == one_hot_features(names)
    assert sorted(groups.values()) == sorted(FeatureTypes.from_names(names).groups)
    with pytest.raises(ValueError, match="'sex' is categorical"):
        mutability_spec({"mutability": "sex=increase"}, credit)
    assert mutability_spec({"immutable": ["sex", "age"]}, credit) == {"sex": "none", "age": "none"}
    codes = parse_mutability({"sex": "none", "age": "none"}, credit.n_features, names, groups=groups)
    assert codes.tolist() == parse_mutability({"sex": "none", "age": "none"}, credit.n_features, names).tolist()
    assert torch.nonzero(codes == NONE).flatten().tolist() == [1, 2, names.index("age")]


@pytest.mark.slow  # two tiny real trainings and an explanation (about 15 s)
def test_columns_named_with_equals_or_percent_train_log_and_explain_from_the_command_line(tmp_path, capsys):
    """Through the recipes, as the user ran them: `--mutability 'ratio=debt/income=decrease'` trained and explained,
    and `--immutable 'Interest rate %'` no longer ends in MLflow's traceback (a parameter's name may not hold `%` or
    `=`, and Lightning logs `mutability/<column>`): the name is logged with `_` in their place."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.run_artifacts import param_name
    from recipes.explain import main as explain_main
    from recipes.train import main as train_main

    rng = np.random.default_rng(0)
    ratio = rng.uniform(0.0, 2.0, 300).round(3)
    frame = pd.DataFrame({RATIO: ratio, "Interest rate %": rng.uniform(2, 20, 300).round(1),
                          "region": rng.choice(["north", "south", "east"], 300),
                          "approved": np.where(ratio + rng.normal(0.0, 0.3, 300) > 1.0, "no", "yes")})
    frame.to_csv(tmp_path / "loans.csv", index=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--data", str(tmp_path / "loans.csv"), "--target", "approved", "--max-epochs", "1", "--nce", "16",
              "--no-progress", "--tracking-uri", uri]
    train_main([*common, "--mutability", f"{RATIO}=decrease", "--immutable", "Interest rate %",
                "--checkpoint-dir", str(tmp_path / "ck")])
    out = capsys.readouterr().out
    run_id = out.split("MLflow run id: ")[1].split()[0]
    # the start-up lines show what the searches keep to, the command line's too (the column list has the spec's)
    assert f"mutability (--immutable, --mutability): {RATIO}: decrease, Interest rate %: none" in out
    params = MlflowClient(tracking_uri=uri).get_run(run_id).data.params
    assert params[param_name(f"mutability/{RATIO}")] == "decrease" and param_name(RATIO) == "ratio_debt/income"
    assert params["mutability/Interest rate _"] == "none"
    row = frame.drop(columns="approved").iloc[[0]].to_json(orient="records")[1:-1]
    records = explain_main(["--checkpoint", str(tmp_path / "ck" / "last.ckpt"), "--row", row, "--max-steps", "20",
                            "--tracking-uri", uri, "--json", str(tmp_path / "out.json")])
    assert records[0]["explained"]
    changed = {change["feature"]: change for change in records[0]["changes"]}
    assert "Interest rate %" not in changed
    assert RATIO not in changed or changed[RATIO]["to"] <= changed[RATIO]["from"]
