"""recipes/evaluate.py takes every checkpoint form train.py --from-checkpoint takes, and a user's table
(the training split, encoded with the model's own preprocessing); mismatches are one-line errors."""

import json
from pathlib import Path

import pytest
from preloaded import run_script
import torch

ROOT = Path(__file__).resolve().parents[1]
LOANS = ROOT / "tests" / "fixtures" / "loans.csv"
TINY = ["--n-individuals", "4", "--n-runs", "1", "--no-log", "--lambda-energy", "1", "--eval-steps", "10"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real one-epoch training on the loans fixture, with its MLflow store and checkpoint folder."""
    from ct_lightning.experiment.runs.train import train

    folder = tmp_path_factory.mktemp("loans-run")
    uri = f"sqlite:///{folder}/mlflow.db"
    summary = train({"data": str(LOANS), "target": "approved", "immutable": ["age", "sex"], "max_epochs": 1,
                     "nce": 16, "tracking_uri": uri, "progress": False, "checkpoint_dir": str(folder / "ckpt")})
    return {"uri": uri, "folder": folder, "ckpt": folder / "ckpt" / "last.ckpt", "run_id": summary["run_id"]}


def evaluate(*argv, tmp_path):
    """One evaluation into the test's plots folder, replacing an earlier one's plots there (``--overwrite``)."""
    from recipes.evaluate import main

    return main([*argv, *TINY, "--out-dir", str(tmp_path / "plots"), "--overwrite"])


def test_an_evaluation_never_replaces_an_earlier_ones_results(trained, tmp_path, capsys):
    """Evaluating the same run twice with the same --summary-json or --out-dir silently replaced the first
    evaluation's summary and plots. Now the second is refused in one line before any work (naming the option, the
    files and another folder or --overwrite), the first's files unchanged; --overwrite replaces them, atomically."""
    from ct_lightning.experiment.configuration.validation import CliExit
    from recipes.evaluate import main

    out, summary = tmp_path / "eval", tmp_path / "eval.json"
    common = ["--run-id", trained["run_id"], "--tracking-uri", trained["uri"], *TINY]
    first = main([*common, "--out-dir", str(out), "--summary-json", str(summary)])
    kept = {path.name: path.read_bytes() for path in [summary, *out.iterdir()]}
    assert json.loads(summary.read_text())["run_id"] == first["run_id"] and any(out.glob("*.png"))
    capsys.readouterr()
    with pytest.raises(CliExit) as refused:
        main([*common, "--out-dir", str(tmp_path / "other"), "--summary-json", str(summary)])
    assert str(refused.value) == (f"--summary-json: got '{summary}' (the file exists); allowed: a new file path, or "
                                  "--overwrite to replace this one")
    with pytest.raises(CliExit) as refused:
        main([*common, "--out-dir", str(out), "--summary-json", str(tmp_path / "again.json")])
    plots = sorted(path.name for path in out.glob("*.png"))
    assert str(refused.value) == (f"--out-dir: got '{out}' (it holds {', '.join(plots)} of an earlier evaluation); "
                                  "allowed: a folder without an earlier evaluation's results (another --out-dir), or "
                                  "--overwrite to replace them")
    assert "accuracy" not in capsys.readouterr().out  # refused before any work
    assert {path.name: path.read_bytes() for path in [summary, *out.iterdir()]} == kept
    assert not (tmp_path / "other").exists() and not (tmp_path / "again.json").exists()
    main([*common, "--out-dir", str(out), "--summary-json", str(summary), "--overwrite", "--eval-seed", "1"])
    assert json.loads(summary.read_text())["run_id"] == first["run_id"]
    assert summary.read_bytes() != kept["eval.json"] and not list(tmp_path.glob(".eval.json*"))  # no leftover


