"""``recipes/compare.py`` on a practitioner's own table: what a walk-through with UCI credit found.

A table named like a built-in set (``credit.csv``) is never put beside the paper's Credit row; one evaluation run
(or a bootstrap without spread) marks nothing significant; IP* from a handful of valid counterfactuals gets its
``†``; ``--immutable`` in the wrong case and a reused run without a checkpoint are refused in one line before any
work; the plan says which features each pair may change; ``summary.json`` is strict JSON with an absolute command.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from preloaded import run_script

from ct_lightning.evaluation import EvaluationConfig
from ct_lightning.evaluation.compare import (bootstrap_comparison, compare_evaluations, format_cell, run_comparison,
                                             table_row, write_csv)
from ct_lightning.evaluation.paper import paper_comparison
from ct_lightning.evaluation.protocol import EvaluationResult
from ct_lightning.experiment.runs.atomic_files import write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"


def _strict(text: str):
    """``json.loads`` that refuses ``NaN``/``Infinity``, as most JSON parsers do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------------------------------- statistics
def test_one_run_or_a_flat_bootstrap_marks_nothing_significant():
    one = run_comparison([2.0], [1.0])
    assert one["significant"] is False and np.isnan(one["ci_low"]) and np.isnan(one["ci_high"])
    assert bootstrap_comparison([2.0], [1.0], n_boot=20)["significant"] is False  # one value a side
    assert bootstrap_comparison([2.0] * 5, [1.0] * 5, n_boot=20)["significant"] is False  # every round alike
    steady = np.linspace(1.9, 2.1, 8)
    assert run_comparison(steady, steady - np.linspace(0.9, 1.1, 8))["significant"] is True  # 8 runs: an interval at 99 % counts
    assert bootstrap_comparison(np.linspace(2, 3, 50), np.linspace(0, 1, 50), n_boot=50)["significant"] is True


def test_too_few_runs_for_the_runs_interval_get_no_star_but_say_so():
    """--statistic runs starred a reduction from two (or three) evaluation runs: its 99 % quantile interval of per-run
    differences is then their range, which lies on one side of zero by chance half the time (2 · 0.5ⁿ). Below the
    fewest runs for which that chance is at most 1 %, the cell says so instead of a star."""
    from ct_lightning.evaluation.compare import fewest_runs

    assert fewest_runs(0.99) == 8 and 2 * 0.5 ** 8 <= 0.01 < 2 * 0.5 ** 7 and fewest_runs(0.95) == 6
    two = run_comparison([2.0, 2.1], [1.0, 1.2])
    assert two["ci_high"] < 0 and two["significant"] is False and two["too_few_runs"] is True  # the range excludes 0
    runs = np.linspace(1.9, 2.1, 8)
    eight = run_comparison(runs, runs - np.linspace(0.9, 1.1, 8))
    assert eight["significant"] is True and eight["too_few_runs"] is False
    assert bootstrap_comparison(np.linspace(2, 3, 50), np.linspace(0, 1, 50), n_boot=50).get("too_few_runs") is None
    for stats, cell in ((two, " (too few runs for a test)"), (eight, "*")):
        row = table_row("loans", {name: stats for name in ("ip", "ip_star")}, {"cost": stats}, {}, {})
        text = format_cell(row, "ip").split(" †")[0]  # the dagger: no sample counts in this made-up row
        assert text.endswith(cell) and text.count("*") == (cell == "*"), text
    # the legend names the level --confidence set (it said 99% at any level)
    from ct_lightning.experiment.workflows.compare import statistic_legend

    assert "* the central 95% quantile interval" in statistic_legend("runs", 0.95)
    assert "fewer than 6 runs" in statistic_legend("runs", 0.95)
    assert "* 99.5% bootstrap interval" in statistic_legend("bootstrap", 0.995)


# ------------------------------------------------------------------------------------- IP* dagger
def _result(n_valid_per_group: list[int], ip_star: list[float]) -> EvaluationResult:
    """A real evaluation result of one run and len(groups) λ values, 10 counterfactuals per group."""
    lams = np.repeat(np.arange(len(ip_star), dtype=float), 10)
    valid = np.concatenate([np.arange(10) < n for n in n_valid_per_group])
    ip = np.where(valid, 1.0 + 0.1 * np.arange(valid.size), np.nan)
    samples = {"run": np.zeros(valid.size, dtype=int), "lambda_energy": lams, "valid": valid, "ip": ip,
               "cost": ip.copy(), "converged": valid.copy()}
    groups = {"run": np.zeros(len(ip_star), dtype=int), "lambda_energy": np.arange(len(ip_star), dtype=float),
              "n": np.full(len(ip_star), 10), "n_valid": np.asarray(n_valid_per_group),
              "validity": np.asarray(n_valid_per_group) / 10, "ip_star": np.asarray(ip_star, dtype=float)}
    return EvaluationResult(samples, groups, {"accuracy": 0.9, "robust_accuracy": 0.8}, {}, EvaluationConfig(),
                            torch.zeros(valid.size, 2), torch.zeros(valid.size, 2))


