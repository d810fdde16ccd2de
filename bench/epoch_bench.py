"""Sections 2 and 3: wall time of CT epochs against vanilla epochs, where a CT epoch spends its time,
and peak memory (one fresh process per configuration).

Epochs are timed from one ``on_train_epoch_start`` callback to the next (the last one to
``on_train_end``), so an epoch includes the pooled counterfactual search that ``CTModule`` runs
in its own ``on_train_epoch_start``. The first epoch of every fit is a warm-up and is left out.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from bench.common import Clock, median

QUIET_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning")


def quiet() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*litlogger.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)


class EpochTimer(Callback):
    """Wall and CPU seconds of every training epoch (start to next start, last to ``on_train_end``), and
    the time spent in Python's cyclic garbage collector (``gc.callbacks``) during each epoch."""

    def __init__(self):
        self.marks: list[tuple[float, float]] = []
        self.collections: list[tuple[float, float, int]] = []  # (start, seconds, generation)
        self._gc_started = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.collections.append((self._gc_started, time.perf_counter() - self._gc_started, info["generation"]))
            self._gc_started = None

    def on_train_start(self, trainer, pl_module):
        gc.callbacks.append(self._on_gc)

    def on_train_end(self, trainer, pl_module):
        self._mark(trainer)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def gc_per_epoch(self) -> list[tuple[float, int]]:
        """Per epoch: seconds in the garbage collector and number of full (generation 2) collections."""
        out = []
        for (a, _), (b, _) in zip(self.marks, self.marks[1:]):
            inside = [(d, g) for t, d, g in self.collections if a <= t < b]
            out.append((sum(d for d, _ in inside), sum(1 for _, g in inside if g == 2)))
        return out

    def _mark(self, trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        self.marks.append((time.perf_counter(), time.process_time()))

    def on_train_epoch_start(self, trainer, pl_module):
        self._mark(trainer)

    @property
    def epochs(self) -> list[tuple[float, float]]:
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(self.marks, self.marks[1:])]


