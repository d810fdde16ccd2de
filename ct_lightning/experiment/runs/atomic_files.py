"""Result files written atomically: a temporary file beside the target, then one rename (readers never see half)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_json_atomic(path: str | os.PathLike, payload, strict: bool = False, readable: bool = False) -> None:
    """Write ``payload`` as JSON (UTF-8) to ``path`` via a temporary file and an atomic rename. ``strict``: NaN and
    infinities as ``null``, so that any JSON parser reads the file (Python's own ``NaN`` is not JSON); off for
    files this project reads back itself, where a missing value must stay a float. ``readable``: text as written
    (``"männlich"``), not in ASCII escapes (``"m\\u00e4nnlich"``), for a file people open (explanations)."""
    if strict:
        payload = finite_or_null(payload)
    write_text_atomic(path, json.dumps(payload, indent=2, default=str, allow_nan=not strict,
                                       ensure_ascii=not readable))


def finite_or_null(value):
    """``value`` with every non-finite float, at any depth of dicts, lists and tuples, replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(inner) for key, inner in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(inner) for inner in value]
    return value


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` in UTF-8 via a temporary file and an atomic rename."""
    with atomic_file(path) as temporary:
        temporary.write_text(text, encoding="utf-8")


def write_json_new(path: str | os.PathLike, payload, **options) -> Path:
    """Write ``payload`` as :func:`write_json_atomic` does, but never over an existing file: the finished file is
    hard-linked into place, which fails where a file is; where ``path`` exists by then (another process wrote it since
    the start-up check), it goes to the first free ``NAME-2.json``, ``NAME-3.json``, ... Returns the path written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as folder:
        temporary = Path(folder) / path.name
        write_json_atomic(temporary, payload, **options)
        for number in range(1, 10_000):
            target = path if number == 1 else path.with_name(f"{path.stem}-{number}{path.suffix}")
            try:
                os.link(temporary, target)
            except FileExistsError:
                continue
            return target
    raise FileExistsError(f"{path}: no free name beside it")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside ``path`` to write (its folder created, mode 0644: results are meant to be shared),
    renamed onto ``path`` in one step when the block ends, removed if it raises: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    os.chmod(temporary, 0o644)  # mkstemp makes 0600
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
