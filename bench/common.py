"""Shared helpers of the benchmark: machine facts, clocks, data sets and a briefly trained MLP."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from datamodules.base import TensorDataModule

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = "/work/shared/data/raw"


def script_parser(doc: str, json_name: str, data: str, repeats: int) -> argparse.ArgumentParser:
    """The options every standalone script of ``bench/`` takes: ``--data``, ``--repeats`` and ``--out`` (its JSON,
    by default ``bench/json_name``); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--data", default=data)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", default=str(REPO / "bench" / json_name))
    return parser


def repeated_runs(doc: str, json_name: str, data: str, repeats: int, epochs: int, measure
                  ) -> tuple[argparse.Namespace, dict, dict]:
    """A paired-epochs script's options (:func:`script_parser` and ``--epochs``) and set-up
    (:func:`single_thread_quiet`), then ``measure(data_set, epochs)`` ``--repeats`` times per data set: the options,
    the results by data set, and the machine's load averages before and after."""
    parser = script_parser(doc, json_name, data, repeats)
    parser.add_argument("--epochs", type=int, default=epochs)
    args = parser.parse_args()
    single_thread_quiet()
    before = os.getloadavg()
    runs = {name: [measure(name, args.epochs) for _ in range(args.repeats)] for name in args.data.split(",")}
    return args, runs, {"load_average_before": before, "load_average_after": os.getloadavg()}


def measure_data_sets(doc: str, json_name: str, data: str, repeats: int, measure, describe, **fields) -> dict:
    """A standalone search script's run: its options (:func:`script_parser`), one quiet torch thread, then per data set
    ``measure(name, repeats)`` and the line ``describe(name, result)`` printed; the JSON (``--out``) holds the results
    by data set, the time, the load averages and ``fields``. Returns the results."""
    import json

    from bench.epoch_bench import quiet

    args = script_parser(doc, json_name, data, repeats).parse_args()
    single_thread_quiet()
    quiet()
    load_before = os.getloadavg()
    results = {}
    for name in args.data.split(","):
        results[name] = measure(name, args.repeats)
        print(describe(name, results[name]), flush=True)
    out = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": 1, **fields,
           "repeats": args.repeats, "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return results


def single_thread_quiet() -> None:
    """How the standalone scripts measure: :func:`setup_environment`, one torch thread, MLflow's loggers quiet."""
    setup_environment()
    torch.set_num_threads(1)
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)


def setup_environment() -> None:
    """Read the raw data from the shared copy (unless CT_DATA_DIR is set) and never download; tune the allocator
    as the recipes do (``keep_freed_memory``), so that every section measures what a recipe's process runs."""
    from ct_lightning.experiment.configuration.allocator import keep_freed_memory

    if not os.environ.get("CT_DATA_DIR") and Path(DEFAULT_DATA_DIR).is_dir():
        os.environ["CT_DATA_DIR"] = DEFAULT_DATA_DIR
    os.environ.setdefault("CT_OFFLINE", "1")
    keep_freed_memory()


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def sync(device: torch.device) -> None:
    """Wait for queued kernels so that a clock reading covers them (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Wall time and CPU time of this process (all threads) since creation."""

    def __init__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


@contextmanager
def timed(store: list, device: torch.device | None = None):
    """Append ``(wall, cpu)`` seconds of the block to ``store``."""
    if device is not None:
        sync(device)
    clock = Clock()
    yield
    if device is not None:
        sync(device)
    store.append(clock.read())


def median(values) -> float:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else float("nan")


