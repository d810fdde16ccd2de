"""One "did you mean" for every refusal of a misspelt name (datamodules.suggest), at one similarity cutoff: before,
a row bound's unknown column was suggested from 0.6, a spec key or an ordinal value from 0.75."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_row_bounds import fit

from datamodules.suggest import CUTOFF, closest, did_you_mean


def test_the_closest_allowed_name_is_suggested_case_ignored_or_none():
    assert closest("agee", ["income", "age"]) == "age"
    assert closest("AGE", ["income", "age"]) == "age"  # the allowed name as it is spelt
    assert closest(5, [1, 2, 3, 4]) is None and closest("xyz", ["age"]) is None
    assert did_you_mean("mutabilty", ["kind", "mutability"]) == " (did you mean 'mutability'?)"
    assert did_you_mean("xyz", ["age"]) == ""


def test_a_row_bound_and_a_spec_key_suggest_from_the_same_similarity():
    # 'inco' is 0.8 like 'income', 'inc' 0.67: both sides of the cutoff, for a rule's column and a column's key alike
    assert 2 * 3 / (3 + 6) < CUTOFF <= 2 * 4 / (4 + 6)
    for near, far, allowed, spec in (("inco", "inc", "income", lambda word: {"upper": f"{word} - 16"}),
                                     ("stp", "st", "step", lambda word: {word: 1})):
        for word, hinted in ((near, True), (far, False)):
            with pytest.raises(ValueError) as error:
                fit({"columns": {"experience": spec(word)}})
            assert (f"(did you mean '{allowed}'?)" in str(error.value)) == hinted, str(error.value)


def test_an_unknown_name_is_hinted_alike_everywhere():
    """--immutable, a served request's immutable and a model-inputs list named 'agee' without a hint, while a row
    bound's 'agee' got one; a name in another case keeps its case-sensitivity hint."""
    from datamodules.suggest import name_hint
    from ct_lightning.feature_names import unknown_feature_error

    assert name_hint("agee", ["income", "age"]) == " (did you mean 'age'?)"
    assert name_hint("Age", ["income", "age"], "; {}") == "; did you mean 'age'? names are case-sensitive"
    assert name_hint("zzz", ["income", "age"]) == ""
    assert "immutable: got 'agee' (unknown feature; did you mean 'age'?); allowed: the features: age" in \
        str(unknown_feature_error("immutable", "agee", ["age", "income"]))


def test_path_hint_mends_each_misspelt_part_and_only_names_a_file_that_is_there(tmp_path, monkeypatch):
    """A misspelt file (lst.ckpt), a misspelt folder (ct_runz/last.ckpt), both, relative and absolute: the file it
    probably means; nothing close, a path that is there, or a mended path that is a folder: no hint."""
    from datamodules.suggest import path_hint

    (tmp_path / "ct_runs").mkdir()
    for name in ("last.ckpt", "best.ckpt"):
        (tmp_path / "ct_runs" / name).write_bytes(b"PK")
    monkeypatch.chdir(tmp_path)
    assert path_hint("ct_runs/lst.ckpt") == " (did you mean 'ct_runs/last.ckpt'?)"
    assert path_hint("ct_runz/bestt.ckpt", "; {}") == "; did you mean 'ct_runs/best.ckpt'?"
    assert path_hint(tmp_path / "ct_rns" / "last.ckpt") == f" (did you mean '{tmp_path / 'ct_runs' / 'last.ckpt'}'?)"
    assert path_hint("ct_runs/last.ckpt") == ""  # it is there
    assert path_hint("elsewhere/last.ckpt") == "" and path_hint("ct_runs/model.pt") == ""  # nothing close
    assert path_hint("ct_run") == ""  # the folder, not a file
    assert path_hint("ct_runs/last.ckpt/more") == ""  # a file where a folder should be


def test_train_names_the_column_a_data_spec_label_stands_for(tmp_path):
    """train.py --immutable 'Yearly income' (a column by its data spec words, as explanations write it) was refused
    with no word of the column meant; explain.py already named it (label_hint, one home for both)."""
    from ct_lightning.experiment.configuration.table_columns import check_table_header

    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  income: {label: Yearly income, unit: $}\n")
    config = {"data": str(Path(__file__).parent / "fixtures" / "loans.csv"), "target": "approved",
              "data_spec": str(spec)}
    for option, value, given in (("immutable", "Yearly income", "Yearly income"),
                                 ("immutable", "Yearly income ($)", "Yearly income ($)"),
                                 ("mutability", "Yearly income=increase", "Yearly income")):
        with pytest.raises(ValueError) as refused:
            check_table_header({**config, option: value})
        assert str(refused.value).startswith(
            f"{option}: got {given!r} (unknown feature; {given!r} is the data spec's label of 'income': name the "
            "column, income); allowed: the features: age, income, debt, ")
