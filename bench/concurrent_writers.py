"""32 concurrent writers into one tracking store: a fresh local SQLite store, then a real ``mlflow server``.

Issue 26 §3: "32 concurrent writers (train, compare, sweep trials) into one fresh SQLite store and into a
server: 0 lost runs or metrics". A 2-core machine cannot run 32 trainings at once in reasonable time, so
each store gets

- ``--writers`` (32) light writer processes that write exactly what a training writes, the way this
  project's code writes it: the store and experiment set up by ``prepare_store`` (inter-process lock),
  a run created by ``create_run`` (name, tags), the run-level parameters in one ``log_batch`` (as
  Lightning's ``log_hyperparams``), ``--epochs`` epochs of ``--keys`` metrics each sent as one ``log_batch``
  at ``step = epoch`` (as ``EpochStepMLFlowLogger``), ``config.json`` by ``log_dict``, a checkpoint-sized
  file by ``log_artifact`` and the end ``FINISHED``; all wait at a barrier and write at the same moment;
- ``--trainings`` (4) real ``recipes/train.py`` trainings started at the same moment.

Afterwards the store is read back: one run per writer, FINISHED, every metric key with every step once,
every parameter, the artifacts. Lost runs and lost metric points are counted (expected: 0).

Usage: python bench/concurrent_writers.py [--writers 32] [--trainings 4] [--out bench/concurrent_writers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "concurrent-writers"
N_PARAMS = 20
TRAINING_EPOCHS = 2
TRAINING_KEYS = ("train/loss", "train/clf", "val/acc", "val/loss")


def writer(tracking_uri: str, index: int, epochs: int, keys: int, barrier: Path, scratch: Path) -> dict:
    """One light writer: everything a training writes, in the same calls; returns what it sent."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.lifecycle import create_run
    from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store

    while not barrier.exists():
        time.sleep(0.05)
    started = time.perf_counter()
    artifact_location = prepare_store(tracking_uri, EXPERIMENT)
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = ensure_experiment(client, EXPERIMENT, artifact_location)
    config = {"data": "moons", "objective": "full", "generator": "ecco", "seed": index, "run_name": f"writer-{index}"}
    run_id, _ = create_run(client, experiment_id, config, {"role": "bench"})
    client.log_batch(run_id, params=[Param(f"p{k}", str(k * index)) for k in range(N_PARAMS)])
    for epoch in range(epochs):
        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(f"m/{k}", float(epoch * k + index), now, epoch) for k in range(keys)])
    client.log_dict(run_id, config, "config.json")
    checkpoint = scratch / f"last-{index}.ckpt"
    checkpoint.write_bytes(os.urandom(64 * 1024))
    client.log_artifact(run_id, str(checkpoint), "checkpoints")
    client.set_terminated(run_id, "FINISHED")
    return {"run_id": run_id, "name": f"writer-{index}", "seconds": time.perf_counter() - started}


def start_writers(tracking_uri: str, n: int, epochs: int, keys: int, barrier: Path, scratch: Path):
    """``n`` writer processes, each waiting at ``barrier`` (a file) once its imports are done."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen([sys.executable, __file__, "--writer", str(i), "--tracking-uri", tracking_uri,
                              "--epochs", str(epochs), "--keys", str(keys), "--barrier", str(barrier),
                              "--scratch", str(scratch)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(n)]


def start_trainings(tracking_uri: str, n: int, folder: Path):
    """``n`` tiny real trainings (``recipes/train.py``) into ``tracking_uri``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen([sys.executable, str(ROOT / "recipes" / "train.py"), "--data", "moons", "--max-epochs",
                              str(TRAINING_EPOCHS), "--limit-train-batches", "2", "--limit-val-batches", "1",
                              "--nce", "16", "--max-steps", "3", "--accelerator", "cpu", "--no-progress",
                              "--seed", str(i), "--run-name", f"training-{i}", "--tracking-uri", tracking_uri,
                              "--experiment", EXPERIMENT, "--checkpoint-dir", str(folder / f"ckpt-{i}")],
                             env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(n)]


