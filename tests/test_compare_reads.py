"""``recipes/compare.py`` reads each table file once at start-up (a user walk-through on two files of one shape).

The input check built each table's data module, every role's resolved configuration built it again (for the CT
settings chosen from its size) and the start-up description built it once more per pair; the reading kept in memory
(``datamodules.table_format.read_table``) holds one table, so with two tables each was parsed by pandas three times
before the first training. Now the check's data modules are reused (``table_key``: the file's content and the table
options). Counted with pandas' own reader wrapped, on a real tiny compare (one epoch, two batches, a real MLflow
SQLite store); reads during the trainings and evaluations (``run_tasks``) are not start-up.
"""

from __future__ import annotations

import shutil
import traceback
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
TINY = ["--max-epochs", "1", "--nce", "16", "--limit-train-batches", "2", "--n-runs", "1", "--n-individuals", "6",
        "--lambda-energy", "1", "--eval-steps", "10", "--n-boot", "10", "--no-progress"]


@pytest.mark.slow  # four tiny trainings
def test_each_table_is_read_once_before_the_first_training(tmp_path, monkeypatch):
    from recipes.compare import main

    march, april = tmp_path / "march.csv", tmp_path / "april.csv"
    shutil.copy(LOANS, march)
    frame = pd.read_csv(LOANS)
    frame.sample(len(frame), random_state=1).to_csv(april, index=False)  # the same columns, other rows' order
    reads: list[str] = []
    read_csv = pd.read_csv

    def counting(path, *args, **kwargs):
        if not any(step.name == "run_tasks" for step in traceback.extract_stack()):  # before the trainings
            reads.append(Path(path).name)
        return read_csv(path, *args, **kwargs)

    monkeypatch.setattr(pd, "read_csv", counting)
    summary = main(["--data", f"{march},{april}", "--target", "approved", "--no-actionability", *TINY,
                    "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out-dir", str(tmp_path / "out")])
    assert [row["data"] for row in summary["rows"]] == ["march", "april"]
    assert sorted(reads) == ["april.csv", "march.csv"], reads