def _wrap(owner, name: str, store: list, sync_device=None) -> None:
    """Replace ``owner.name`` (an instance attribute) by a version that appends ``(start, wall seconds)``
    of every call to ``store``."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if sync_device is not None and sync_device.type == "cuda":
                torch.cuda.synchronize(sync_device)
            store.append((started, time.perf_counter() - started))

    setattr(owner, name, wrapper)


def make_trainer(epochs: int, accelerator: str, callbacks: list, profiler=None) -> L.Trainer:
    return L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     limit_val_batches=0, enable_model_summary=False, accelerator=accelerator, devices=1,
                     callbacks=callbacks, profiler=profiler, num_sanity_val_steps=0)


def build(datamodule, objective: str, overrides: dict | None = None, seed: int = 0):
    """A ``CTModule`` for ``datamodule`` with the paper's defaults (SPEC Note 1 and the set's Table 2 row)."""
    from ct_lightning.experiment.configuration.settings import DATA_DEFAULT_KEYS, DEFAULTS
    from ct_lightning.experiment.runs.train import build_module

    config = {**DEFAULTS, **{k: v for k, v in datamodule.ct_defaults.items() if k in DATA_DEFAULT_KEYS},
              **(overrides or {}), "objective": objective, "seed": seed}
    L.seed_everything(seed, workers=True, verbose=False)
    return build_module(config, datamodule), config


def fit_timed(datamodule, objective: str, epochs: int, accelerator: str, overrides: dict | None = None,
              profile: bool = False) -> dict:
    """Fit ``epochs`` epochs; return per-epoch wall/CPU seconds and the search time of each epoch.

    With ``profile``, Lightning's SimpleProfiler records the loop's actions and the module's
    pool chunking, ``self.log`` calls and accuracy metric are timed too.
    """
    from lightning.pytorch.profilers import SimpleProfiler

    module, config = build(datamodule, objective, overrides)
    timer = EpochTimer()
    searches: list[float] = []
    pools: list[float] = []
    last_steps: list[torch.Tensor] = []
    generate = module.generator.generate

    def keep_steps(*args, **kwargs):
        result = generate(*args, **kwargs)
        last_steps[:] = [result.steps.detach().cpu()]
        return result

    module.generator.generate = keep_steps
    _wrap(module.generator, "generate", searches)
    _wrap(module, "generate_pool", pools)
    extra: dict[str, list] = {"chunk": [], "log": [], "metric": []}
    if profile:
        _wrap(module, "_pool_for_step", extra["chunk"])
        _wrap(module, "log", extra["log"])
        _wrap(module, "_accumulate", extra["metric"])  # per-step loss-term and accuracy sums
    profiler = SimpleProfiler() if profile else None
    trainer = make_trainer(epochs, accelerator, [timer], profiler)
    trainer.fit(module, datamodule=datamodule)
    out = {"objective": objective, "epochs": timer.epochs, "gc": timer.gc_per_epoch(),
           "search_s": [d for _, d in searches],
           "pool_s": [d for _, d in pools],
           "batches_per_epoch": int(trainer.num_training_batches), "nce": config["nce"],
           "batch_size": datamodule.batch_size, "tau": config["tau"], "lambda_reg": config["lambda_reg"],
           "cf_steps_mean": float(last_steps[0].float().mean()) if last_steps else 0.0, "module": module,
           "last_steps": last_steps[0] if last_steps else None}
    if profile:
        warm = timer.marks[1][0] if len(timer.marks) > 1 else float("inf")  # end of the warm-up epoch
        after = {key: sum(d for t, d in calls if t >= warm) for key, calls in
                 {**extra, "search": searches, "pool": pools}.items()}
        out["profile"] = profile_breakdown(profiler.recorded_durations, after, timer.epochs,
                                           int(trainer.num_training_batches), objective)
    return out


def _after_warmup(values: list, per_epoch: int) -> float:
    return float(sum(values[per_epoch:]))


PROFILE_PARTS = [
    ("search", "counterfactual search (generator.generate)"),
    ("pool", "pool set-up: factuals, targets, x⁺, contrast pairs"),
    ("chunk", "pool slicing per step (_pool_for_step)"),
    ("forward", "training_step compute: forward of [x, x⁺, x', x'_tε] + loss terms"),
    ("logging", "training_step logging: self.log + per-step sums of the loss terms and accuracy"),
    ("backward", "backward"),
    ("optimizer", "optimizer: Adam step + zero_grad"),
    ("data", "data: next batch + transfer"),
    ("other", "Lightning loop, hooks, epoch-end reductions (rest)"),
]


def profile_breakdown(durations: dict, after: dict, epochs: list, batches: int, objective: str) -> dict:
    """Seconds per epoch (warm-up excluded) of each part of PROFILE_PARTS.

    ``durations``: SimpleProfiler's per-call records (per-batch actions: one call per batch);
    ``after``: seconds of the wrapped calls made after the warm-up epoch.
    """
    measured = max(1, len(epochs) - 1)

    def total(action: str) -> float:
        return _after_warmup(durations.get(action, []), batches)

    step = total("[Strategy]SingleDeviceStrategy.training_step")
    backward = total("[Strategy]SingleDeviceStrategy.backward")
    optimizer_step = total("[LightningModule]CTModule.optimizer_step")
    logging_time = after["log"] + after["metric"]
    data = total("[_TrainingEpochLoop].train_dataloader_next") + total("[Strategy]SingleDeviceStrategy.batch_to_device")
    epoch_total = sum(e[0] for e in epochs[1:])
    parts = {
        "search": after["search"], "pool": after["pool"] - after["search"], "chunk": after["chunk"],
        "forward": step - after["chunk"] - logging_time, "logging": logging_time, "backward": backward,
        "optimizer": optimizer_step - step - backward, "data": data,
    }
    parts["other"] = epoch_total - sum(parts.values())
    return {"objective": objective, "epoch_s": epoch_total / measured,
            "parts_s": {k: v / measured for k, v in parts.items()}}


def run_overhead_section(datamodule, epochs: int, repeats: int, accelerator: str, log=print,
                         separate_profile: bool = True) -> dict:
    """Vanilla and full fits alternated ``repeats`` times (same data, model, batch size, paper defaults),
    then one profiled fit per objective (``separate_profile=False``: profile the timed fits instead)."""
    fits = {"vanilla": [], "full": []}
    for _ in range(repeats):
        for objective in ("vanilla", "full"):
            fits[objective].append(fit_timed(datamodule, objective, epochs, accelerator,
                                             profile=not separate_profile))
    summary = {}
    for objective, runs in fits.items():
        walls = [e[0] for run in runs for e in run["epochs"][1:]]
        cpus = [e[1] for run in runs for e in run["epochs"][1:]]
        searches = [s for run in runs for s in run["search_s"][1:]]
        collections = [g for run in runs for g in run["gc"][1:]]
        summary[objective] = {"epoch_s": median(walls), "epoch_cpu_s": median(cpus), "epochs_s": walls,
                              "gc_s_mean": sum(g[0] for g in collections) / max(1, len(collections)),
                              "gc_full_per_epoch": sum(g[1] for g in collections) / max(1, len(collections)),
                              "search_s": median(searches) if searches else 0.0,
                              "batches_per_epoch": runs[0]["batches_per_epoch"], "nce": runs[0]["nce"],
                              "batch_size": runs[0]["batch_size"], "tau": runs[0]["tau"],
                              "lambda_reg": runs[0]["lambda_reg"]}
    summary["full"]["cf_steps_mean"] = median(run["cf_steps_mean"] for run in fits["full"])
    summary["full"]["bare_search_s"] = bare_search_time(datamodule, fits["full"][-1])
    ratio = summary["full"]["epoch_s"] / summary["vanilla"]["epoch_s"]
    ratio_cpu = summary["full"]["epoch_cpu_s"] / summary["vanilla"]["epoch_cpu_s"]
    if separate_profile:
        profiles = {objective: fit_timed(datamodule, objective, epochs, accelerator, profile=True)["profile"]
                    for objective in ("vanilla", "full")}
    else:
        profiles = {objective: runs[-1]["profile"] for objective, runs in fits.items()}
    full = summary["full"]
    log(f"  vanilla {summary['vanilla']['epoch_s']:.3f} s/epoch  full {full['epoch_s']:.3f} s/epoch "
        f"(search {full['search_s']:.3f} s)  ratio ×{ratio:.2f} (CPU time ×{ratio_cpu:.2f})")
    floor = (summary["vanilla"]["epoch_s"] + summary["full"]["bare_search_s"]) / summary["vanilla"]["epoch_s"]
    loading = data_loading_check(datamodule)
    return {"summary": summary, "ratio": ratio, "ratio_cpu": ratio_cpu, "ratio_floor": floor, "profiles": profiles,
            "data_loading": loading}


def data_loading_check(datamodule, repeats: int = 3) -> dict:
    """One epoch of the data module's training DataLoader (per-sample fetch + collate) against the same
    shuffled batches fetched by indexing the tensors once per batch (a ``BatchSampler`` as sampler,
    ``batch_size=None``); checks that both give identical batches."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    def batched_loader():
        dataset = TensorDataset(datamodule.x_train, datamodule.y_train)
        generator = torch.Generator().manual_seed(datamodule.seed)
        sampler = BatchSampler(RandomSampler(dataset, generator=generator), datamodule.batch_size, drop_last=False)
        return DataLoader(dataset, sampler=sampler, batch_size=None, generator=generator)

    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(datamodule.train_dataloader(), batched_loader()))
    times = {"per_sample": [], "batch_index": []}
    for _ in range(repeats):
        for key, make in (("per_sample", datamodule.train_dataloader), ("batch_index", batched_loader)):
            clock = Clock()
            for _batch in make():
                pass
            times[key].append(clock.read()[0])
    return {"per_sample_s": median(times["per_sample"]), "batch_index_s": median(times["batch_index"]),
            "identical_batches": same}


