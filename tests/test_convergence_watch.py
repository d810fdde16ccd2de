"""ConvergenceWatch: warns once after `patience` low epochs of train/cf_converged, silent otherwise (real Trainer)."""

import warnings

import lightning as L
import pytest
import torch

from ct_lightning.callbacks import ConvergenceWarning, ConvergenceWatch


class Logs(L.LightningModule):
    """A tiny model that logs a given train/cf_converged sequence, one value per epoch."""

    def __init__(self, shares):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.shares = shares

    def training_step(self, batch, batch_idx):
        self.log("train/cf_converged", self.shares[self.current_epoch], on_step=False, on_epoch=True)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(2, 1)), batch_size=2)


def fit(shares, watch):
    trainer = L.Trainer(max_epochs=len(shares), callbacks=[watch], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Logs(shares))
    return [w for w in caught if issubclass(w.category, ConvergenceWarning)]


def test_warns_once_after_patience_low_epochs_and_names_settings():
    caught = fit([1.0, 0.05, 0.02, 0.01, 0.0], ConvergenceWatch(threshold=0.1, patience=3))
    assert len(caught) == 1
    # the fourth epoch (current_epoch 3) is the third low one: "epoch 4", as its progress line "epoch 4/5" says
    assert "--tau" in str(caught[0].message) and "(epoch 4)" in str(caught[0].message)


def test_the_warning_counts_epochs_as_the_progress_lines_do():
    """A 3-epoch run low from the start warns at its last epoch: "(epoch 3)", the epoch of the line "epoch 3/3",
    not Lightning's 0-based current_epoch 2 (printed between "epoch 2/3" and "epoch 3/3")."""
    from ct_lightning.callbacks.epoch_lines import EpochLines

    lines = []
    echo = lambda text, **_: lines.append(text)  # noqa: E731
    trainer = L.Trainer(max_epochs=3, callbacks=[EpochLines(echo), ConvergenceWatch(threshold=0.1, patience=3,
                                                                                     echo=echo)],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Logs([0.05, 0.02, 0.01]))
    warned = [line for line in lines if "stopped converging" in line]
    assert len(warned) == 1 and "for 3 epochs (epoch 3)" in warned[0], lines
    assert [line.split(":")[0] for line in lines if line.startswith("epoch ")] == ["epoch 1/3", "epoch 2/3",
                                                                                   "epoch 3/3"]


def test_silent_when_low_epochs_are_not_consecutive():
    assert fit([0.05, 0.05, 0.5, 0.05, 0.05], ConvergenceWatch(threshold=0.1, patience=3)) == []


@pytest.mark.parametrize("shares", [[1.0, 0.05, 0.02, 0.01, 0.0], [0.05, 0.05, 0.5, 0.05, 0.05]])
def test_a_stacked_training_is_warned_as_a_lone_one(shares):
    """A stacked training's members are checked after training from their histories: the same message, or none."""
    from ct_lightning.callbacks.convergence import convergence_warning

    caught = fit(shares, ConvergenceWatch(threshold=0.1, patience=3))
    assert convergence_warning(list(enumerate(shares))) == (str(caught[0].message) if caught else None)


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="threshold"):
        ConvergenceWatch(threshold=0.0)


def test_hyperparameters_describe_a_given_network_not_the_defaults(tmp_path):
    """README's Python route: CTModule(model=64-32 MLP) logs hidden_sizes [64, 32] to MLflow, not [32]."""
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    from ct_lightning.models import build_mlp
    from ct_lightning.module import CTModule

    module = CTModule(model=build_mlp(3, 2, (64, 32), "tanh"), n_classes=2)
    assert module.hparams.hidden_sizes == [64, 32] and module.hparams.activation == "tanh"
    assert module.hparams.architecture == "mlp"
    logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment_name="hp")
    logger.log_hyperparams(module.hparams)
    params = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'm.db'}").get_run(logger.run_id).data.params
    assert params["hidden_sizes"] == "[64, 32]" and params["architecture"] == "mlp"
    odd = CTModule(model=torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(), torch.nn.Linear(4, 2)),
                   n_classes=2)
    assert odd.hparams.architecture == "custom"


def test_the_advice_names_only_options_of_train_py():
    """Every --option the warning names is one recipes/train.py accepts (no --lambda-egy, no --nce as steps)."""
    import re

    from ct_lightning.callbacks.convergence import ADVICE
    from recipe_loader import load_recipe

    accepted = set(load_recipe("train").build_parser()._option_string_actions)
    named = set(re.findall(r"--[a-z][a-z-]*", ADVICE))
    assert named and named <= accepted, sorted(named - accepted)
    assert "--max-steps" in named and "--nce" not in named