def test_a_summary_written_by_another_process_meanwhile_is_kept_beside_this_one(tmp_path):
    """The start-up check passed, then another evaluation wrote the same file: neither summary is lost."""
    from ct_lightning.experiment.runs.atomic_files import write_json_new

    path = tmp_path / "summary.json"
    assert write_json_new(path, {"n": 1}) == path
    assert write_json_new(path, {"n": 2}) == tmp_path / "summary-2.json"
    assert json.loads(path.read_text()) == {"n": 1} and json.loads((tmp_path / "summary-2.json").read_text()) == {"n": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary-2.json", "summary.json"]  # no temporary left


def test_a_lightning_checkpoint_on_the_users_table_uses_its_own_preprocessing(trained, tmp_path, capsys):
    lone = tmp_path / "lone.ckpt"  # no config.json beside it: the table comes from --data/--target
    lone.write_bytes(trained["ckpt"].read_bytes())
    payload = evaluate("--checkpoint", str(lone), "--data", str(LOANS), "--target", "approved", tmp_path=tmp_path)
    out = capsys.readouterr().out
    assert "with the model's own preprocessing" in out
    # 'ip: 3.9704' says nothing to someone who has not read the paper: one line says what each measures
    lines = out.splitlines()
    meaning = lines[next(i for i, line in enumerate(lines) if line.strip().startswith("n_valid:")) + 1]
    assert meaning.startswith("what they mean: ip, the mean distance of the valid counterfactuals to real test rows of "
                              "their target class, and ip_star, the MMD² between the two sets: lower, more plausible; "
                              "cost, the ℓ1 distance from the factual in the model's encoding: lower, smaller changes;")
    assert meaning.endswith("robust_accuracy, the accuracy on test rows perturbed by FGSM at ε 0.03 "
                            "(docs/evaluation.md)")
    assert payload["data"] == "loans" and payload["immutable"] and set(payload["immutable"]) >= {"age", "sex"}
    assert 0.0 <= payload["summary"]["validity"] <= 1.0


def test_an_unseen_category_in_the_evaluated_file_gets_advice_for_evaluate(trained, tmp_path):
    """A --data row with a category the model never saw is refused in one line whose advice fits evaluate.py (old
    code: train.py's "train a new model on it (without --from-checkpoint)", an option evaluate.py does not have)."""
    import pandas as pd

    from ct_lightning.experiment.configuration.validation import CliExit

    rows = pd.read_csv(LOANS)
    rows.loc[2, "purpose"] = "wedding"
    rows.to_csv(tmp_path / "unseen.csv", index=False)
    with pytest.raises(CliExit) as refused:
        evaluate("--checkpoint", str(trained["ckpt"]), "--data", str(tmp_path / "unseen.csv"), "--target", "approved",
                 tmp_path=tmp_path)
    message = str(refused.value)
    assert message.startswith("--data: got purpose='wedding' (a category the model was not trained on, in 1 row(s)")
    assert message.endswith("leave those rows out of the file, or use a model trained on rows that hold them "
                            "(recipes/train.py --data on this file)")
    assert "--from-checkpoint" not in message


def test_a_plain_state_dict_needs_the_data_and_infers_the_mlp(trained, tmp_path):
    from ct_lightning.experiment.runs.loading import load_any_checkpoint

    checkpoint = torch.load(trained["ckpt"], weights_only=True)
    state = {k[len("model."):]: v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    plain = tmp_path / "weights.pt"
    torch.save(state, plain)
    loaded = load_any_checkpoint(str(plain), str(LOANS), {"target": "approved"}, trained["uri"])
    assert list(loaded.module.hparams.hidden_sizes) == [state["0.weight"].shape[0]]
    for key, value in state.items():
        torch.testing.assert_close(loaded.module.model.state_dict()[key], value)
    payload = evaluate("--checkpoint", str(plain), "--data", str(LOANS), "--target", "approved", tmp_path=tmp_path)
    assert 0.0 <= payload["summary"]["validity"] <= 1.0


def test_an_mlflow_model_uri_is_evaluated(trained, tmp_path):
    uri = f"runs:/{trained['run_id']}/model"
    payload = evaluate("--checkpoint", uri, "--tracking-uri", trained["uri"], "--data", str(LOANS), "--target",
                       "approved", tmp_path=tmp_path)
    assert payload["checkpoint"] == uri


def run_recipe(*argv):
    return run_script(ROOT / "recipes" / "evaluate.py", [*argv, *TINY], cwd=ROOT)


def one_line_error(done) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("usage")]
    return lines[-1]


@pytest.mark.slow
def test_mismatches_are_one_line_errors(trained, tmp_path):
    checkpoint = torch.load(trained["ckpt"], weights_only=True)
    state = {k[len("model."):]: v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    plain = tmp_path / "weights.pt"
    torch.save(state, plain)
    line = one_line_error(run_recipe("--checkpoint", str(plain)))
    assert line.startswith("error: --data") and "weights only" in line
    line = one_line_error(run_recipe("--checkpoint", str(plain), "--data", "circles"))
    assert line.startswith("error: --checkpoint") and "shape mismatch in 0.weight" in line and "2 features" in line
    line = one_line_error(run_recipe("--checkpoint", str(plain), "--data", str(LOANS)))
    assert line.startswith("error: --target")
    line = one_line_error(run_recipe("--checkpoint", str(trained["ckpt"]), "--data", str(LOANS), "--target", "sex"))
    assert "target" in line and "approved" in line


def test_the_constraints_are_printed_as_the_user_named_them_and_the_data_spec_always_holds(tmp_path, capsys):
    """A categorical column trained immutable is printed once by its name, not as its one-hot inputs; the data
    spec's mutability (age immutable, income increase only) is a fact of the data: --all-mutable drops only what
    the training added (--immutable home_ownership)."""
    from ct_lightning.experiment.runs.train import train

    spec = tmp_path / "spec.yaml"
    spec.write_text("columns:\n  age: {mutability: none}\n  income: {mutability: increase}\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = train({"data": str(LOANS), "target": "approved", "data_spec": str(spec), "immutable": ["home_ownership"],
                     "max_epochs": 1, "nce": 16, "tracking_uri": uri, "progress": False})
    capsys.readouterr()
    payload = evaluate("--run-id", summary["run_id"], "--tracking-uri", uri, tmp_path=tmp_path)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("data loans"))
    assert line == ("data loans (test split), immutable: age, home_ownership; increase only: income; "
                    "within the data domain")
    assert "home_ownership=own" in payload["immutable"]  # the JSON summary keeps the model's inputs
    payload = evaluate("--run-id", summary["run_id"], "--tracking-uri", uri, "--all-mutable", tmp_path=tmp_path)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("data loans"))
    assert line == "data loans (test split), immutable: age; increase only: income; within the data domain"
    assert payload["immutable"] == ["age"] and payload["evaluated_under"] == line.split("split), ")[1]


