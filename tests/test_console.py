"""A quiet console: a training prints what runs and how to resume, not Lightning's INFO lines, the LitLogger
advertisement or the _pytree deprecation warning; ``verbose`` brings them back. Compare's children print no
``train.py --resume`` hints of their own (compare resumes by re-running it)."""

import logging
import warnings

import pytest

from ct_lightning.experiment.configuration.console import child_training_echo, quiet_console
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
