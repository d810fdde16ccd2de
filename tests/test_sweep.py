"""Sweeps: search spaces, the shared executor, and a tiny sweep end to end on Ray Tune into a real MLflow store."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from mlflow.tracking import MlflowClient

from ct_lightning.experiment.studies.executor import LocalExecutor, RayTuneExecutor
from ct_lightning.experiment.studies.sweep import SWEEP_KEY_TAG, combinations, parse_space, run_sweep

HAS_RAY = importlib.util.find_spec("ray") is not None
TINY = {"data": "circles", "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 1, "max_steps": 3,
        "accelerator": "cpu", "experiment": "sweep-test"}


def test_parse_space_reads_values_with_the_settings_types():
    space = parse_space(["lambda_div=0.01,0.1", "nce=100,1000", "generator=ecco,revise", "hidden_sizes=32;64,64",
                         "protect=true,false"])
    assert space == {"lambda_div": [0.01, 0.1], "nce": [100, 1000], "generator": ["ecco", "revise"],
                     "hidden_sizes": [[32], [64, 64]], "protect": [True, False]}
    with pytest.raises(ValueError, match=r"--param: got 'lambda_bogus=1' \(unknown setting 'lambda_bogus'\); allowed: "
                                         r"NAME=V1,V2,\.\.\. with NAME a setting .*lambda_div"):
        parse_space(["lambda_bogus=1"])
    with pytest.raises(ValueError, match=r"--param: got 'nce=x' \('x' cannot be read as a value of nce\); allowed: "
                                         r"nce=V1,V2,\.\.\. with each value an integer ≥ 1"):
        parse_space(["nce=x"])


# Bad sweep inputs that need no data: (arguments, what the one error line says, exit code). Every value error names
# the option, the value given and the values allowed; an environment error names the option and the file.
REFUSED_BEFORE_THE_DATA = [
    (["--param", "tau="], "--param: got 'tau=' (no values); allowed: tau=V1,V2,... with each value a finite number "
                          "in (0, 1]", 2),
    (["--param", "tau=0.5,7"], "--param: got 'tau=0.5,7' (7 is not allowed for tau); allowed: tau=V1,V2,... with "
                               "each value a finite number in (0, 1]", 2),
    (["--param", "tau"], "--param: got 'tau' (no '='); allowed: NAME=V1,V2,... with NAME a setting", 2),
    (["--param", "bogus=1,2"], "--param: got 'bogus=1,2' (unknown setting 'bogus'); allowed: NAME=V1,V2,...", 2),
    (["--param", "tau=0.5", "--param", "tau=0.7"], "(tau is already given); allowed: one --param per setting", 2),
    (["--param", "tau=0.5,0.5"], "(0.5 is given twice); allowed: tau=V1,V2,...", 2),
    (["--param", "nce=x"], "('x' cannot be read as a value of nce); allowed: nce=V1,V2,... with each value an "
                           "integer ≥ 1", 2),
    (["--param", "protect=maybe"], "('maybe' is not true or false); allowed: protect=V1,V2,... with each value true "
                                   "or false", 2),
    (["--param", "generator=ecco,nosuch"], "allowed: generator=V1,V2,... with each value one of amortised, ecco", 2),
    (["--param", "run_name=a,b"], "(run_name does not change the trained model: give it once, as --run-name, for "
                                  "every trial); allowed: NAME=V1,V2,...", 2),
    ([], "--param: none given; allowed: one or more --param NAME=V1,V2,...", 2),
    (["--param", "nce=16", "--search", "random", "--num-samples", "0"], "--num-samples: got 0; allowed: an integer "
                                                                        "≥ 1", 2),
    (["--param", "nce=16", "--metric", "val/bogus"], "--metric: got 'val/bogus' (not logged by the trials); "
                                                     "allowed: val/acc, ", 2),
    (["--param", "nce=16", "--metric", "val/ip"], "(logged only with --eval-every N); allowed: val/acc", 2),
    (["--param", "nce=16", "--cpus-per-trial", "-1"], "--cpus-per-trial: got -1; allowed: a finite number ≥ 0", 2),
    (["--param", "nce=16", "--max-concurrent", "-1", "--executor", "ray"], "--max-concurrent: got -1; allowed: an "
                                                                           "integer ≥ 0", 2),
    (["--param", "nce=16", "--gpus-per-trial", "1"], "--gpus-per-trial: got 1.0 (local trials are processes of "
                                                     "this machine, not Ray Tune trials); allowed: only with --executor "
                                                     "ray", 2),
    (["--param", "nce=16", "--executor", "ray", "--jobs", "2"], "--jobs: got 2", 2),
    (["--param", "limit_train_batches=2,0"], "--limit-train-batches: got 0 (no --from-checkpoint", 2),
    (["--param", "nce=16", "--summary-json", "s.json"], "--summary-json: got 's.json' (it applies to one run, a sweep "
                                                        "trains many); allowed: --sweep-json FILE", 2),
    (["--param", "nce=16", "--from-checkpoint", "missing.ckpt"], "--from-checkpoint: no file at missing.ckpt", 1),
    (["--param", "nce=16", "--config", "missing.yaml"], "--config: no file at missing.yaml", 1),
    (["--param", "nce=16", "--sweep-json", "{loans}/sweep.json"], "--sweep-json", 1),
]


def test_bad_sweep_inputs_are_refused_before_torch_or_the_data_is_loaded(tmp_path):
    """Each refusal that needs no data ends ``recipes/sweep.py`` in one line before torch, Lightning, pandas or
    MLflow is imported, so before the table is read (they used to come after seconds of imports, some after the
    table was read, some only once trials had failed)."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    loans = tmp_path / "loans.csv"
    loans.write_text((root / "tests" / "fixtures" / "loans.csv").read_text())
    base = ["--data", str(loans), "--target", "approved", "--executor", "local", "--max-epochs", "1",
            "--tracking-uri", f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"]
    cases = [[*base, *(a.format(loans=loans) for a in arguments)] for arguments, _, _ in REFUSED_BEFORE_THE_DATA]
    driver = """if True:
        import contextlib, io, json, sys
        sys.path.insert(0, sys.argv[2])
        from recipe_loader import load_recipe
        sweep, answers = load_recipe("sweep"), []
        for argv in json.loads(sys.argv[1]):
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                try:
                    sweep.main(argv)
                    code = 0
                except SystemExit as error:
                    code = error.code
            heavy = sorted(m for m in ("torch", "lightning", "pandas", "mlflow", "ray") if m in sys.modules)
            answers.append({"code": code, "stderr": stderr.getvalue(), "heavy": heavy})
        print(json.dumps(answers))
    """
    env = {**os.environ, "PYTHONPATH": str(root), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", driver, json.dumps(cases), str(root / "tests" / "helpers")],
                          cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    for (arguments, said, code), answer in zip(REFUSED_BEFORE_THE_DATA, answers):
        lines = answer["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (arguments, answer["stderr"])
        assert said.format(loans=loans) in lines[0], (arguments, lines[0])
        assert answer["code"] == code, (arguments, answer)
        assert answer["heavy"] == [], (arguments, f"refused after importing {answer['heavy']}")
    assert not (tmp_path / "store").exists(), "nothing was written"


# Options that name a table's columns, wrong: (arguments, the error line both recipes print).
COLUMNS_NAMED_WRONG = [
    (["--target", "nosuch"], "error: --target: column 'nosuch' not found in loans.csv; allowed: age, income, debt, "
                             "years_employed, home_ownership, purpose, sex, approved"),
    (["--target", "approved", "--immutable", "agee"], "error: --immutable: got 'agee' (unknown feature; did you mean 'age'?); allowed: the features: age, "
                                                      "income, debt, years_employed, home_ownership, purpose, sex"),
    (["--target", "approved", "--drop-columns", "sex", "--mutability", "Debt=decrease"],
     "error: --mutability: got 'Debt' (unknown feature; did you mean 'debt'? names are case-sensitive); allowed: "
     "the features: "
     "age, income, debt, years_employed, home_ownership, purpose"),
    (["--target", "approved", "--drop-columns", "sexx"], "error: --drop-columns: got 'sexx', not a column of loans.csv; "
                                                         "allowed: age, income, debt, years_employed, home_ownership, "
                                                         "purpose, sex, approved"),
]


@pytest.mark.parametrize("arguments, said", COLUMNS_NAMED_WRONG, ids=["target", "immutable", "mutability", "drop"])
def test_sweep_refuses_a_column_named_wrong_as_train_does_before_torch(tmp_path, arguments, said):
    """A bad ``--target``, ``--immutable``, ``--mutability`` or ``--drop-columns`` on a table: ``sweep.py`` refused it
    only after torch and
    the data module were loaded (about 7 s), ``train.py`` the last two too (8 s). Both now read the table's header
    line first: exit code 2, the same one line, and torch is never imported (``-X importtime`` lists every import)."""
    import re
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "tests" / "fixtures" / "loans.csv", tmp_path / "loans.csv")
    common = ["--data", "loans.csv", *arguments, "--max-epochs", "1",
              "--tracking-uri", f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"]
    env = {**os.environ, "PYTHONPATH": str(root), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore"}
    for recipe, extra in (("sweep", ["--executor", "local", "--param", "lambda_reg=0.1,0.5"]), ("train", [])):
        done = subprocess.run([sys.executable, "-X", "importtime", str(root / "recipes" / f"{recipe}.py"), *common,
                               *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
        assert done.returncode == 2 and lines == [said], (recipe, done.returncode, lines, done.stdout[-2000:])
        imported = re.findall(r"^import time:.*\|\s+(torch|lightning)(?:\.\S*)?$", done.stderr, re.MULTILINE)
        assert imported == [], f"{recipe}.py imported {sorted(set(imported))} before refusing"
    assert not (tmp_path / "store").exists(), "nothing was written"


def test_grid_and_random_combinations():
    space = {"a": [1, 2, 3], "b": ["x", "y"]}
    grid = combinations(space, "grid")
    assert len(grid) == 6 and {tuple(c.values()) for c in grid} == {(a, b) for a in (1, 2, 3) for b in "xy"}
    drawn = combinations(space, "random", num_samples=4, seed=1)
    assert len(drawn) == 4 and len({tuple(c.values()) for c in drawn}) == 4
    assert drawn == combinations(space, "random", num_samples=4, seed=1)  # reproducible, so resumable
    with pytest.raises(ValueError, match="--search: got 'bayes'; allowed: grid, random"):
        combinations(space, "bayes")


def square_or_fail(x: int) -> dict:
    """Module level, so spawned workers can import it."""
    if x == 2:
        raise ValueError("two is not allowed")
    return {"square": x * x}


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_executor_reports_a_failure_and_goes_on(jobs):
    seen = []
    outcomes = LocalExecutor(jobs).run(square_or_fail, [1, 2, 3], ["one", "two", "three"], seen.append)
    assert sorted((o.index, o.label, o.result, o.error) for o in seen) == [
        (0, "one", {"square": 1}, None), (1, "two", None, "ValueError: two is not allowed"),
        (2, "three", {"square": 9}, None)]
    assert len(outcomes) == 3


def test_local_executor_fail_fast_raises_inline():
    with pytest.raises(ValueError, match="two is not allowed"):
        LocalExecutor(1, fail_fast=True).run(square_or_fail, [1, 2, 3], ["a", "b", "c"])


def check_sweep(uri: str, summary: dict, n_trials: int) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("sweep-test")
    parents = client.search_runs([experiment.experiment_id], f"tags.`{SWEEP_KEY_TAG}` != ''")
    assert [p.info.run_id for p in parents] == [summary["parent_run_id"]]
    # the parent's own settings do not share a column with the trials' training settings (objective: full/vanilla)
    assert parents[0].data.params["sweep.goal"] == "max val/acc" and "objective" not in parents[0].data.params
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{summary['parent_run_id']}'")
    assert len(children) == n_trials and all(c.info.status == "FINISHED" for c in children)
    for child in children:  # parameters and metrics per trial: what the MLflow UI's parallel coordinates show
        assert {"lambda_div", "nce"} <= set(child.data.params) and "val/acc" in child.data.metrics
        # and the trial's settings in its name, to tell the runs apart in the list
        params = child.data.params
        assert child.info.run_name.endswith(f" lambda_div={params['lambda_div']}, nce={params['nce']}"), child.info.run_name
    assert summary["best"] is not None and summary["best"]["objective"] == max(
        c.data.metrics["val/acc"] for c in children)
    tied = [t["trial"] for t in summary["trials"] if t["objective"] == summary["best"]["objective"]]
    assert summary["best"]["trial"] == min(tied), "ties go to the first trial, whatever order trials finished in"
    # Trials are not registered; the sweep registers its best trial's predictor once (also when it is resumed).
    versions = client.search_model_versions("name = 'ct-circles-ct'")
    assert [v.run_id for v in versions] == [summary["best"]["run_id"]]
    assert summary["registered"] == f"ct-circles-ct/{versions[0].version}"
    return children


def test_sweep_with_local_processes_resumes_and_reports_failures(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    base = {**TINY, "tracking_uri": uri}
    space = {"lambda_div": [0.1, 0.3], "nce": [16]}
    summary = run_sweep(base, space, LocalExecutor(1), echo=lambda *a, **k: None)
    assert summary["failures"] == [] and len(summary["trials"]) == 2
    check_sweep(uri, summary, 2)
    again = run_sweep(base, space, LocalExecutor(1), echo=lambda *a, **k: None)
    assert again["parent_run_id"] == summary["parent_run_id"] and all(t["reused"] for t in again["trials"])
    # the parent names what its trials share (two sweeps' parents had the same params but for the space)
    params = MlflowClient(tracking_uri=uri).get_run(summary["parent_run_id"]).data.params
    assert params["base.data"] == TINY["data"] and params["base.max_epochs"] == str(TINY["max_epochs"])
    assert "base.nce" not in params and params["space.nce"] == "16"
    # generator_options are only checked when the generator is built: that trial fails inside training.
    failing = run_sweep({**base, "max_epochs": 1}, {"generator_options": ["bogus_option=1", None]},
                        LocalExecutor(1), echo=lambda *a, **k: None)
    assert [f["params"] for f in failing["failures"]] == [{"generator_options": "bogus_option=1"}]
    assert [t["params"] for t in failing["trials"]] == [{"generator_options": None}]


def test_vanilla_trials_that_differ_only_in_what_vanilla_does_not_read_share_one_training(tmp_path):
    """lambda_energy x objective full/vanilla: the two vanilla trials are one training (vanilla reads no
    lambda_energy, as in the appendix grids); the second is a FINISHED child run that names the run and trial it
    shares and reports that training's results, which equal a training of its own configuration: in MLflow, that
    training's whole metric history (it used to get the final values alone, at step 0) and its artifacts but the
    checkpoints."""
    import json

    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    base = {**TINY, "tracking_uri": uri}
    space = {"lambda_energy": [1.0, 5.0], "objective": ["full", "vanilla"]}  # trials 1 and 3 are vanilla
    summary = run_sweep(base, space, LocalExecutor(1), echo=lambda *a, **k: None)
    rows = {row["trial"]: row for row in summary["trials"]}
    assert len({row["run_id"] for row in rows.values()}) == 3, "four trials, three trainings"
    assert summary["failures"] == [] and summary["n_trials"] == 4 and summary["n_trainings"] == 3
    assert rows[3]["shares_training_of"] == 1 and rows[3]["run_id"] == rows[1]["run_id"]
    assert rows[3]["metrics"] == rows[1]["metrics"] and "shares_training_of" not in rows[1]
    assert len({rows[i]["run_id"] for i in (0, 1, 2)}) == 3
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_experiment_by_name("sweep-test").experiment_id
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{summary['parent_run_id']}'")
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    from ct_lightning.experiment.studies.sweep import SHARES_TAG, SHARES_TRIAL_TAG

    (shared,) = [c for c in children if SHARES_TAG in c.data.tags]
    assert shared.data.tags[SHARES_TAG] == rows[1]["run_id"] and shared.data.tags[SHARES_TRIAL_TAG] == "1"
    assert shared.data.params["lambda_energy"] == "5.0" and shared.data.params["objective"] == "vanilla"
    assert shared.info.run_name.startswith("trial-3 ") and "trial 1" in shared.data.tags["mlflow.note.content"]
    assert shared.data.metrics["val/acc"] == rows[3]["metrics"]["val/acc"]
    # its run shows the shared training's whole metric history (every epoch), not its final values alone
    trained = client.get_run(rows[1]["run_id"])

    def history(run_id: str, key: str) -> list:
        return sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))

    assert set(shared.data.metrics) == set(trained.data.metrics)
    for key in trained.data.metrics:
        assert history(shared.info.run_id, key) == history(trained.info.run_id, key), key
    assert len(history(shared.info.run_id, "val/acc")) == TINY["max_epochs"]

    # and its small artifacts (plots); the checkpoints stay in the run its tag and note name
    def files(run_id: str, path=None) -> list[str]:
        found = []
        for entry in client.list_artifacts(run_id, path):
            found += files(run_id, entry.path) if entry.is_dir else [entry.path]
        return found

    assert any(path.startswith("checkpoints/") for path in files(trained.info.run_id))
    assert sorted(files(shared.info.run_id)) == sorted(p for p in files(trained.info.run_id)
                                                       if not p.startswith("checkpoints/"))
    assert any(path.startswith("plots/") for path in files(shared.info.run_id))
    assert f"#/experiments/{experiment_id}/runs/{rows[1]['run_id']})" in shared.data.tags["mlflow.note.content"]
    with open(client.download_artifacts(shared.info.run_id, "config.json", str(tmp_path))) as handle:
        config = json.load(handle)
    assert config["lambda_energy"] == 5.0 and config["objective"] == "vanilla"
    # the same results as training trial 3's configuration on its own
    alone = train({**base, "experiment": "alone", "lambda_energy": 5.0, "objective": "vanilla", "progress": False})
    metrics = client.get_run(alone["run_id"]).data.metrics
    assert {k: metrics[k] for k in ("val/acc", "val/loss", "test/acc")} == \
        {k: rows[3]["metrics"][k] for k in ("val/acc", "val/loss", "test/acc")}
    # resumed: every trial reused, the shared one still shares, nothing trained or recorded again
    again = run_sweep(base, space, LocalExecutor(1), echo=lambda *a, **k: None)
    assert all(t["reused"] for t in again["trials"]) and again["trials"][3]["shares_training_of"] == 1
    assert [t["run_id"] for t in again["trials"]] == [t["run_id"] for t in summary["trials"]]
    assert len(client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{summary['parent_run_id']}'")) == 4


def test_a_sweep_ends_with_the_train_command_of_its_best_trial(tmp_path):
    """The last lines of a sweep give the ``recipes/train.py`` command that trains its best trial on its own: read by
    train.py's own parser, it is that trial's training (the same training key as the trial's run), with its swept
    settings shown even where they are defaults (``--objective full``), and no run-only setting of the trial."""
    import shlex

    from recipe_loader import load_recipe

    from ct_lightning.experiment.configuration.settings import resolve_config
    from ct_lightning.experiment.runner import batches
    from ct_lightning.experiment.studies.reproduce import CONFIG_KEY_TAG, training_key

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    base = {**TINY, "tracking_uri": uri, "nce": 16, "domain": False, "hidden_sizes": [8, 8], "lambda_div": 0.3}
    space = {"lambda_reg": [0.05, 0.5], "objective": ["full"]}
    lines = []
    summary = run_sweep(base, space, LocalExecutor(1), echo=lambda line, **k: lines.append(line))
    best = summary["best"]
    assert lines[-2].startswith(f"best trial {best['trial']} ") and lines[-2].endswith(f"(run {best['run_id']})")
    assert lines[-1] == "train the best trial on its own: " + best["train_command"], lines[-1]
    command = shlex.split(best["train_command"])
    assert command[1].endswith("recipes/train.py"), command
    assert " --objective full " in lines[-1] and f" --lambda-reg {best['params']['lambda_reg']} " in lines[-1]
    assert "--no-domain" in command and command[command.index("--hidden-sizes") + 1] == "8,8", command
    assert not {"--run-name", "--checkpoint-dir", "--no-progress", "--overwrite"} & set(command), command
    given = vars(load_recipe("train").build_parser().parse_args(command[2:]))
    given = {k: batches(v) if k.startswith("limit_") else v for k, v in given.items() if k != "write_data_spec"}
    run = MlflowClient(tracking_uri=uri).get_run(best["run_id"])
    assert training_key(resolve_config(given)) == run.data.tags[CONFIG_KEY_TAG]
    assert given["tracking_uri"] == uri and given["experiment"] == TINY["experiment"]


@pytest.mark.skipif(HAS_RAY, reason="Ray is installed here; the message for a missing Ray is checked without it")
def test_sweep_recipe_names_the_extra_when_ray_is_missing(tmp_path):
    from recipe_loader import load_recipe

    sweep = load_recipe("sweep")
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[sweep\]"'):
        sweep.main(["--param", "nce=10,20", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert not (tmp_path / "mlflow.db").exists()  # the error came before any work


@pytest.mark.skipif(not HAS_RAY, reason='Ray is not installed (pip install -e ".[sweep]"); the Ray Tune sweep '
                    'is tested where the extra is installed, as in CI')
def test_tiny_sweep_on_ray_tune_end_to_end_then_resumed(tmp_path, capfd, monkeypatch):
    from ct_lightning.experiment.configuration.console import VERBOSE_ENV, quiet_console

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    space = {"lambda_div": [0.1, 0.5], "nce": [16, 32]}  # 2 x 2 grid
    executor = RayTuneExecutor(cpus=1, max_concurrent=2, storage_path=str(tmp_path / "ray"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    quiet_console(False)  # as recipes/sweep.py without --verbose
    capfd.readouterr()
    summary = run_sweep({**TINY, "tracking_uri": uri}, space, executor)
    assert summary["failures"] == [] and not any(t["reused"] for t in summary["trials"])
    # the console holds our lines only: no Ray start-up notes, Tune tables or MLflow registry lines
    console = capfd.readouterr()
    ours = ("sweep: ", "[", "registered the best trial's predictor", "best trial ", "train the best trial on its own: ")
    assert [line for line in (console.out + console.err).splitlines() if line.strip()
            and not line.startswith(ours)] == [], console.out + console.err
    assert sum(line.startswith("[") for line in console.out.splitlines()) == 4
    children = check_sweep(uri, summary, 4)
    resumed = run_sweep({**TINY, "tracking_uri": uri}, space, RayTuneExecutor(storage_path=str(tmp_path / "ray")),
                        echo=lambda *a, **k: None)
    assert resumed["parent_run_id"] == summary["parent_run_id"] and all(t["reused"] for t in resumed["trials"])
    assert {t["run_id"] for t in resumed["trials"]} == {c.info.run_id for c in children}
    check_sweep(uri, resumed, 4)


@pytest.mark.slow
def test_sweep_recipe_on_a_table_file_with_a_relative_path(tmp_path):
    """``recipes/sweep.py --data loans.csv --target approved`` (issue 23 §1): trials in worker processes find the
    file although they run elsewhere, and every trial trains on the table."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "tests" / "fixtures" / "loans.csv", tmp_path / "loans.csv")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    done = subprocess.run([sys.executable, str(root / "recipes" / "sweep.py"), "--data", "loans.csv", "--target",
                           "approved", "--immutable", "age", "--executor", "local", "--param", "lambda_div=0.1,0.3",
                           "--max-epochs", "1", "--experiment", "sweep-test", "--tracking-uri", uri,
                           "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root), "MLFLOW_TRACKING_URI": ""})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep-test").experiment_id],
                              "tags.`mlflow.parentRunId` != ''")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    for run in runs:
        assert run.data.params["data"] == str(tmp_path / "loans.csv") and run.data.params["target"] == "approved"
    # the parent is named, and tagged, by its table as its trials are: two sweeps of lambda_div on two tables were
    # both 'sweep lambda_div' in the runs list
    parent = client.get_run(runs[0].data.tags["mlflow.parentRunId"])
    assert parent.info.run_name == "sweep loans: lambda_div" and parent.data.tags["data"] == "loans"


def test_run_only_options_are_shared_made_per_trial_or_refused_before_any_work(tmp_path):
    """A run-only setting names one run's outputs or the run to continue: ``--summary-json`` and ``--resume`` are
    refused up front (each trial after the first used to fail on them), ``--checkpoint-dir`` gives every trial
    its own folder in it; a new run-only setting is refused until the sweep decides how it applies."""
    from ct_lightning.experiment.configuration.settings import RUN_ONLY_KEYS
    from ct_lightning.experiment.configuration.sweep_space import PER_TRIAL_RUN_ONLY, SHARED_RUN_ONLY

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    for name in sorted(RUN_ONLY_KEYS - SHARED_RUN_ONLY - PER_TRIAL_RUN_ONLY):
        with pytest.raises(ValueError, match=f"^{name}: got .*; allowed: "):
            run_sweep({**TINY, "tracking_uri": uri, name: "x"}, {"nce": [16, 32]}, LocalExecutor(1),
                      echo=lambda *a, **k: None)
    assert not (tmp_path / "store").exists(), "refused before any work"
    lines = []
    summary = run_sweep({**TINY, "tracking_uri": uri, "checkpoint_dir": str(tmp_path / "ck")}, {"nce": [16, 32]},
                        LocalExecutor(1), echo=lambda line, **k: lines.append(line))
    assert summary["failures"] == [] and len(summary["trials"]) == 2
    client = MlflowClient(tracking_uri=uri)
    folders = {client.get_run(t["run_id"]).data.tags["ct.checkpoint_dir"] for t in summary["trials"]}
    parent = summary["parent_run_id"]
    assert folders == {str(tmp_path / "ck" / f"sweep-{parent[:8]}" / f"trial-{i}") for i in (0, 1)}
    # The same sweep under another --sweep-name: the existing parent is resumed, renamed, and the line says so.
    again = run_sweep({**TINY, "tracking_uri": uri, "checkpoint_dir": str(tmp_path / "ck")}, {"nce": [16, 32]},
                      LocalExecutor(1), name="renamed", echo=lambda line, **k: lines.append(line))
    assert again["parent_run_id"] == parent and client.get_run(parent).info.run_name == "renamed"
    assert any(line.startswith("sweep: resuming sweep 'sweep circles: nce' ") and "renamed 'renamed'" in line for line in lines)


@pytest.mark.slow
def test_ctrl_c_stops_a_local_sweep_cleanly_and_the_same_command_resumes_its_trials(tmp_path):
    """Ctrl-C (SIGINT to the process group) on ``--executor local --jobs 2``: each trial ends its epoch, keeps its
    checkpoint and ends KILLED, the parent too, one last line says to re-run the command, exit code 130. The same
    command then resumes both trials in their own runs from their checkpoints: no second run per trial."""
    import signal
    import subprocess
    import time

    uri, command, env, process = start_local_sweep(tmp_path, "lambda_div=0.1,0.3", max_epochs=400)
    deadline = time.time() + 240
    while len(list((tmp_path / "store" / "checkpoints").glob("*/last.ckpt"))) < 2 and time.time() < deadline \
            and process.poll() is None:
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the sweep and its workers
    out, err = process.communicate(timeout=240)
    assert process.returncode == 130, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "re-run the same command" in err.strip().splitlines()[-1]
    assert "--resume" not in out + err, "a trial names the sweep's command, not its own train.py --resume"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_experiment_by_name("sweep-test").experiment_id
    (parent,) = client.search_runs([experiment_id], f"tags.`{SWEEP_KEY_TAG}` != ''")
    killed = client.search_runs([experiment_id], "tags.`mlflow.parentRunId` != ''")
    assert parent.info.status == "KILLED" and [r.info.status for r in killed] == ["KILLED", "KILLED"]

    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    children = client.search_runs([experiment_id], "tags.`mlflow.parentRunId` != ''")
    assert {r.info.run_id for r in children} == {r.info.run_id for r in killed}, "resumed, not trained again"
    assert all(r.info.status == "FINISHED" for r in children)
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"


def start_local_sweep(tmp_path, param: str, max_epochs: int):
    """``recipes/sweep.py --executor local --jobs 2`` on circles over ``param``, started in a process group of its own
    (so that a test can send it Ctrl-C's SIGINT): its store URI, command, environment and process."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    command = [sys.executable, str(root / "recipes" / "sweep.py"), "--data", "circles", "--executor", "local",
               "--jobs", "2", "--param", param, "--max-epochs", str(max_epochs), "--limit-train-batches", "2",
               "--limit-val-batches", "1", "--nce", "16", "--accelerator", "cpu", "--experiment", "sweep-test",
               "--tracking-uri", uri, "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(root), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    return uri, command, env, process


def spawned_workers(pid: int) -> list[int]:
    """The worker processes (``multiprocessing.spawn``) that process ``pid`` started, from ``/proc``."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if f"\nPPid:\t{pid}\n" in status and b"multiprocessing.spawn" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker processes in /proc")
def test_ctrl_c_while_local_workers_start_is_an_interruption_not_failed_trials(tmp_path):
    """Ctrl-C the moment the ``--executor local`` workers exist, while they still import torch: they used to die with
    a KeyboardInterrupt traceback, breaking the process pool, and every trial read as failed (exit 1). Now it reads
    as a later Ctrl-C does: the parent KILLED and tagged interrupted, the line naming the command to re-run, 130."""
    import signal
    import time

    from ct_lightning.experiment.runs.interrupt import INTERRUPTED_TAG

    uri, _, _, process = start_local_sweep(tmp_path, "lambda_div=0.1,0.3,0.5", max_epochs=2)
    deadline = time.time() + 120
    while not spawned_workers(process.pid) and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the sweep and its workers, which take a second or more to start
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, out[-2000:] + err[-3000:]
    assert "Traceback" not in err and "BrokenProcessPool" not in out + err and "FAILED" not in out, out + err
    assert "KILLED with 0 of 3 trials finished" in err and "re-run the same command" in err.strip().splitlines()[-1]
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_experiment_by_name("sweep-test").experiment_id
    (parent,) = client.search_runs([experiment_id], f"tags.`{SWEEP_KEY_TAG}` != ''")
    assert parent.info.status == "KILLED" and INTERRUPTED_TAG in parent.data.tags
    assert client.search_runs([experiment_id], "tags.`mlflow.parentRunId` != ''") == [], \
        "the signal came while the workers started: no trial began"


DESCRIBED = "columns (kind from the data spec or inferred from the dtypes):"  # a line of a table's description


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.skipif(
    not HAS_RAY, reason='Ray is not installed (pip install -e ".[sweep]")'))])
def test_a_sweep_describes_its_table_once_and_train_still_does(tmp_path, capfd, monkeypatch, executor):
    """A sweep on a table printed the whole description of the data (columns, kinds, notes) once per trial (local
    trials), or never (Ray trials print to their workers' logs): now once, before the first trial, and in the parent
    run as ``data.txt``; each trial's lines are its own (its CT settings, its run). ``train`` still describes it."""
    from pathlib import Path

    from ct_lightning.experiment.configuration.console import VERBOSE_ENV
    from ct_lightning.experiment.runs.train import train

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    loans = str(Path(__file__).parent / "fixtures" / "loans.csv")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    base = {"data": loans, "target": "approved", "max_epochs": 1, "max_steps": 3, "accelerator": "cpu",
            "experiment": "sweep-test", "tracking_uri": uri, "registered_model": "none"}
    run = LocalExecutor(1) if executor == "local" else RayTuneExecutor(cpus=1, max_concurrent=2,
                                                                       storage_path=str(tmp_path / "ray"))
    capfd.readouterr()
    summary = run_sweep(base, {"lambda_reg": [0.1, 0.5]}, run)
    assert summary["failures"] == [] and len(summary["trials"]) == 2
    out = capfd.readouterr().out
    lines = out.splitlines()
    assert lines.count(DESCRIBED) == 1 and sum(line.startswith("data ") for line in lines) == 1, out
    assert lines.index(DESCRIBED) < min(i for i, line in enumerate(lines) if line.startswith("[")), out
    if executor == "local":  # the trial's own settings still show, once per trial
        assert [line.split(": ")[1] for line in lines if line.startswith("CT settings")] == [
            "tau 0.5, nce 210, lambda_reg 0.1, batch_size 32", "tau 0.5, nce 210, lambda_reg 0.5, batch_size 32"], out
    client = MlflowClient(tracking_uri=uri)
    text = Path(client.download_artifacts(summary["parent_run_id"], "data.txt", str(tmp_path))).read_text()
    assert DESCRIBED in text and "purpose: categorical 5 categories" in text
    if executor == "local":
        train({**base, "run_name": "alone"})
        assert capfd.readouterr().out.splitlines().count(DESCRIBED) == 1
