"""Generators by name: ``@register_generator("name")`` on a class, ``make_generator(name, ...)`` to build one."""

from __future__ import annotations

import inspect
from collections.abc import Callable

# name -> class (or factory) taking the shared settings it accepts plus its own generator_options.
GENERATORS: dict[str, Callable] = {}
SHARED_SETTINGS = ("lambda_cost", "lambda_energy", "lr")


def register_generator(name: str):
    """Class (or factory) decorator making it available as ``generator=name``.

    The shared settings ``lambda_cost``, ``lambda_energy`` and ``lr`` are passed when its signature
    takes them; ``generator_options`` become its other keyword arguments.
    """

    def decorate(factory):
        if name in GENERATORS:
            raise ValueError(f"generator: {name!r} is registered twice")
        GENERATORS[name] = factory
        if inspect.isclass(factory):
            factory.name = name
        return factory

    return decorate


def generator_class(name: str) -> Callable:
    """The class (or factory) registered under ``name``, with an error naming the allowed ones."""
    key = name.lower()
    if key not in GENERATORS:
        raise ValueError(f"generator: unknown {name!r}; allowed: {', '.join(sorted(GENERATORS))}")
    return GENERATORS[key]


def make_generator(name: str, lambda_cost: float = 0.001, lambda_energy: float = 5.0, lr: float = 0.25,
                   **options):
    """Build a registered generator by name; ``options`` are generator-specific settings."""
    factory = generator_class(name)
    parameters = inspect.signature(factory).parameters
    shared = {k: v for k, v in zip(SHARED_SETTINGS, (lambda_cost, lambda_energy, lr)) if k in parameters}
    own = [p for p in parameters if p not in SHARED_SETTINGS]
    if options and not own:
        raise ValueError(f"generator_options: {name.lower()} takes none, got {sorted(options)}")
    try:
        return factory(**shared, **options)
    except TypeError as error:
        raise ValueError(f"generator_options: {name.lower()}: {error}") from None
