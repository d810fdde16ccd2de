"""The fast epoch (loss terms summed on the device and logged once per epoch, batches sliced from the
tensors) logs the same values as the previous implementation, kept here as the reference: one
``self.log`` per term and step, a torchmetrics accuracy, and a DataLoader that collates sample by sample."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from datamodules.base import EpochSeededSampler
from torchmetrics.classification import MulticlassAccuracy

from ct_lightning import CTModule
from ct_lightning.losses import adversarial_loss, contrastive_divergence, energy_ridge
from datamodules import get_datamodule


class ReferenceCTModule(CTModule):
    """CTModule's training step and logging as they were before the per-epoch accumulation."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.reference_acc = MulticlassAccuracy(self.hparams.n_classes, average="micro")
        self.reference_val_acc = MulticlassAccuracy(self.hparams.n_classes, average="micro")
        self.reference_test_acc = MulticlassAccuracy(self.hparams.n_classes, average="micro")

    def training_step(self, batch, batch_idx):
        hp = self.hparams
        x, y = batch[0], batch[1]
        if not self.uses_counterfactuals:
            logits = self.model(x)
            clf = F.cross_entropy(logits, y)
            zero = clf.detach() * 0.0
            terms = {"clf": clf, "div": zero, "ridge": zero, "adv": zero}
            loss = hp.lambda_clf * clf
        else:
            pool = self._pool_for_step(batch_idx, self._batches_per_epoch())
            m = len(pool)
            logits = self.model(torch.cat([x, pool.x_pos, pool.x_neg, pool.nascent]))
            logits, logits_pos, logits_neg, logits_adv = logits.split([len(x), m, m, m])
            clf = F.cross_entropy(logits, y)
            div = contrastive_divergence(logits_pos, logits_neg, pool.target)
            ridge = energy_ridge(logits_pos, logits_neg, pool.target)
            adv = adversarial_loss(logits_adv, pool.labels)
            if not self.uses_energy:
                div, ridge = div.detach() * 0.0, ridge.detach() * 0.0
            if not self.uses_adversarial:
                adv = adv.detach() * 0.0
            terms = {"clf": clf, "div": div, "ridge": ridge, "adv": adv}
            loss = hp.lambda_clf * clf + hp.lambda_div * div + hp.lambda_reg * ridge + hp.lambda_adv * adv
        self.reference_acc(logits.detach(), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
        for name, value in terms.items():
            self.log(f"train/{name}", value, on_step=False, on_epoch=True, batch_size=len(y))
        self.log("train/acc", self.reference_acc, on_step=False, on_epoch=True)
        self.log("train/ct_active", float(self.uses_counterfactuals), on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self):
        # the share converged per target class (logged since 11/27), as self.log sends it
        for k, (_, share) in self.converged_by_target().items():
            self.log(f"train/cf_converged_target_{k}", share, on_step=False, on_epoch=True)

    def _reference_eval_step(self, batch, stage, metric):
        x, y = batch[0], batch[1]
        logits = self.model(x)
        self.log(f"{stage}/loss", F.cross_entropy(logits, y), prog_bar=stage == "val", batch_size=len(y))
        metric(logits, y)
        self.log(f"{stage}/acc", metric, prog_bar=stage == "val")

    def validation_step(self, batch, batch_idx):
        self._reference_eval_step(batch, "val", self.reference_val_acc)

    def on_validation_epoch_end(self):
        pass

    def test_step(self, batch, batch_idx):
        self._reference_eval_step(batch, "test", self.reference_test_acc)

    def on_test_epoch_end(self):
        pass


CLOCK_READINGS = {"train/cf_search_seconds"}  # wall time: differs between any two runs


def reference_loader(datamodule):
    """The previous training loader: per-sample fetch and default collation (same epoch-seeded order)."""
    dataset = TensorDataset(datamodule.x_train, datamodule.y_train)
    return DataLoader(dataset, batch_size=datamodule.batch_size,
                      sampler=EpochSeededSampler(dataset, datamodule.seed))


class RecordingLogger(L.pytorch.loggers.logger.Logger):
    """A real Lightning logger that keeps every logged value in memory."""

    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))


def fit(module_class, datamodule, loader, objective, pool, epochs=3, logger=None, callbacks=(), direct=False):
    L.seed_everything(0, verbose=False)
    module = module_class(n_features=2, n_classes=2, objective=objective, pool=pool, nce=90, seed=0)
    module.log_epochs_directly(direct)
    logger = logger or RecordingLogger()
    checkpoints = any(isinstance(callback, L.pytorch.callbacks.ModelCheckpoint) for callback in callbacks)
    trainer = L.Trainer(max_epochs=epochs, logger=logger, enable_checkpointing=checkpoints,
                        enable_progress_bar=False, callbacks=list(callbacks),
                        enable_model_summary=False, accelerator="cpu", limit_train_batches=8, limit_val_batches=2,
                        num_sanity_val_steps=2, log_every_n_steps=1)
    datamodule.setup()
    trainer.fit(module, train_dataloaders=loader(datamodule), val_dataloaders=datamodule.val_dataloader())
    metrics = dict(trainer.callback_metrics)
    progress_bar = dict(trainer.progress_bar_metrics)
    trainer.test(module, dataloaders=datamodule.test_dataloader(), verbose=False)
    return logger.rows, {**metrics, **trainer.callback_metrics}, progress_bar


