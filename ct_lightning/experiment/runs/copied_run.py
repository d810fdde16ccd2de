"""One MLflow run's record copied into another: its metric history, step by step, and its artifacts but the large
ones. A sweep's trial that shares another trial's training (``studies.sweep.record_shared_trial``) shows that
training's curves and plots in its own run, and names the run that holds its checkpoints and models."""

from __future__ import annotations

import tempfile
from pathlib import Path

MAX_METRICS_PER_BATCH = 1000  # MLflow's most metrics in one log_batch
NOT_COPIED = ("checkpoints",)  # artifact folders left in the source run: a model's weights, kept once


def copy_metric_history(client, source_run_id: str, run_id: str) -> int:
    """Log every value of every metric of run ``source_run_id`` (each step, with its timestamp) to run ``run_id``, so
    that its curves are the source's; the number of values copied."""
    from mlflow.entities import Metric

    values = [Metric(m.key, m.value, m.timestamp, m.step)
              for key in client.get_run(source_run_id).data.metrics
              for m in client.get_metric_history(source_run_id, key)]
    for start in range(0, len(values), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=values[start:start + MAX_METRICS_PER_BATCH])
    return len(values)


def copy_artifacts(client, source_run_id: str, run_id: str, skip=NOT_COPIED, replace=()) -> list[str]:
    """Log the artifacts of run ``source_run_id`` to run ``run_id`` at the same paths, but for the folders in ``skip``
    (checkpoints: large, and the source keeps them) and the files in ``replace`` (that the caller writes itself);
    the paths copied."""
    copied = []
    with tempfile.TemporaryDirectory(prefix="ct-copy-") as folder:
        pending = [None]
        while pending:
            for entry in client.list_artifacts(source_run_id, pending.pop()):
                if entry.path.split("/")[0] in skip or entry.path in replace:
                    continue
                if entry.is_dir:
                    pending.append(entry.path)
                    continue
                local = client.download_artifacts(source_run_id, entry.path, folder)
                parent = str(Path(entry.path).parent)
                client.log_artifact(run_id, local, None if parent == "." else parent)
                copied.append(entry.path)
    return sorted(copied)
