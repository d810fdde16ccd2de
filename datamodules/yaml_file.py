"""YAML read strictly: a key written twice in one mapping is an error, not a silent last-one-wins."""
from __future__ import annotations

import yaml


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        """The mapping, after checking that no key is written twice in it."""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark,
                        f"found {key!r} twice (a key may be written once)", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(stream):
    """The value of a YAML (or JSON) text or open file, safe types only; a repeated key raises ``yaml.YAMLError``."""
    return yaml.load(stream, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(error: Exception) -> str:
    """A YAML (or decoding) error in one short line: ``line 3, column 22: found 'tau' twice (...)``."""
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(error, "problem", None) or getattr(error, "reason", None) or str(error)
    return " ".join(f"{where}{problem}".split())
