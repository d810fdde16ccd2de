"""A run's outbox: what a tracking server could not take during an outage, kept on disk and sent later.

While the server is unreachable (after MLflow's own retries, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and
``MLFLOW_HTTP_REQUEST_TIMEOUT``), :class:`OutboxClient` appends each write of the run (metrics, parameters,
tags, artifacts, its end) to ``journal.jsonl`` in the run's ``mlflow-outbox/`` folder (beside its
checkpoints; artifacts are copied there) and the training goes on. Every few seconds a write first asks
the server's ``/health``; once it answers, the journal is replayed in order and writing goes direct again.

Replaying is idempotent: ``replayed.json`` counts the records already sent, and metric points the run's
history already holds (same key, step, timestamp and value) are not sent again, so a replay cut short
by a second outage, or run twice, duplicates nothing. A run whose end found the server still down keeps
its last records here; ``python -m ct_lightning.experiment.runs.upload FOLDER`` sends them and ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ct_lightning.experiment.runs.tracking_server import is_outage, server_answers

OUTBOX_DIR = "mlflow-outbox"
JOURNAL = "journal.jsonl"
REPLAYED = "replayed.json"
RUN_FILE = "run.json"
FINAL_STATE = "final_state.pt"
PROBE_ENV = "CT_TRACKING_PROBE_SECONDS"  # how often a write asks a down server whether it is back (default 10)
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # MLflow's limits per log_batch


class Outbox:
    """The append-only journal of one run's unsent writes, and the copies of its unsent files."""

    def __init__(self, folder: str | os.PathLike, run: dict | None = None):
        self.folder = Path(folder)
        self.run = run  # what the upload command needs to know: run_id, tracking_uri, experiment_id

    def about(self) -> dict:
        """The outbox's ``run.json``: its run id, tracking URI and experiment id."""
        try:
            return json.loads((self.folder / RUN_FILE).read_text())
        except (OSError, ValueError):
            return {}

    @property
    def journal(self) -> Path:
        """The JSON-lines file of records, one write each."""
        return self.folder / JOURNAL

    def append(self, record: dict) -> None:
        """Add ``record`` as one line (one ``write`` on an ``O_APPEND`` file, then ``fsync``): a crash can only
        cut the last line short, and a cut line is skipped (and closed by the next append)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.run and not (self.folder / RUN_FILE).is_file():
            from ct_lightning.experiment.runs.atomic_files import write_json_atomic

            write_json_atomic(self.folder / RUN_FILE, self.run)
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size:
                with open(self.journal, "rb") as handle:
                    handle.seek(size - 1)
                    if handle.read(1) != b"\n":
                        line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def keep(self, path: str | os.PathLike) -> str:
        """Copy the file or folder ``path`` into the outbox (under its own name); returns the copy's relative path."""
        path = Path(path)
        slot = self.folder / "files" / f"{time.time_ns()}"
        temporary = slot.with_name(slot.name + ".part")
        temporary.mkdir(parents=True)
        if path.is_dir():
            shutil.copytree(path, temporary / path.name)
        else:
            shutil.copy2(path, temporary / path.name)
        os.replace(temporary, slot)  # a copy is whole or absent
        return str((slot / path.name).relative_to(self.folder))

    def records(self) -> list[dict]:
        """Every whole record, in order."""
        if not self.journal.is_file():
            return []
        out = []
        for line in self.journal.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash while it was written
                continue
        return out

    def replayed(self) -> int:
        """How many records have been sent."""
        try:
            return int(json.loads((self.folder / REPLAYED).read_text())["records"])
        except (OSError, ValueError, KeyError):
            return 0

    def mark_replayed(self, count: int) -> None:
        """Record that the first ``count`` records have been sent."""
        from ct_lightning.experiment.runs.atomic_files import write_json_atomic

        write_json_atomic(self.folder / REPLAYED, {"records": count})

    def pending(self) -> list[dict]:
        """The records not sent yet."""
        return self.records()[self.replayed():]

    @contextlib.contextmanager
    def lock(self):
        """An inter-process lock on the outbox, so a training and an upload command never replay at once."""
        from ct_lightning.experiment.runs.tracking import store_lock

        with store_lock(self.folder):
            yield


def _metric_row(metric) -> list:
    return [metric.key, float(metric.value), int(metric.timestamp), int(metric.step or 0)]


def replay(client, outbox: Outbox, end=None) -> int:
    """Send ``outbox``'s unsent records through ``client`` in order; returns how many were sent.

    ``end(client, record, outbox)`` completes an ``end`` record (the deferred end of a training: its models,
    plots and FINISHED); without it such a record stops the replay with a ``ValueError``. A failure raises,
    the records sent so far stay counted.
    """
    with outbox.lock():
        records, start = outbox.records(), outbox.replayed()
        histories: dict[tuple[str, str], set] = {}
        for index in range(start, len(records)):
            record = records[index]
            if record["op"] == "end":
                if end is None:
                    raise ValueError(f"the outbox {outbox.folder} holds the end of run {record['run_id']}; "
                                     f"send it with: {upload_command(outbox.folder)}")
                end(client, record, outbox)
            else:
                _send(client, record, outbox, histories)
            outbox.mark_replayed(index + 1)
        return len(records) - start


