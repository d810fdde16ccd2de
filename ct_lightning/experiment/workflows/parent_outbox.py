"""The writes of a compare's parent runs (one per training seed, and the one over the seeds of ``--seeds``) through
a tracking-server outage: the client wrapped in an outbox, the end that names the upload command, and metrics
logged once per resumed compare (see :mod:`ct_lightning.experiment.runs.outbox`)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ct_lightning.experiment.runs.atomic_files import write_json_atomic


def parent_client(client, tracking_uri: str, parent: str, out_dir: Path):
    """On a tracking server, ``client`` wrapped so that the writes of the compare (its parent run's parameters,
    tags, metrics, tables, plots and end, and tags it sets on other runs) survive an outage: kept in
    ``out_dir/mlflow-outbox`` and sent when the server answers again, or by the upload command
    (:mod:`ct_lightning.experiment.runs.outbox`). Records an earlier attempt left there are sent first. Reads
    (the stored evaluations, the children) still need the server; a plain client for a local store."""
    from ct_lightning.experiment.runs.outbox import OUTBOX_DIR, OutboxClient, server_writable  # noqa: PLC0415
    from ct_lightning.experiment.runs.tracking_server import is_server_uri  # noqa: PLC0415

    if not is_server_uri(tracking_uri):
        return client
    wrapped = OutboxClient(client, tracking_uri, lambda *a, **k: print(*a, file=sys.stderr, **k))
    wrapped.attach(out_dir / OUTBOX_DIR, parent, client.get_run(parent).info.experiment_id)
    if wrapped.outbox.pending() and server_writable(wrapped):  # an earlier attempt's end (FAILED, KILLED) came last
        client.update_run(parent, status="RUNNING")
    return wrapped


def log_metrics_once(client, run_id: str, metrics: dict[str, float]) -> None:
    """Log each of ``metrics`` to ``run_id`` unless the run's latest value of that key is already the same: a
    resumed compare computes the same numbers again from the stored evaluations, and the run's history keeps
    one point each. Values still waiting in the client's outbox count as held; a server that cannot be read
    (an outage) holds nothing, so everything is logged (to the outbox)."""
    from ct_lightning.experiment.runs.outbox import OutboxClient  # noqa: PLC0415
    from ct_lightning.experiment.runs.tracking_server import is_outage  # noqa: PLC0415

    try:
        held = dict(client.get_run(run_id).data.metrics)
    except Exception as error:  # noqa: BLE001 - only an unreachable server; anything else raises
        if not is_outage(error):
            raise
        held = {}
    if isinstance(client, OutboxClient) and client.outbox is not None:
        for record in client.outbox.pending():
            if record.get("op") == "log_batch" and record.get("run_id") == run_id:
                held.update({key: value for key, value, _, _ in record.get("metrics", [])})
    for key, value in metrics.items():
        value, before = float(value), held.get(key)
        if before is None or not (before == value or math.isnan(before) and math.isnan(value)):
            client.log_metric(run_id, key, value)


def end_pending(client, summary: dict, args, out_dir: Path) -> None:
    """Once a parent run is ended: send what its outbox holds if the server answers again, else name the
    upload command (stderr, and ``tracking`` in the summary and its JSON file)."""
    from ct_lightning.experiment.runs.outbox import pending_upload, server_writable  # noqa: PLC0415

    server_writable(client)
    pending = pending_upload(client)
    if pending:
        summary["tracking"] = pending
        write_json_atomic(Path(args.summary_json or out_dir / "summary.json"), summary, strict=True)
        print(f"warning: tracking server {args.tracking_uri} unreachable at the end of the compare: parent run "
              f"{summary['parent_run_id']} is not complete on the server (the table and plots are in {out_dir}); "
              f"{pending['records']} record(s) wait in {pending['outbox']}; send them and end the run with:\n  "
              f"{pending['command']}", file=sys.stderr, flush=True)
