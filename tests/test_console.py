"""A quiet console: a training prints what runs and how to resume, not Lightning's INFO lines, the LitLogger
advertisement or the _pytree deprecation warning; ``verbose`` brings them back. Compare's children print no
``train.py --resume`` hints of their own (compare resumes by re-running it). A training's registered predictor is
one line of ours (name, version, how to load and serve it), not MLflow's registry lines, unless ``verbose``."""

import logging
import warnings

import pytest

from mlflow.tracking import MlflowClient
from recipe_loader import load_recipe

from ct_lightning.experiment.configuration.console import VERBOSE_ENV, child_training_echo, quiet_console
from ct_lightning.experiment.runs.train import train

TINY = {"data": "moons", "max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1, "nce": 10,
        "progress": False}
NOISE = ("litlogger", "GPU available", "LeafSpec", "`Trainer.fit` stopped")


@pytest.fixture(autouse=True)
def restore_console():
    levels = {name: logging.getLogger(name).level for name in ("lightning.pytorch", "pytorch_lightning")}
    with warnings.catch_warnings():
        yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.slow  # real Trainer fits with MLflow (4-6 s each)
@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_lightning_chatter_only_with_verbose(tmp_path, capfd, caplog, verbose):
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train({**TINY, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "verbose": verbose})
        quiet_console(False)
    out, err = capfd.readouterr()
    shown = out + err + caplog.text + "\n".join(str(w.message) for w in caught)
    assert ("resume it with" in shown) and shown.count("--resume") == 1
    found = [text for text in NOISE if text in shown]
    if verbose:
        assert "GPU available" in found, shown[-3000:]
    else:
        assert not found, found


def test_a_compare_child_prints_no_resume_hint_of_its_own(capsys):
    child_training_echo("MLflow run abc (name); if it is interrupted, resume it with:\n  python recipes/train.py --resume abc")
    child_training_echo("interrupted (SIGTERM after 2 complete epoch(s)): run abc is KILLED; resume it with: ...")
    child_training_echo("resume: skipping run abc: no checkpoint")
    assert capsys.readouterr().out == "resume: skipping run abc: no checkpoint\n"


MLFLOW_REGISTRY_LINES = ("Successfully registered model", "already exists. Creating a new version", "Created version")


@pytest.mark.slow  # three tiny real trainings through recipes/train.py (about 4 s each)
def test_train_prints_one_registry_line_of_ours_with_the_new_version(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--data", "moons", "--max-epochs", "1", "--limit-train-batches", "2", "--limit-val-batches", "1",
            "--nce", "10", "--no-progress", "--tracking-uri", uri]
    recipe = load_recipe("train")
    capfd.readouterr()
    for version in (1, 2):  # a new registered model, then a new version of it in the same store
        summary = recipe.main(argv)
        out, err = capfd.readouterr()
        assert not [text for text in MLFLOW_REGISTRY_LINES if text in out + err], out + err
        ours = [line for line in (out + err).splitlines() if line.startswith("registered model")]
        model_uri = f"models:/ct-moons-ct/{version}"
        assert len(ours) == 1 and ours[0].startswith(f"registered model ct-moons-ct version {version}: {model_uri}; "
                                                     "serve: "), ours
        assert f"mlflow models serve -m {model_uri} --env-manager local" in ours[0] and uri in ours[0]
        assert MlflowClient(uri).get_model_version("ct-moons-ct", str(version)).run_id == summary["run_id"]
    recipe.main([*argv, "--verbose"])  # --verbose: MLflow's own lines as well
    quiet_console(False)
    out, err = capfd.readouterr()
    assert "Created version '3' of model 'ct-moons-ct'." in out + err
    assert "registered model ct-moons-ct version 3: models:/ct-moons-ct/3; serve: " in out


def test_a_registry_error_still_raises_while_its_chatter_is_hidden(tmp_path, capfd):
    from mlflow.exceptions import MlflowException

    from ct_lightning.experiment.runs.served_model import register_predictor

    with pytest.raises(MlflowException, match="m-0123"):  # the name is registered, then no such logged model
        register_predictor(f"sqlite:///{tmp_path / 'mlflow.db'}", "models:/m-0123", "ct-moons-ct")
    out, err = capfd.readouterr()
    assert "Successfully registered model" not in out + err
