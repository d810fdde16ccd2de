"""An ordinal column's ``step`` and ``max_change`` count places of its order (``grade: {kind: ordinal, max_change:
2}``: at most two grades up or down; ``step: 2``: two places at a time), in the data spec, explain.py's ``--step`` and
``--max-change`` and a served model's params of the same names; the start-up lines, ``--write-data-spec`` and the
``ct.constraints`` tag say so. A real training and explain.py: without a largest change the search moves a grade more
than two places (so the test can fail), with one at most two."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from datamodules.codec import TabularCodec
from datamodules.spec_file import spec_text
from datamodules.table import TableDataModule

LOANS = Path(__file__).resolve().parent / "fixtures" / "loans.csv"
GRADES = list("ABCDEFG")
RATES = ["5%", "10%", "20%", "50%"]  # labels written with a sign: the reader must not make numbers of them


def graded() -> pd.DataFrame:
    """loans.csv with a grade that decides approval (approved: E to G, rejected: A to C), so that a rejected
    applicant's explanation raises the grade by up to six places, and a rate written as percentages."""
    frame = pd.read_csv(LOANS)
    rng = np.random.default_rng(0)
    rank = np.where(frame["approved"] == "yes", 4, 0) + rng.integers(0, 3, len(frame))
    frame["grade"] = np.array(GRADES, dtype=object)[rank]
    frame["rate"] = np.array(RATES, dtype=object)[rng.integers(0, len(RATES), len(frame))]
    return frame


def spec(**grade) -> dict:
    return {"columns": {"grade": {"kind": "ordinal", "order": GRADES, **grade},
                        "rate": {"kind": "ordinal", "order": RATES}}}


def test_a_step_and_a_largest_change_of_an_ordinal_column_are_places_of_its_order():
    module = TableDataModule(graded(), target="approved", spec=spec(step=1, max_change=2))
    codec = module.codec
    index = codec.feature_names.index("grade")
    types = codec.feature_types()
    assert types.reach == {index: 2.0} and types.steps == {index: 1.0}  # raw units of an ordinal input: its ranks
    offset, scale = types.raw_units([index])
    grade = next(c for c in codec.columns if c.name == "grade")
    assert float(offset) == pytest.approx(grade.mean) and float(scale) == pytest.approx(grade.scale)
    assert "  grade: ordinal A < B < C < D < E < F < G, in steps of 1 place, changing by at most 2 places" in \
        codec.describe().splitlines()
    assert TabularCodec.from_dict(codec.to_dict()).to_dict() == codec.to_dict()
    # --write-data-spec writes them back, and the file trains the same codec
    line = next(line for line in spec_text(module).splitlines() if line.startswith("  grade:"))
    assert line.startswith("  grade: {kind: ordinal, mutability: both, step: 1, max_change: 2, order: [A, B, C, D, E, F, "
                           "G]}"), line
    written = yaml.safe_load(spec_text(module))
    assert TableDataModule(graded(), target="approved", spec=written).codec.to_dict() == codec.to_dict()
    stepped = TableDataModule(graded(), target="approved", spec=spec(step=2)).codec
    assert stepped.feature_types().steps == {index: 2.0} and index not in stepped.feature_types().integers
    assert "  grade: ordinal A < B < C < D < E < F < G, in steps of 2 places" in stepped.describe().splitlines()


@pytest.mark.parametrize("grade, said", [
    ({"max_change": 1.5}, "max_change 1.5; allowed: a whole number of places of its order, at least 1, for an ordinal "
                          "column (max_change: 2 moves at most two places either way; a column that may not change "
                          "at all: mutability: none)"),
    ({"max_change": 0}, "max_change 0; allowed: a whole number of places of its order, at least 1"),
    ({"step": 0.5}, "step 0.5; allowed: a whole number of places of its order, at least 1, for an ordinal column "
                    "(step: 2 moves two places at a time)"),
    ({"step": "two"}, "step 'two'; allowed: a whole number of places of its order"),
    ({"lower": 1}, "lower 1 has no meaning for an ordinal column (its order's first and last categories are its "
                   "bounds); allowed: kind, mutability, order, step, max_change, label, values"),
])
def test_a_step_or_largest_change_that_is_no_whole_number_of_places_is_refused_in_one_line(grade, said):
    with pytest.raises(ValueError) as error:
        TabularCodec.fit(graded(), "approved", spec(**grade))
    assert str(error.value).startswith(f"data_spec: column 'grade': {said}"), str(error.value)


