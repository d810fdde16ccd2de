"""Parsers for the raw file formats, with clear ``ValueError``s for malformed files.

CSV readers check the columns (naming the missing ones and the file) and that numeric columns
are numeric; the IDX reader checks the magic number and that the byte count matches the
header (a truncated download fails loudly instead of yielding a short data set).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
GZIP_MAGIC = b"\x1f\x8b"


def read_csv_columns(path: Path, required: list[str], **kwargs) -> pd.DataFrame:
    """Read a CSV with a header row and check that it has all ``required`` columns."""
    frame = pd.read_csv(path, **kwargs)
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; the file has {list(frame.columns)}")
    return frame


def read_headerless(path: Path, names: list[str], **kwargs) -> pd.DataFrame:
    """Read a CSV without header row that must have exactly ``len(names)`` fields per line."""
    frame = pd.read_csv(path, header=None, **kwargs)
    if frame.shape[1] != len(names):
        raise ValueError(f"{path}: expected {len(names)} comma-separated fields per line "
                         f"({', '.join(names)}), found {frame.shape[1]}")
    frame.columns = names
    return frame


def require_numeric(frame: pd.DataFrame, columns: list[str], path: Path) -> pd.DataFrame:
    """Convert ``columns`` to float, raising a ``ValueError`` naming those with non-numeric values."""
    converted = frame[columns].apply(pd.to_numeric, errors="coerce")
    bad = [c for c in columns if (converted[c].isna() & frame[c].notna()).any()]
    if bad:
        raise ValueError(f"{path}: non-numeric values in columns {bad}")
    out = frame.copy()
    out[columns] = converted.astype(float)
    return out


def require_complete(frame: pd.DataFrame, columns: list[str], path: Path) -> None:
    """Raise a ``ValueError`` naming the ``columns`` that have missing values."""
    bad = [c for c in columns if frame[c].isna().any()]
    if bad:
        counts = {c: int(frame[c].isna().sum()) for c in bad}
        raise ValueError(f"{path}: missing values in columns {counts}")


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Read an IDX file (gzipped or plain) of unsigned bytes; check magic number and length."""
    raw = Path(path).read_bytes()
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as error:
            raise ValueError(f"{path}: truncated or corrupt gzip stream ({error})") from error
    if len(raw) < 4:
        raise ValueError(f"{path}: too short for an IDX file ({len(raw)} bytes)")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: IDX magic number {found}, expected {magic}")
    n_dims = magic & 0xFF
    header = 4 + 4 * n_dims
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(n_dims))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise ValueError(f"{path}: IDX header says shape {shape} ({expected} bytes) but the data has "
                         f"{len(raw)} bytes (truncated or corrupt file)")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)
