"""The README's Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_example_runs(capsys):
    blocks = python_blocks()
    assert blocks, "the README must hold a Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})
    assert "tensor(" in capsys.readouterr().out


def test_readme_commands_name_the_ci_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = ".venv/bin/python -m pytest -q"
    assert test_command in README.read_text() and test_command in ci
