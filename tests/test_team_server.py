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

ROOT = Path(__file__).resolve().parents[1]
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
    assert done.returncode == 0 and "row 0: predicted" in done.stdout, (done.stdout + done.stderr)[-3000:]
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
    env = _env(MLFLOW_TRACKING_URI=server.uri if given == "environment" else "")
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
    assert MlflowClient(tracking_uri=server.uri).get_run(parent).info.status == "FINISHED"


@pytest.mark.slow  # a recipe process
def test_resuming_a_run_whose_checkpoints_are_on_another_machine_says_so(server, tmp_path):
    """``train.py --resume ID`` of a run trained elsewhere (a teammate's, a job on another node: its checkpoint folder is
    not here) said the run 'has no checkpoint (it stopped before its first epoch ended); start it again instead', which
    is false and throws its epochs away."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path / "elsewhere"
    summary = train({"data": str(LOANS), "target": "approved", "max_epochs": 2, "nce": 16, "max_steps": 3,
                     "progress": False, "tracking_uri": server.uri, "registered_model": "none",
                     "checkpoint_dir": str(folder)}, echo=lambda *a, **k: None)
    folder.rename(tmp_path / "moved")  # as seen from another machine
    done = run_script(ROOT / "recipes" / "train.py", ["--resume", summary["run_id"], "--max-epochs", "3",
                                                      "--tracking-uri", server.uri], cwd=tmp_path, env=_env())
    line = _one_error(done)
    assert done.returncode != 0 and f"keeps its checkpoints in {folder}, which is not on this machine" in line, line
    assert "first epoch" not in line


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
