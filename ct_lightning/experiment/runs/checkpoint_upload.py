"""A run's last checkpoint on a shared store (a tracking server), so that ``--resume`` continues it on any machine.

A run keeps its checkpoints in a folder on the machine that trains it; a finished run logs them to MLflow. On a
shared store a run that stops early (a signal: KILLED; an error: FAILED) uploads its ``last.ckpt`` (and
``best.ckpt``) as the artifacts ``checkpoints/last.ckpt`` and ``checkpoints/best.ckpt`` before it is marked so, and
then records the upload in the tag :data:`UPLOADED_TAG` (the epochs it holds, its size and SHA-256); a finished run
records its final ``last.ckpt`` alike. The tag is the commit mark: an upload cut short (a second signal) leaves no
tag, or one whose digest the file on the server does not match, and ``--resume`` says so instead of resuming from a
partial file. ``--resume`` of a run whose folder is not on this machine fetches the recorded checkpoint into
``mlruns/checkpoints/RUN_ID`` here (downloaded beside it, checked, then moved into place), and so does a folder that
holds fewer epochs than the upload (a shared path resumed elsewhere since).

Cost: nothing per epoch; one upload at the stop (its size and time are printed) and one fetch at a resume elsewhere.
Measured to a server on the same (busy, 2-core) machine: 0.1-0.4 s for a checkpoint up to 1 MB (the loans MLP's is
16 KB), 0.4-1.1 s for 10 MB, 2-4 s for 100 MB, a fetch alike; a finished run adds one digest and one tag (a few ms).
A run killed outright (SIGKILL, a lost node) uploads nothing: its folder stays the only resume point.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

UPLOADED_TAG = "ct.uploaded_checkpoint"  # {"epochs", "bytes", "sha256"} of the artifact checkpoints/last.ckpt


def shared_store(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is a store other machines read (a tracking server, a database server), not a local
    SQLite file or folder whose machine alone holds the checkpoint folders."""
    uri = str(tracking_uri)
    return "://" in uri and not uri.startswith(("sqlite:", "file:"))


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def record_upload(client, run_id: str, last: Path) -> dict:
    """Set :data:`UPLOADED_TAG` for ``last`` (just logged as ``checkpoints/last.ckpt``): its epochs, size and
    digest. The recorded values."""
    from ct_lightning.experiment.runs.lifecycle import completed_epochs  # noqa: PLC0415

    record = {"epochs": completed_epochs(last), "bytes": last.stat().st_size, "sha256": _digest(last)}
    client.set_tag(run_id, UPLOADED_TAG, json.dumps(record))
    return record


def upload_last_checkpoint(client, run_id: str, folder: str | Path) -> str | None:
    """Upload ``folder``'s ``last.ckpt`` (and ``best.ckpt``) to run ``run_id`` as ``checkpoints/``, then record it
    (:func:`record_upload`); the line to print (what, how large, how long), ``None`` where there is no checkpoint.
    Raises what MLflow raises."""
    folder = Path(folder)
    last = folder / "last.ckpt"
    if not last.is_file():
        return None
    started = time.perf_counter()
    files = [path for path in (folder / "best.ckpt", last) if path.is_file()]  # last.ckpt last: it names best
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path="checkpoints")
    record = record_upload(client, run_id, last)
    size = sum(path.stat().st_size for path in files)
    return (f"uploaded {' and '.join(path.name for path in files)} ({_size(size)}, after {record['epochs']} "
            f"epoch(s)) to run {run_id} in {time.perf_counter() - started:.2f} s: --resume {run_id} continues it "
            "on any machine")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{max(1, round(n / 1e3))} KB"


def uploaded_epochs(run) -> int | None:
    """The epochs of the checkpoint the run uploaded (:data:`UPLOADED_TAG`), ``None`` where it uploaded none."""
    text = run.data.tags.get(UPLOADED_TAG)
    try:
        return int(json.loads(text)["epochs"]) if text else None
    except (ValueError, KeyError, TypeError):
        return None


def fetch_uploaded_checkpoint(client, run, folder: str | Path, echo=None) -> Path:
    """Download the run's uploaded ``checkpoints/last.ckpt`` (and ``best.ckpt``) into ``folder`` and return the
    ``last.ckpt`` there: downloaded into a temporary folder beside it, its digest checked against
    :data:`UPLOADED_TAG`, the checkpoint folder it names rewritten to ``folder`` (so that ``best.ckpt`` and the best
    score come back too), then moved into place file by file. A one-line ``ValueError`` where the file on the server
    is not the one recorded."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a line of its own, not a bar
    record = json.loads(run.data.tags[UPLOADED_TAG])
    run_id = run.info.run_id
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=folder))
    try:
        names = {Path(a.path).name for a in client.list_artifacts(run_id, "checkpoints")}
        fetched = {name: Path(client.download_artifacts(run_id, f"checkpoints/{name}", str(staging)))
                   for name in ("last.ckpt", "best.ckpt") if name in names}
        last = fetched.get("last.ckpt")
        if last is None or _digest(last) != record["sha256"]:
            got = "is missing" if last is None else f"is not the one recorded ({last.stat().st_size} bytes, not " \
                f"{record['bytes']})"
            raise ValueError(f"resume: run {run_id}'s uploaded checkpoint checkpoints/last.ckpt {got}: its upload "
                             "was cut short (a second signal?); resume it where its checkpoint folder is "
                             f"({run.data.tags.get('ct.checkpoint_dir')})")
        _moved(last, folder)
        for name in ("best.ckpt", "last.ckpt"):  # last.ckpt last: it names best.ckpt
            if name in fetched:
                os.replace(fetched[name], folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if echo is not None:
        echo(f"resume: fetched run {run_id}'s uploaded checkpoint (after {record['epochs']} epoch(s), "
             f"{_size(record['bytes'])}) into {folder} in {time.perf_counter() - started:.2f} s", flush=True)
    return folder / "last.ckpt"


def _moved(checkpoint: Path, folder: Path) -> None:
    """Rewrite, in place, the checkpoint folder that ``checkpoint``'s checkpoint callbacks name to ``folder``:
    Lightning restores the best score and ``best.ckpt``'s path only where the folder is the one it was saved in."""
    import torch  # noqa: PLC0415

    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    states = [state for state in (payload.get("callbacks") or {}).values()
              if isinstance(state, dict) and state.get("dirpath")]
    if not states:
        return
    for state in states:
        old = str(state["dirpath"])

        def moved(path, old=old):
            return str(folder / Path(path).relative_to(old)) if path and str(path).startswith(old) else path

        state["dirpath"] = str(folder)
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if key in state:
                state[key] = moved(state[key])
        if isinstance(state.get("best_k_models"), dict):
            state["best_k_models"] = {moved(k): v for k, v in state["best_k_models"].items()}
    with open(checkpoint, "wb") as file:  # the staging copy: moved into place only once whole
        torch.save(payload, file)
        file.flush()
        os.fsync(file.fileno())