class EpochRecordingLogger(RecordingLogger):
    """Files every metric under its ``epoch`` value, as EpochStepMLFlowLogger does (so direct logging applies)."""

    steps_by_epoch = True

    def log_metrics(self, metrics, step=None):
        super().log_metrics(metrics, int(metrics["epoch"]))


class DirectLoggingSeen(L.Callback):
    """Records, at every epoch end and validation end, whether the module logs directly."""

    def __init__(self):
        self.seen = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.seen.append(pl_module._logs_directly())

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.seen.append(pl_module._logs_directly())


@pytest.mark.parametrize("objective,pool", [("full", "epoch"), ("vanilla", "epoch"), ("adversarial", "step")])
def test_direct_epoch_logging_sends_what_self_log_sends(tmp_path, objective, pool):
    from lightning.pytorch.callbacks import ModelCheckpoint

    datamodule = get_datamodule("circles")
    runs = {}
    for direct in (False, True):
        seen = DirectLoggingSeen()
        best = ModelCheckpoint(dirpath=tmp_path / str(direct), filename="best", monitor="val/acc", mode="max")
        rows, final, progress_bar = fit(CTModule, datamodule, lambda dm: dm.train_dataloader(), objective, pool,
                                        logger=EpochRecordingLogger(), callbacks=[seen, best], direct=direct)
        by_epoch = {}
        for step, values in rows:
            by_epoch.setdefault(step, {}).update(values)
        runs[direct] = by_epoch, final, progress_bar, best, seen.seen
    (old, old_final, old_bar, old_best, old_seen), (new, new_final, new_bar, new_best, new_seen) = runs[False], runs[True]
    assert not any(old_seen) and new_seen and all(new_seen)  # the direct path really ran, and only there
    assert new.keys() == old.keys() == {0, 1, 2, 3}  # 3: the test, after the last epoch
    for epoch in old:
        assert new[epoch].keys() == old[epoch].keys(), epoch
        for key in set(old[epoch]) - CLOCK_READINGS:
            assert new[epoch][key] == pytest.approx(old[epoch][key], rel=1e-6, abs=1e-7), (epoch, key)
    assert set(new_final) == set(old_final)
    for key in set(old_final) - CLOCK_READINGS:
        assert float(new_final[key]) == pytest.approx(float(old_final[key]), rel=1e-6, abs=1e-7), key
    assert new_bar.keys() == old_bar.keys() >= {"train/loss", "val/loss", "val/acc"}
    assert float(new_best.best_model_score) == float(old_best.best_model_score)
    assert torch.load(new_best.best_model_path, weights_only=False)["epoch"] == \
        torch.load(old_best.best_model_path, weights_only=False)["epoch"]


@pytest.mark.parametrize("objective,pool", [("full", "epoch"), ("vanilla", "epoch"), ("adversarial", "step")])
def test_logged_epoch_metrics_match_the_previous_implementation(objective, pool):
    datamodule = get_datamodule("circles")
    rows, final, _ = fit(CTModule, datamodule, lambda dm: dm.train_dataloader(), objective, pool)
    reference_rows, reference_final, _ = fit(ReferenceCTModule, datamodule, reference_loader, objective, pool)

    def by_step(table):
        merged = {}
        for step, values in table:
            merged.setdefault(step, {}).update(values)
        return merged

    new, old = by_step(rows), by_step(reference_rows)
    assert new.keys() == old.keys()
    train_keys = {"train/loss", "train/clf", "train/div", "train/ridge", "train/adv", "train/acc", "train/ct_active",
                  "val/loss", "val/acc", "test/loss", "test/acc"}
    for step in old:
        assert new[step].keys() == old[step].keys(), step
        for key, value in old[step].items():
            if key in CLOCK_READINGS:
                continue
            assert new[step][key] == pytest.approx(value, rel=1e-6, abs=1e-7), (step, key)
    assert train_keys <= set().union(*(values.keys() for values in old.values()))
    assert set(final) == set(reference_final)
    for key in set(reference_final) - CLOCK_READINGS:
        assert float(final[key]) == pytest.approx(float(reference_final[key]), rel=1e-6, abs=1e-7), key
    if objective == "full":
        assert float(final["train/adv"]) > 0.0 and float(final["train/ct_active"]) == 1.0
        assert float(final["train/loss"]) != float(final["train/clf"])


def test_indexed_loader_yields_the_same_batches_as_per_sample_collation():
    datamodule = get_datamodule("circles", batch_size=70)
    datamodule.setup()
    new_loader, old_loader = datamodule.train_dataloader(), reference_loader(datamodule)
    epochs = []
    for epoch in range(2):  # the order is a function of (seed, epoch), identically in both loaders
        new_loader.sampler.set_epoch(epoch)
        old_loader.sampler.set_epoch(epoch)
        new, old = list(new_loader), list(old_loader)
        assert len(new) == len(old) == -(-len(datamodule.y_train) // 70)
        for (x, y), (x_ref, y_ref) in zip(new, old):
            assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
        epochs.append(torch.cat([y for _, y in new]))
    assert not torch.equal(epochs[0], epochs[1])


def test_predicted_classes_is_argmax_ties_included():
    from ct_lightning.module import predicted_classes

    generator = torch.Generator().manual_seed(0)
    for classes in (2, 3, 10):
        # Rounded logits: many exact ties, which argmax gives to the first class.
        logits = (torch.randn(5000, classes, generator=generator) * 2).round()
        assert torch.equal(predicted_classes(logits), logits.argmax(1)), classes
