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
