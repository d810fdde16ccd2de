"""Numbers in explanations and notes written with the thousands separator the training file writes, column by
column: a French export's ``14 999,01 €`` is explained as ``24 062,39 €``, not in German style (``24.062,39 €``), a
Swiss ``1'234.50`` as ``1'234.5``, a column that groups none (``24062,39``) without one inserted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from ct_lightning.evaluation.explanation import change_text
from datamodules.codec import TabularCodec
from datamodules.table import TableDataModule

LOANS = Path(__file__).resolve().parent / "fixtures" / "loans.csv"
NBSP = "\u00a0"


def french(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as Excel in France writes it: ``30 600,50 €`` (a no-break space between thousands), debt as a plain
    ``8100`` (no separator), a rate ``27,5 %`` (all below 1000: no separator shows)."""
    return frame.assign(income=frame.income.map(lambda v: f"{v + 0.5:,.2f} €".replace(",", NBSP).replace(".", ",")),
                        rate=(frame.debt / frame.income * 100).map(lambda v: f"{v:.1f} %".replace(".", ",")))


def thousands(codec: TabularCodec) -> dict:
    """``{column: its thousands separator}`` of the codec's columns that know one."""
    return {c.name: c.thousands for c in codec.columns if c.thousands is not None}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A model trained for one epoch on the French export (``;``, Windows-1252), and three applicants written so."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("french")
    loans = pd.read_csv(LOANS)
    (folder / "export.csv").write_bytes(french(loans).to_csv(sep=";", index=False).encode("cp1252"))
    train({"data": str(folder / "export.csv"), "target": "approved", "immutable": "age,sex", "max_epochs": 1,
           "nce": 16, "seed": 0, "tracking_uri": f"sqlite:///{folder / 'mlflow.db'}", "progress": False,
           "checkpoint_dir": str(folder / "ct")})
    (folder / "applicants.csv").write_bytes(
        french(loans).drop(columns="approved").head(3).to_csv(sep=";", index=False).encode("cp1252"))
    return folder, folder / "ct" / "last.ckpt"


