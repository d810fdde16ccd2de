"""Recipes are thin: at most 80 lines each, over one library workflow and the one runner, and an option that
several recipes have is declared from its row (``experiment.options``): one flag, type, check, help and meaning."""

import argparse
import re
from collections import defaultdict
from pathlib import Path

import pytest

from ct_lightning.experiment.configuration.options import HOMONYMS, ROWS, add_arguments
from recipe_loader import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(path.stem for path in (ROOT / "recipes").glob("*.py") if path.stem != "__init__")
MAX_LINES = 80


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_is_at_most_80_lines_over_the_one_runner(name):
    text = (ROOT / "recipes" / f"{name}.py").read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"recipes/{name}.py has {len(text.splitlines())} lines"
    assert "run_recipe(build_parser(), argv, " in text, f"recipes/{name}.py does not run through the runner"


def declarations() -> dict[str, dict[str, argparse.Action]]:
    """Long flag → {recipe: its action}, over every recipe's parser."""
    found: dict[str, dict[str, argparse.Action]] = defaultdict(dict)
    for name in RECIPES:
        parser = load_recipe(name).build_parser()
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    found[flag][name] = (parser, action)
    return found


def shape(action: argparse.Action) -> tuple:
    """What a user sees and gets of an option: flags, destination, help, type, choices, metavar, nargs, default."""
    kind = getattr(action.type, "__name__", action.type)
    return (tuple(action.option_strings), action.dest, action.help, kind, action.choices, action.metavar,
            action.nargs, action.const, type(action).__name__, repr(action.default))


def from_row(row, parser: argparse.ArgumentParser, action: argparse.Action, recipe: str | None = None) -> list[tuple]:
    """The shapes ``add_arguments`` gives the row in ``parser``: with the row's default, or the recipe's own; with the
    row's help, or the recipe's own help of the row (``RECIPE_HELP``)."""
    shapes = []
    for defaults in ({}, {row.name: action.default}):
        fresh = argparse.ArgumentParser(argument_default=parser.argument_default)
        add_arguments(fresh, [row.name], recipe=recipe, **defaults)
        shapes.append(shape(fresh._actions[-1]))
    every = argparse.ArgumentParser(argument_default=parser.argument_default)
    add_arguments(every)  # the training settings, as recipes/train.py has them
    shapes += [shape(declared) for declared in every._actions if declared.dest == row.name]
    return shapes


def test_an_option_of_several_recipes_is_declared_from_its_row():
    shared = {flag: where for flag, where in declarations().items() if len(where) > 1}
    assert {"--tracking-uri", "--seed", "--max-epochs", "--summary-json", "--threads"} <= set(shared)
    wrong = []
    for flag, where in shared.items():
        rows = [row for row in ROWS.values() if row.option == flag]
        for recipe, (parser, action) in where.items():
            if any(shape(action) in from_row(row, parser, action, recipe) for row in rows):
                continue
            if flag not in HOMONYMS or len(rows) > 1:  # a homonym with a row per meaning is held to its rows too
                wrong.append(f"{recipe} {flag}: not declared from a row of experiment.options")
    assert not wrong, "\n".join(wrong)
    assert set(HOMONYMS) <= set(shared), "a homonym is a flag that several recipes have"


def test_the_check_can_fail():
    """A recipe that declared a shared option by hand (a help of its own) is found."""
    parser = argparse.ArgumentParser()
    action = parser.add_argument("--tracking-uri", default="sqlite:///mlruns/mlflow.db", help="where to track")
    assert shape(action) not in from_row(ROWS["tracking_uri"], parser, action)
    declared = argparse.ArgumentParser()
    add_arguments(declared, ["tracking_uri"])
    assert shape(declared._actions[-1]) in from_row(ROWS["tracking_uri"], declared, declared._actions[-1])


def test_a_recipe_default_is_shown_and_checked_as_the_row_says():
    parser = argparse.ArgumentParser()
    add_arguments(parser, ["max_epochs", "batch_size", "hidden_sizes"], max_epochs=30, batch_size=256,
                  hidden_sizes=[64, 64])
    helps = {action.dest: action.help for action in parser._actions}
    assert helps["max_epochs"].endswith("(default 30)") and helps["batch_size"].endswith("(default 256)")
    assert helps["hidden_sizes"].endswith("(default 64,64)")
    assert parser.parse_args([]).max_epochs == 30
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-epochs", "0"])
    with pytest.raises(KeyError):
        add_arguments(parser, ["no_such_row"])


def test_each_recipe_help_says_what_that_recipe_takes():
    """explain.py --help said under --checkpoint what only evaluate.py takes ("evaluate.py also takes what train.py
    --from-checkpoint accepts: a plain state_dict ..., runs:/RUN_ID/model, models:/NAME/VERSION"); a row's help now
    holds in every recipe that has it, and the one recipe that takes more has its own (``RECIPE_HELP``). Read from
    the real ``--help`` of each recipe, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    def help_of(name: str) -> str:
        done = subprocess.run([sys.executable, str(ROOT / "recipes" / f"{name}.py"), "--help"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-2000:]
        return " ".join(done.stdout.split())  # argparse wraps its lines

    for name in ("explain", "train_generator"):  # a checkpoint file (or --run-id); explain.py the run's model too
        text = help_of(name)
        assert "--checkpoint CHECKPOINT the model as a file: a checkpoint of recipes/train.py" in text, text
        # its own help (not the usage line's "--checkpoint CHECKPOINT"), up to the next option or group: --run-id
        # takes models:/ too (registered)
        own = re.split(r" --[a-z][a-z-]* [A-Z_]+ (?=[a-z])| [a-z]+: --", text.split(
            "--checkpoint CHECKPOINT the model", 1)[1], maxsplit=1)[0]
        assert not [word for word in ("evaluate.py", "state_dict") if word in own], own
        # explain.py reads runs:/ID/model and models:/NAME/VERSION as --run-id (run_of_checkpoint); its help says so
        said = [word for word in ("runs:/RUN_ID/model", "models:/NAME/VERSION") if word in own]
        assert said == (["runs:/RUN_ID/model", "models:/NAME/VERSION"] if name == "explain" else []), own
    evaluate = help_of("evaluate")
    assert "a plain state_dict" in evaluate and "runs:/RUN_ID/model (a run of train.py: read with that run's " \
        "settings, as --run-id" in evaluate and "evaluate.py also" not in evaluate
    compare, appendix = help_of("compare"), help_of("appendix")
    assert "the data the given runs were trained on" in compare and "appendix.py" not in compare
    assert "default: all the grid's" in appendix and "compare.py" not in appendix and "--target" not in appendix
    from ct_lightning.experiment.configuration.options import RECIPE_HELP

    declared = {(row, recipe) for recipe in RECIPES for row in
                {action.dest for action in load_recipe(recipe).build_parser()._actions}}
    assert set(RECIPE_HELP) <= declared, "a recipe's own help of a row it does not have"