def load_average() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict:
    import lightning

    from ct_lightning.experiment.configuration.allocator import keep_freed_memory  # applied once: here it reports the state

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "torch_threads": torch.get_num_threads(),
        "allocator": "glibc malloc, freed blocks kept (keep_freed_memory)" if keep_freed_memory() else "default",
        "device": str(device),
        "load_average_start": load_average(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return info


# ------------------------------------------------------------------------------------------ data
def load_datamodule(name: str, **kwargs):
    """The registered data module ``name`` after ``setup``; raises with a clear message when it is missing."""
    setup_environment()
    from datamodules import available, get_datamodule

    try:
        datamodule = get_datamodule(name, **kwargs)
    except ValueError as error:
        raise LookupError(f"data set {name!r} is not registered ({error}); registered: {', '.join(available())}") \
            from None
    datamodule.setup("fit")
    return datamodule


class SyntheticClassification(TensorDataModule):
    """Two classes from ``sklearn.datasets.make_classification`` with ``n_features`` columns.

    Standardised on the training split; used to see how cost grows with the number of
    features (paper defaults otherwise: τ 0.75, λ_reg 0.1).
    """

    name = "synthetic"
    ct_defaults = {"tau": 0.75, "nce": 1000, "lambda_reg": 0.1}

    def __init__(self, n_features: int, n_train: int = 5000, n_test: int = 500, batch_size: int = 500,
                 seed: int = 0, data_seed: int = 0):
        super().__init__(batch_size=batch_size, seed=seed)
        self.n_columns, self.n_train, self.n_test, self.data_seed = n_features, n_train, n_test, data_seed
        self.name = f"synthetic-{n_features}"

    def load_splits(self) -> dict:
        from sklearn.datasets import make_classification

        d, n = self.n_columns, self.n_train + 2 * self.n_test
        x, y = make_classification(n, n_features=d, n_informative=max(1, min(d, max(2, d // 2))), n_redundant=0,
                                   n_repeated=0, n_classes=2, n_clusters_per_class=1, random_state=self.data_seed)
        x = x.astype(np.float32)
        mean, std = x[:self.n_train].mean(0), x[:self.n_train].std(0) + 1e-6
        x = (x - mean) / std
        a, b = self.n_train, self.n_train + self.n_test
        names = [f"f{i}" for i in range(d)]
        return {"x_train": x[:a], "y_train": y[:a], "x_val": x[a:b], "y_val": y[a:b], "x_test": x[b:],
                "y_test": y[b:], "feature_names": names, "protected": names[:1], "n_classes": 2}


def train_vanilla(datamodule, epochs: int = 3, batch_size: int = 100, seed: int = 0,
                  device: torch.device | None = None, architecture: str = "mlp"):
    """The paper's MLP (one hidden layer of 32 ReLU units; or ``architecture``), trained briefly with Adam on
    plain cross-entropy."""
    from ct_lightning.models import build_model

    device = device or torch.device("cpu")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = build_model(architecture, datamodule.n_features, datamodule.n_classes).to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = datamodule.x_train.to(device), datamodule.y_train.to(device)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator).to(device)
        for start in range(0, len(y), batch_size):
            index = order[start:start + batch_size]
            optimiser.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimiser.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    return model, accuracy


def run_per_data_set(doc: str, json_name: str, measure) -> None:
    """A standalone script's main: :func:`script_parser`'s options, :func:`single_thread_quiet`, ``measure(name,
    repeats)`` (a list of result rows) for each ``--data`` set, and the rows with :func:`machine_fields` written to
    ``--out``."""
    args = script_parser(doc, json_name, "circles,adult,mnist", 9).parse_args()
    single_thread_quiet()
    before = load_average()
    rows = [row for name in args.data.split(",") for row in measure(name, args.repeats)]
    Path(args.out).write_text(json.dumps({**machine_fields(before), "repeats": args.repeats, "rows": rows},
                                         indent=2) + "\n")
    print(f"wrote {args.out}")


def machine_fields(load_before) -> dict:
    """What a bench result says of the machine: cores, CPU, the load before (given) and now, and the time."""
    return {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def append_result(out, result: dict) -> None:
    """Append ``result`` to the JSON list in the file ``out`` (created if missing) and print it."""
    import json

    out = Path(out)
    existing = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*existing, result], indent=2) + "\n")
    print(json.dumps(result, indent=2))
