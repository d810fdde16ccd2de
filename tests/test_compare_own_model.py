"""``recipes/compare.py`` on a model of one's own: ``--model package.module:Class`` (and train.py's other model
options) for every role it trains, checked before any work, and keyed so that a default-network run is never reused
as one of that model (nor one of an edited module file). Real tiny trainings, a real MLflow SQLite store.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
HIRING_NET = ("from torch import nn\n"
              "class HiringNet(nn.Sequential):\n"
              "    def __init__(self, n_features, n_classes):\n"
              "        super().__init__(nn.Linear(n_features, 6), nn.Tanh(), nn.Linear(6, n_classes))\n"
              "class WideNet(nn.Sequential):  # arguments of its own, which no training gives\n"
              "    def __init__(self, n_inputs, width):\n"
              "        super().__init__(nn.Linear(n_inputs, width))\n")
TINY = ["--max-epochs", "1", "--nce", "16", "--limit-train-batches", "2", "--n-runs", "1", "--n-individuals", "4",
        "--lambda-energy", "1", "--eval-steps", "10", "--n-boot", "10", "--no-progress"]


@pytest.fixture
def own(tmp_path, monkeypatch):
    """A folder with the user's ``hiring_net.py``, the current directory (train.py imports ``--model`` from it)."""
    (tmp_path / "hiring_net.py").write_text(HIRING_NET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "hiring_net", raising=False)  # another test's hiring_net.py, imported before
    return {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "out": tmp_path / "out", "folder": tmp_path}


def _params(database: Path, key: str) -> dict[str, str]:
    """``run id → value`` of the param ``key`` of every run in the store."""
    with sqlite3.connect(database) as connection:
        return dict(connection.execute("select run_uuid, value from params where key = ?", (key,)))


@pytest.mark.slow  # a whole compare
def test_compare_trains_every_role_on_a_model_of_ones_own_and_reuses_it(own, capsys):
    """``compare.py --data loans.csv --target approved --immutable age --model hiring_net:HiringNet`` was refused
    ('unrecognized arguments: --model'); it trains the four roles on that class, and a re-run reuses all four."""
    from recipes.compare import main

    argv = ["--data", str(LOANS), "--target", "approved", "--immutable", "age", "--model", "hiring_net:HiringNet",
            "--tracking-uri", own["uri"], "--out-dir", str(own["out"]), *TINY]
    summary = main(argv)
    [row] = summary["rows"]
    trained = set(row["runs"].values())
    assert len(trained) == 4
    models = _params(own["folder"] / "mlflow.db", "model")
    assert {models[run_id] for run_id in trained} == {"hiring_net:HiringNet"}, models
    capsys.readouterr()
    again = main(argv)
    assert set(again["rows"][0]["runs"].values()) == trained
    assert "reproduction: 4 models, 4 already trained and evaluated in the store" in capsys.readouterr().out


def test_a_model_of_ones_own_is_keyed_by_its_module_files_content(own):
    """The training key held ``--model keyed_net:HiringNet`` as a name only: an edited keyed_net.py found the
    runs of the old class. A default network and the user's class never share a key either. (A module already
    imported is keyed by the file it was imported from, which is the one a training in that process uses: hence a
    name no other test imports.)"""
    from ct_lightning.experiment.configuration.settings import resolve_config
    from ct_lightning.experiment.studies.reproduce import training_key

    (own["folder"] / "keyed_net.py").write_text(HIRING_NET)
    common = {"data": str(LOANS), "target": "approved", "max_epochs": 1}
    default = training_key(resolve_config(common))
    first = training_key(resolve_config({**common, "model": "keyed_net:HiringNet"}))
    assert default != first
    (own["folder"] / "keyed_net.py").write_text(HIRING_NET.replace("nn.Tanh()", "nn.ReLU()"))
    edited = training_key(resolve_config({**common, "model": "keyed_net:HiringNet"}))
    assert edited not in (default, first)
    assert default == training_key(resolve_config(common))  # the default network's key is as before


@pytest.mark.parametrize("given, said", [
    (["--model", "hiring_net:HiringNett"], "error: --model: got 'hiring_net:HiringNett' (module 'hiring_net' has no "
                                           "'HiringNett'; did you mean 'HiringNet'?); allowed: a class or function of "
                                           "hiring_net: HiringNet"),
    (["--model", "nosuch:Net"], "error: --model: cannot import module 'nosuch' of 'nosuch:Net'"),
    (["--from-checkpoint", "missing.pt"], "error: --from-checkpoint: no file at missing.pt"),
    (["--model", "hiring_net:WideNet"], "error: --model: got 'hiring_net:WideNet' (it requires 'n_inputs', 'width', "
                                        "which ct-lightning does not give)"),
], ids=["class", "module", "checkpoint", "arguments"])
def test_a_bad_model_of_ones_own_is_refused_in_one_line_before_any_work(own, capsys, given, said):
    from recipes.compare import main

    with pytest.raises(SystemExit) as refused:
        main(["--data", str(LOANS), "--target", "approved", "--no-actionability", "--tracking-uri", own["uri"],
              "--out-dir", str(own["out"]), *TINY, *given])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert refused.value.code in (1, 2) and len(errors) == 1 and errors[0].startswith(said), errors
    assert not own["out"].exists() and not (own["folder"] / "mlflow.db").exists()  # before any work


@pytest.mark.slow  # a training and a compare
def test_compare_fine_tunes_a_model_that_keeps_its_table_preprocessing(own, capsys):
    """``compare.py --from-checkpoint`` of a model trained here on a table (its checkpoint carries its preprocessing)
    reads the table as that model does: a column of dates the model was trained without (--drop-columns) was refused
    by the compare's start-up check, its evaluation and its table row, each reading the table afresh; train.py
    fine-tunes on it. Now every role fine-tunes, is evaluated and compared, and the start-up description is the
    model's."""
    import pandas as pd

    from ct_lightning.experiment.runs.train import train
    from recipes.compare import main

    table = pd.read_csv(LOANS)
    table.insert(0, "applied_on", pd.date_range("2026-10-01", periods=len(table), freq="h").strftime("%Y-%m-%d"))
    table.to_csv(own["folder"] / "october.csv", index=False)
    october = train({"data": str(own["folder"] / "october.csv"), "target": "approved", "drop_columns": "applied_on",
                     "max_epochs": 1, "nce": 16, "limit_train_batches": 2, "progress": False,
                     "tracking_uri": own["uri"], "checkpoint_dir": str(own["folder"] / "october")})
    capsys.readouterr()
    summary = main(["--data", str(own["folder"] / "october.csv"), "--target", "approved", "--no-actionability",
                    "--from-checkpoint", october["checkpoints"]["last"], "--tracking-uri", own["uri"],
                    "--out-dir", str(own["out"]), *TINY])
    [row] = summary["rows"]
    assert len(set(row["runs"].values())) == 2
    printed = capsys.readouterr().out
    assert "left out: applied_on, which the model was trained without" in printed, printed[-3000:]
