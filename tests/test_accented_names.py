"""Column names with accents written the two ways Unicode allows: a file from a tool that decomposes them (NFD: 'A'
followed by a combining circumflex, as macOS may write) against the name a person types (NFC: 'Â'). They looked the
same and were refused as ``got 'Âge du dirigeant' (unknown column); allowed: ... Âge du dirigeant``."""

from __future__ import annotations

import unicodedata

import numpy as np
import pandas as pd

TYPED_AGE, TYPED_TARGET = "Âge du dirigeant", "Décision"
FILE_AGE, FILE_TARGET = (unicodedata.normalize("NFD", name) for name in (TYPED_AGE, TYPED_TARGET))


def write_table(path) -> None:
    rng = np.random.default_rng(0)
    age, revenue = rng.integers(20, 70, 80), rng.normal(100, 30, 80).round(1)
    pd.DataFrame({FILE_AGE: age, "revenue": revenue, FILE_TARGET: np.where(revenue > 100, "oui", "non")}
                 ).to_csv(path, index=False)


def test_a_decomposed_header_reads_as_the_names_a_person_types(tmp_path):
    from ct_lightning.experiment.configuration.preflight import check_table_columns
    from datamodules.table import TableDataModule
    from datamodules.table_header import header_names

    assert FILE_AGE != TYPED_AGE and FILE_TARGET != TYPED_TARGET
    write_table(tmp_path / "firms.csv")
    assert header_names(tmp_path / "firms.csv") == [TYPED_AGE, "revenue", TYPED_TARGET]
    check_table_columns({"data": str(tmp_path / "firms.csv"), "target": TYPED_TARGET, "immutable": [TYPED_AGE]})
    data = TableDataModule(tmp_path / "firms.csv", target=TYPED_TARGET, spec={"columns": {TYPED_AGE: {"mutability": "none"}}})
    assert [c.name for c in data.codec.columns] == [TYPED_AGE, "revenue"]
    assert TableDataModule(pd.read_csv(tmp_path / "firms.csv"), target=TYPED_TARGET).target == TYPED_TARGET


def test_a_name_typed_decomposed_is_pointed_to_the_column():
    from datamodules.suggest import name_hint

    assert name_hint(FILE_AGE, [TYPED_AGE, "revenue"]) == \
        f" (did you mean {TYPED_AGE!r}? the same letters, its accents written another way)"
    assert name_hint("revenu", [TYPED_AGE, "revenue"]) == " (did you mean 'revenue'?)"