def test_ip_star_from_few_valid_counterfactuals_gets_the_dagger():
    bl, ct = _result([2, 3], [0.4, 0.5]), _result([10, 10], [0.2, 0.3])  # BL: 5 valid counterfactuals behind IP*
    pair = compare_evaluations(bl, ct, ("ip", "ip_star"), n_boot=10)
    row = table_row("credit", pair, {}, bl.summary(), ct.summary())
    assert "† (n 5/20)" in format_cell(row, "ip_star"), format_cell(row, "ip_star")
    assert "† (n 5/20)" in format_cell(row, "ip")
    many = _result([10, 10], [0.4, 0.5])
    plenty = table_row("credit", compare_evaluations(many, many, ("ip_star",), n_boot=10), {}, many.summary(),
                       many.summary())
    assert "† (n 20/20)" in format_cell(plenty, "ip_star")  # 20 < 30 on both sides
    wide = _result([10] * 4, [0.1, 0.2, 0.3, 0.4])
    row = table_row("credit", compare_evaluations(wide, wide, ("ip_star",), n_boot=10), {}, wide.summary(),
                    wide.summary())
    assert "†" not in format_cell(row, "ip_star")  # 40 valid counterfactuals a side


def test_table_csv_writes_nested_values_as_json(tmp_path):
    """A compare row's nested values (the comparison details, per-λ values, the protocol's λ list) were written to
    table.csv as Python reprs ('{'bl_mean': nan, ...}', '(0.1, 0.5)'), which no JSON reader parses; now JSON, a
    missing number null, equal to what summary.json holds."""
    bl, ct = _result([2, 3], [0.4, float("nan")]), _result([10, 10], [0.2, 0.3])
    pair = compare_evaluations(bl, ct, ("ip", "ip_star"), n_boot=10)
    row = table_row("loans", pair, {}, bl.summary(), ct.summary())
    row["protocol"] = {"bl": {"lambda_energies": (0.1, 0.5), "n_runs": 1}}
    row["details"] = {"plausibility": pair, "per_lambda": {"bl": bl.summary()["per_lambda"]}}
    write_csv([row], tmp_path / "table.csv")
    write_json_atomic(tmp_path / "summary.json", {"rows": [row]}, strict=True)
    with open(tmp_path / "table.csv", newline="") as handle:
        [cells] = list(csv.DictReader(handle))
    [expected] = _strict((tmp_path / "summary.json").read_text())["rows"]
    assert _strict(cells["details_plausibility_ip_star"]) == expected["details"]["plausibility"]["ip_star"]
    assert _strict(cells["details_per_lambda_bl"]) == expected["details"]["per_lambda"]["bl"]
    assert _strict(cells["protocol_bl_lambda_energies"]) == [0.1, 0.5] and cells["protocol_bl_n_runs"] == "1"
    assert cells["data"] == "loans"


# ---------------------------------------------------------------------------------- paper comparison
def test_a_users_table_is_never_put_beside_the_paper():
    row = {"data": "credit", "ip_reduction_pct": -12.4, "ip_se": 1.0, "ip_star_reduction_pct": 3.0,
           "ip_star_se": 1.0, "cost_reduction_pct": 5.0, "cost_se": 1.0,
           "significant": {"ip": True, "ip_star": False, "cost": False}, "bl": {}, "ct": {}}
    assert "12.31" in paper_comparison([{**row, "built_in": True}])  # the built-in Credit: the paper's row
    text = paper_comparison([{**row, "built_in": False}])
    assert "Cred" not in text and "12.31" not in text and "opposite" not in text.replace("0 opposite", "")
    assert "Verdicts over 0 cells" in text


def test_strict_json_writes_null_for_nan(tmp_path):
    write_json_atomic(tmp_path / "s.json", {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2.5}},
                      strict=True)
    assert _strict((tmp_path / "s.json").read_text()) == {"a": None, "b": [1.0, None], "c": {"d": 2.5}}


# ------------------------------------------------------------------------------------------ the recipe
def _env(tmp_path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore",
            "CT_CACHE_DIR": str(tmp_path / "cache")}


def _runs(database: Path) -> list:
    if not database.is_file():
        return []
    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type='table'")}
        return list(connection.execute("select run_uuid from runs")) if "runs" in tables else []


