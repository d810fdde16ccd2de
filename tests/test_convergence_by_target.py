"""CT's search per target class: logged as train/cf_converged_target_K, and named in the convergence warnings.

An HR table of three outcomes (1 050 rejected, 307 interview, 143 offer) trained with CT converged for 4.8 % of its
counterfactuals; the warning gave the share over all targets only. The searches for 'rejected' converged, those for
'interview' and 'offer' did not: the model gave those classes tau's probability on no training row, and a
counterfactual that does not converge adds no penalty, so CT did nothing for them, without a word.
"""

import lightning as L
import numpy as np
import pandas as pd
import torch

from ct_lightning.callbacks.convergence import ConvergenceWatch
from ct_lightning.module import CTModule
from ct_lightning.training.pool import target_tally
from datamodules.table import TableDataModule


def applications(n: int = 300, seed: int = 0) -> pd.DataFrame:
    """Three imbalanced outcomes (70 % rejected, 20 % interview, 10 % offer) of a noisy score; age held."""
    rng = np.random.default_rng(seed)
    test, years, age = rng.normal(65, 12, n), rng.gamma(2.0, 3.0, n), rng.integers(21, 62, n)
    score = 0.08 * (test - 65) + 0.15 * years + rng.normal(0, 0.8, n)
    cut = np.quantile(score, [0.7, 0.9])
    outcome = np.where(score < cut[0], "rejected", np.where(score < cut[1], "interview", "offer"))
    return pd.DataFrame({"test_score": test, "years_experience": years, "age": age, "outcome": outcome})


def test_the_tally_counts_each_target_class_and_its_converged_counterfactuals():
    converged = torch.tensor([True, False, True, True, False])
    target = torch.tensor([0, 0, 2, 2, 2])
    assert target_tally(converged, target, 3).tolist() == [[2.0, 0.0, 3.0], [1.0, 0.0, 2.0]]


def test_a_three_class_training_names_the_targets_its_search_does_not_reach():
    dm = TableDataModule(applications(), target="outcome", batch_size=32)
    dm.setup()
    L.seed_everything(0, verbose=False)
    lines = []
    module = CTModule(n_features=dm.n_features, n_classes=3, nce=200, tau=0.5, mutability="age=none",
                      feature_names=dm.feature_names, lr=0.01)
    trainer = L.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu",
                        callbacks=[ConvergenceWatch(echo=lambda text, **_: lines.append(text))])
    trainer.fit(module, dm)
    metrics = trainer.callback_metrics
    by_target = module.converged_by_target()
    # the per-target shares are the logged ones, and their mean weighted by counts is the share over all targets
    assert by_target and {f"train/cf_converged_target_{k}" for k in by_target} <= set(metrics)
    for k, (_, share) in by_target.items():
        assert abs(float(metrics[f"train/cf_converged_target_{k}"]) - share) < 1e-6
    total = sum(n for n, _ in by_target.values())
    assert abs(sum(n * s for n, s in by_target.values()) / total - float(metrics["train/cf_converged"])) < 1e-6
    # three epochs of a model that predicts 'rejected' almost only: its searches do not converge; the warning
    # gives each target's share and, for the rare 'offer', why and what to try
    assert float(metrics["train/cf_converged"]) < 0.1, metrics["train/cf_converged"]
    names = [str(c) for c in dm.codec.classes]
    warned = [line for line in lines if "stopped converging" in line]
    assert len(warned) == 1, lines
    for k, (n, share) in by_target.items():
        assert f"{names[k]} {share:.2f} of {n} (predicted for " in warned[0], warned[0]
    offer = names.index("offer")
    assert by_target[offer][1] < 0.1
    assert "the model does not predict 'offer', so CT adds little for it: try a longer --burnin" in warned[0] or \
        "the model predicts 'offer'" in warned[0] and "seldom with probability >= tau 0.5" in warned[0], warned[0]


