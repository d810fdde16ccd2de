"""Names and defaults the command lines need, read from the source without importing torch.

``--help`` and argument errors must answer in well under two seconds, but the registries of data sets
and generators, the objectives and ``CTModule``'s default arguments live in modules that import
torch and Lightning (over ten seconds on a busy machine). This module reads those same values from
the source files with :mod:`ast` (the decorators ``@register("name", "alias")`` and
``@register_generator("name")``, literal constants, literal signature defaults and the options of the
``CTModule`` arguments that are settings), so they keep one source. Where the source cannot be read that
way (an installed wheel without sources, a default that is not a literal) it falls back to importing the
real thing. ``tests/test_bad_inputs.py`` checks that
both ways give the same values.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from functools import cache
from pathlib import Path


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # locates a top-level package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _ct_dir() -> Path:
    return Path(__file__).resolve().parents[2]


def _decorated_names(folder: Path, decorator: str) -> list[tuple[str, ...]]:
    """Constant arguments of every ``@decorator("a", "b")`` on a class under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == decorator:
                    found.append(tuple(ast.literal_eval(arg) for arg in deco.args))
    return found


def _literal_or_none(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _constant(path: Path, name: str):
    """The literal value assigned to module-level ``name`` in ``path``."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(getattr(t, "id", None) == name for t in targets) and node.value is not None:
            if isinstance(node.value, ast.Dict):  # keys are what the command line needs; values may be code
                return {ast.literal_eval(k): _literal_or_none(v) for k, v in zip(node.value.keys, node.value.values)}
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} not found in {path}")


def datasets() -> dict[str, str]:
    """Every accepted ``--data`` name (canonical names and aliases) → its canonical name.

    Data sets registered at run time (``datamodules`` already imported) count too.
    """
    names = dict(_static_datasets())
    registry = sys.modules.get("datamodules.registry")
    if registry is not None:
        names.update({**{n: n for n in registry._REGISTRY}, **registry._ALIASES})
    return names


@cache
def _static_datasets() -> dict[str, str]:
    try:
        folder = _package_dir("datamodules")
        names: dict[str, str] = {}
        for args in _decorated_names(folder, "register"):
            names[args[0]] = args[0]
            names.update({alias: args[0] for alias in args[1:]})
        if names:
            return names
    except (OSError, SyntaxError, ValueError, TypeError, LookupError):
        pass
    from datamodules import registry  # noqa: PLC0415 - fallback: import the registry itself
    import datamodules  # noqa: F401,PLC0415 - registers the sets

    registry.available()  # imports every data module once
    return {**{n: n for n in registry._REGISTRY}, **registry._ALIASES}


def available_datasets() -> list[str]:
    """Canonical data set names, sorted (as ``datamodules.available()``)."""
    return sorted(set(datasets().values()))


def canonical_dataset(name: str) -> str | None:
    """The canonical name of a data set name or alias (case-insensitive), or ``None`` if unknown."""
    return datasets().get(str(name).lower())


def generators() -> list[str]:
    """Registered generator names (as ``ct_lightning.generators.GENERATORS``, run-time registrations too)."""
    names = set(_static_generators())
    registry = sys.modules.get("ct_lightning.generators.registry")
    if registry is not None:
        names.update(registry.GENERATORS)
    return sorted(names)


@cache
def _static_generators() -> list[str]:
    # Every file of the package, as ct_lightning.generators imports every module of it: a new file is found here too.
    try:
        names = [args[0] for args in _decorated_names(_ct_dir() / "generators", "register_generator")]
        if names:
            return sorted(names)
    except (OSError, SyntaxError, ValueError, TypeError):
        pass
    from ct_lightning.generators import GENERATORS  # noqa: PLC0415

    return sorted(GENERATORS)


def _source(module: str) -> Path:
    """The source file of ``module`` (a dotted name in ``ct_lightning``), not executed."""
    root = _ct_dir().parent
    path = root.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@cache
def constant(module: str, name: str):
    """The literal module-level constant ``module.name`` (read from the source, else imported)."""
    try:
        return _constant(_source(module), name)
    except (OSError, SyntaxError, ValueError, LookupError):
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(module), name)


@cache
def class_defaults(module: str, name: str) -> dict:
    """Literal defaults of the fields of dataclass ``module.name`` (read from the source, else imported)."""
    try:
        tree = ast.parse(_source(module).read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        out = {}
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                try:
                    out[node.target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue  # e.g. field(default_factory=...)
        return out
    except (OSError, SyntaxError, StopIteration):
        import dataclasses  # noqa: PLC0415
        import importlib  # noqa: PLC0415

        cls = getattr(importlib.import_module(module), name)
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def validation_metrics() -> tuple[str, ...]:
    """The ``val/`` names the evaluation callback logs (``METRICS[key].logged`` for each key of
    ``ct_lightning.metrics.names.validation_metrics()``, in table order); rows registered at run time count where
    the table is already imported."""
    names = sys.modules.get("ct_lightning.metrics.names")
    if names is not None:
        return tuple(names.METRICS[key].logged for key in names.validation_metrics())
    return _static_validation_metrics()


@cache
def _static_validation_metrics() -> tuple[str, ...]:
    # The rows MetricName(key, label, higher_is_better, logged, ..., scope=..., validation=...) of the table.
    try:
        found = []
        for node in ast.walk(ast.parse(_source("ct_lightning.metrics.names").read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "MetricName":
                keywords = {k.arg: _literal_or_none(k.value) for k in node.keywords}
                logged = keywords["logged"] if "logged" in keywords else ast.literal_eval(node.args[3])
                if keywords.get("scope") is not None and keywords.get("validation", True):
                    found.append(logged)
        if found:
            return tuple(found)
    except (OSError, SyntaxError, ValueError, IndexError):
        pass
    from ct_lightning.metrics.names import METRICS  # noqa: PLC0415 - fallback: the table itself
    from ct_lightning.metrics.names import validation_metrics as keys  # noqa: PLC0415

    return tuple(METRICS[key].logged for key in keys())


def objectives() -> list[str]:
    """Training objectives (the keys of ``ct_lightning.losses.OBJECTIVES``)."""
    return list(constant("ct_lightning.losses", "OBJECTIVES"))


def pool_modes() -> tuple[str, ...]:
    """``ct_lightning.module.POOL_MODES``."""
    return tuple(constant("ct_lightning.module", "POOL_MODES"))


def mutability_kinds() -> tuple[str, ...]:
    """``ct_lightning.feature_names.MUTABILITY_KINDS``."""
    return tuple(constant("ct_lightning.feature_names", "MUTABILITY_KINDS"))


def search_compile_modes() -> tuple[str, ...]:
    """``ct_lightning.generators.compiled_step.SEARCH_COMPILE_MODES``."""
    return tuple(constant("ct_lightning.generators.compiled_step", "SEARCH_COMPILE_MODES"))


def activations() -> list[str]:
    """MLP activations (the keys of ``ct_lightning.models.ACTIVATIONS``)."""
    return list(constant("ct_lightning.models", "ACTIVATIONS"))


def _option(annotation: ast.expr | None) -> dict | None:
    """The option of an ``Annotated[type, {...}]`` annotation (with ``"type"``: the type's name), else ``None``."""
    if not (isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", None) == "Annotated"
            and isinstance(annotation.slice, ast.Tuple) and len(annotation.slice.elts) == 2):
        return None
    base, option = annotation.slice.elts
    return {**ast.literal_eval(option), "type": getattr(base, "id", None)}


@cache
def _ctmodule_arguments() -> list[tuple[str, ast.expr | None, object]]:
    """``(name, annotation, default)`` of ``CTModule.__init__``'s keyword arguments, read from the source (else
    from the imported signature, whose annotations are source text too: ``from __future__ import annotations``)."""
    try:
        tree = ast.parse((_ct_dir() / "module.py").read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CTModule")
        init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        args = init.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        return [(arg.arg, arg.annotation, ast.literal_eval(default)) for arg, default in pairs]
    except (OSError, SyntaxError, ValueError, StopIteration):
        import inspect  # noqa: PLC0415

        from ct_lightning.module import CTModule  # noqa: PLC0415

        return [(name, ast.parse(p.annotation, mode="eval").body if isinstance(p.annotation, str) else None,
                 p.default) for name, p in inspect.signature(CTModule.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty]


def module_defaults() -> dict:
    """Default values of ``CTModule.__init__``'s keyword arguments."""
    return {name: default for name, _, default in _ctmodule_arguments()}


@cache
def module_options() -> dict[str, dict]:
    """The ``CTModule`` arguments that are training settings (annotated ``Annotated[type, {option}]``), in
    signature order: name → the option (``help``, ``group``, bounds, ``choices``...) with ``"type"`` (the
    annotation's type name, ``None`` for a union) and ``"default"``."""
    options = {}
    for name, annotation, default in _ctmodule_arguments():
        option = _option(annotation)
        if option is not None:
            options[name] = {**option, "default": default}
    return options
