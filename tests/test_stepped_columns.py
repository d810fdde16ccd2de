"""A data spec's ``step`` and ``max_change``: a counterfactual changes a column only by whole multiples of its step, in
the column's own units and counted from the applicant's own value (``income: {step: 1000}``: 30 600 → 32 600, never
31 977), and by at most its ``max_change`` either way.

``Constraints.snap`` is checked against a row-by-row reference; the codec reads, keeps and refuses steps; a real
training and ``explain.py`` on tests/fixtures/loans.csv give changes in whole steps, where the same search without
steps does not.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from ct_lightning.constraints import Constraints, FeatureTypes, invalid_rows, parse_mutability
from datamodules.codec import TabularCodec

LOANS = Path(__file__).parent / "fixtures" / "loans.csv"


def reference_steps(points, x, scale, steps, lower, upper):
    """Row by row in float64: the whole number of steps nearest to the point's offset from the factual, kept to
    the whole steps that stay inside [lower, upper] (none: the factual's value)."""
    out = points.double().clone()
    for i in range(len(points)):
        for column, step in steps.items():
            width = step / float(scale[column])
            start = float(x[i, column])
            k = round((float(points[i, column]) - start) / width)
            fewest = math.ceil((float(lower[column]) - start) / width - 1e-4)
            most = math.floor((float(upper[column]) - start) / width + 1e-4)
            k = min(max(k, fewest), most) if fewest <= most else 0
            out[i, column] = start + k * width
    return out.float()


def test_snap_moves_stepped_features_by_whole_steps_inside_the_domain_as_a_row_by_row_reference_does():
    torch.manual_seed(0)
    scale = torch.tensor([3000.0, 1.0, 12.0, 2.0])
    offset = torch.tensor([50_000.0, 0.0, 40.0, 1.0])
    steps = {0: 1000.0, 2: 5.0}  # an amount in steps of 1 000; an integer column in steps of 5
    types = FeatureTypes(4, steps=steps, offset=offset, scale=scale)
    lower, upper = torch.tensor([-1.5, -2.0, -1.0, -3.0]), torch.tensor([1.2, 2.0, 1.5, 3.0])
    x = torch.rand(200, 4) * (upper - lower) + lower
    x[:5, 0] = 1.19  # so near the upper bound that no step up fits
    x[5, 0] = 2.0  # a factual outside the domain
    points = x + torch.randn(200, 4)
    got = Constraints(None, lower, upper, types=types).snap(points, x)
    torch.testing.assert_close(got, reference_steps(points, x, scale, steps, lower, upper), rtol=0, atol=1e-5)
    moved = (got - x) * scale / torch.tensor([1000.0, 1.0, 5.0, 1.0])
    for column in steps:
        assert torch.allclose(moved[:, column], moved[:, column].round(), atol=1e-3)
        assert (moved[:, column].round() != 0).sum() > 50, "most points move by some whole steps"
    inside = (got[:, 0] >= lower[0] - 1e-6) & (got[:, 0] <= upper[0] + 1e-6)
    assert inside[x[:, 0] <= upper[0]].all()
    torch.testing.assert_close(got[:, [1, 3]], points[:, [1, 3]])  # unstepped columns are left alone
    assert not invalid_rows(types, x).any()  # a factual is where its steps are counted from


def test_stepped_features_keep_their_mutability_and_the_factual_is_valid():
    types = FeatureTypes(2, steps={0: 1.0, 1: 1.0})
    codes = parse_mutability({"a": "increase", "b": "none"}, 2, ["a", "b"])
    x = torch.tensor([[0.3, 0.3]])
    limits = Constraints(codes, types=types)
    assert torch.equal(limits.snap(torch.tensor([[-2.0, 5.0]]), x), x)  # no step down, none at all
    assert limits.snap(torch.tensor([[2.6, 5.0]]), x)[0, 0].item() == pytest.approx(2.3)
    with pytest.raises(ValueError, match="every step must be a positive finite number"):
        FeatureTypes(2, steps={0: 0.0})
    with pytest.raises(ValueError, match="has two of the kinds"):
        FeatureTypes(2, integers=[0], steps={0: 2.0})


def test_snap_keeps_features_within_their_reach_of_the_factual_in_whole_numbers_and_steps():
    scale = torch.tensor([3000.0, 12.0, 1.0, 1.0])
    offset = torch.tensor([50_000.0, 40.0, 0.0, 0.0])
    # an amount in steps of 1 000 moving at most 2 500 (so 2 steps), an integer at most 2.5 (so 2), a number at most
    # 0.5, and a number without a reach
    types = FeatureTypes(4, integers=[1], steps={0: 1000.0}, reach={0: 2500.0, 1: 2.5, 2: 0.5},
                         offset=offset, scale=scale)
    torch.manual_seed(1)
    x = torch.randn(300, 4)
    x[:, 1] = (torch.randint(18, 80, (300,)) - 40.0) / 12.0
    points = x + 3 * torch.randn(300, 4)
    got = Constraints(None, types=types).snap(points, x)
    moved = (got - x) * scale
    assert moved[:, 0].abs().max() <= 2000 + 1e-2 and torch.allclose(moved[:, 0] / 1000, (moved[:, 0] / 1000).round(),
                                                                      atol=1e-4)
    assert set((moved[:, 1]).round().tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}  # whole numbers within 2.5
    torch.testing.assert_close(got[:, 2], torch.minimum(torch.maximum(points[:, 2], x[:, 2] - 0.5), x[:, 2] + 0.5))
    torch.testing.assert_close(got[:, 3], points[:, 3])
    assert (moved[:, 2].abs() == 0.5).sum() > 100, "most points would move further: the reach holds them"
    with pytest.raises(ValueError, match="a largest change needs a number feature's column"):
        FeatureTypes(3, groups=[[1, 2]], reach={1: 1.0})


def fit_loans(columns: dict) -> TabularCodec:
    return TabularCodec.fit(pd.read_csv(LOANS), "approved", {"columns": columns})


def test_the_codec_keeps_steps_and_payloads_without_them_are_unchanged():
    codec = fit_loans({"income": {"step": 1000}, "debt": {"step": 250, "lower": 0}})
    assert [c.step for c in codec.columns if c.name in ("income", "debt")] == [1000, 250]
    types = codec.feature_types()
    index = codec.feature_names.index("income")
    assert types.steps == {index: 1000.0, codec.feature_names.index("debt"): 250.0}
    assert index not in types.integers and codec.feature_names.index("age") in types.integers
    assert TabularCodec.from_dict(codec.to_dict()).to_dict() == codec.to_dict()
    assert "income: integer, in steps of 1000" in codec.describe()
    limited = fit_loans({"income": {"max_change": 10_000, "step": 1000}})
    assert limited.feature_types().reach == {index: 10_000.0}
    assert "income: integer, in steps of 1000, changing by at most 10000" in limited.describe()
    assert TabularCodec.from_dict(limited.to_dict()).to_dict() == limited.to_dict()
    assert all("step" not in column for column in fit_loans({}).to_dict()["columns"])


@pytest.mark.parametrize("columns, said", [
    ({"income": {"step": 0}}, "column 'income': step 0; allowed: a positive number, the smallest change of the column "
                              "in its own units (step: 1000)"),
    ({"income": {"step": "1k"}}, "column 'income': step '1k'; allowed: a positive number"),
    ({"age": {"step": 2.5}}, "column 'age': step 2.5 would leave the whole numbers of an integer column; allowed: a "
                             "whole number such as 1 or 5"),
    ({"purpose": {"step": 1}}, "column 'purpose': step 1 has no meaning for a categorical column; allowed: kind, "
                               "mutability"),
    ({"income": {"max_change": 0}}, "column 'income': max_change 0; allowed: a positive number, the largest change of "
                                    "the column either way in its own units (max_change: 10000; a column that may not "
                                    "change at all: mutability: none)"),
    ({"age": {"max_change": 1.5}}, "column 'age': max_change 1.5 would leave the whole numbers of an integer column"),
    ({"sex": {"max_change": 1}}, "column 'sex': max_change 1 has no meaning for a binary column"),
])
def test_a_step_that_cannot_mean_anything_is_refused_in_one_line(columns, said):
    with pytest.raises(ValueError) as error:
        fit_loans(columns)
    assert str(error.value).startswith(f"data_spec: {said}"), str(error.value)


def whole_steps(changes: list[dict], steps: dict) -> bool:
    """Every change of a stepped column is a whole number of its steps."""
    return all((c["to"] - c["from"]) % steps[c["feature"]] == 0 for c in changes if c["feature"] in steps)


def test_explanations_change_stepped_columns_by_whole_steps_from_the_applicants_values(tmp_path, capsys):
    """A real training with ``income`` in steps of 1 000 and ``debt`` in steps of 500 in its data spec, and one
    without, explained with explain.py: the first's changes of those columns are whole steps; the second's are not
    (so this test can fail), unless explain.py's ``--step`` asks for them; a bad ``--step`` is refused in one line."""
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main

    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  income: {step: 1000}\n  debt: {step: 500}\n")
    pd.read_csv(LOANS).drop(columns="approved").head(40).to_csv(tmp_path / "rows.csv", index=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    steps = {"income": 1000, "debt": 500}

    def trained(data_spec) -> str:
        return train({"data": str(LOANS), "target": "approved", "max_epochs": 2, "nce": 16, "tracking_uri": uri,
                      "progress": False, "seed": 0, "data_spec": data_spec})["run_id"]

    def changes(run_id, *options) -> list[dict]:
        records = main(["--run-id", run_id, "--tracking-uri", uri, "--rows", str(tmp_path / "rows.csv"),
                        "--target", "yes", "--max-steps", "80", "--no-log", *options])
        return [c for record in records for c in record["changes"] if c["feature"] in steps]

    stepped = changes(trained(str(spec)))
    assert "income: integer, in steps of 1000" in capsys.readouterr().out  # the start-up message says so
    assert len(stepped) >= 5 and whole_steps(stepped, steps), stepped
    free = trained(None)
    plain = changes(free)
    assert len(plain) >= 5 and not whole_steps(plain, steps)
    asked = changes(free, "--step", "income=1000,debt=500")
    assert len(asked) >= 5 and whole_steps(asked, steps), asked
    for value, said in (("incme=1000", "--step: got 'incme=1000' (no such column; did you mean 'income'?); allowed: COLUMN=NUMBER for the "
                                       "model's number columns: age, income, debt, years_employed"),
                        ("purpose=1", "--step: got 'purpose=1' ('purpose' is categorical); allowed: COLUMN=NUMBER"),
                        ("income=-5", "--step: got 'income=-5' (not a positive number); allowed: COLUMN=NUMBER"),
                        ("age=2.5", "--step: got 'age=2.5' ('age' is integer); allowed: a whole number such as 1"),
                        ("income", "--step: got 'income' (expected COLUMN=NUMBER, e.g. income=1000); allowed:")):
        with pytest.raises(CliExit) as refused:
            changes(free, "--step", value)
        assert refused.value.code == 2 and str(refused.value).startswith(said), str(refused.value)


def test_explanations_change_a_column_by_at_most_its_max_change(tmp_path):
    """A data spec's max_change holds in a real training's explanations, and explain.py's --max-change holds in those
    of a model trained without one, whose own explanations move further (so this test can fail)."""
    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main

    pd.read_csv(LOANS).drop(columns="approved").head(40).to_csv(tmp_path / "rows.csv", index=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    reach = {"income": 2000, "debt": 1000}

    def largest(data_spec=None, *options) -> dict[str, float]:
        run = train({"data": str(LOANS), "target": "approved", "max_epochs": 2, "nce": 16, "tracking_uri": uri,
                     "progress": False, "seed": 0, "data_spec": data_spec})["run_id"]
        records = main(["--run-id", run, "--tracking-uri", uri, "--rows", str(tmp_path / "rows.csv"), "--target",
                        "yes", "--max-steps", "80", "--no-log", *options])
        moved = [c for record in records for c in record["changes"] if c["feature"] in reach]
        return {name: max([abs(c["to"] - c["from"]) for c in moved if c["feature"] == name], default=0)
                for name in reach}

    free = largest()
    assert any(free[name] > reach[name] for name in reach), free
    asked = largest(None, "--max-change", "income=2000,debt=1000")
    assert all(0 < asked[name] <= reach[name] for name in reach), asked
    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  income: {max_change: 2000}\n  debt: {max_change: 1000}\n")
    trained = largest(str(spec))
    assert all(trained[name] <= reach[name] for name in reach), trained


def test_a_step_or_largest_change_may_be_written_as_the_file_writes_the_column(tmp_path):
    """``explain.py --step 'revenue=$1,000'``, for a column the file writes ``$734,300``, was cut at its thousands
    comma and refused as ``got 'revenue=$1' (not a positive number)``; ``rate=0.5%`` was refused too. Both read as
    the training file's cells are read; a number that stays ambiguous (``1,5`` without decimal commas) is still
    refused."""
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_steps
    from datamodules.table import TableDataModule

    loans = pd.read_csv(LOANS)
    loans.assign(income=loans.income.map(lambda v: f"${v:,}"), rate=[f"{4 + i % 90 / 10:.1f}%" for i in range(len(loans))]
                 ).to_csv(tmp_path / "dressed.csv", index=False)
    codec = TableDataModule(tmp_path / "dressed.csv", target="approved").codec
    assert requested_steps(codec, {"step": "income=$1,000,debt=500,rate=0.5%"}) == {"income": 1000, "debt": 500,
                                                                                   "rate": 0.5}
    assert requested_steps(codec, {"max_change": "income=12,500"}, "max_change") == {"income": 12500}
    with pytest.raises(MutabilityRefused, match=r"^params: step 'income=1,5' \(not a positive number\); allowed: "):
        requested_steps(codec, {"step": "income=1,5"})


def test_a_step_in_a_file_with_decimal_commas_reads_as_the_file_writes_numbers(tmp_path):
    """In a file that writes 31.000,00 € (decimal commas), ``--step income=1.000`` is a thousand, as the file's
    cells read, not 1; ``debt_ratio=0,05`` a twentieth."""
    from ct_lightning.experiment.runs.request_checks import requested_steps
    from datamodules.table import TableDataModule

    loans = pd.read_csv(LOANS)
    european = loans.assign(
        income=loans.income.map(lambda v: f"{v:,.2f} €".translate(str.maketrans(",.", ".,"))),
        debt_ratio=(loans.debt / loans.income).round(2).map(lambda v: f"{v:.2f}".replace(".", ",")))
    european.to_csv(tmp_path / "export.csv", sep=";", index=False)
    codec = TableDataModule(tmp_path / "export.csv", target="approved").codec
    assert codec.decimal_comma
    assert requested_steps(codec, {"step": "income=1.000,debt_ratio=0,05"}) == {"income": 1000, "debt_ratio": 0.05}
    assert requested_steps(codec, {"step": "income=250"}) == {"income": 250}


def test_a_column_named_by_its_words_in_the_data_spec_is_refused_naming_the_column():
    """Explanations write a column by its data spec label (``Yearly income ($): 31,000 → 36,000 [income: ...]``);
    ``explain.py --step 'Yearly income=1000'`` or ``--immutable 'Debt owed ($)'`` was refused as "no such column",
    without a word of the column meant."""
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability, requested_steps

    spec = {"columns": {"income": {"label": "Yearly income", "unit": "$"}, "debt": {"label": "Debt owed", "unit": "$"}}}
    codec = TabularCodec.fit(pd.read_csv(LOANS), "approved", spec)
    with pytest.raises(MutabilityRefused, match=r"^params: step 'Yearly income=1000' \(no such column; 'Yearly income' "
                                                r"is the data spec's label of 'income': name the column, income\); "):
        requested_steps(codec, {"step": "Yearly income=1000"})
    with pytest.raises(MutabilityRefused, match=r"^params: immutable 'Debt owed \(\$\)' \(no such column; 'Debt owed "
                                                r"\(\$\)' is the data spec's label of 'debt': name the column, debt\); "):
        requested_mutability(codec, {"immutable": "Debt owed ($)"})
    with pytest.raises(MutabilityRefused, match=r"\(no such column; did you mean 'debt'\? names are case-sensitive\)"):
        requested_mutability(codec, {"immutable": "Debt"})  # a name close to a column's: that column, as before


def test_a_step_or_largest_change_of_a_column_that_may_not_change_is_refused(tmp_path, capsys):
    """``explain.py --max-change age=5`` for a model whose data spec holds age (``mutability: none``), or ``--step
    income=1000`` beside ``--immutable income``, was accepted and did nothing: the explanation never moves such a
    column. Refused in one line before any search, naming the columns that may change."""
    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main

    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  age: {mutability: none}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "tracking_uri": uri,
                 "progress": False, "seed": 0, "data_spec": str(spec), "immutable": ["sex"]})["run_id"]
    row = pd.read_csv(LOANS).drop(columns="approved").iloc[0].to_json()
    common = ["--run-id", run, "--tracking-uri", uri, "--row", row, "--max-steps", "5", "--no-log"]
    for options, message in (
            (["--max-change", "age=5"], "--max-change: got 'age=5' ('age' may not change at all (held in the model's "
                                        "training: its data spec or --immutable)); allowed: COLUMN=NUMBER for the "
                                        "columns that may change: income, debt, years_employed"),
            (["--immutable", "income", "--step", "income=1000"],
             "--step: got 'income=1000' ('income' may not change at all (--immutable here)); allowed: COLUMN=NUMBER for "
             "the columns that may change: debt, years_employed")):
        with pytest.raises(CliExit) as refused:
            main([*common, *options])
        assert refused.value.code == 2 and str(refused.value) == message, str(refused.value)
    records = main([*common, "--step", "income=1000", "--max-change", "debt=500"])  # columns that may change
    assert len(records) == 1
    # --only-predicted passing over the one row: "the 1 others are not" read as it is now
    other = "yes" if records[0]["prediction"] == "no" else "no"
    capsys.readouterr()
    main([*common, "--only-predicted", other])
    assert f"--only-predicted {other}: 0 of 1 rows are predicted {other} and explained; the other is not (its " \
           "prediction is in --json and --csv)" in capsys.readouterr().out
