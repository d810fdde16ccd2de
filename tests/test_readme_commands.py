"""Every command in the README works as written after the set-up line: the environment's own programs, valid options."""

import re
import shlex
from pathlib import Path

import pytest

from recipe_loader import load_recipe

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages the README's manual moved to: their commands are held to the same rules.
PAGES = [README, *(ROOT / "docs" / f"{name}.md" for name in ("guide", "evaluation", "explain", "scaling", "generators"))]


def shell_commands() -> list[str]:
    """The commands of the README's ```bash blocks, continuation lines joined, comments dropped."""
    commands = []
    text = "\n".join(page.read_text() for page in PAGES)
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def recipe_calls() -> list[tuple[str, list[str]]]:
    """``(recipe, argv)`` of every ``.venv/bin/python recipes/X.py ...`` in the README (``$(...)`` → a path)."""
    calls = []
    for command in shell_commands():
        for part in command.split("&&"):
            text = re.sub(r'"\$\((?:[^()]|\([^()]*\))*\)"', "PLACEHOLDER", part)
            words = shlex.split(text)
            if len(words) > 1 and words[1].startswith("recipes/"):
                calls.append((Path(words[1]).stem, words[2:]))
    return calls


def test_commands_use_the_environment_programs():
    for command in shell_commands():
        for part in command.split("&&"):
            words = shlex.split(re.sub(r'"\$\(.*\)"', "X", part))
            program = words[1] if words[0] == "srun" else words[0]  # SLURM's launcher runs the environment's python
            assert program in (".venv/bin/python", ".venv/bin/mlflow", ".venv/bin/pip", ".venv/bin/torchrun", "python3"), \
                command
        assert not re.search(r"(?<![\w/.])python (recipes/|-c )", command), command


@pytest.mark.parametrize("recipe, argv", recipe_calls(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_readme_recipe_command_parses(recipe, argv, tmp_path, monkeypatch):
    if "--help" in argv:
        return
    import shutil

    shutil.copy(ROOT / "tests" / "fixtures" / "loans.csv", tmp_path / "loans.csv")  # what the README's first
    monkeypatch.chdir(tmp_path)  # lending command writes, in the folder the commands run in
    load_recipe(recipe).build_parser().parse_args(argv)  # a bad option or value exits with code 2
