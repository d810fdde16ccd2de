"""A tracking server that goes away while a compare logs its tables to the parent run (issue 26).

A real tiny compare (moons, BL and CT, two epochs) against a real ``mlflow server`` process. The server is
stopped when the first table is written, after the row's evaluations were read back: the parent's writes from
then on (tables, summary, the final table, its end) must go to ``OUT_DIR/mlflow-outbox`` and reach the server
once it answers, either during the compare (server back before the final table) or through the printed upload
command (server back only after the compare).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_server_outage import MlflowServer, server  # noqa: F401 - the fixture: a real server, short retries

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = {"table.md", "paper_comparison.md", "table.csv", "summary.json"}


class OutageAtTheTables:
    """Wraps the compare's ``write_outputs``: the server is stopped before the first table is logged and, if
    ``back_before_end``, started again before the final one; the tables themselves are written unchanged."""

    def __init__(self, server: MlflowServer, write_outputs, back_before_end: bool):
        self.server, self.write_outputs, self.back_before_end = server, write_outputs, back_before_end
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            self.server.stop()
        elif self.back_before_end and kwargs.get("final"):
            self.server.start()
        return self.write_outputs(*args, **kwargs)


def _check_parent(uri: str, parent: str, out: Path) -> None:
    """The parent is FINISHED with its parameters, tags, metrics once each, and the final tables."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.params["data"] == "moons" and "ct.child.moons.ct" in run.data.tags
    assert run.data.metrics, "the row's metrics"
    for key in run.data.metrics:
        assert len(client.get_metric_history(parent, key)) == 1, key
    assert ARTIFACTS <= {a.path for a in client.list_artifacts(parent)}
    local = client.download_artifacts(parent, "table.md", str(out.parent / "downloaded"))
    assert Path(local).read_text() == (out / "table.md").read_text()
    summary = json.loads(Path(client.download_artifacts(parent, "summary.json", str(out.parent / "downloaded")))
                         .read_text())
    assert summary["complete"] is True  # the final summary, sent after the row's first one


@pytest.mark.slow
@pytest.mark.parametrize("back_before_end", [True, False], ids=["server back before the end", "back after the end"])
def test_the_parent_run_of_a_compare_survives_an_outage(server, tmp_path, monkeypatch, capsys,  # noqa: F811
                                                        back_before_end):
    from mlflow.tracking import MlflowClient
    from recipes.compare import main

    from ct_lightning.experiment.runs.outbox import Outbox
    from ct_lightning.experiment.workflows import compare

    monkeypatch.chdir(tmp_path)
    outage = OutageAtTheTables(server, compare.write_outputs, back_before_end)
    monkeypatch.setattr(compare, "write_outputs", outage)
    out = tmp_path / "out"
    summary = main(["--data", "moons", "--max-epochs", "2", "--limit-train-batches", "2", "--nce", "16",
                    "--n-runs", "1", "--n-individuals", "10", "--n-boot", "10", "--no-actionability",
                    "--accelerator", "cpu", "--tracking-uri", server.uri, "--experiment", "outage",
                    "--out-dir", str(out), "--no-progress"])
    assert outage.calls == 2
    err = capsys.readouterr().err
    assert "unreachable" in err
    outbox = Outbox(out / "mlflow-outbox")
    kept = outbox.records()
    assert len(kept) >= len(ARTIFACTS), "the first table's writes met the outage: the test tests it"
    parent = summary["parent_run_id"]
    if back_before_end:
        assert "tracking" not in summary and "answers again" in err
        assert outbox.replayed() == len(kept)
        _check_parent(server.uri, parent, out)
        return
    pending = summary["tracking"]
    assert pending["status"] == "pending_upload" and pending["command"] in err
    assert json.loads((out / "summary.json").read_text())["tracking"] == pending
    assert kept[-1]["op"] == "set_terminated" and kept[-1]["status"] == "FINISHED"
    server.start()
    assert MlflowClient(tracking_uri=server.uri).get_run(parent).info.status == "RUNNING"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(pending["command"], shell=True, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"run {parent}: {len(kept)} of {len(kept)} waiting record(s) sent" in done.stdout
    assert "the run is FINISHED" in done.stdout
    _check_parent(server.uri, parent, out)
