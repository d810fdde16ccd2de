"""The GPU path: training, the search and the evaluation protocol on CUDA. Skipped without a GPU."""

import lightning as L
import pytest
import torch

from ct_lightning import CTModule
from ct_lightning.generators import ECCo
from ct_lightning.generators.search import search_counterfactuals
from datamodules import get_datamodule

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def circles():
    datamodule = get_datamodule("circles")
    datamodule.setup()
    return datamodule


class DevicesSeen(L.Callback):
    """Records, at each training epoch's end, the device types of the parameters, the training data and the pool."""

    def __init__(self):
        self.devices = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.devices.append((next(pl_module.model.parameters()).device.type, pl_module.x_train.device.type,
                             pl_module.pool.x_neg.device.type))


def test_ct_training_runs_on_the_gpu(circles):
    L.seed_everything(0, verbose=False)
    module = CTModule(n_features=2, n_classes=2, objective="full", nce=120, **{"tau": 0.5, "lambda_reg": 0.5})
    seen = DevicesSeen()
    trainer = L.Trainer(max_epochs=2, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_train_batches=10,
                        limit_val_batches=2, callbacks=[seen])
    trainer.fit(module, circles)
    # Lightning moves the module back to the CPU at teardown, so the devices are the ones seen while training.
    assert seen.devices == [("cuda", "cuda", "cuda")] * 2, seen.devices
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/div", "train/acc", "val/acc", "train/cf_converged"):
        assert torch.isfinite(torch.as_tensor(metrics[key])), key


class NoSyncInSteps(L.Callback):
    """Turns a host synchronisation into an error while a training step (a fused epoch's block of steps) runs."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch.cuda.set_sync_debug_mode("default")


def test_a_fused_epoch_makes_no_host_sync_between_its_steps(circles):
    """Issue 27: the optimisation steps of a fused CT epoch run without waiting for the GPU (the pool's search,
    at the epoch's start, and the epoch-end logging may synchronise; 120 steps include the per-64-step sums)."""
    from ct_lightning.training.epoch_block import EpochBlockLoader

    L.seed_everything(0, verbose=False)
    module = CTModule(n_features=2, n_classes=2, objective="full", nce=120, tau=0.5, lambda_reg=0.5)
    module.fuse_epochs(True)
    make_loader = circles.train_dataloader
    circles.train_dataloader = lambda: EpochBlockLoader(make_loader())
    trainer = L.Trainer(max_epochs=2, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        callbacks=[NoSyncInSteps()])
    try:
        trainer.fit(module, circles)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        circles.train_dataloader = make_loader
    assert trainer.num_training_batches == 1 and torch.isfinite(torch.as_tensor(trainer.callback_metrics["train/loss"]))


def test_search_on_the_gpu_matches_the_cpu_search(circles):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).eval()
    x = circles.x_train[:500]
    target = torch.randint(2, (500,), generator=torch.Generator().manual_seed(1))
    lower, upper = circles.domain(3.0)
    cpu = search_counterfactuals(model, x, target, ECCo(), 0.75, 30, 0.3, None, lower, upper)
    gpu = search_counterfactuals(model.cuda(), x.cuda(), target.cuda(), ECCo(), 0.75, 30, 0.3, None,
                                 lower.cuda(), upper.cuda())
    assert gpu.counterfactual.is_cuda
    assert (gpu.converged.cpu() == cpu.converged).float().mean() > 0.99
    agree = gpu.steps.cpu() == cpu.steps
    torch.testing.assert_close(gpu.counterfactual.cpu()[agree], cpu.counterfactual[agree], rtol=1e-4, atol=1e-4)