def test_a_french_exports_explanation_writes_its_thousands_with_a_space(trained, capsys, tmp_path):
    """Explained as ``income: 30.600,5 € → 45.128,13 €`` (German thousands points); now ``30 600,5 € → 45 128,13
    €``, as the file writes them, and ``debt``, which the file writes without a separator, without one."""
    from ct_lightning.experiment.configuration.validation import CliExit
    from recipes.explain import main

    folder, checkpoint = trained
    records = main(["--checkpoint", str(checkpoint), "--rows", str(folder / "applicants.csv"), "--target", "yes",
                    "--all-changes", "--max-steps", "300", "--no-log", "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    changes = {c["feature"]: c for r in records for c in r["changes"]}
    grouped = r"\d{1,3}(?: \d{3})+(?:,\d+)? €"  # 30 600,5 € (a plain space: it shows as the file's no-break one)
    assert re.search(rf"    income: {grouped} → {grouped}\n", out), out
    income = changes["income"]
    assert income["thousands"] == " "  # --json says so too
    written = json.loads((tmp_path / "out.json").read_text())
    assert {c["thousands"] for r in written for c in r["changes"] if c["feature"] == "income"} == {" "}
    assert f"    {change_text(income)}\n" in out and "." not in change_text(income), out
    if "debt" in changes:
        assert re.search(r"    debt: \d{4,} → \d{4,}\n", out), out  # 8100 → 9650, not 8 100 → 9 650
    # a row outside the domain is refused in the file's numbers too: 9 000 000 €, not 9.000.000 € or 9000000 €
    row = pd.read_csv(folder / "applicants.csv", sep=";", encoding="cp1252", dtype=str).iloc[0].to_dict()
    with pytest.raises(CliExit):
        main(["--checkpoint", str(checkpoint), "--row", json.dumps({**row, "income": "9 000 000,00 €"}), "--no-log"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"income=9 000 000 €' \(outside the model's domain in row 1\); allowed: 0 € to \d{3} \d{3}"
                     r"(,\d+)? € \(the", line), line


def test_each_column_keeps_its_own_separator_through_the_saved_codec(tmp_path):
    """Read from the file per column (a French income's space, a count written ``1234``: none; a rate below 1000
    takes the file's other columns'), saved with the model's preprocessing, and shown in start-up and fill-in notes.
    A Swiss ``1'234.50`` keeps its apostrophe, a German ``1.234,50 €`` its point."""
    loans = pd.read_csv(LOANS).head(120)
    frame = french(loans)
    frame.loc[:3, "income"] = ""
    (tmp_path / "fr.csv").write_bytes(frame.to_csv(sep=";", index=False).encode("cp1252"))
    spec = {"columns": {"income": {"lower": 0, "upper": 250000}}}
    data = TableDataModule(tmp_path / "fr.csv", target="approved", impute="median", spec=spec)
    described = data.describe()
    assert "  income: continuous, from 0 to 250 000" in described, described
    assert re.search(r"income: missing in 4 row\(s\), filled with \d{2} \d{3},\d+, ", described), described
    codec = TabularCodec.from_dict(json.loads(json.dumps(data.codec.to_dict())))  # as a checkpoint keeps it
    assert thousands(codec) == {"age": " ", "income": " ", "debt": "", "years_employed": " ", "rate": " "}
    change = {"feature": "income", "from": 14999.01, "to": 24062.39, "unit": "{} €", "decimal_comma": True}
    assert change_text({**change, "thousands": thousands(codec)["income"]}) == "income: 14 999,01 € → 24 062,39 €"

    swiss = loans.assign(income=loans.income.map(lambda v: f"{v + 0.5:,.2f}".replace(",", "'")))
    swiss.to_csv(tmp_path / "ch.csv", index=False)
    swiss_codec = TableDataModule(tmp_path / "ch.csv", target="approved").codec
    assert thousands(swiss_codec)["income"] == "'"
    assert change_text({"feature": "income", "from": 1234.5, "to": 2000.5, "thousands": "'"}) == \
        "income: 1'234.5 → 2'000.5"

    plain = loans.assign(income=loans.income.map(lambda v: f"{v + 0.39:.2f}".replace(".", ",")))
    plain.to_csv(tmp_path / "none.csv", sep=";", index=False)
    none = thousands(TableDataModule(tmp_path / "none.csv", target="approved").codec)
    assert none["income"] == "" and none["debt"] == ""  # 24062,39 and 8100: none inserted
    assert change_text({**change, "to": 24062.39, "thousands": none["income"]}) == "income: 14999,01 € → 24062,39 €"

    german = loans.assign(income=loans.income.map(lambda v: f"{v:,.2f} €".translate(str.maketrans(",.", ".,"))))
    german.to_csv(tmp_path / "de.csv", sep=";", index=False)
    assert thousands(TableDataModule(tmp_path / "de.csv", target="approved").codec)["income"] == "."
    assert change_text({**change, "thousands": "."}) == "income: 14.999,01 € → 24.062,39 €"


def test_an_old_payload_and_a_file_of_plain_numbers_keep_todays_grouping(tmp_path):
    """A model saved before the separator was kept (its columns without ``thousands``) and a file of plain numbers
    (``30600``, which shows no number style) group thousands as before: ``,``, or ``.`` with decimal commas."""
    data = TableDataModule(LOANS, target="approved")
    assert thousands(data.codec) == {}
    assert "thousands" not in json.dumps(data.codec.to_dict())  # the saved preprocessing as before
    payload = TableDataModule(_french_file(tmp_path), target="approved").codec.to_dict()
    for column in payload["columns"]:
        column.pop("thousands", None)
    old = TabularCodec.from_dict(payload)
    assert thousands(old) == {} and old.decimal_comma
    assert change_text({"feature": "income", "from": 14999.01, "to": 24062.39, "unit": "{} €",
                        "decimal_comma": True}) == "income: 14.999,01 € → 24.062,39 €"
    assert change_text({"feature": "income", "from": 30600, "to": 38400}) == "income: 30,600 → 38,400"


def _french_file(folder: Path) -> Path:
    """The French export of the first 120 loans, written as Excel in France saves a CSV."""
    path = folder / "fr.csv"
    path.write_bytes(french(pd.read_csv(LOANS).head(120)).to_csv(sep=";", index=False).encode("cp1252"))
    return path
