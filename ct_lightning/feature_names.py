"""Features as a user names them (``--immutable age``, ``--mutability debt=decrease``), in plain Python.

The mutability kinds, the split of ``FEATURE=KIND`` text and the one message for a name that is no feature: used by
:func:`ct_lightning.constraints.parse_mutability` in every training, and by the recipes to refuse such a name against
a table's header before torch is imported (``ct_lightning.experiment.configuration.table_columns``).
"""

from __future__ import annotations

from collections.abc import Sequence

from datamodules.suggest import name_hint

MUTABILITY_KINDS = ("both", "increase", "decrease", "none")
SHOWN_FEATURES = 30  # the known features an error lists


def mutability_pairs(text: str, argument: str = "mutability") -> dict[str, str]:
    """Split ``"age=none,hours_per_week=increase"`` into ``{feature: kind}`` (kinds checked later); each item is split
    at its last ``=``: a column may hold ``=`` in its name."""
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{argument}: expected FEATURE=KIND, got {item!r} "
                             f"(KIND one of {', '.join(MUTABILITY_KINDS)})")
        name, kind = item.rsplit("=", 1)
        pairs[name.strip()] = kind.strip()
    return pairs


def unknown_feature_error(argument: str, key, features: Sequence[str]) -> ValueError:
    """The one-line error for ``key``, named by ``argument`` (``immutable``, ``mutability``), that is none of
    ``features`` (the features by the names a user gives: a one-hot group once, by its column)."""
    shown = ", ".join(features[:SHOWN_FEATURES]) + (" ..." if len(features) > SHOWN_FEATURES else "")
    hint = name_hint(key, features) if isinstance(key, str) else ""
    return ValueError(f"{argument}: unknown feature {key!r}{hint}; known features: {shown or '(none named)'}")
