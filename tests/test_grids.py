"""The App. D/E grids: transcription against the paper's counts, shared BL trainings, a tiny grid end to end.

The end-to-end test runs a real tiny grid (2 epochs, real Lightning Trainer, real MLflow SQLite store)
through recipes/appendix.py in a subprocess, kills it after its first model, re-runs it and checks
that every distinct training ran exactly once to completion and vanilla points shared one training.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from preloaded import run_script, start_script
import torch

from ct_lightning.experiment.studies.grids import (NOTE1, VANILLA_IGNORED, effective_overrides, f1_score, load_grid,
                                           plan)

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ["ls", "circles", "moons", "ol"]
NINE = ["adult", "california_housing", "circles", "credit", "gmsc", "ls", "mnist", "moons", "ol"]


@pytest.mark.parametrize("name, per_set, datasets", [("note3", 270, SYNTHETIC), ("note5", 270, SYNTHETIC),
                                                     ("note7", 48, SYNTHETIC), ("note9", 18, NINE),
                                                     ("note11", 18, NINE)])
def test_grid_counts_match_the_paper(name, per_set, datasets):
    grid = load_grid(name)
    assert len(grid.points()) == per_set
    assert sorted(grid.data) == sorted(datasets)
    assert grid.space["objective"] == ["full", "vanilla"]


def test_transcribed_values():
    assert load_grid("note3").space["lambda_energy"] == [0.1, 0.5, 5.0, 10.0, 20.0]
    assert load_grid("note3").space["max_steps"] == [5, 25, 50]
    assert load_grid("note5").space["lambda_reg"] == [0.0, 0.01, 0.1, 0.25, 0.5]
    assert load_grid("note7").space["nce"] == [100, 1000]
    assert load_grid("note9").space["tau"] == [0.5, 0.75, 0.9]
    assert load_grid("note11").base["tau"] == 0.5
    for name in ("note3", "note5", "note7", "note9", "note11"):
        assert load_grid(name).evaluation["lambda_energy"] == [0.1, 0.5, 1.0, 5.0, 10.0]


def test_unknown_grid_is_a_clear_error():
    with pytest.raises(ValueError, match="grid: unknown 'note99'; allowed: note11, note3"):
        load_grid("note99")


@pytest.mark.parametrize("name, per_set", [("note3", 136), ("note5", 136), ("note7", 26), ("note9", 10)])
def test_vanilla_points_share_one_training(name, per_set, tmp_path):
    # Note 3/5: 135 CT points + 1 BL; Note 7: 24 CT + one BL per epoch count (50, 100); Note 9: 9 CT + 1 BL.
    grid = load_grid(name)
    points, jobs = plan(grid, ["moons"], f"sqlite:///{tmp_path}/m.db", "x")
    assert len(points) == len(grid.points())
    assert len(jobs) == per_set


def test_effective_overrides_keep_what_vanilla_reads():
    full = {**NOTE1, "data": "moons", "generator": "revise", "nce": 100}
    vanilla = effective_overrides({**full, "objective": "vanilla"})
    assert not set(VANILLA_IGNORED) & set(vanilla)
    assert vanilla["lr"] == NOTE1["lr"] and vanilla["max_epochs"] == NOTE1["max_epochs"]
    assert effective_overrides(full) == full


def test_f1_against_a_hand_count():
    predicted, labels = torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 0, 0, 1, 1])
    # class 1: tp 2, fp 1, fn 1 -> 2*2 / (4 + 1 + 1)
    assert f1_score(predicted, labels, 2) == pytest.approx(4 / 6)
    # three classes: macro average of per-class F1
    p3, l3 = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 2, 2, 1])
    assert f1_score(p3, l3, 3) == pytest.approx((1.0 + 0.0 + 0.5) / 3)


def test_vanilla_training_ignores_the_search_settings(tmp_path):
    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path}/m.db"
    base = {"data": "moons", "objective": "vanilla", "max_epochs": 1, "tracking_uri": uri, "progress": False}
    a = train({**base, "generator": "ecco"})["run_id"]
    b = train({**base, "generator": "generic", "nce": 100, "tau": 0.5, "lambda_reg": 0.0, "burnin": 0.5,
               "max_steps": 5, "lambda_energy": 20.0, "search_lr": 1.0, "lambda_adv": 1.0, "lambda_div": 0.01})["run_id"]
    wa, wb = (load_run(r, uri).module.state_dict() for r in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


TINY = """name: tiny
title: tiny test grid
data: [moons]
space:
  generator: [ecco, generic]
  nce: [20, 40]
  objective: [full, vanilla]
