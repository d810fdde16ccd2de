"""A tracking server that goes away while a compare logs its tables to the parent run (issue 26).

A real tiny compare (moons, BL and CT, two epochs) against a real ``mlflow server`` process. The server is
stopped when the first table is written, after the row's evaluations were read back: the parent's writes from
then on (tables, summary, the final table, its end) must go to ``OUT_DIR/mlflow-outbox`` and reach the server
once it answers, either during the compare (server back before the final table) or through the printed upload
command (server back only after the compare). With ``--seeds``, the same for the parent over the seeds: the server
is stopped once that parent is opened, before it tags the per-seed parents as its children, and the records are
sent by the upload command or by running the same compare again.
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
TINY = ["--data", "moons", "--max-epochs", "2", "--limit-train-batches", "2", "--nce", "16", "--n-runs", "1",
        "--n-individuals", "10", "--n-boot", "10", "--no-actionability", "--accelerator", "cpu", "--no-progress"]


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
    summary = main([*TINY, "--tracking-uri", server.uri, "--experiment", "outage", "--out-dir", str(out)])
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


class OutageAtTheSeedsParent:
    """Wraps ``parent_client``: once the parent over the seeds (the one whose folder is ``top``) is opened and its
    client wrapped, the server is stopped (while ``armed``), so all of that parent's writes meet the outage."""

    def __init__(self, server: MlflowServer, parent_client, top: Path):
        self.server, self.parent_client, self.top = server, parent_client, top
        self.armed, self.calls = True, 0

    def __call__(self, client, tracking_uri, parent, out_dir):
        wrapped = self.parent_client(client, tracking_uri, parent, out_dir)
        if self.armed and Path(out_dir) == self.top:
            self.calls += 1
            self.server.stop()
        return wrapped