@pytest.mark.slow
def test_compare_on_a_file_named_credit(tmp_path):
    """One tiny reproduction (two models, one epoch, one evaluation run) of a copy of the loans fixture named
    credit.csv, with a data spec that fixes age."""
    table = tmp_path / "credit.csv"
    table.write_text(LOANS.read_text())
    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  age: {mutability: none}\n")
    store, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "out"
    argv = ["--data", "credit.csv", "--target", "approved", "--data-spec", str(spec), "--no-actionability",
            "--max-epochs", "1", "--nce", "20", "--n-runs", "1", "--n-individuals", "10", "--n-boot", "10",
            "--lambda-energy", "0.5", "--tracking-uri", store, "--out-dir", str(out), "--no-progress"]
    done = run_script(ROOT / "recipes" / "compare.py", argv, env=_env(tmp_path), cwd=tmp_path, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    # never beside the paper's tables: a comparison file held a '| credit | ... | n/a |' row and "Verdicts over 0 cells"
    assert not (out / "paper_comparison.md").exists() and (out / "table.md").is_file()
    summary = _strict((out / "summary.json").read_text())  # no bare NaN
    [row] = summary["rows"]
    assert row["built_in"] is False and not any(row["significant"].values())
    assert row["details"]["plausibility"]["ip"]["significant"] is False  # one evaluation run: no interval
    with open(out / "table.csv", newline="") as handle:  # nested values as JSON, the same as summary.json's
        [cells] = list(csv.DictReader(handle))
    assert _strict(cells["details_plausibility_ip"]) == row["details"]["plausibility"]["ip"]
    assert _strict(cells["robust_curves_ct_accuracy"]) == row["robust_curves"]["ct"]["accuracy"]
    assert "*" not in summary["table_markdown"].splitlines()[2]
    assert "†" in summary["table_markdown"].splitlines()[2].split("|")[3]  # IP*: fewer than 30 valid
    words = shlex.split(summary["command"])  # from this folder: its relative credit.csv means the same again
    assert words[:3] == ["cd", str(tmp_path), "&&"], words[:3]
    assert Path(words[4]).is_absolute() and Path(words[4]) == ROOT / "recipes" / "compare.py", words[:5]
    assert "all features mutable" not in output  # age stays fixed in the training and evaluation of both pairs
    assert "the data spec's own mutability in training and evaluation" in output, output[-3000:]
    assert "- credit, IP/IP*: immutable: age; within the data domain" in output, output[-3000:]


def test_immutable_in_the_wrong_case_is_refused_before_training(tmp_path):
    argv = ["--data", str(LOANS), "--target", "approved", "--immutable", "AGE", "--max-epochs", "1",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out-dir", str(tmp_path / "out")]
    done = run_script(ROOT / "recipes" / "compare.py", argv, env=_env(tmp_path), cwd=tmp_path, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --immutable: got 'AGE' (unknown feature"), output[-3000:]
    assert _runs(tmp_path / "mlflow.db") == []  # refused before any run


@pytest.mark.parametrize("arguments, said", [
    (["--target", "approvd", "--immutable", "age"], "error: --target: column 'approvd' not found in "),
    (["--target", "approved", "--immutable", "agee"], "error: --immutable: got 'agee' (unknown feature; did you mean 'age'?); allowed: the features: age, "),
    (["--target", "approved", "--immutable", "age", "--drop-columns", "sexx"], "error: --drop-columns: got 'sexx', not a "
                                                                               "column of "),
], ids=["target", "immutable", "drop"])
def test_a_column_named_wrong_is_refused_before_torch_is_imported(tmp_path, arguments, said):
    """compare.py read the table with torch loaded (about 6 s) before refusing a misspelt column; it now reads the
    header line first, as train.py and sweep.py do (a real process: ``-X importtime`` lists every import)."""
    import re
    import subprocess
    import sys

    argv = ["--data", str(LOANS), *arguments, "--max-epochs", "1", "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}", "--out-dir", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "recipes" / "compare.py"), *argv],
                          cwd=tmp_path, env={**_env(tmp_path), "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), (done.returncode, lines)
    assert not re.findall(r"^import time:.*\|\s+(torch|lightning)(?:\.\S*)?$", done.stderr, re.MULTILINE)


def test_a_reused_run_without_a_checkpoint_is_refused_in_one_line(tmp_path):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("ct-lightning", artifact_location=str(tmp_path / "artifacts"))
    bare = client.create_run(experiment).info.run_id  # as --limit-train-batches 0 or deleted checkpoints leave it
    argv = ["--data", "circles", "--bl-run-id", bare, "--ct-run-id", bare, "--no-actionability",
            "--tracking-uri", store, "--out-dir", str(tmp_path / "out")]
    done = run_script(ROOT / "recipes" / "compare.py", argv, env=_env(tmp_path), cwd=tmp_path, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --bl-run-id: got '{bare}'"), output[-3000:]
    assert "checkpoints/last.ckpt" in errors[0]
    assert len(_runs(tmp_path / "mlflow.db")) == 1 and not (tmp_path / "out").exists()  # no parent run, no output