def test_the_masked_search_makes_no_host_sync_inside_a_step(circles):
    model = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).cuda().eval()
    x = circles.x_train[:200].cuda()
    target = torch.randint(2, (200,), device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            # check_every=1: the one permitted sync (the early-stop check) happens at the first step
            search_counterfactuals(model, x, target, ECCo(), 1.0, 3, 0.3, check_every=1)
        search_counterfactuals(model, x, target, ECCo(), 1.0, 3, 0.3, check_every=100)  # no check: no sync
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_train_evaluate_and_compare_run_on_the_gpu(tmp_path):
    """The recipes' GPU path: a fused-epoch CT training, the evaluation protocol and a comparison on CUDA."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--tracking-uri", store, "--accelerator", "gpu"]
    run = lambda *args: subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True,  # noqa: E731
                                       timeout=900)
    trained = run("recipes/train.py", "--data", "circles", "--max-epochs", "2", "--nce", "100", "--no-progress",
                  "--summary-json", str(tmp_path / "train.json"), *common)
    assert trained.returncode == 0, trained.stderr[-2000:]
    summary = json.loads((tmp_path / "train.json").read_text())
    evaluated = run("recipes/evaluate.py", "--run-id", summary["run_id"], "--n-runs", "2", "--n-individuals", "10",
                    "--summary-json", str(tmp_path / "eval.json"), *common)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    compared = run("recipes/compare.py", "--data", "circles", "--max-epochs", "2", "--n-runs", "2",
                   "--n-individuals", "10", "--no-actionability", "--out-dir", str(tmp_path / "cmp"), *common)
    assert compared.returncode == 0, compared.stderr[-2000:]


def test_a_stack_trains_on_the_gpu_what_lone_gpu_trainings_train(tmp_path):
    """Issue 25: a stacked training runs where a lone one would (``accelerator gpu``) and ends within a tolerance of
    the lone GPU trainings (one burn-in epoch, one CT epoch)."""
    from ct_lightning.experiment.runs.loading import load_run
    from ct_lightning.experiment.runs.stacked_train import train_stack
    from ct_lightning.experiment.runs.train import train

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = {"data": "moons", "max_epochs": 2, "burnin": 0.5, "nce": 90, "progress": False, "tracking_uri": uri,
            "experiment": "stk", "accelerator": "gpu"}
    points = [{"lambda_reg": 0.1}, {"lambda_reg": 0.5, "tau": 0.9, "lambda_div": 0.1}]
    alone = [train({**base, **point}) for point in points]
    lines = []
    stacked = train_stack([{**base, **point} for point in points], echo=lambda text, **_: lines.append(text))
    assert "cuda" in lines[0], lines[0]
    for a, b in zip(alone, stacked):
        weights_a = load_run(a["run_id"], uri).module.state_dict()
        weights_b = load_run(b["run_id"], uri).module.state_dict()
        for name in weights_a:
            assert weights_b[name].device.type == "cpu"
            torch.testing.assert_close(weights_b[name], weights_a[name].cpu(), atol=1e-3, rtol=1e-3)


def test_a_model_of_your_own_encoding_fine_tunes_on_the_gpu(tmp_path):
    """--model-inputs on CUDA: the frozen input layer moves with the network, and the weights given back
    (model-weights.pt, on the CPU) predict in the user's pipeline as the GPU-trained composite does."""
    from test_model_inputs import fit_users_model, frame, settings

    from ct_lightning.experiment.runs.loading import load_checkpoint
    from ct_lightning.experiment.runs.train import train
    from datamodules.codec import TabularCodec

    preprocess, model = fit_users_model(tmp_path)
    run = train(settings(tmp_path, max_epochs=2, accelerator="gpu", checkpoint_dir=str(tmp_path / "ct"),
                         model_inputs=str(tmp_path / "model-inputs.json")))
    assert run["metrics"]["val/acc"] > 0.5
    trained = load_checkpoint(tmp_path / "ct" / "last.ckpt")
    features, _ = frame()
    model.load_state_dict(torch.load(tmp_path / "ct" / "model-weights.pt", weights_only=True))
    with torch.no_grad():
        theirs = model(torch.tensor(preprocess.transform(features), dtype=torch.float32))
        ours = trained.model(torch.from_numpy(TabularCodec.from_dict(trained.preprocessing).encode(features)))
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


def test_the_search_by_hand_is_the_search_by_autograd_on_the_gpu(circles):
    from ct_lightning.generators.input_gradient import autograd_only

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).cuda().eval()
    x = circles.x_train[:500].cuda()
    target = torch.randint(2, (500,), generator=torch.Generator().manual_seed(1)).cuda()
    arguments = (model, x, target, ECCo(), 0.75, 30, 0.3)
    by_hand = search_counterfactuals(*arguments)
    with autograd_only():
        by_autograd = search_counterfactuals(*arguments)
    assert torch.equal(by_hand.steps, by_autograd.steps) and torch.equal(by_hand.converged, by_autograd.converged)
    torch.testing.assert_close(by_hand.counterfactual, by_autograd.counterfactual, rtol=1e-6, atol=1e-7)