def _metric_points(client, run_id: str) -> dict[str, list[tuple]]:
    """Every metric of the run with its history, as (step, timestamp, value) points."""
    return {key: [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
            for key in client.get_run(run_id).data.metrics}


def _check_seeds_parent(uri: str, summary: dict, out: Path) -> dict[str, list[tuple]]:
    """The parent over the seeds is FINISHED with its parameters, metrics once each and the tables; the per-seed
    parents are FINISHED, its children, with their metrics once each. Returns the parent's metric points."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = summary["parent_run_id"]
    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.params["seeds"] == "0,1" and run.data.params["data"] == "moons"
    points = _metric_points(client, parent)
    assert {"moons/ip_mean", "moons/ip_sd"} <= set(points)
    assert all(len(history) == 1 for history in points.values()), points
    assert ARTIFACTS <= {a.path for a in client.list_artifacts(parent)}
    local = client.download_artifacts(parent, "table.md", str(out.parent / "downloaded"))
    assert Path(local).read_text() == (out / "table.md").read_text()
    for seed, entry in summary["per_seed"].items():
        seed_run = client.get_run(entry["parent_run_id"])
        assert seed_run.info.status == "FINISHED", seed
        assert seed_run.data.tags["mlflow.parentRunId"] == parent, seed
        assert all(len(history) == 1 for history in _metric_points(client, entry["parent_run_id"]).values()), seed
    return points


def _compare_with_seeds_outage(server, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A 2-seed compare whose server stops once the parent over the seeds is opened and stays down to the end."""
    from recipes.compare import main

    from ct_lightning.experiment.runs.outbox import Outbox
    from ct_lightning.experiment.workflows import parent_outbox

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    outage = OutageAtTheSeedsParent(server, parent_outbox.parent_client, out)
    monkeypatch.setattr(parent_outbox, "parent_client", outage)
    argv = [*TINY, "--seeds", "0,1", "--tracking-uri", server.uri, "--experiment", "outage", "--out-dir", str(out)]
    summary = main(argv)
    assert outage.calls == 1
    err = capsys.readouterr().err
    assert "unreachable" in err
    pending = summary["tracking"]
    assert pending["status"] == "pending_upload" and pending["command"] in err
    assert json.loads((out / "summary.json").read_text())["tracking"] == pending
    for seed in (0, 1):  # the per-seed parents were complete before the outage
        assert not Outbox(out / f"s{seed}" / "mlflow-outbox").pending(), seed
    kept = Outbox(out / "mlflow-outbox").records()
    assert len(kept) == pending["records"]
    seed_parents = {entry["parent_run_id"] for entry in summary["per_seed"].values()}
    tagged = {r["run_id"] for r in kept if ["mlflow.parentRunId", summary["parent_run_id"]] in r.get("tags", [])}
    assert tagged == seed_parents, "the per-seed parents' tags are kept under their own run ids"
    assert kept[-1]["op"] == "set_terminated" and kept[-1]["status"] == "FINISHED"
    outage.armed = False
    server.start()
    return argv, summary, kept


@pytest.mark.slow
def test_the_parent_over_the_seeds_is_completed_by_the_upload_command(server, tmp_path, monkeypatch,  # noqa: F811
                                                                      capsys):
    from mlflow.tracking import MlflowClient

    _, summary, kept = _compare_with_seeds_outage(server, tmp_path, monkeypatch, capsys)
    parent = summary["parent_run_id"]
    assert MlflowClient(tracking_uri=server.uri).get_run(parent).info.status == "RUNNING"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(summary["tracking"]["command"], shell=True, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"run {parent}: {len(kept)} of {len(kept)} waiting record(s) sent" in done.stdout
    assert "the run is FINISHED" in done.stdout
    _check_seeds_parent(server.uri, summary, tmp_path / "out")


@pytest.mark.slow
def test_running_the_compare_again_sends_the_kept_records_first(server, tmp_path, monkeypatch, capsys):  # noqa: F811
    from recipes.compare import main

    from ct_lightning.experiment.runs.outbox import Outbox

    argv, first, kept = _compare_with_seeds_outage(server, tmp_path, monkeypatch, capsys)
    again = main(argv)  # the server is back: trainings and evaluations are reused
    err = capsys.readouterr().err
    assert f"answers again: {len(kept)} kept record(s) sent" in err
    assert "tracking" not in again and again["parent_run_id"] == first["parent_run_id"]
    outbox = Outbox(tmp_path / "out" / "mlflow-outbox")
    assert outbox.replayed() == len(outbox.records()) == len(kept)
    points = _check_seeds_parent(server.uri, again, tmp_path / "out")
    kept_points = {key: (step, timestamp, value) for record in kept if record["op"] == "log_batch"
                   for key, value, timestamp, step in record.get("metrics", [])}
    assert {key: history[0] for key, history in points.items()} == kept_points, "the kept points, not new ones"


class OutageAtTheReads:
    """Wraps the compare's ``compare_data``: the server is stopped before the row's evaluations are read back."""

    def __init__(self, server: MlflowServer, compare_data):
        self.server, self.compare_data, self.calls = server, compare_data, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            self.server.stop()
        return self.compare_data(*args, **kwargs)


@pytest.mark.slow
def test_a_compare_that_cannot_read_its_runs_stops_in_one_line_and_resumes(server, tmp_path, monkeypatch,  # noqa: F811
                                                                           capsys):
    """Reads need the server: the compare stops with one line that says how to resume (no traceback, exit code
    1), and the same command, once the server answers, finishes the parent run."""
    from recipes.compare import main

    from ct_lightning.experiment.workflows import compare

    monkeypatch.chdir(tmp_path)
    outage = OutageAtTheReads(server, compare.compare_data)
    monkeypatch.setattr(compare, "compare_data", outage)
    out = tmp_path / "out"
    argv = [*TINY, "--tracking-uri", server.uri, "--experiment", "outage", "--out-dir", str(out)]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 1 and outage.calls == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert "stopped answering" in errors[0] and "re-run the same command" in errors[0] and "Traceback" not in err
    server.start()
    monkeypatch.setattr(compare, "compare_data", outage.compare_data)
    summary = main(argv)
    _check_parent(server.uri, summary["parent_run_id"], out)
