"""Find a raw data file, or download it from its public source, verified and written atomically.

A download is streamed into a temporary file in the target folder (with a tqdm progress bar),
checked against the expected size and sha256, and only then moved into place with
``os.replace``; on any failure the temporary file is removed, so a half-written file never
appears under the final name. Files without a public, unauthenticated source (or with
downloads disabled by ``download=False`` or ``CT_OFFLINE=1``) raise ``FileNotFoundError``
naming the file, its expected path and where to get it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from datamodules.paths import DATA_DIR_ENV, OFFLINE_ENV, offline, progress_shown

CHUNK = 1 << 20
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RawFile:
    """One raw file of a data set: where it lives, how to check it and where it comes from.

    ``size``/``sha256`` describe the file as stored (``None``: not checked). When ``archive_member``
    is set, ``urls`` point to a ``.tar.gz`` (checked against ``archive_sha256``) holding the file.
    ``source`` tells a person where to get the file by hand.
    """

    dataset: str
    filename: str
    size: int | None
    sha256: str | None
    urls: tuple[str, ...] = ()
    source: str = ""
    archive_member: str | None = None
    archive_sha256: str | None = None

    def path(self, data_dir: Path) -> Path:
        """The expected location ``<data_dir>/<dataset>/<filename>``."""
        return Path(data_dir) / self.dataset / self.filename


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _missing_message(raw: RawFile, path: Path, reason: str) -> str:
    """The text of the FileNotFoundError for a raw file that is not there."""
    where = f" Get it from {raw.source}" if raw.source else ""
    return (f"{raw.dataset}: raw file {raw.filename!r} not found at {path} ({reason}).{where} and put it at "
            f"that path, or point data_dir / ${DATA_DIR_ENV} at a folder laid out as <set>/<file> "
            f"(e.g. shared/data/raw).")


@contextmanager
def _temporary_file(folder: Path, name: str):
    """A temporary file in ``folder`` (same file system as the target), removed unless moved away."""
    handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".part")
    os.close(handle)
    temp = Path(temp)
    try:
        yield temp
    finally:
        temp.unlink(missing_ok=True)


def _stream(url: str, target: Path, description: str, timeout: float) -> tuple[int, str]:
    """Copy ``url`` into ``target`` with a progress bar; return the byte count and sha256."""
    digest, size = hashlib.sha256(), 0
    with urllib.request.urlopen(url, timeout=timeout) as response, open(target, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=description, leave=False,
                  disable=not progress_shown()) as bar:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                bar.update(len(chunk))
    return size, digest.hexdigest()


def _check(label: str, size: int, sha256: str, expected_size: int | None, expected_sha256: str | None) -> None:
    """Raise ``OSError`` when a download's size or checksum is not the expected one."""
    if expected_size is not None and size != expected_size:
        raise OSError(f"{label}: got {size} bytes, expected {expected_size}")
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise OSError(f"{label}: sha256 {sha256} does not match the expected {expected_sha256}")


def _download(raw: RawFile, url: str, path: Path, timeout: float) -> None:
    """Download ``url`` (extracting the archive member if any), verify it and move it to ``path``."""
    with _temporary_file(path.parent, raw.filename) as temp:
        if raw.archive_member is None:
            size, sha256 = _stream(url, temp, raw.filename, timeout)
        else:
            with _temporary_file(path.parent, raw.filename + ".archive") as archive:
                _check(url, *_stream(url, archive, raw.filename, timeout), None, raw.archive_sha256)
                with tarfile.open(archive, mode="r:gz") as tar:
                    member = tar.extractfile(raw.archive_member)
                    if member is None:
                        raise OSError(f"{url}: archive has no file {raw.archive_member!r}")
                    with member, open(temp, "wb") as out:
                        shutil.copyfileobj(member, out, CHUNK)
            size, sha256 = temp.stat().st_size, sha256_of(temp)
        _check(url, size, sha256, raw.size, raw.sha256)
        os.chmod(temp, 0o644)  # mkstemp creates 0600
        os.replace(temp, path)


def fetch(raw: RawFile, data_dir: Path, download: bool = True, timeout: float = TIMEOUT_S) -> Path:
    """The path of ``raw`` under ``data_dir``, downloading it first if it is missing.

    Raises ``FileNotFoundError`` (naming the file, its expected path and its source) when the
    file is missing and cannot be downloaded: no public source, downloads disabled
    (``download=False`` or ``CT_OFFLINE=1``), or every download attempt failed.
    """
    path = raw.path(data_dir)
    if path.is_file():
        return path
    if not raw.urls:
        raise FileNotFoundError(_missing_message(raw, path, "it has no public unauthenticated download"))
    if not download or offline():
        why = f"${OFFLINE_ENV} is set" if offline() else "download=False"
        raise FileNotFoundError(_missing_message(raw, path, f"automatic download disabled: {why}"))
    errors = []
    for url in raw.urls:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _download(raw, url, path, timeout)
            return path
        except (OSError, tarfile.TarError, ValueError) as error:  # URLError and HTTPError are OSErrors
            errors.append(f"{url}: {error}")
    raise FileNotFoundError(_missing_message(raw, path, "download failed: " + "; ".join(errors)))
