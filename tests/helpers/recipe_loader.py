"""Import a script from ``recipes/`` as a module, so tests can call its ``main`` in-process."""

import importlib.util
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def load_recipe(name: str):
    """The module of ``recipes/<name>.py``."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