evaluation:
  lambda_energy: [0.5, 5.0]
"""


def _recipe(grid: Path, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "recipes" / "appendix.py"), "--grid", str(grid), "--max-epochs", "2",
            "--n-runs", "2", "--n-individuals", "8", "--tracking-uri", f"sqlite:///{out}/mlflow.db",
            "--out-dir", str(out)]


def test_tiny_grid_end_to_end_resumes_and_shares_bl(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    grid = tmp_path / "tiny.yaml"
    grid.write_text(TINY)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    results = tmp_path / "tiny.json"
    # First invocation: SIGTERM (a scheduler's preemption) once its first model is stored: it stops at the end of
    # the training's epoch or at once between trainings, exits 143 and leaves its parent run KILLED.
    # Forked from the preloaded interpreter (one job: the grid trains in this one process, no workers to reach).
    command = _recipe(grid, tmp_path)
    process = start_script(command[1], command[2:], env=env, cwd=Path.cwd())
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if results.exists() and json.loads(results.read_text())["models"]:
            break
        time.sleep(0.1)
    assert process.poll() is None, "the grid finished before it could be interrupted"
    os.kill(process.pid, signal.SIGTERM)
    stopped = process.wait(300)
    stderr = stopped.stderr
    assert stopped.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    first = json.loads(results.read_text())
    assert 1 <= len(first["models"]) < 5
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (parent,) = client.search_runs([client.get_experiment_by_name("ct-appendix").experiment_id],
                                   "tags.`ct.role` = 'grid'")
    assert parent.info.status == "KILLED" and parent.data.tags["ct.interrupted"].startswith("SIGTERM")
    # Second invocation: finishes the rest.
    done = run_script(command[1], command[2:], env=env, cwd=Path.cwd())
    assert done.returncode == 0, done.stderr[-2000:]
    final = json.loads(results.read_text())
    assert final["n_points"] == 8 and final["n_models"] == 5  # 4 CT points + 1 shared BL
    assert len(final["models"]) == 5 and not final["failures"]
    reused = [m for m in final["models"].values() if not m["trained"]]
    assert len(reused) >= len(first["models"])  # what finished before the kill was not trained again
    resumed = client.get_run(parent.info.run_id)  # the same parent, finished: no longer tagged as interrupted
    assert resumed.info.status == "FINISHED" and "ct.interrupted" not in resumed.data.tags
    experiment = client.get_experiment_by_name("ct-appendix")
    finished = client.search_runs([experiment.experiment_id],
                                  "tags.`ct.role` = 'grid-model' and attributes.status = 'FINISHED'")
    assert len(finished) == 5  # every distinct training exactly once, the BL once for its 4 points
    assert len({r.data.tags["ct.config_key"] for r in finished}) == 5
    for model in final["models"].values():
        evaluation = model["evaluation"]
        assert len(evaluation["groups"]) == 2 * 2  # runs × λ_egy
        assert 0.0 <= evaluation["accuracy"] <= 1.0
    parents = client.search_runs([experiment.experiment_id], "tags.`ct.role` = 'grid'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # The report: tables and box plots from the results.
    from ct_lightning.experiment.studies.appendix_report import write_report

    doc = tmp_path / "docs" / "appendix.md"
    evidence = write_report(tmp_path, tmp_path / "docs" / "appendix", doc)
    text = doc.read_text()
    assert "| moons | full |" in text and "| moons | vanilla |" in text
    assert (tmp_path / "docs" / "appendix" / "tiny_ip.png").exists()
    assert set(evidence["tiny"]["ip"]["generator"]["moons"]) == {"ecco", "generic"}


def test_percent_change_from_the_matching_baseline():
    from ct_lightning.experiment.studies.appendix_report import medians_by, percent_changes

    def row(objective, generator, ips):
        groups = [{"run": r, "lambda_energy": 1.0, "ip": ip, "cost": 1.0, "validity": 1.0} for r, ip in enumerate(ips)]
        return {"data": "moons", "params": {"generator": generator, "objective": objective},
                "evaluation": {"groups": groups, "accuracy": 1.0, "f1": 1.0}}

    rows = [row("vanilla", "ecco", [2.0, 4.0]), row("vanilla", "generic", [2.0, 4.0]),
            row("full", "ecco", [1.0, 5.0]), row("full", "generic", [3.0, None])]
    changes = percent_changes(rows, "ip")
    # ecco: (1-2)/2 = -50 %, (5-4)/4 = +25 %; generic: (3-2)/2 = +50 %, the invalid group is skipped
    assert sorted(c["change"] for c in changes) == pytest.approx([-50.0, 25.0, 50.0])
    medians = medians_by(changes, "generator")["moons"]
    assert medians["ecco"] == (pytest.approx(-12.5), 2) and medians["generic"] == (pytest.approx(50.0), 1)


def test_training_key_unchanged_by_the_table_data_settings_at_their_defaults():
    # Stores filled before --data-spec/--impute/--target/--drop-columns/--balance existed are still found (grids and
    # reproductions resume across versions); every table setting is checked, so a new one cannot be forgotten here.
    from ct_lightning.experiment.configuration.settings import SETTINGS_BY_NAME, resolve_config
    from ct_lightning.experiment.studies.reproduce import training_key

    config = resolve_config({"data": "moons"})
    table_settings = [name for name, setting in SETTINGS_BY_NAME.items() if setting.help.startswith("table files:")]
    assert {"data_spec", "impute", "target", "drop_columns", "balance"} <= set(table_settings)
    older = {k: v for k, v in config.items() if k not in table_settings}
    assert training_key(config) == training_key(older)
    for changed in ({"impute": "median"}, {"drop_columns": ["id"]}, {"balance": "undersample"}):
        assert training_key({**config, **changed}) != training_key(config)


def test_the_accuracy_finding_is_judged_on_the_synthetic_sets_only():
    """App. D.1.1 says accuracy drops by at most ~1 point *for the synthetic sets*: a real set's larger drop (Notes 9
    and 11 also run on them) is shown beside the verdict but does not decide it."""
    from ct_lightning.experiment.studies.appendix_report import findings

    def grid(data: str, bl: float, ct: float) -> dict:
        return {"table": {f"{data}/vanilla": {"accuracy": [bl, 0.0]}, f"{data}/full": {"accuracy": [ct, 0.0]}}}

    synthetic_only = {"note9-moons": grid("moons", 0.99, 0.985)}
    with_real = {**synthetic_only, "note9-gmsc": grid("gmsc", 0.76, 0.70)}
    row = lambda evidence: next(line for line in findings(evidence) if "at most ~1 point" in line)
    assert "| supported: largest drop 0.50 points (note9-moons/moons) |" in row(synthetic_only)
    assert "| supported: largest drop 0.50 points" in row(with_real) and "note9-gmsc/gmsc: +6.00 pt" in row(with_real)
    assert "not supported" in row({"note9-moons": grid("moons", 0.99, 0.95)})


def test_the_lambda_reg_finding_weighs_the_three_penalties():
    """"λ_reg is the key penalty" is judged by how far each penalty's values move the median % change in IP; "too
    little hurts Circles" by Circles' medians at λ_reg ≤ 0.01 against ≥ 0.1; a data set not yet run is said so."""
    from ct_lightning.experiment.studies.appendix_report import findings

    def note5(data: str, reg: dict, div: dict, adv: dict) -> dict:
        return {"ip": {name: {data: {str(v): [m, 0] for v, m in values.items()}}
                       for name, values in (("lambda_reg", reg), ("lambda_div", div), ("lambda_adv", adv))}}

    row = lambda evidence: next(line for line in findings(evidence) if "key penalty" in line)
    circles_hurt = note5("circles", {0: -10.0, 0.01: -12.0, 0.1: -40.0, 0.5: -45.0}, {0.01: -30.0, 1: -35.0},
                         {0.1: -30.0, 1: -31.0})
    assert "| supported: λ_reg moves IP most in 1 of 1 data sets; Circles: λ_reg ≤ 0.01 worse than ≥ 0.1 |" in \
        row({"note5-circles": circles_hurt})
    moons_div_key = note5("moons", {0: -20.0, 0.5: -22.0}, {0.01: -5.0, 1: -40.0}, {0.1: -20.0, 1: -21.0})
    assert "| not supported: λ_reg moves IP most in 0 of 1 data sets; Circles not run yet |" in \
        row({"note5-moons": moons_div_key})
    assert "partly supported: λ_reg moves IP most in 1 of 2 data sets" in \
        row({"note5-circles": circles_hurt, "note5-moons": moons_div_key})
    assert "not tested (note5 did not run)" in row({})