@pytest.mark.slow  # a real training through MLflow (about 5 s)
def test_a_training_prints_the_warning_once_as_a_plain_line(tmp_path, capfd):
    from ct_lightning.experiment.runs.train import train

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train({"data": "moons", "max_epochs": 4, "limit_train_batches": 2, "limit_val_batches": 1, "nce": 10,
               "max_steps": 1, "tau": 0.999, "progress": False, "tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"})
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "stopped converging" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: training's counterfactual search"), lines
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]


def test_a_search_that_converges_again_after_the_warning_says_so():
    """An HR model of two classes warned 'stopped converging' at epoch 4 (its first CT epochs, the model still poor),
    and its search then reached 0.98 from epoch 9 on: the console kept only the warning. A note now follows once the
    share stays at or above the threshold for `patience` epochs, once."""
    from ct_lightning.callbacks.epoch_lines import EpochLines

    lines = []
    echo = lambda text, **_: lines.append(text)  # noqa: E731
    watch = ConvergenceWatch(threshold=0.1, patience=3, echo=echo)
    trainer = L.Trainer(max_epochs=9, callbacks=[EpochLines(echo), watch], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Logs([0.2, 0.04, 0.0, 0.0, 0.35, 0.8, 0.95, 0.05, 0.97]))
    notes = [line for line in lines if line.startswith("note: ")]
    assert notes == ["note: training's counterfactual search converges again: train/cf_converged = 0.950 >= 0.1 for 3 "
                     "epochs (epoch 7); the warning of epoch 4 no longer holds"], lines
    assert lines.index(notes[0]) == lines.index(next(line for line in lines if line.startswith("epoch 7/9"))) - 1
    quiet = []
    trainer = L.Trainer(max_epochs=5, callbacks=[ConvergenceWatch(threshold=0.1, patience=3,
                                                                  echo=lambda text, **_: quiet.append(text))],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Logs([0.5, 0.6, 0.7, 0.8, 0.9]))  # never warned: nothing to take back
    assert quiet == []


class LogsOfAModel(Logs):
    """:class:`Logs` with a CT model's ``tau`` and ``n_classes`` in its hparams."""

    def __init__(self, shares, tau, n_classes):
        super().__init__(shares)
        self.save_hyperparameters({"tau": tau, "n_classes": n_classes})


@pytest.mark.parametrize(("tau", "n_classes", "lower"), [(0.5, 2, False), (0.4, 2, False), (0.75, 2, True),
                                                         (0.5, 3, True)])
def test_a_lower_tau_is_advised_only_where_it_still_means_the_target(tau, n_classes, lower):
    """An HR model of two classes at tau 0.5 (chosen for a small table) was told 'try a lower --tau': below 0.5 a
    counterfactual of two classes still has the factual's class, and train.py takes --tau 0.3 without a word."""
    lines = []
    trainer = L.Trainer(max_epochs=3, callbacks=[ConvergenceWatch(echo=lambda text, **_: lines.append(text))],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LogsOfAModel([0.0, 0.0, 0.0], tau, n_classes))
    assert len(lines) == 1 and "more search steps (--max-steps)" in lines[0]
    assert ("a lower --tau" in lines[0]) is lower, lines
    # a stack member's notes, read from its history after training, advise the same (they always named a lower tau)
    from ct_lightning.experiment.runs.stacked_train import member_notes

    history = [{"epoch": e, "train/cf_converged": 0.0} for e in range(3)]
    said = member_notes(LogsOfAModel([0.0] * 3, tau, n_classes), history)
    assert len(said) == 1 and ("a lower --tau" in said[0][1]) is lower, said


def test_a_stacked_training_says_it_converges_again_as_a_lone_one():
    """Stacked and appendix trainings read their histories after training with convergence_warning and never said
    that the search converged again; convergence_notes says what the watch says, warning and note alike."""
    from ct_lightning.callbacks.convergence import convergence_notes

    shares = [0.2, 0.04, 0.0, 0.0, 0.35, 0.8, 0.95, 0.05, 0.97]
    lines = []
    trainer = L.Trainer(max_epochs=len(shares), callbacks=[ConvergenceWatch(threshold=0.1, patience=3,
                                                                            echo=lambda text, **_: lines.append(text))],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Logs(shares))
    said = convergence_notes(list(enumerate(shares)))
    assert [kind for kind, _ in said] == ["warning", "note"] and "(epoch 7)" in said[1][1], said
    assert [f"{kind}: {text}" for kind, text in said] == lines, lines
    assert convergence_notes(list(enumerate([0.5, 0.6, 0.7, 0.8]))) == []  # never warned: nothing to say