def count(tracking_uri: str, writers: int, trainings: int, epochs: int, keys: int) -> dict:
    """Read the store back: runs found, FINISHED, metric points and parameters found against those sent."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = {} if experiment is None else {r.info.run_name: r for r in
                                           client.search_runs([experiment.experiment_id], max_results=1000)}
    expected_points = writers * epochs * keys + trainings * TRAINING_EPOCHS * len(TRAINING_KEYS)
    found_points = duplicates = params = artifacts = finished = 0
    for i in range(writers):
        run = runs.get(f"writer-{i}")
        if run is None:
            continue
        finished += run.info.status == "FINISHED"
        params += sum(f"p{k}" in run.data.params for k in range(N_PARAMS))
        paths = {a.path for a in client.list_artifacts(run.info.run_id)}
        artifacts += "config.json" in paths and "checkpoints" in paths
        for k in range(keys):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, f"m/{k}")]
            found_points += len(set(steps) & set(range(epochs)))
            duplicates += len(steps) - len(set(steps))
    for i in range(trainings):
        run = runs.get(f"training-{i}")
        if run is None:
            continue
        finished += run.info.status == "FINISHED"
        for key in TRAINING_KEYS:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            found_points += len(set(steps) & set(range(TRAINING_EPOCHS)))
            duplicates += len(steps) - len(set(steps))
    expected_runs = writers + trainings
    found_runs = sum(name in runs for name in [*(f"writer-{i}" for i in range(writers)),
                                               *(f"training-{i}" for i in range(trainings))])
    return {"runs_expected": expected_runs, "runs_found": found_runs, "runs_lost": expected_runs - found_runs,
            "runs_finished": finished, "metric_points_expected": expected_points, "metric_points_found": found_points,
            "metric_points_lost": expected_points - found_points, "duplicate_points": duplicates,
            "params_expected": writers * N_PARAMS, "params_found": params,
            "writers_with_all_artifacts": artifacts}


def run_store(tracking_uri: str, args, folder: Path) -> dict:
    """Start the writers and trainings at once against ``tracking_uri``, wait, and count what the store holds."""
    barrier, scratch = folder / "go", folder / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    writers = start_writers(tracking_uri, args.writers, args.epochs, args.keys, barrier, scratch)
    time.sleep(args.import_wait)  # let the writers import MLflow, so that they write at the same moment
    started = time.perf_counter()
    barrier.touch()
    trainings = start_trainings(tracking_uri, args.trainings, folder)
    failures, writer_seconds = [], []
    for i, process in enumerate(writers):
        out, err = process.communicate(timeout=1800)
        if process.returncode != 0:
            failures.append(f"writer-{i}: {err.strip().splitlines()[-1] if err.strip() else process.returncode}")
        else:
            writer_seconds.append(json.loads(out.strip().splitlines()[-1])["seconds"])
    for i, process in enumerate(trainings):
        out = process.communicate(timeout=1800)[0]
        if process.returncode != 0:
            failures.append(f"training-{i}: {out.strip().splitlines()[-1] if out.strip() else process.returncode}")
    wall = time.perf_counter() - started
    result = count(tracking_uri, args.writers, args.trainings, args.epochs, args.keys)
    result.update({"failed_processes": failures, "wall_seconds": round(wall, 1),
                   "writer_seconds_max": round(max(writer_seconds, default=0.0), 1),
                   "writer_seconds_median": round(sorted(writer_seconds)[len(writer_seconds) // 2], 1)
                   if writer_seconds else None})
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` as the docs start it (SQLite backend, artifact root; MLflow's default workers)."""
    import urllib.request

    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                               f"sqlite:///{folder / 'server.db'}", "--artifacts-destination",
                               str(folder / "server-artifacts"), "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(uri + "/health", timeout=1).close()
            return server, uri
        except OSError:
            time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)
    raise RuntimeError("mlflow server did not answer within 180 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--trainings", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--keys", type=int, default=8, help="metric keys per epoch")
    parser.add_argument("--import-wait", type=float, default=45.0, help="seconds the writers get to import")
    parser.add_argument("--stores", default="sqlite,server")
    parser.add_argument("--out", default=str(ROOT / "bench" / "concurrent_writers.json"))
    parser.add_argument("--writer", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tracking-uri", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer is not None:
        print(json.dumps(writer(args.tracking_uri, args.writer, args.epochs, args.keys, Path(args.barrier),
                                Path(args.scratch))))
        return
    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
               "settings": {"writers": args.writers, "trainings": args.trainings, "epochs": args.epochs,
                            "keys": args.keys, "params": N_PARAMS, "training_epochs": TRAINING_EPOCHS},
               "stores": {}}
    import mlflow

    results["machine"]["mlflow"] = mlflow.__version__
    for store in args.stores.split(","):
        folder = Path(tempfile.mkdtemp(prefix=f"ct-writers-{store}-"))
        try:
            if store == "sqlite":
                uri = f"sqlite:///{folder / 'store' / 'mlflow.db'}"  # fresh: the folder does not exist yet
                results["stores"][store] = run_store(uri, args, folder)
            else:
                server, uri = start_server(folder)
                try:
                    results["stores"][store] = run_store(uri, args, folder)
                finally:
                    os.killpg(server.pid, signal.SIGTERM)
                    server.wait(timeout=60)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(store, json.dumps(results["stores"][store]), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