def test_a_plain_state_dict_of_a_table_read_with_dropped_columns_and_balance_is_evaluated(tmp_path):
    import pandas as pd

    from ct_lightning.models import build_mlp

    table = tmp_path / "applicants.csv"
    pd.read_csv(LOANS).assign(applicant_id=lambda f: range(len(f))).to_csv(table, index=False)
    torch.save(build_mlp(13, 2, [8]).state_dict(), tmp_path / "own.pt")  # trained without applicant_id: 13 inputs
    payload = evaluate("--checkpoint", str(tmp_path / "own.pt"), "--data", str(table), "--target", "approved",
                       "--drop-columns", "applicant_id", "--balance", "undersample", tmp_path=tmp_path)
    assert 0.0 <= payload["summary"]["validity"] <= 1.0
    with pytest.raises(SystemExit, match="weights of a model of 14 features"):  # without: one input too many
        evaluate("--checkpoint", str(tmp_path / "own.pt"), "--data", str(table), "--target", "approved",
                 tmp_path=tmp_path)


def test_a_run_that_logged_its_model_as_it_is_is_evaluated_and_reused_by_compare(trained, tmp_path):
    """The worked example's "before" run (--from-checkpoint with --limit-train-batches 0) logs the model as it was,
    without a checkpoint: evaluate.py --run-id ended in 'no artifact checkpoints/last.ckpt' and compare.py
    --bl-run-id refused it, so the model as it was could not be compared with its fine-tuning. Both now load its
    logged model, with the run's preprocessing and constraints."""
    from ct_lightning.experiment.configuration.validation import InputError, check_run_ids
    from ct_lightning.experiment.runs.train import train

    before = train({"data": str(LOANS), "target": "approved", "immutable": ["age", "sex"],
                    "from_checkpoint": str(trained["ckpt"]), "limit_train_batches": 0, "max_epochs": 1,
                    "objective": "vanilla", "tracking_uri": trained["uri"], "progress": False,
                    "checkpoint_dir": str(tmp_path / "before")})
    assert before["checkpoints"]["last"] is None
    check_run_ids("--bl-run-id", [before["run_id"]], trained["uri"], checkpoint="last")  # compare's check passes
    with pytest.raises(InputError, match="its checkpoints: best.ckpt, last.ckpt"):  # has checkpoints: not the model
        check_run_ids("--bl-run-id", [trained["run_id"]], trained["uri"], checkpoint="nope")
    payload = evaluate("--run-id", before["run_id"], "--tracking-uri", trained["uri"], "--split", "test",
                       tmp_path=tmp_path)
    assert payload["data"] == "loans" and set(payload["immutable"]) >= {"age", "sex"}  # the trained constraints
    assert payload["summary"]["accuracy"] == pytest.approx(before["metrics"]["test/acc"], abs=1e-6)


