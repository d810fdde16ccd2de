"""Registry of data modules, so that recipes find a data set by name."""

from __future__ import annotations

from collections.abc import Callable

_REGISTRY: dict[str, Callable] = {}
_ALIASES: dict[str, str] = {}
_CATALOGUE_LOADED = False


def _load_catalogue() -> None:
    """Import every module of the ``datamodules`` package once (registration happens in the decorators)."""
    global _CATALOGUE_LOADED
    if _CATALOGUE_LOADED:
        return
    _CATALOGUE_LOADED = True
    import importlib
    import pkgutil

    import datamodules

    for module in pkgutil.iter_modules(datamodules.__path__, "datamodules."):
        importlib.import_module(module.name)


def register(name: str, *aliases: str):
    """Class decorator that makes a data module available as ``--data name`` (and aliases)."""

    def decorate(cls):
        _REGISTRY[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        cls.name = name
        return cls

    return decorate


def available() -> list[str]:
    """Canonical names of all registered data sets."""
    _load_catalogue()
    return sorted(_REGISTRY)


def canonical_name(name: str) -> str:
    """Resolve an alias (e.g. ``ch``) to the registered name, or raise a clear error."""
    _load_catalogue()
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        aliases = ", ".join(f"{a}→{n}" for a, n in sorted(_ALIASES.items()))
        raise ValueError(f"data: unknown data set {name!r}; allowed: {', '.join(available())}"
                         + (f" (aliases: {aliases})" if aliases else ""))
    return key


def get_datamodule_class(name: str):
    """The data module class registered under ``name``."""
    return _REGISTRY[canonical_name(name)]


def get_datamodule(name: str, **kwargs):
    """Instantiate the data module registered under ``name`` with ``kwargs``."""
    return get_datamodule_class(name)(**kwargs)
