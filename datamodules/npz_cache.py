"""Cache of preprocessed splits as ``.npz`` files, keyed on the raw files and the options.

The key hashes each raw file's name, size and modification time together with the
preprocessing options (sizes, seeds, format version), so editing or replacing a raw file, or
asking for other sizes, builds a new cache entry. Files are written to a temporary file in
the cache folder and moved into place with ``os.replace``: a reader never sees a partial
cache. A cache that cannot be read is ignored (and rebuilt); one that cannot be written
(read-only folder) only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np

CACHE_FORMAT = 1


def cache_key(name: str, raw_paths: list[Path], options: dict) -> str:
    """A short hex key for data set ``name`` built from ``raw_paths`` with ``options``."""
    files = []
    for path in raw_paths:
        stat = Path(path).stat()
        files.append([Path(path).name, stat.st_size, stat.st_mtime_ns])
    payload = json.dumps({"format": CACHE_FORMAT, "set": name, "files": files, "options": options},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def cache_file(cache_dir: Path, name: str, key: str) -> Path:
    """Where the cache entry ``key`` of data set ``name`` lives."""
    return Path(cache_dir) / name / f"{name}-{key}.npz"


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays stored at ``path``, or ``None`` when there is no readable cache there."""
    if not Path(path).is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        warnings.warn(f"ignoring unreadable data cache {path}: {error}", stacklevel=2)
        return None


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> bool:
    """Write ``arrays`` to ``path`` atomically; return whether the cache was written."""
    path = Path(path)
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz.part")
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **arrays)
        os.chmod(temp, 0o644)  # mkstemp creates 0600
        os.replace(temp, path)
        temp = None
        return True
    except OSError as error:
        warnings.warn(f"could not write data cache {path} ({error}); set cache_dir or $CT_CACHE_DIR "
                      "to a writable folder to cache preprocessing", stacklevel=2)
        return False
    finally:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
