"""Table 1 over training seeds (``ct_lightning.evaluation.seeds``, ``compare.py --seeds``)."""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from preloaded import run_script

from ct_lightning.evaluation.paper import PUBLISHED, SATML_TABLE1
from ct_lightning.evaluation.seeds import aggregate_cell, aggregate_rows, robust_verdict, t_test

ROOT = Path(__file__).resolve().parents[1]


def test_t_test_against_the_closed_form_for_two_degrees_of_freedom():
    t, p = t_test([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3
    assert t == pytest.approx(2.0 / (1.0 / math.sqrt(3.0)))
    # Student t with 2 degrees of freedom: F(t) = 1/2 + t / (2 sqrt(t^2 + 2)), so p = 1 - t / sqrt(t^2 + 2)
    assert p == pytest.approx(1.0 - t / math.sqrt(t * t + 2.0))
    assert t_test([float("nan"), 1.0, 2.0, 3.0]) == (t, p), "missing seeds are left out"
    assert math.isnan(t_test([1.0])[1]) and t_test([2.0, 2.0]) == (math.inf, 0.0) and t_test([0.0, 0.0])[1] == 1.0


def test_robust_verdict_needs_four_of_five_seeds():
    assert robust_verdict(["same"] * 4 + ["opposite"]) == "same"
    assert robust_verdict(["same"] * 3 + ["direction only"] * 2) == "seed-dependent"
    assert robust_verdict(["direction only"] * 5) == "direction only"
    assert robust_verdict(["same", "same", "same", "same", "n/a"]) == "same", "n/a seeds are left out"
    assert robust_verdict(["same", "n/a", "n/a"]) == "n/a"


def test_cell_counts_agreement_with_each_published_table():
    # MNIST cost: arXiv -12.34 n.s., satml -35.11*; five seeds, negative, one starred
    values, stars = [-25.0, -31.1, -27.1, -24.8, -23.6], [False, True, False, False, False]
    cell = aggregate_cell(values, stars, 0.99, label="MNIST", metric="cost")
    assert cell["mean"] == pytest.approx(sum(values) / 5) and cell["min"] == -31.1 and cell["max"] == -23.6
    assert cell["n_significant"] == 1 and cell["n_positive"] == 0 and cell["n_seeds"] == 5
    arxiv, satml = cell["published"]["arxiv"], cell["published"]["satml"]
    assert (arxiv["sign_agrees"], arxiv["significance_agrees"], arxiv["same"]) == (5, 4, 4)
    assert arxiv["robust"] == "same"
    assert (satml["sign_agrees"], satml["significance_agrees"], satml["same"]) == (5, 1, 1)
    assert satml["robust"] == "direction only" and satml["per_seed"].count("direction only") == 4
    assert cell["t_significant"] and satml["t_verdict"] == "same" and arxiv["t_verdict"] == "direction only"


def test_aggregate_rows_and_the_satml_transcription():
    rows = {seed: [{"data": "ls", "ip_reduction_pct": 20.0 + seed, "ip_star_reduction_pct": 30.0,
                    "cost_reduction_pct": math.nan, "significant": {"ip": True, "ip_star": True, "cost": False}}]
            for seed in range(5)}
    (row,) = aggregate_rows(rows)
    assert row["label"] == "LS" and row["seeds"] == [0, 1, 2, 3, 4]
    assert row["ip"]["mean"] == pytest.approx(22.0) and row["ip"]["sd"] == pytest.approx(math.sqrt(2.5))
    assert row["cost"]["n_seeds"] == 0 and row["cost"]["published"]["satml"]["robust"] == "n/a"
    assert row["ip"]["published"]["satml"]["robust"] == "same"
    # main.tex at 94e80a16, spot checks named in issue 24
    assert SATML_TABLE1["LS"]["ip"] == (26.26, 0.67, True) and SATML_TABLE1["Moon"]["ip_star"] == (8.0, 9.44, False)
    assert SATML_TABLE1["MNIST"]["cost"] == (-35.11, 6.96, True) and SATML_TABLE1["GMSC"]["ip_star"][0] == 24.75
    assert set(PUBLISHED) == {"arxiv", "satml"} and all(len(t[1]) == 9 for t in PUBLISHED.values())


def _training_keys(store: Path) -> Counter:
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.studies.reproduce import CONFIG_KEY_TAG

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("ct-lightning")
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'")
    return Counter(run.data.tags[CONFIG_KEY_TAG] for run in runs if CONFIG_KEY_TAG in run.data.tags)


COMPARE = ROOT / "recipes" / "compare.py"


def test_seeds_reuse_a_single_seed_reproduction(tmp_path):
    store = tmp_path / "mlflow.db"
    common = ["--data", "circles", "--max-epochs", "1",
              "--n-runs", "2", "--n-individuals", "6", "--lambda-energy", "1", "--limit-train-batches", "3",
              "--tracking-uri", f"sqlite:///{store}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    first = run_script(COMPARE, [*common, "--seed", "0", "--out-dir", str(tmp_path / "one")], env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert len(_training_keys(store)) == 4
    second = run_script(COMPARE, [*common, "--seeds", "0,1", "--out-dir", str(tmp_path / "many")], env=env,
                        cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    keys = _training_keys(store)
    assert len(keys) == 8 and set(keys.values()) == {1}, "seed 0 was trained again"
    outcomes = Counter(re.findall(r"done\] \S+ (trained\+evaluated|evaluated|reused) in ", second.stdout))
    assert outcomes == {"reused": 4, "trained+evaluated": 4}
    for name in ("table.md", "table.csv", "summary.json", "paper_comparison.md", "s0/table.md", "s1/table.md"):
        assert (tmp_path / "many" / name).is_file(), name
    table = (tmp_path / "many" / "table.md").read_text()  # the constraints each pair was evaluated under
    assert "- circles, IP/IP*: every feature mutable; within the data domain" in table, table
    assert "- circles, Cost: immutable: x1; within the data domain" in table, table
    import json

    summary = json.loads((tmp_path / "many" / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["per_seed"]["0"]["rows"][0]["ip_reduction_pct"] == \
        json.loads((tmp_path / "one" / "summary.json").read_text())["rows"][0]["ip_reduction_pct"]
    comparison = (tmp_path / "many" / "paper_comparison.md").read_text()
    assert "arXiv July 2025" in comparison and "main.tex" in comparison
