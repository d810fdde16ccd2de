"""Features as a user names them (``--immutable age``, ``--mutability debt=decrease``), in plain Python.

The mutability kinds, the split of ``FEATURE=KIND`` text and the one message for a name that is no feature: used by
:func:`ct_lightning.constraints.parse_mutability` in every training, and by the recipes to refuse such a name against
a table's header before torch is imported (``ct_lightning.experiment.configuration.table_columns``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from datamodules.suggest import label_hint, name_hint

MUTABILITY_KINDS = ("both", "increase", "decrease", "none")
SHOWN_FEATURES = 30  # the known features an error lists


class KindConflict(ValueError):
    """One feature given two kinds: ``argument``, the ``value`` given, the ``detail`` and what is ``allowed``, for a
    caller that names its own option (a served model's ``params: mutability``, explain.py's ``--mutability``)."""

    def __init__(self, argument: str, value: str, detail: str, allowed: str):
        self.argument, self.value, self.detail, self.allowed = argument, value, detail, allowed
        super().__init__(f"{argument}: got {value!r} ({detail}); allowed: {allowed}")


def mutability_pairs(text: str, argument: str = "mutability") -> dict[str, str]:
    """Split ``"age=none,hours_per_week=increase"`` into ``{feature: kind}`` (kinds checked later); each item is split
    at its last ``=``: a column may hold ``=`` in its name. A feature given two different kinds
    (``debt=increase,debt=decrease``) is a one-line ``ValueError``: neither can be meant."""
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{argument}: expected FEATURE=KIND, got {item!r} "
                             f"(KIND one of {', '.join(MUTABILITY_KINDS)})")
        name, kind = (part.strip() for part in item.rsplit("=", 1))
        if pairs.get(name, kind) != kind:
            raise KindConflict(argument, text, f"{name!r} given two kinds, {pairs[name]} and {kind}",
                               "one kind per feature")
        pairs[name] = kind
    return pairs


def immutable_conflict(immutable: Sequence[str], mutability: dict[str, str], argument: str = "mutability",
                       held_by: str = "given as immutable") -> KindConflict | None:
    """The one-line error for a feature that ``immutable`` (names) holds fixed and ``mutability`` (``{feature:
    kind}``, :func:`mutability_pairs`) lets change, named by ``argument``; ``None`` if there is none (the same
    feature as ``none`` in both is fine). ``held_by``: what holds them, in words (``held by --protect``)."""
    fixed = set(immutable)
    for name, kind in mutability.items():
        if name in fixed and kind != "none":
            return KindConflict(argument, f"{name}={kind}", f"{name!r} is also {held_by}",
                                f"{name}=none, or {name!r} in only one of them")
    return None


def loosened_kind(data_kinds: Mapping[str, str], mutability: Mapping[str, str], source: str = "the data spec",
                  argument: str = "mutability", remedy: str | None = None) -> KindConflict | None:
    """The one-line error for a feature that ``mutability`` (``{feature: kind}``, given by ``argument``) lets change
    more than the data's own kind for it (``data_kinds``, a data spec's ``mutability`` by column, named by
    ``source``): ``age: increase`` in a data spec is a fact about the data (an applicant cannot get younger), so
    ``age=both`` or ``age=decrease`` is refused; the same kind or ``none`` (holding it fixed on top) is fine.
    ``remedy``: the other way out, in words (default: change ``source``). ``None`` if there is none."""
    for name, kind in mutability.items():
        held = data_kinds.get(name, "both")
        if held not in ("both", kind) and kind != "none":
            allowed = f"{name}=none" if held == "none" else f"{name}={held} or {name}=none"
            return KindConflict(argument, f"{name}={kind}", f"{name!r} is {held} in {source}, a fact about the data "
                                "that holds in every training and evaluation",
                                f"{allowed}, or {remedy or f'change {source}'}")
    return None


def unknown_feature_error(argument: str, key, features: Sequence[str],
                          labels: Iterable[tuple[str, str | None, str | None]] = ()) -> ValueError:
    """The one-line error for ``key``, named by ``argument`` (``immutable``, ``mutability``), that is none of
    ``features`` (the features by the names a user gives: a one-hot group once, by its column), in the form of
    :class:`KindConflict`: the name it is probably a misspelling of, or the column whose data spec words it is
    (``labels``: ``(column, label, unit)``, :func:`~datamodules.suggest.label_hint`)."""
    shown = ", ".join(features[:SHOWN_FEATURES]) + (" ..." if len(features) > SHOWN_FEATURES else "")
    hint = name_hint(key, features, "; {}") or label_hint(key, labels, "; {}") if isinstance(key, str) else ""
    return ValueError(f"{argument}: got {key!r} (unknown feature{hint}); allowed: the features: "
                      f"{shown or '(none named)'}")