def test_compare_evaluates_the_model_as_it_was_beside_its_fine_tuning(trained, tmp_path, capsys):
    """compare.py --bl-run-id BEFORE --ct-run-id AFTER: the model as it was (no checkpoint) beside the fine-tuned
    run. The plan said both were trained "with the data spec's own mutability in training and evaluation (no
    --immutable)", though the given runs were trained with --immutable age,sex: compare only evaluates them."""
    from recipes.compare import main
    from ct_lightning.experiment.runs.train import train

    before = train({"data": str(LOANS), "target": "approved", "immutable": ["age", "sex"],
                    "from_checkpoint": str(trained["ckpt"]), "limit_train_batches": 0, "max_epochs": 1,
                    "objective": "vanilla", "tracking_uri": trained["uri"], "progress": False,
                    "checkpoint_dir": str(tmp_path / "before")})
    main(["--data", str(LOANS), "--target", "approved", "--bl-run-id", before["run_id"], "--ct-run-id",
          trained["run_id"], "--no-actionability", "--tracking-uri", trained["uri"], "--out-dir", str(tmp_path / "cmp"),
          "--n-runs", "1", "--n-individuals", "4", "--no-progress"])
    out = capsys.readouterr().out
    plan = [line for line in out.splitlines() if "(given)" in line]
    assert len(plan) == 2 and all("in evaluation (trained as the given run was)" in line and "in training" not in line
                                  for line in plan), plan
    assert (tmp_path / "cmp" / "table.md").is_file()


def test_a_run_with_a_data_spec_is_evaluated_and_explained_from_any_folder(tmp_path, monkeypatch, capsys):
    """``train.py --data-spec spec.yaml`` kept the spec's path as typed while the data's was made absolute, so
    ``evaluate.py --run-id`` (or ``--checkpoint``) from another folder, or after the spec was moved or edited into
    another name, ended with ``error: [Errno 2] No such file or directory: 'spec.yaml'``, although the model's own
    preprocessing holds everything the spec declared. The run now names the spec absolutely, and a model's
    evaluation and explanations never read it again."""
    import json

    from ct_lightning.experiment.runs.train import train
    from recipes.explain import main as explain

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "spec.yaml").write_text("columns:\n  age: {mutability: none}\n  debt: {mutability: decrease}\n")
    monkeypatch.chdir(work)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = train({"data": str(LOANS), "target": "approved", "data_spec": "spec.yaml", "max_epochs": 1, "nce": 16,
                     "tracking_uri": uri, "progress": False, "checkpoint_dir": str(work / "ckpt")})
    assert json.loads((work / "ckpt" / "config.json").read_text())["data_spec"] == str(work / "spec.yaml")
    (work / "spec.yaml").rename(work / "spec-v1.yaml")  # the practitioner keeps the first version under a new name
    monkeypatch.chdir(elsewhere)
    for source in (["--run-id", summary["run_id"], "--tracking-uri", uri], ["--checkpoint", str(work / "ckpt" / "last.ckpt")]):
        payload = evaluate(*source, tmp_path=tmp_path)
        assert set(payload["immutable"]) == {"age"} and 0.0 <= payload["summary"]["validity"] <= 1.0
    row = '{"age": 29, "income": 31000, "debt": 21000, "years_employed": 2, "home_ownership": "rent", ' \
          '"purpose": "car", "sex": "female"}'
    records = explain(["--checkpoint", str(work / "ckpt" / "last.ckpt"), "--row", row, "--data", str(LOANS),
                       "--max-steps", "5", "--no-log"])
    assert records[0]["immutable"] == ["age"] and "Errno" not in capsys.readouterr().err
