"""The one "did you mean" of a refusal: the allowed name an unknown one is probably a misspelling of.

Used wherever a data spec or a table is read (an unknown spec key, an ordinal value outside its order, an unknown
column in a row bound) and by everything above (``datamodules`` is the lowest layer: plain Python, no imports of ours).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable
from pathlib import Path

CUTOFF = 0.75  # difflib's similarity ratio from which a name is suggested ('agee' → 'age' 0.86; 'nope' → 'none' 0.75)


def closest(value, allowed: Iterable) -> str | None:
    """The allowed name (as text) most like ``value`` at a similarity of :data:`CUTOFF` or more, case ignored, else
    ``None``."""
    names = [str(name) for name in allowed]
    folded = {}
    for name in names:
        folded.setdefault(name.casefold(), name)  # the first of names that differ only in case
    close = difflib.get_close_matches(str(value).casefold(), list(folded), n=1, cutoff=CUTOFF)
    return folded[close[0]] if close else None


def did_you_mean(value, allowed: Iterable) -> str:
    """``" (did you mean 'age'?)"`` for the name :func:`closest` finds, else ``""``: to append to a refusal."""
    close = closest(value, allowed)
    return f" (did you mean {close!r}?)" if close is not None else ""


def name_hint(value, allowed: Iterable, wrap: str = " ({})") -> str:
    """The hint for an unknown column or feature name, put into ``wrap``: ``" (did you mean 'Age'? names are
    case-sensitive)"`` where one allowed name differs only in case, else ``" (did you mean 'age'?)"`` for the name
    :func:`closest` finds, else ``""``."""
    names = [str(name) for name in allowed]
    composed = unicodedata.normalize("NFC", str(value))
    accents = [name for name in names if name != str(value) and unicodedata.normalize("NFC", name) == composed]
    if accents:  # the same letters, an accent written as its own character (NFD) on one side
        return wrap.format(f"did you mean {accents[0]!r}? the same letters, its accents written another way")
    same = [name for name in names if name.casefold() == str(value).casefold()]
    close = same[0] if same else closest(value, names)
    if close is None:
        return ""
    return wrap.format(f"did you mean {close!r}?" + (" names are case-sensitive" if same else ""))


def label_hint(value, labels: Iterable[tuple[str, str | None, str | None]], wrap: str = " ({})") -> str:
    """The hint for a name that is a column's words in the data spec, put into ``wrap``: ``'Yearly income'`` (or
    ``'Yearly income ($)'``, as explanations write it) ``is the data spec's label of 'income': name the column,
    income``; ``labels``: ``(column, label, unit)`` for each column (``None`` where the spec gives none); else ``""``."""
    for column, label, unit in labels:
        shown = {label.casefold(), f"{label} ({unit})".casefold()} if label and unit else {label.casefold()} if label \
            else set()
        if str(value).strip().casefold() in shown:
            return wrap.format(f"{value!r} is the data spec's label of {column!r}: name the column, {column}")
    return ""


def path_hint(path, wrap: str = " ({})") -> str:
    """The hint for a file path that is not there, put into ``wrap``: ``" (did you mean 'bl/last.ckpt'?)"`` where each
    missing part of it has a close name (:func:`closest`) in the folder before it and the path so mended is a file,
    else ``""``."""
    given = Path(str(path)).expanduser()
    mended = Path(given.anchor) if given.is_absolute() else Path()
    for part in given.parts[1 if given.is_absolute() else 0:]:
        if not (mended / part).exists():
            try:
                part = closest(part, [entry.name for entry in mended.iterdir()]) or ""
            except OSError:  # a file where a folder should be, or one that cannot be listed
                return ""
            if not part:
                return ""
        mended = mended / part
    if mended == given or not mended.is_file():
        return ""
    return wrap.format(f"did you mean {str(mended)!r}?")
