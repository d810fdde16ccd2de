"""Where a small model's fused training epoch spends its time on a GPU (issue 27): per-epoch times through
Lightning's Trainer (the fused loop as ``train()`` sets it up, no tracking), the host synchronisations of one
epoch with the Python line that caused each, and the profiler's top host-side operations.

    python bench/gpu_probe.py --data circles --epochs 6 --out probe.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lightning as L  # noqa: E402
import torch  # noqa: E402

from bench.common import load_datamodule  # noqa: E402
from bench.epoch_bench import build  # noqa: E402
from ct_lightning.training.epoch_block import EpochBlockLoader  # noqa: E402


class EpochClock(L.Callback):
    """Wall seconds of each training epoch (synchronised), and of each validation pass."""

    def __init__(self):
        self.train, self.val, self._t = [], [], 0.0

    def _now(self):
        torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module):
        self._t = self._now()

    def on_train_epoch_end(self, trainer, pl_module):
        self.train.append(self._now() - self._t)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._v = self._now()

    def on_validation_epoch_end(self, trainer, pl_module):
        self.val.append(self._now() - self._v)


def fit(datamodule, objective, epochs, fused=True, validate=True, callbacks=(), overrides=None):
    module, config = build(datamodule, objective, overrides)
    clock = EpochClock()
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="gpu", devices=1, num_sanity_val_steps=0,
                        limit_val_batches=None if validate else 0, callbacks=[clock, *callbacks])
    loader = datamodule.train_dataloader
    if fused:
        module.fuse_epochs(True)
        datamodule.train_dataloader = lambda: EpochBlockLoader(loader())
    started = time.perf_counter()
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        datamodule.train_dataloader = loader
    return {"objective": objective, "fused": fused, "train_s": clock.train, "val_s": clock.val,
            "wall_s": time.perf_counter() - started, "batches": int(trainer.num_training_batches),
            "train_acc": float(trainer.callback_metrics.get("train/acc", float("nan"))),
            "val_acc": float(trainer.callback_metrics.get("val/acc", float("nan")))}


class SyncSpy(L.Callback):
    """Records the stack of every synchronising CUDA call in one training epoch (the second)."""

    def __init__(self, epoch=1):
        self.epoch, self.sites = epoch, collections.Counter()

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            self._old = warnings.showwarning
            warnings.simplefilter("always")
            spy = self

            def show(message, category, filename, lineno, file=None, line=None):
                frames = [f for f in traceback.extract_stack()[:-1]
                          if "ct_lightning" in f.filename or "lightning" in f.filename or "torch/optim" in f.filename]
                key = " <- ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in frames[-4:][::-1])
                spy.sites[key] += 1

            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self._old


def profile_epoch(datamodule, objective):
    from torch.profiler import ProfilerActivity, profile

    holder = {}

    class Prof(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                holder["p"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                holder["p"].__enter__()

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                torch.cuda.synchronize()
                holder["p"].__exit__(None, None, None)

    fit(datamodule, objective, 2, validate=False, callbacks=[Prof()])
    table = holder["p"].key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    return table


def graph_epoch_bench(n_train=3600, n_features=2, batch=30, pool=1000, epochs=6, seed=0) -> dict:
    """The CUDA-graph question, in plain PyTorch: a circles-sized epoch (``n_train`` rows in batches of ``batch``,
    the paper's MLP, Adam; with ``pool`` > 0 each step also carries its share of a ``pool``-row counterfactual
    pool, as a CT step does) run eagerly, step by step, against the same epoch captured once as one CUDA graph
    and replayed (row order and pool copied into static buffers each epoch: the shapes do not change between
    epochs). Seconds per epoch (median after the first) and the largest weight difference after equal epochs."""
    import torch.nn.functional as F

    def make():
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(n_features, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 2)).cuda()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n_train, n_features, device="cuda", generator=g)
    y = (x.norm(dim=1) > 1).long()
    sizes = [batch] * (n_train // batch) + ([n_train % batch] if n_train % batch else [])
    bounds = torch.linspace(0, pool, len(sizes) + 1).round().long().tolist()

    def epoch_body(model, opt, index, pool_x, pool_y):
        for i, rows in enumerate(index.split(sizes)):
            xb, yb = x[rows], y[rows]
            lo, hi = bounds[i], bounds[i + 1]
            logits = model(torch.cat([xb, pool_x[lo:hi]]))
            loss = F.cross_entropy(logits[:len(xb)], yb)
            if hi > lo:
                loss = loss + 0.5 * F.cross_entropy(logits[len(xb):], pool_y[lo:hi])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()

    def orders(e):
        gen = torch.Generator(device="cuda").manual_seed(100 + e)
        return (torch.randperm(n_train, device="cuda", generator=gen),
                torch.randn(pool, n_features, device="cuda", generator=gen),
                torch.randint(2, (pool,), device="cuda", generator=gen))

    out = {}
    # eager
    model, opt = make()
    times = []
    for e in range(epochs):
        index, px, py = orders(e)
        torch.cuda.synchronize()
        t = time.perf_counter()
        epoch_body(model, opt, index, px, py)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    eager_weights = [p.detach().clone() for p in model.parameters()]
    out["eager_s"] = sorted(times[1:])[len(times[1:]) // 2]
    # one graph per epoch
    model, opt = make()
    static_index, static_px, static_py = (t.clone() for t in orders(0))
    # Warm up on a side stream (as torch.cuda.graphs' docs ask), then restore the seeded state and capture.
    state = ([p.detach().clone() for p in model.parameters()], opt.state_dict())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        epoch_body(model, opt, static_index, static_px, static_py)
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        for p, v in zip(model.parameters(), state[0]):
            p.copy_(v)
    for group_state in opt.state.values():
        for value in group_state.values():
            value.zero_()
    graph = torch.cuda.CUDAGraph()
    capture_start = time.perf_counter()
    with torch.cuda.graph(graph):
        epoch_body(model, opt, static_index, static_px, static_py)
    out["capture_s"] = time.perf_counter() - capture_start
    with torch.no_grad():  # capturing ran nothing; but reset anyway so both runs start equal
        for p, v in zip(model.parameters(), state[0]):
            p.copy_(v)
    for group_state in opt.state.values():
        for value in group_state.values():
            value.zero_()
    times = []
    for e in range(epochs):
        index, px, py = orders(e)
        torch.cuda.synchronize()
        t = time.perf_counter()
        static_index.copy_(index)
        static_px.copy_(px)
        static_py.copy_(py)
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    out["graph_s"] = sorted(times[1:])[len(times[1:]) // 2]
    out["max_weight_diff"] = max(float((a - b.detach()).abs().max()) for a, b in zip(eager_weights,
                                                                                    model.parameters()))
    out["steps"] = len(sizes)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="circles")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", default="probe.json")
    parser.add_argument("--profile-out", default="")
    args = parser.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "lightning": L.__version__}
    for pool in (0, 1000):
        try:
            row = graph_epoch_bench(pool=pool)
        except Exception as error:  # noqa: BLE001 - report it and go on with the Trainer measurements
            row = {"error": f"{type(error).__name__}: {error}"}
        results[f"graph_epoch_pool{pool}"] = row
        print(f"plain epoch, pool {pool}: {row}", flush=True)
    for name in args.data.split(","):
        datamodule = load_datamodule(name)
        rows = results.setdefault(name, {})
        for objective in ("vanilla", "full"):
            rows[objective] = fit(datamodule, objective, args.epochs)
            rows[objective + "_noval"] = fit(datamodule, objective, args.epochs, validate=False)
            spy = SyncSpy()
            fit(datamodule, objective, 2, validate=False, callbacks=[spy])
            rows[objective + "_syncs"] = dict(spy.sites.most_common(20))
            r = rows[objective]
            print(name, objective, "train s/epoch", [round(t, 4) for t in r["train_s"]],
                  "val", [round(t, 4) for t in r["val_s"]], "noval train",
                  [round(t, 4) for t in rows[objective + "_noval"]["train_s"]], flush=True)
            print("  syncs in one epoch:", sum(spy.sites.values()), flush=True)
            for k, v in spy.sites.most_common(8):
                print(f"   {v:5d} {k}", flush=True)
        if args.profile_out:
            Path(args.profile_out + f"_{name}.txt").write_text(profile_epoch(datamodule, "full"))
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