def moved(records: list[dict]) -> list[int]:
    """How many places each explanation moves the grade (up: positive)."""
    return [GRADES.index(c["to"]) - GRADES.index(c["from"]) for record in records for c in record["changes"]
            if c["feature"] == "grade"]


def test_explanations_move_an_ordinal_column_at_most_its_max_change_in_places(tmp_path, capsys):
    """A real training without a largest change: explain.py raises some grade by more than two places. explain.py's
    ``--max-change grade=2`` and a served model's ``max_change`` param hold it to two, ``--step grade=2`` moves it by
    two places at a time, and a model trained with ``max_change: 2`` in its data spec says so at start-up and in its
    ``ct.constraints`` tag and keeps to it. The rows file writes the rate as percentages, as its order does."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.configuration.validation import CliExit
    from ct_lightning.experiment.runs.lifecycle import CONSTRAINTS_TAG
    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri
    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main

    frame = graded()
    frame.to_csv(tmp_path / "graded.csv", index=False)
    rows = frame[frame["approved"] == "no"].drop(columns="approved").head(30)
    rows.to_csv(tmp_path / "rows.csv", index=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def trained(name: str, given: dict) -> str:
        (tmp_path / name).write_text(yaml.safe_dump(given))
        return train({"data": str(tmp_path / "graded.csv"), "target": "approved", "data_spec": str(tmp_path / name),
                      "objective": "vanilla", "max_epochs": 20, "tracking_uri": uri, "progress": False,
                      "seed": 0})["run_id"]

    def explained(run_id: str, *options) -> list[dict]:
        return main(["--run-id", run_id, "--tracking-uri", uri, "--rows", str(tmp_path / "rows.csv"), "--target",
                     "yes", "--max-steps", "80", "--no-log", *options])

    free = trained("free.yaml", spec())
    records = explained(free)
    assert max(moved(records)) > 2, moved(records)  # else the limits below could not fail
    assert all(record["counterfactual"]["rate"] in RATES for record in records)
    limited = moved(explained(free, "--max-change", "grade=2"))
    assert limited and max(map(abs, limited)) <= 2 and max(limited) == 2, limited
    stepped = moved(explained(free, "--step", "grade=2"))
    assert stepped and all(places % 2 == 0 for places in stepped) and max(stepped) > 2, stepped
    for value, said in (("grade=1.5", "--max-change: got 'grade=1.5' ('grade' is ordinal); allowed: a whole number "
                                      "of places of its order such as 1 or 2"),
                        ("purpose=1", "--max-change: got 'purpose=1' ('purpose' is categorical); allowed: "
                                      "COLUMN=NUMBER for the model's number and ordinal columns: age, income, debt, "
                                      "years_employed, grade, rate")):
        with pytest.raises(CliExit) as refused:
            explained(free, "--max-change", value)
        assert refused.value.code == 2 and str(refused.value) == said, str(refused.value)
    with _tracking_uri(uri):  # the served predictor's params of the same names
        model = mlflow.pyfunc.load_model(f"runs:/{free}/predictor")
        served = model.predict(rows, params={"explain": True, "target": "yes", "max_steps": 80, "max_change": "grade=2"})
        with pytest.raises(Exception, match=r"params: max_change 'grade=2.5' \('grade' is ordinal\); allowed: a whole "
                                            "number of places of its order"):
            model.predict(rows.head(2), params={"explain": True, "max_change": "grade=2.5"})
    places = [GRADES.index(after["grade"]) - GRADES.index(before)
              for before, after in zip(rows["grade"], served["counterfactual"])]
    assert max(map(abs, places)) <= 2 and max(places) == 2, places

    capsys.readouterr()
    run = trained("limited.yaml", spec(max_change=2))
    assert "  grade: ordinal A < B < C < D < E < F < G, changing by at most 2 places" in capsys.readouterr().out
    tag = MlflowClient(tracking_uri=uri).get_run(run).data.tags[CONSTRAINTS_TAG]
    assert tag == "every feature mutable; grade changing by at most 2 places; within the data domain", tag
    kept = moved(explained(run))
    assert kept and max(map(abs, kept)) <= 2, kept
