"""A small team on one MLflow tracking server (a real ``mlflow server``): analyst A trains on the server, analyst B,
in another folder with none of A's files, reads A's run from it; and the slips a team makes with a server's address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from preloaded import run_script
from test_server_outage import MlflowServer
from test_tracking_auth import auth_server  # noqa: F401 - the fixture: a server behind a password

ROOT = Path(__file__).resolve().parents[1]
UPLOADED_TAG = "ct.uploaded_checkpoint"  # the record of a run's checkpoint uploaded to its server
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
TINY = ["--max-epochs", "2", "--nce", "16", "--max-steps", "3", "--no-progress", "--registered-model", "none"]


def _env(**extra) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore", **extra}


def _one_error(done: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refused command (no traceback)."""
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The team's server: SQLite backend, artifacts served by the server."""
    if not (Path(sys.executable).parent / "mlflow").is_file():
        pytest.skip("the mlflow command is not installed beside this Python")
    running = MlflowServer(tmp_path_factory.mktemp("team-server"))
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def a_run(server, tmp_path_factory) -> str:
    """Analyst A's run on the server: a tiny CT training on the loans table, age and sex immutable."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("analyst-a")
    summary = train({"data": str(LOANS), "target": "approved", "immutable": "age,sex", "max_epochs": 2, "nce": 16,
                     "max_steps": 3, "progress": False, "tracking_uri": server.uri, "registered_model": "none",
                     "checkpoint_dir": str(folder / "checkpoints")}, echo=lambda *a, **k: None)
    return summary["run_id"]


@pytest.fixture
def not_mlflow(tmp_path):
    """A web server that is no MLflow server (``python -m http.server``), on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.slow  # recipe processes
def test_a_web_server_that_is_no_mlflow_server_is_refused_in_one_line(not_mlflow, tmp_path):
    """Any HTTP answer to /health counted as a server: training read the data, then died in MLflow's traceback
    (``get-by-name failed with error code 404``), and explain.py said the run did not exist."""
    wanted = f"error: --tracking-uri: {not_mlflow} answers, but not as an MLflow tracking server (GET /health: HTTP 404)"
    done = run_script(ROOT / "recipes" / "train.py", ["--data", str(LOANS), "--target", "approved", "--tracking-uri",
                                                      not_mlflow, *TINY], cwd=tmp_path, env=_env())
    assert done.returncode == 1 and _one_error(done).startswith(wanted), done.stdout + done.stderr
    assert "data " not in done.stdout  # refused before the data were read
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", "0123456789abcdef0123456789abcdef", "--tracking-uri",
                                                        not_mlflow, "--row", '{"age": 30}'], cwd=tmp_path, env=_env())
    assert done.returncode == 1 and _one_error(done).startswith(wanted), done.stdout + done.stderr
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.slow  # recipe processes
def test_mlflow_tracking_uri_in_the_environment_names_the_store(server, a_run, tmp_path):
    """``export MLFLOW_TRACKING_URI=http://...`` (MLflow's own way to name the team's server) was ignored: training went
    to a new local store under mlruns/ of the folder, and explain.py looked for A's run there."""
    env = _env(MLFLOW_TRACKING_URI=server.uri)
    done = run_script(ROOT / "recipes" / "train.py", ["--data", str(LOANS), "--target", "approved", *TINY],
                      cwd=tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"MLflow store: {server.uri}" in done.stdout.splitlines()
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    from mlflow.tracking import MlflowClient

    [run_id] = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("MLflow run id: ")]
    assert MlflowClient(tracking_uri=server.uri).get_run(run_id).info.status == "FINISHED"
    row = '{"age": 29, "income": 31000, "debt": 21000, "years_employed": 2, "home_ownership": "rent", ' \
          '"purpose": "car", "sex": "female"}'
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", a_run, "--row", row, "--no-log"],
                      cwd=tmp_path, env=env)
    assert done.returncode == 0 and "row 1: predicted" in done.stdout, (done.stdout + done.stderr)[-3000:]
    # the option still wins over the environment
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", a_run, "--row", row, "--no-log", "--tracking-uri",
                                                        f"sqlite:///{tmp_path}/other/mlflow.db"], cwd=tmp_path, env=env)
    assert done.returncode == 1 and "no MLflow store at" in _one_error(done)