def _send(client, record: dict, outbox: Outbox, histories: dict) -> None:
    """Send one journal record (metric points the run already holds are left out)."""
    from mlflow.entities import Metric, Param, RunTag

    op, run_id = record["op"], record.get("run_id")
    if op == "log_batch":
        metrics = []
        for key, value, timestamp, step in record.get("metrics", []):
            if (run_id, key) not in histories:
                histories[run_id, key] = {(m.step, m.timestamp, m.value) for m in
                                          client.get_metric_history(run_id, key)}
            if (step, timestamp, value) not in histories[run_id, key]:
                metrics.append(Metric(key, value, timestamp, step))
                histories[run_id, key].add((step, timestamp, value))
        params = [Param(k, v) for k, v in record.get("params", [])]
        tags = [RunTag(k, v) for k, v in record.get("tags", [])]
        for start in range(0, max(len(metrics), 1), MAX_METRICS):
            if metrics[start:start + MAX_METRICS]:
                client.log_batch(run_id, metrics=metrics[start:start + MAX_METRICS])
        for start in range(0, len(params), MAX_PARAMS):
            client.log_batch(run_id, params=params[start:start + MAX_PARAMS])
        for start in range(0, len(tags), MAX_TAGS):
            client.log_batch(run_id, tags=tags[start:start + MAX_TAGS])
    elif op == "delete_tag":
        if record["key"] in client.get_run(run_id).data.tags:
            client.delete_tag(run_id, record["key"])
    elif op == "log_artifact":
        client.log_artifact(run_id, str(outbox.folder / record["file"]), record.get("artifact_path"))
    elif op == "log_artifacts":
        client.log_artifacts(run_id, str(outbox.folder / record["file"]), record.get("artifact_path"))
    elif op == "log_dict":
        client.log_dict(run_id, record["dictionary"], record["artifact_file"])
    elif op == "set_terminated":
        client.set_terminated(run_id, record.get("status"), record.get("end_time"))
    elif op != "run":
        raise ValueError(f"outbox {outbox.folder}: unknown record {op!r}")


def upload_command(folder: str | os.PathLike) -> str:
    """The shell command that sends an outbox's records and ends its run (works as printed)."""
    import shlex

    return " ".join(shlex.quote(part) for part in
                    [sys.executable, "-m", "ct_lightning.experiment.runs.upload", str(Path(folder).resolve())])


