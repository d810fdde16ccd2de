"""Imports point one way: each package imports alone, the core knows no MLflow, the data know no ct_lightning."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["ct_lightning", "ct_lightning.generators", "ct_lightning.metrics", "ct_lightning.evaluation",
            "ct_lightning.callbacks", "ct_lightning.experiment", "ct_lightning.training", "datamodules"]
# Layers of ct_lightning, lowest first: a module may import only from its own layer or lower ones.
LAYERS = [{"constraints", "training", "models", "model_inputs", "attacks", "losses", "lazy_exports",
           "feature_names"}, {"metrics"},
          {"generators"}, {"module"}, {"evaluation"}, {"callbacks"}, {"stacked"}, {"experiment"}]
# Inside ct_lightning.experiment, lowest first: settings and checks, one MLflow run, studies of many runs, the
# recipes' runner, the workflows.
EXPERIMENT_LAYERS = ["configuration", "runs", "studies", "runner", "workflows"]


def imported_modules(package: str) -> set[str]:
    """``sys.modules`` after importing ``package`` alone in a fresh interpreter."""
    code = f"import json, sys; import {package}; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, f"import {package} failed in isolation:\n{done.stderr[-2000:]}"
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow  # a fresh interpreter per package
@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_alone(package):
    modules = imported_modules(package)
    if package != "ct_lightning.experiment":
        # ct_lightning.experiment's submodules hold MLflow; the package itself imports none of them.
        assert "mlflow" not in modules, f"{package} imports mlflow"
        assert not any(m.startswith("ct_lightning.experiment.") for m in modules), f"{package} imports experiment"
    if package == "datamodules":
        assert not any(m == "ct_lightning" or m.startswith("ct_lightning.") for m in modules)
    if package in ("ct_lightning", "ct_lightning.generators", "ct_lightning.training"):
        # the core and the generators need no data registry: neither pandas nor scikit-learn is loaded
        heavy = sorted(m for m in modules if m.split(".")[0] in ("pandas", "sklearn") or m == "datamodules.base")
        assert not heavy, f"{package} loads {heavy[:5]}"
    if package in ("ct_lightning.generators", "ct_lightning.evaluation"):
        # explain.py's search and explanation: the Lightning modules of learned generators and the protocol's
        # metric classes (torchmetrics) load on first use
        heavy = sorted(m for m in modules if m.split(".")[0] in ("lightning", "torchmetrics", "scipy", "matplotlib"))
        assert not heavy, f"{package} loads {heavy[:5]}"


def _layer(module: str) -> tuple[int, int]:
    """(layer of ct_lightning, layer inside ct_lightning.experiment) of a module."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else ""
    outer = next((i for i, layer in enumerate(LAYERS) if name in layer), len(LAYERS))
    inner = EXPERIMENT_LAYERS.index(parts[2]) if name == "experiment" and len(parts) > 2 and parts[2] in EXPERIMENT_LAYERS else -1
    return outer, inner


def test_ct_lightning_modules_import_only_their_own_or_lower_layers():
    wrong = []
    for path in (ROOT / "ct_lightning").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module in ("ct_lightning", "ct_lightning.experiment"):
            continue  # the package front doors re-export from every layer
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("ct_lightning.") and _layer(target) > _layer(module):
                    wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_recipes_do_not_patch_sys_path_or_import_each_other():
    for path in (ROOT / "recipes").glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path.name
        assert "from recipes" not in text and "import recipes" not in text, path.name
