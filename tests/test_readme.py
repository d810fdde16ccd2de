"""The user guide's Python example runs as written; the README stays a front door (≤ 120 lines)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide.md"  # the Python-API example (moved from the README)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_readme_python_example_runs(capsys):
    blocks = python_blocks()
    assert blocks, "the user guide must hold a Python example"
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), {"__name__": "readme_example"})
    assert "tensor(" in capsys.readouterr().out


def test_readme_commands_name_the_ci_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = ".venv/bin/python -m pytest -q -n auto"
    assert test_command in README.read_text() and test_command in ci


def test_the_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 120


def test_the_guides_data_spec_example_fits_the_credit_file():
    """The YAML in docs/guide.md reads as written and declares what it says on the UCI credit file's sample."""
    import re

    import pandas as pd
    import yaml

    from datamodules.table import TableDataModule

    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S).group(1))
    frame = pd.read_csv(ROOT / "tests" / "fixtures" / "raw" / "credit" / "UCI_Credit_Card.csv").drop(columns="ID")
    codec = TableDataModule(frame, target="default.payment.next.month", spec=spec).codec
    kinds = {c.name: c.kind for c in codec.columns}
    assert kinds["SEX"] == kinds["EDUCATION"] == kinds["MARRIAGE"] == "categorical" and kinds["AGE"] == "integer"
    assert codec.mutability() == {"SEX": "none", "MARRIAGE": "none", "AGE": "none"} and codec.positive == 1
    assert next(c for c in codec.columns if c.name == "LIMIT_BAL").domain() == (0, 1_000_000)