@pytest.mark.slow  # a recipe process
def test_a_fine_tuning_of_a_teammates_logged_model_keeps_the_console_quiet(server, a_run, tmp_path):
    """B fine-tunes A's logged model (``--from-checkpoint runs:/ID/model``): loading it imports ``mlflow.pytorch``, which
    imports the standalone ``pytorch_lightning`` and so set Lightning's logger back to INFO (``INFO:pytorch_lightning...
    GPU available``, the LitLogger advertisement, ``Trainer.fit stopped``), and the start-up line named the weights by
    the URI's last part (``model as loaded``; ``1 as loaded`` for ``models:/NAME/1``)."""
    uri = f"runs:/{a_run}/model"
    done = run_script(ROOT / "recipes" / "train.py", ["--data", str(LOANS), "--target", "approved", "--from-checkpoint",
                                                      uri, "--immutable", "age,sex", "--tracking-uri", server.uri, *TINY],
                      cwd=tmp_path, env=_env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    text = done.stdout + done.stderr
    assert "INFO:" not in text and "LitLogger" not in text, text[-3000:]
    assert any(line.startswith(f"{uri} as loaded, before any training: validation accuracy")
               for line in done.stdout.splitlines()), done.stdout


@pytest.mark.slow  # recipe processes
@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_sweep_on_the_server_names_it_in_its_train_command(server, given, tmp_path):
    """A sweep on the team's server, named by --tracking-uri or by $MLFLOW_TRACKING_URI: its parent is on the server
    and its last line, the command that trains the best trial on its own, names the server (MLflow's fluent API,
    pointed at the store to log the models, left $MLFLOW_TRACKING_URI set to MLflow's own default, so a later default
    could be taken for the server and the option dropped from the command)."""
    store = ["--tracking-uri", server.uri] if given == "option" else []
    env = _env(MLFLOW_TRACKING_URI=server.uri if given == "environment" else "", LOGNAME="analyst-b")
    done = run_script(ROOT / "recipes" / "sweep.py", ["--executor", "local", "--jobs", "1", "--data", str(LOANS),
                                                      "--target", "approved", "--max-epochs", "2", "--nce", "16",
                                                      "--max-steps", "3", "--param", "tau=0.5,0.9", "--no-progress",
                                                      "--sweep-json", str(tmp_path / "sweep.json"), *store],
                      cwd=tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.splitlines()[-1].endswith(f"--tracking-uri {server.uri}"), done.stdout[-1500:]
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    import json

    from mlflow.tracking import MlflowClient

    parent = json.loads((tmp_path / "sweep.json").read_text())["parent_run_id"]
    client = MlflowClient(tracking_uri=server.uri)
    assert client.get_run(parent).info.status == "FINISHED"
    trials = client.search_runs([client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(trials) == 2
    # whose sweep it is, as MLflow's own start_run says it (the login name here): the UI's User column
    assert {run.data.tags.get("mlflow.user") for run in [client.get_run(parent), *trials]} == {"analyst-b"}


@pytest.mark.slow  # recipe processes
def test_resuming_a_run_whose_checkpoints_are_on_another_machine_says_so(server, tmp_path):
    """``train.py --resume ID`` of a run trained elsewhere and killed outright there (SIGKILL: nothing could upload its
    checkpoint; its folder is not here) said the run 'has no checkpoint (it stopped before its first epoch ended);
    start it again instead', which is false and throws its epochs away."""
    import json

    folder = tmp_path / "elsewhere"
    overrides = {"data": str(LOANS), "target": "approved", "max_epochs": 4, "nce": 16, "max_steps": 3,
                 "progress": False, "tracking_uri": server.uri, "registered_model": "none", "experiment": "team-sigkill",
                 "checkpoint_dir": str(folder), "checkpoint_seconds": 0}
    done = run_script(ROOT / "tests" / "helpers" / "kill_during_training.py", [json.dumps(overrides), "epoch_start",
                                                                                "2", "0"], cwd=tmp_path, env=_env())
    assert done.returncode == -9, (done.stdout + done.stderr)[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    [run] = client.search_runs([client.get_experiment_by_name("team-sigkill").experiment_id])
    folder.rename(tmp_path / "moved")  # as seen from another machine
    done = run_script(ROOT / "recipes" / "train.py", ["--resume", run.info.run_id, "--tracking-uri", server.uri],
                      cwd=tmp_path, env=_env())
    line = _one_error(done)
    assert done.returncode != 0 and f"keeps its checkpoints in {folder}, which is not on this machine" in line, line
    assert "uploaded none" in line and "first epoch" not in line


@pytest.mark.slow  # a signalled training, two resumes and a reference training
def test_a_run_stopped_early_on_the_server_resumes_on_another_machine_bit_identical(server, tmp_path):
    """A run on the server stopped by SIGTERM (a preemption, Ctrl-C alike) kept its last.ckpt only in the checkpoint
    folder of the machine it ran on, so ``--resume`` elsewhere could not continue it. Now the stop uploads it; B, in
    another folder without A's files, resumes from it and ends bit-identical to an uninterrupted run, its best
    checkpoint and best score included. An upload cut short is refused in one line, not resumed from."""
    import json

    from mlflow.tracking import MlflowClient
    from test_lifecycle import KILL, assert_same_run, signal_child

    from ct_lightning.experiment.runs.train import train

    store = {"tracking_uri": server.uri, "registered_model": "none", "progress": False}
    reference = train({**KILL, **store, "experiment": "team-reference", "checkpoint_dir": str(tmp_path / "ref")},
                      echo=lambda *a, **k: None)
    a = tmp_path / "a" / "checkpoints"
    done = signal_child({**KILL, **store, "experiment": "team-resume", "checkpoint_dir": str(a)}, "TERM", 2, 3,
                        env=_env())
    assert done.returncode == 143, (done.stdout + done.stderr)[-3000:]
    client = MlflowClient(tracking_uri=server.uri)
    [killed] = client.search_runs([client.get_experiment_by_name("team-resume").experiment_id])
    run_id = killed.info.run_id
    said = [line for line in done.stderr.splitlines() if line.startswith("uploaded ")]
    assert said and said[0].startswith(f"uploaded best.ckpt and last.ckpt (") and "after 3 epoch(s)) to run" in said[0]
    assert f"--resume {run_id}" in done.stderr.splitlines()[-1]
    assert killed.info.status == "KILLED" and json.loads(killed.data.tags[UPLOADED_TAG])["epochs"] == 3
    moved = a.parent.rename(tmp_path / "a-gone") / "checkpoints"  # machine B has none of A's files
    b = tmp_path / "b"
    b.mkdir()
    cut = tmp_path / "cut" / "last.ckpt"  # an upload cut short by a second signal: part of the file on the server
    cut.parent.mkdir()
    cut.write_bytes((moved / "last.ckpt").read_bytes()[:4000])
    client.log_artifact(run_id, str(cut), "checkpoints")
    resume = ["--resume", run_id, "--tracking-uri", server.uri, "--summary-json", str(b / "summary.json")]
    done = run_script(ROOT / "recipes" / "train.py", resume, cwd=b, env=_env())
    line = _one_error(done)
    assert done.returncode != 0 and f"run {run_id}'s uploaded checkpoint checkpoints/last.ckpt is not the one " \
        "recorded (4000 bytes" in line, line
    assert not (b / "mlruns" / "checkpoints" / run_id / "last.ckpt").exists()  # nothing half-fetched left in place
    client.log_artifact(run_id, str(moved / "last.ckpt"), "checkpoints")  # the whole file again
    done = run_script(ROOT / "recipes" / "train.py", resume, cwd=b, env=_env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    here = (b / "mlruns" / "checkpoints" / run_id).resolve()
    assert f"resume: fetched run {run_id}'s uploaded checkpoint (after 3 epoch(s)" in done.stdout, done.stdout
    resumed = json.loads((b / "summary.json").read_text())
    assert Path(resumed["checkpoints"]["last"]).parent == here and Path(resumed["checkpoints"]["best"]).parent == here
    assert_same_run(reference, resumed, client)
    best = [torch_epoch(s["checkpoints"]["best"]) for s in (reference, resumed)]
    assert best[0] == best[1], best  # the best score came back with the folder: the same best epoch
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED" and finished.data.tags["ct.checkpoint_dir"] == str(here)


def torch_epoch(path) -> int:
    """The epoch a checkpoint file was written at."""
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])


@pytest.mark.slow  # a training
def test_a_run_that_fails_on_the_server_uploads_its_last_checkpoint(server, tmp_path):
    """An error in the middle of training (here a callback's, in epoch 2) ends the run FAILED; on the server its last
    checkpoint is uploaded first, as a signal's stop does, so it can be resumed elsewhere once the cause is mended."""
    import json

    import lightning as L
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train

    class Fails(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 2:
                raise RuntimeError("the node's disk went away")

    said = []
    with pytest.raises(RuntimeError, match="disk went away"):
        train({"data": str(LOANS), "target": "approved", "max_epochs": 4, "nce": 16, "max_steps": 3, "progress": False,
               "tracking_uri": server.uri, "registered_model": "none", "experiment": "team-fails",
               "checkpoint_dir": str(tmp_path / "c"), "checkpoint_seconds": 0}, callbacks=[Fails()],
              echo=lambda *a, **k: said.append(" ".join(map(str, a))))
    client = MlflowClient(tracking_uri=server.uri)
    [run] = client.search_runs([client.get_experiment_by_name("team-fails").experiment_id])
    assert run.info.status == "FAILED" and json.loads(run.data.tags[UPLOADED_TAG])["epochs"] == 2
    assert {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "checkpoints")} >= {"last.ckpt"}
    assert any(line.startswith("uploaded ") for line in said), said


@pytest.mark.slow  # recipe processes
def test_evaluating_a_teammates_run_without_its_table_says_which_table_to_give(server, tmp_path):
    """B evaluates A's run from the server: its config.json names A's table on A's machine, and evaluate.py ended with
    ``error: --data: file '/home/a/loans.csv' not found``, blaming an option B had not given."""
    import shutil

    from ct_lightning.experiment.runs.train import train

    table = tmp_path / "a" / "loans.csv"
    table.parent.mkdir()
    shutil.copy(LOANS, table)
    summary = train({"data": str(table), "target": "approved", "max_epochs": 2, "nce": 16, "max_steps": 3,
                     "progress": False, "tracking_uri": server.uri, "registered_model": "none",
                     "checkpoint_dir": str(tmp_path / "a" / "checkpoints")}, echo=lambda *a, **k: None)
    table.unlink()  # B's machine: no such file
    b = tmp_path / "b"
    b.mkdir()
    tiny = ["--n-individuals", "4", "--n-runs", "1", "--no-log", "--lambda-energy", "1", "--eval-steps", "10"]
    done = run_script(ROOT / "recipes" / "evaluate.py", ["--run-id", summary["run_id"], "--tracking-uri", server.uri,
                                                         *tiny], cwd=b, env=_env())
    line = _one_error(done)
    assert done.returncode == 1 and line == (f"error: --run-id: run {summary['run_id']} was trained on {table}, which is "
                                             "not on this machine (its config.json names it); give a copy of that table "
                                             "with --data FILE"), line
    shutil.copy(LOANS, b / "copy.csv")  # as told
    done = run_script(ROOT / "recipes" / "evaluate.py", ["--run-id", summary["run_id"], "--tracking-uri", server.uri,
                                                         "--data", "copy.csv", *tiny], cwd=b, env=_env())
    assert done.returncode == 0 and "accuracy" in done.stdout, (done.stdout + done.stderr)[-3000:]


@pytest.fixture(scope="module")
def registered(server, tmp_path_factory) -> tuple[str, str]:
    """A's run registered as ``team-loans`` (``models:/team-loans/1``, as train.py prints it), alias ``champion``:
    ``(run id, the registered model's URI)``."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("analyst-a-registers")
    summary = train({"data": str(LOANS), "target": "approved", "max_epochs": 2, "nce": 16, "max_steps": 3,
                     "progress": False, "tracking_uri": server.uri, "registered_model": "team-loans",
                     "checkpoint_dir": str(folder / "checkpoints")}, echo=lambda *a, **k: None)
    version = summary["models"]["version"]
    MlflowClient(tracking_uri=server.uri).set_registered_model_alias("team-loans", "champion", version)
    return summary["run_id"], f"models:/team-loans/{version}"


ROW = '{"age": 29, "income": 31000, "debt": 21000, "years_employed": 2, "home_ownership": "rent", "purpose": "car", ' \
      '"sex": "female"}'
EVAL_TINY = ["--n-individuals", "4", "--n-runs", "1", "--lambda-energy", "1", "--eval-steps", "10"]


@pytest.mark.slow  # recipe processes
def test_explain_and_evaluate_take_the_registered_model_that_training_prints(server, registered, tmp_path):
    """B takes the ``models:/team-loans/1`` that A's training printed: ``--run-id`` said 'no such run' (and explain.py's
    ``--checkpoint`` 'explain.py reads no registry or other URI'); an alias and ``latest`` name a version too."""
    run_id, uri = registered
    for given in (["--run-id", uri], ["--run-id", "models:/team-loans@champion"],
                  ["--checkpoint", "models:/team-loans/latest"]):
        done = run_script(ROOT / "recipes" / "explain.py", [*given, "--row", ROW, "--no-log", "--tracking-uri",
                                                            server.uri], cwd=tmp_path, env=_env())
        assert done.returncode == 0 and "row 1: predicted" in done.stdout, (done.stdout + done.stderr)[-3000:]
        assert f"version 1 of team-loans, logged by run {run_id}" in done.stdout, done.stdout
    done = run_script(ROOT / "recipes" / "evaluate.py", ["--run-id", uri, "--tracking-uri", server.uri, "--no-log",
                                                         *EVAL_TINY], cwd=tmp_path, env=_env())
    assert done.returncode == 0 and "accuracy" in done.stdout, (done.stdout + done.stderr)[-3000:]
    assert f"logged by run {run_id}" in done.stdout


@pytest.mark.slow  # recipe processes
def test_an_unknown_registered_model_or_version_is_one_line_naming_those_there_are(server, registered, tmp_path):
    """A slip in the name, the version or the alias: one line naming the registered models, or the model's versions
    and aliases, before any work."""
    cases = {
        ("explain", "--run-id", "models:/team-loans/7"): "error: --run-id: got 'models:/team-loans/7' (team-loans has "
        "no version 7); allowed: a version of team-loans (versions: 1; aliases: @champion (version 1))",
        ("evaluate", "--run-id", "models:/team-loans@chamption"): "error: --run-id: got 'models:/team-loans@chamption' "
        "(team-loans has no alias @chamption); allowed: a version of team-loans (versions: 1; aliases: @champion "
        "(version 1))",
        ("explain", "--run-id", "models:/team-lons/1"): "(no registered model 'team-lons'); allowed: models:/NAME/VERSION",
        ("evaluate", "--checkpoint", "models:/team-loans/7"): "error: --checkpoint: got 'models:/team-loans/7' "
        "(team-loans has no version 7)",
    }
    for (recipe, option, value), wanted in cases.items():
        rest = ["--row", ROW] if recipe == "explain" else EVAL_TINY
        done = run_script(ROOT / "recipes" / f"{recipe}.py", [option, value, *rest, "--no-log", "--tracking-uri",
                                                               server.uri], cwd=tmp_path, env=_env())
        line = _one_error(done)
        assert done.returncode != 0 and wanted in line, (recipe, line)
        assert "data " not in done.stdout and "row 1" not in done.stdout
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", "models:/team-lons/1", "--row", ROW, "--no-log",
                                                        "--tracking-uri", server.uri], cwd=tmp_path, env=_env())
    assert "team-loans" in _one_error(done).split("allowed:")[1]  # the models there are


@pytest.mark.slow  # a compare and a training
def test_every_run_names_its_user_as_mlflow_does(server, tmp_path):
    """Runs had no ``mlflow.user`` tag (MLflow's fluent start_run sets it; ours are made with MlflowClient.create_run),
    so the team could not tell whose run is whose. Now each run says it as MLflow does: the user name a password-
    protected server is given (MLFLOW_TRACKING_USERNAME), else the login name."""
    from mlflow.tracking import MlflowClient

    compare = ["--data", str(LOANS), "--target", "approved", "--no-actionability", "--max-epochs", "1", "--nce", "16",
               "--limit-train-batches", "2", "--n-runs", "1", "--n-individuals", "4", "--lambda-energy", "1",
               "--eval-steps", "10", "--n-boot", "10", "--no-progress",
               "--tracking-uri", server.uri, "--experiment", "team-users", "--out-dir", str(tmp_path / "out")]
    done = run_script(ROOT / "recipes" / "compare.py", compare, cwd=tmp_path,
                      env=_env(LOGNAME="analyst-b", MLFLOW_TRACKING_USERNAME=""))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    done = run_script(ROOT / "recipes" / "train.py", ["--data", str(LOANS), "--target", "approved", *TINY,
                                                      "--tracking-uri", server.uri, "--experiment", "team-users"],
                      cwd=tmp_path, env=_env(LOGNAME="analyst-b", MLFLOW_TRACKING_USERNAME="carol"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    client = MlflowClient(tracking_uri=server.uri)
    runs = client.search_runs([client.get_experiment_by_name("team-users").experiment_id])
    users = {(run.data.tags.get("ct.role") or run.data.tags.get("role"), run.data.tags.get("mlflow.user"))
             for run in runs}
    assert users == {("compare", "analyst-b"), ("BL", "analyst-b"), ("CT", "analyst-b"), (None, "carol")}, users
    assert all(run.info.user_id == run.data.tags["mlflow.user"] for run in runs)
    assert all(run.data.tags.get("mlflow.source.name", "").endswith(("compare.py", "train.py")) for run in runs)


@pytest.mark.slow  # a server behind a password, a training and recipe processes
def test_a_teammates_run_with_read_permission_explains_and_evaluates_keeping_the_results_here(auth_server, monkeypatch,
                                                                                              tmp_path):
    """B explains and evaluates A's run on a server behind a password whose default permission is READ: the results
    were computed, then the write to A's run was refused with MLflow's traceback (``PERMISSION_DENIED``) and exit 1.
    Now one note says so before the work, the results stay here (printed; an evaluation's summary and plots in its
    folder) and the command succeeds; A's own explanation is still logged to A's run."""
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train

    url, admin_password = auth_server
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin_password)
    users = get_app_client("basic-auth", tracking_uri=url)
    for user in ("alice", "bob"):
        users.create_user(user, f"{user}-password-1")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "alice-password-1")
    run_id = train({"data": str(LOANS), "target": "approved", "max_epochs": 1, "nce": 16, "max_steps": 3,
                    "progress": False, "tracking_uri": url, "registered_model": "none",
                    "checkpoint_dir": str(tmp_path / "a")}, echo=lambda *a, **k: None)["run_id"]
    bob = _env(MLFLOW_TRACKING_USERNAME="bob", MLFLOW_TRACKING_PASSWORD="bob-password-1")
    why = f"{url} lets 'bob' only read run {run_id}, alice's run (PERMISSION_DENIED)"
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", run_id, "--row", ROW, "--tracking-uri", url],
                      cwd=tmp_path, env=bob)
    assert done.returncode == 0 and "row 1: predicted" in done.stdout, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if "not logged" in line]
    assert notes == [f"note: the explanations are not logged to the run: {why}; they are printed here only (--json "
                     "FILE or --csv FILE keeps them); --no-log skips logging"], done.stdout
    out = tmp_path / "b-eval"
    done = run_script(ROOT / "recipes" / "evaluate.py", ["--run-id", run_id, "--tracking-uri", url, "--out-dir",
                                                         str(out), *EVAL_TINY], cwd=tmp_path, env=bob)
    assert done.returncode == 0 and "accuracy" in done.stdout, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert f"note: the evaluation is not logged to the run: {why}; its results are kept here: the summary in " \
        f"{out / 'summary.json'}, the plots in {out}; --no-log skips logging" in done.stdout.splitlines()
    assert (out / "summary.json").is_file() and any(out.glob("*.png"))
    assert not any(key.startswith("eval/") for key in MlflowClient(url).get_run(run_id).data.metrics)
    # evaluated again into the same folder: its summary.json was silently replaced; now refused before any work
    kept = {path.name: path.read_bytes() for path in out.iterdir()}
    done = run_script(ROOT / "recipes" / "evaluate.py", ["--run-id", run_id, "--tracking-uri", url, "--out-dir",
                                                         str(out), *EVAL_TINY, "--eval-seed", "1"], cwd=tmp_path, env=bob)
    assert done.returncode == 2 and _one_error(done) == (
        f"error: --out-dir: got '{out}' (it holds {', '.join(sorted(kept))} of an earlier evaluation); allowed: a "
        "folder without an earlier evaluation's results (another --out-dir), or --overwrite to replace them")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == kept
    alice = _env(MLFLOW_TRACKING_USERNAME="alice", MLFLOW_TRACKING_PASSWORD="alice-password-1")
    done = run_script(ROOT / "recipes" / "explain.py", ["--run-id", run_id, "--row", ROW, "--tracking-uri", url],
                      cwd=tmp_path, env=alice)
    assert done.returncode == 0 and f"to run {run_id}" in done.stdout.splitlines()[-1], done.stdout[-2000:]
    assert "not logged" not in done.stdout