class OutboxClient:
    """An ``MlflowClient`` for one run against a tracking server that keeps writing through an outage.

    Writes go to the server while it answers; one that fails because the server cannot be reached (after
    MLflow's own retries) goes to the :class:`Outbox` instead, and so do the next ones until the server
    answers ``/health`` again (asked at most every ``probe_seconds``); then the outbox is replayed first.
    Reads and every other method go to the wrapped client unchanged. Until :meth:`attach` names the outbox
    folder, a failed write raises as before.
    """

    def __init__(self, client, tracking_uri: str, echo=None, probe_seconds: float | None = None):
        self._client = client
        self.tracking_uri = tracking_uri
        self.outbox: Outbox | None = None
        self.echo = echo or (lambda *a, **k: print(*a, file=sys.stderr, **k))
        self.probe_seconds = float(os.environ.get(PROBE_ENV, 10) if probe_seconds is None else probe_seconds)
        self.offline = False
        self._probed = 0.0

    def __getattr__(self, name):
        return getattr(self._client, name)

    def attach(self, folder: str | os.PathLike, run_id: str, experiment_id: str) -> None:
        """Keep unsent writes in ``folder`` (the run's ``mlflow-outbox``) from now on."""
        self.outbox = Outbox(folder, {"run_id": run_id, "tracking_uri": self.tracking_uri,
                                      "experiment_id": experiment_id})
        if self.outbox.pending():  # left by an earlier attempt of this run (resumed): sent at the first write
            self.offline, self._probed = True, 0.0

    def went_offline(self, error: BaseException) -> None:
        """Note that the server cannot be reached (``error`` says why); the next writes go to the outbox."""
        if not self.offline:
            reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            where = f"they wait in {self.outbox.folder}" if self.outbox else "nothing can be kept yet"
            self.echo(f"tracking server {self.tracking_uri} unreachable ({reason}); training goes on, the run's "
                      f"records are kept on disk until it answers again: {where}", flush=True)
        self.offline = True
        self._probed = time.monotonic()

    def reconnect(self, force: bool = False) -> bool:
        """Whether writes can go to the server: if it was down and answers again (asked at most every
        ``probe_seconds`` unless ``force``), the outbox is replayed first."""
        if not self.offline:
            return True
        if not force and time.monotonic() - self._probed < self.probe_seconds:
            return False
        self._probed = time.monotonic()
        if not server_answers(self.tracking_uri):
            return False
        try:
            sent = replay(self._client, self.outbox) if self.outbox else 0
        except Exception as error:  # noqa: BLE001 - stay on the outbox; nothing is lost, the upload command says why
            if not is_outage(error):
                self.echo(f"tracking server {self.tracking_uri} answers again, but sending the outbox failed "
                          f"({str(error).splitlines()[0][:200]}); records stay in {self.outbox.folder}", flush=True)
            self._probed = time.monotonic()
            return False
        self.offline = False
        self.echo(f"tracking server {self.tracking_uri} answers again: {sent} kept record(s) sent", flush=True)
        return True

    def _write(self, send, record):
        if self.outbox is None:
            return send()
        if self.offline and not self.reconnect():
            self.outbox.append(record())
            return None
        try:
            return send()
        except Exception as error:
            if not is_outage(error):
                raise
            self.went_offline(error)
            self.outbox.append(record())
            return None

    # The writes a training makes (our code and Lightning's MLFlowLogger); each has its journal record.
    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):  # noqa: D102
        metrics, params, tags = list(metrics), list(params), list(tags)
        return self._write(lambda: self._client.log_batch(run_id, metrics=metrics, params=params, tags=tags),
                           lambda: {"op": "log_batch", "run_id": run_id, "metrics": [_metric_row(m) for m in metrics],
                                    "params": [[p.key, str(p.value)] for p in params],
                                    "tags": [[t.key, str(t.value)] for t in tags]})

    def log_metric(self, run_id, key, value, timestamp=None, step=None, **kwargs):  # noqa: D102
        timestamp = int(timestamp if timestamp is not None else time.time() * 1000)
        return self._write(lambda: self._client.log_metric(run_id, key, value, timestamp, step or 0),
                           lambda: {"op": "log_batch", "run_id": run_id,
                                    "metrics": [[key, float(value), timestamp, int(step or 0)]]})

    def log_param(self, run_id, key, value, **kwargs):  # noqa: D102
        return self._write(lambda: self._client.log_param(run_id, key, value),
                           lambda: {"op": "log_batch", "run_id": run_id, "params": [[key, str(value)]]})

    def set_tag(self, run_id, key, value, **kwargs):  # noqa: D102
        return self._write(lambda: self._client.set_tag(run_id, key, value),
                           lambda: {"op": "log_batch", "run_id": run_id, "tags": [[key, str(value)]]})

    def delete_tag(self, run_id, key):  # noqa: D102
        return self._write(lambda: self._client.delete_tag(run_id, key),
                           lambda: {"op": "delete_tag", "run_id": run_id, "key": key})

    def log_artifact(self, run_id, local_path, artifact_path=None):  # noqa: D102
        return self._write(lambda: self._client.log_artifact(run_id, local_path, artifact_path),
                           lambda: {"op": "log_artifact", "run_id": run_id, "file": self.outbox.keep(local_path),
                                    "artifact_path": artifact_path})

    def log_artifacts(self, run_id, local_dir, artifact_path=None):  # noqa: D102
        return self._write(lambda: self._client.log_artifacts(run_id, local_dir, artifact_path),
                           lambda: {"op": "log_artifacts", "run_id": run_id, "file": self.outbox.keep(local_dir),
                                    "artifact_path": artifact_path})

    def log_dict(self, run_id, dictionary, artifact_file):  # noqa: D102
        return self._write(lambda: self._client.log_dict(run_id, dictionary, artifact_file),
                           lambda: {"op": "log_dict", "run_id": run_id, "dictionary": dictionary,
                                    "artifact_file": artifact_file})

    def set_terminated(self, run_id, status=None, end_time=None):  # noqa: D102
        end_time = int(end_time if end_time is not None else time.time() * 1000)
        return self._write(lambda: self._client.set_terminated(run_id, status, end_time),
                           lambda: {"op": "set_terminated", "run_id": run_id, "status": status,
                                    "end_time": end_time})

    def defer_end(self, run_id: str, experiment_id: str, config: dict, metrics: dict, module) -> None:
        """Keep the end of a training for the upload command: the final weights, and a record to log the models
        and the plots from them and to end the run FINISHED."""
        import torch

        self.outbox.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.outbox.folder / f".{FINAL_STATE}.part"
        torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, temporary)
        os.replace(temporary, self.outbox.folder / FINAL_STATE)
        self.outbox.append({"op": "end", "run_id": run_id, "experiment_id": experiment_id,
                            "tracking_uri": self.tracking_uri, "config": config, "metrics": metrics,
                            "state": FINAL_STATE})


def pending_upload(client) -> dict | None:
    """What a run left for the upload command (``status``, ``outbox``, ``records``, ``command``), or ``None``."""
    if not isinstance(client, OutboxClient) or client.outbox is None:
        return None
    waiting = client.outbox.pending()
    if not waiting:
        return None
    return {"status": "pending_upload", "outbox": str(client.outbox.folder.resolve()), "records": len(waiting),
            "command": upload_command(client.outbox.folder)}


def server_writable(client) -> bool:
    """Whether ``client`` can write to its store now (always, for a plain client)."""
    return client.reconnect(force=True) if isinstance(client, OutboxClient) else True