class Searches(L.LightningModule):
    """A real MLP classifier whose epochs report a given overall share and per-target shares, as CTModule does."""

    def __init__(self, shares, by_target):
        super().__init__()
        self.save_hyperparameters({"tau": 0.5, "n_classes": 3})
        self.model = torch.nn.Sequential(torch.nn.Linear(2, 3))
        with torch.no_grad():  # class 1 is never given probability 0.5
            self.model[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]]))
            self.model[0].bias.copy_(torch.tensor([0.0, -3.0, 0.0]))
        self.x_train = torch.linspace(-3, 3, 50)[:, None].repeat(1, 2)
        self.shares, self.by_target = shares, by_target
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def converged_by_target(self, gather=False):
        return self.by_target[self.current_epoch]

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(1, 1)), batch_size=1)

    def training_step(self, batch, batch_idx):
        self.log("train/cf_converged", self.shares[self.current_epoch], on_step=False, on_epoch=True)
        return (self.anchor ** 2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD([self.anchor], lr=0.1)


def test_a_target_class_left_behind_is_warned_while_the_share_over_all_targets_is_fine():
    """Over all targets 0.35 (no warning before), but target class 1 at 0.02: CT adds nothing for it."""
    by_target = [{0: (300, 0.6), 1: (300, 0.02), 2: (400, 0.4)}] * 4
    lines = []
    trainer = L.Trainer(max_epochs=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu",
                        callbacks=[ConvergenceWatch(echo=lambda text, **_: lines.append(text))])
    trainer.fit(Searches([0.35] * 4, by_target))
    assert len(lines) == 1, lines  # once, at the third low epoch
    assert lines[0].startswith("warning: training's counterfactual search converges for few counterfactuals of "
                               "target class '1' (< 0.1 for 3 epochs, epoch 3; "), lines[0]
    assert "converged per target class: 0 0.60 of 300, 1 0.02 of 300 (predicted for 0% of training rows, p >= tau " \
        "for 0%, max p " in lines[0] and "2 0.40 of 400" in lines[0]
    assert "the model does not predict '1', so CT adds little for it: try a longer --burnin" in lines[0], lines[0]


def test_a_target_that_one_way_columns_lead_away_from_is_not_met_with_search_advice_alone():
    """The lending walk (examples/loans-words.yaml): income may only rise, debt only fall, the rest is held, so no
    counterfactual of an approved applicant reaches 'no'; the warning advised more search steps and the like alone,
    which cannot help. It now names the one-way columns as the likely cause, the search advice as the alternative."""
    from pathlib import Path

    from datamodules.codec import read_spec

    root = Path(__file__).resolve().parents[1]
    spec = read_spec(root / "examples" / "loans-words.yaml")
    dm = TableDataModule(root / "tests" / "fixtures" / "loans.csv", target="approved", spec=spec, batch_size=32)
    dm.setup()
    L.seed_everything(0, verbose=False)
    lines = []
    mutability = {c.name: c.mutability for c in dm.codec.columns if c.mutability != "both"}
    module = CTModule(n_features=dm.n_features, n_classes=2, nce=100, tau=0.5, mutability=mutability,
                      feature_names=dm.feature_names, lr=0.01)
    trainer = L.Trainer(max_epochs=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu",
                        callbacks=[ConvergenceWatch(echo=lambda text, **_: lines.append(text))])
    trainer.fit(module, dm)
    no = [str(c) for c in dm.codec.classes].index("no")
    assert module.converged_by_target()[no][1] < 0.1
    [warned] = [line for line in lines if line.startswith("warning:")]
    assert "the model gives 'no' probability >= tau on many training rows, yet the search seldom reaches it: the " \
           "mutability lets income: increase, debt: decrease, years_employed: increase change one way only" \
        in warned, warned
    assert "no search setting changes that" in warned
    assert warned.endswith("if a move would lead there, try more search steps (--max-steps), a smaller --lambda-reg "
                           "or --lambda-energy, a larger search step size (--search-lr), or a longer --burnin"), warned
