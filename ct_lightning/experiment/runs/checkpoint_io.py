"""Checkpoints written atomically in their own folder, with the previous ``last.ckpt`` kept as a fallback.

Lightning's own atomic save writes the temporary file in the system's temp folder and moves it into place; when
that folder is on another filesystem (a tmpfs ``/tmp``, a cluster's scratch space) the move is a copy, and a
full checkpoint filesystem truncates ``last.ckpt`` in the middle of it. Here the temporary file sits beside
its target (same filesystem), is flushed to disk, and replaces the target with one ``os.replace``; the
``last.ckpt`` it replaces becomes ``last-previous.ckpt``, which ``--resume`` uses when ``last.ckpt`` is
unreadable. A failed write removes its temporary file and leaves every earlier checkpoint as it was.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

PREVIOUS_SUFFIX = "-previous"


def previous_of(path: str | Path) -> Path:
    """``last-previous.ckpt`` for ``last.ckpt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}{PREVIOUS_SUFFIX}{path.suffix}")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves are atomic on the checkpoint's own filesystem (see the module)."""

    keep_previous = ("last.ckpt",)

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        """Write ``checkpoint`` to a temporary file beside ``path``, fsync it, then move it into place."""
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO: storage_options are not supported")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        # Serialised in memory first (as Lightning does): a refused write then raises the OSError itself, which
        # torch.save's zip writer would replace by a RuntimeError of its own.
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            with open(temporary, "wb") as file:
                file.write(buffer.getbuffer())
                file.flush()
                os.fsync(file.fileno())
            if path.name in self.keep_previous and path.is_file():
                _keep_copy(path, previous_of(path))
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


def _keep_copy(path: Path, keep: Path) -> None:
    """Make ``keep`` a copy of ``path`` (a hard link where the filesystem has them), replacing it atomically;
    ``path`` itself never goes missing."""
    temporary = keep.with_name(f".{keep.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(path, temporary)
    except OSError:
        shutil.copy2(path, temporary)
    os.replace(temporary, keep)
