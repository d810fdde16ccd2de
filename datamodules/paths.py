"""Where raw data files are read from and where preprocessed caches are written.

Raw files: the ``data_dir`` argument, else ``$CT_DATA_DIR``, else ``<user cache>/data``.
Processed caches: the ``cache_dir`` argument, else ``$CT_CACHE_DIR``, else ``<user cache>/processed``.
The user cache is ``$XDG_CACHE_HOME/ct-lightning`` (``~/.cache/ct-lightning`` when unset).
Inside a data dir the layout is ``<data_dir>/<set>/<file>``, as in ``shared/data/raw``.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "CT_DATA_DIR"
CACHE_DIR_ENV = "CT_CACHE_DIR"
OFFLINE_ENV = "CT_OFFLINE"
PROGRESS_ENV = "CT_PROGRESS"  # "0": a recipe's --no-progress (download bars hidden), seen by worker processes too


def progress_shown() -> bool:
    """Whether progress displays are wanted (not under a recipe's ``--no-progress``)."""
    return os.environ.get(PROGRESS_ENV) != "0"


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/ct-lightning``, or ``~/.cache/ct-lightning`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ct-lightning"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding ``<set>/<file>`` raw files: argument, ``$CT_DATA_DIR``, user cache."""
    chosen = data_dir or os.environ.get(DATA_DIR_ENV) or user_cache_root() / "data"
    return Path(chosen).expanduser()


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder for preprocessed ``.npz`` caches: argument, ``$CT_CACHE_DIR``, user cache."""
    chosen = cache_dir or os.environ.get(CACHE_DIR_ENV) or user_cache_root() / "processed"
    return Path(chosen).expanduser()


def offline() -> bool:
    """Whether downloads are disabled by ``CT_OFFLINE`` (any value but empty, 0, false, no)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")