def test_the_accuracy_finding_says_which_setting_the_drop_comes_from():
    """Each CT point's drop is taken from its own BL; the setting value whose points drop most is named, with the
    mean drop of the other points (hand-computed below)."""
    from ct_lightning.experiment.studies.appendix_report import accuracy_drops, findings, largest_drop_setting

    def row(objective, reg, adv, accuracy):
        return {"data": "moons", "params": {"lambda_reg": reg, "lambda_adv": adv, "objective": objective},
                "evaluation": {"groups": [], "accuracy": accuracy, "f1": accuracy}}

    rows = [row("vanilla", r, a, 1.0) for r in (0.0, 0.5) for a in (0.1, 1.0)]
    rows += [row("full", 0.0, 0.1, 0.80), row("full", 0.0, 1.0, 0.90), row("full", 0.5, 0.1, 0.99),
             row("full", 0.5, 1.0, 0.98)]
    drops = accuracy_drops(rows, ["lambda_reg", "lambda_adv"])["moons"]
    assert drops["lambda_reg"][0.0] == (pytest.approx(0.30), 2) and drops["lambda_reg"][0.5] == (pytest.approx(0.03), 2)
    assert drops["lambda_adv"][0.1] == (pytest.approx(0.21), 2)
    param, value, drop, rest = largest_drop_setting(drops)
    assert (param, value) == ("lambda_reg", 0.0) and drop == pytest.approx(0.15) and rest == pytest.approx(0.015)
    evidence = {"note5": {"table": {"moons/vanilla": {"accuracy": [1.0, 0.0]}, "moons/full": {"accuracy": [0.9175, 0]}},
                          "accuracy_drop": {"moons": drops}}}
    line = next(line for line in findings(evidence) if "at most ~1 point" in line)
    assert "not supported: largest drop 8.25 points (note5/moons); its points with lambda_reg = 0.0 drop 15.00 " \
           "points on average, the others 1.50" in line


def test_the_whole_study_runs_every_grid():
    from ct_lightning.experiment.workflows.appendix import STUDY, grid_names

    assert sorted(STUDY) == grid_names()  # --grid all leaves no grid out
    assert STUDY.index("note9") < STUDY.index("note11")  # Note 11 reuses Note 9's BLs


@pytest.mark.parametrize("text, said", [
    ("name: mine\ndata: [moons]\nspace: {tau: [0.5], tau: [0.9]}\n", "not valid YAML: line 3, column 21: found 'tau' twice"),
    ("name: mine\nspace: {tau: [0.5]}\n", "(no data); allowed: "),
])
def test_a_grid_file_with_a_key_twice_or_missing_is_refused_in_one_line(tmp_path, text, said):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_grid(str(path))
    assert str(error.value).startswith(f"grid: got {str(path)!r} ") and said in str(error.value)
    assert "\n" not in str(error.value)