def bare_search_time(datamodule, fit: dict, repeats: int = 3) -> float:
    """Seconds of only the forward+backward passes that the last search of ``fit`` ran (same active-row
    counts per step), on the CT-trained model: what the search would cost if it were free otherwise."""
    from bench.search_bench import MAX_STEPS, bare_passes, pass_schedule

    steps, module = fit["last_steps"], fit["module"]
    if steps is None:
        return 0.0
    model = module.model
    device = next(model.parameters()).device
    schedule = pass_schedule(steps, MAX_STEPS)
    n = len(steps)
    generator = torch.Generator().manual_seed(0)
    index = torch.randint(len(datamodule.y_train), (n,), generator=generator)
    x = datamodule.x_train[index].to(device)
    target = torch.randint(datamodule.n_classes, (n,), generator=generator).to(device)
    model.eval()
    bare_passes(model, x, target, schedule)
    times = []
    for _ in range(repeats):
        clock = Clock()
        bare_passes(model, x, target, schedule)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(clock.read()[0])
    return median(times)


# --------------------------------------------------------------------------- memory (subprocess)
def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux ≥ 4.0); False if impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child_main(spec: dict) -> dict:
    """Run one configuration in this (fresh) process and report time and peak memory."""
    quiet()
    torch.set_num_threads(spec["threads"])
    from bench.common import SyntheticClassification, load_datamodule, setup_environment

    setup_environment()
    started = time.perf_counter()
    if spec.get("data"):
        datamodule = load_datamodule(spec["data"])
    else:
        datamodule = SyntheticClassification(spec["features"], n_train=spec.get("n_train", 5000),
                                             batch_size=spec.get("batch_size", 500))
        datamodule.setup("fit")
    setup_s = time.perf_counter() - started
    if spec.get("gc_freeze"):
        gc.collect()
        gc.freeze()
    rss_setup = _status_kib("VmRSS")
    hwm_setup = _status_kib("VmHWM")  # peak of imports and data loading
    reset = _reset_peak()
    overrides = {"nce": spec["nce"]} if spec.get("nce") else {}
    if spec.get("hidden"):
        overrides["hidden_sizes"] = [int(spec["hidden"])]
    result = fit_timed(datamodule, spec["objective"], spec["epochs"], spec["accelerator"], overrides)
    peak_fit = _status_kib("VmHWM") if reset else None
    # ru_maxrss is not used: in a child made by fork+exec, Linux carries the parent's high-water mark over.
    epochs = result["epochs"][1:]
    return {**spec, "hidden": spec.get("hidden") or 32, "n_features": datamodule.n_features,
            "n_train": len(datamodule.y_train),
            "batch_size": datamodule.batch_size, "nce_used": result["nce"], "setup_s": setup_s,
            "rss_setup_mib": rss_setup / 1024 if rss_setup else None,
            "peak_setup_mib": hwm_setup / 1024 if hwm_setup else None,
            "peak_fit_mib": peak_fit / 1024 if peak_fit else None,
            "epoch_s": median(e[0] for e in epochs), "epoch_cpu_s": median(e[1] for e in epochs),
            "search_s": median(result["search_s"][1:]) if result["search_s"] else 0.0}


def run_children(specs: list[dict], timeout: float = 900.0) -> list[dict]:
    """``child_main`` for each spec, in order, in one fresh interpreter (the peak mark is reset before
    each fit, so each spec gets its own peak; the full benchmark passes one spec per process)."""
    command = [sys.executable, str(Path(__file__).with_name("run.py")), "--child", json.dumps(specs)]
    env = {**os.environ, "OMP_NUM_THREADS": str(specs[0]["threads"])}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return [{**spec, "error": f"timed out after {timeout:.0f} s"} for spec in specs]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return [{**spec, "error": f"exit {done.returncode}: {' | '.join(tail)}"} for spec in specs]
    return json.loads(lines[-1])
