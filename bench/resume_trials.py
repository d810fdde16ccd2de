"""Kill-and-resume trials: how many SIGKILLed-and-resumed runs end bit-identical to an uninterrupted run.

Each trial trains in a subprocess that is SIGKILLed, then resumes it (``train(resume=...)``) and
compares the final weights (every tensor, exactly), the final metrics (all but timings) and the
per-epoch metric histories with those of one uninterrupted run with the same seed. Half the
trials kill at a random point of the loop from inside (a training batch, a validation batch, an
epoch start or just after an epoch's checkpoint), half from outside after a random delay (which may land anywhere, also while a
checkpoint is written). A run killed before its first checkpoint cannot be resumed; the trial then
checks that ``--resume`` refuses it and counts it separately.

Usage: python bench/resume_trials.py [--trials 20] [--seed 0] [--out bench/resume_trials.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"data": "moons", "max_epochs": 5, "limit_train_batches": 8, "limit_val_batches": 2, "nce": 60,
          "progress": False, "accelerator": "cpu", "seed": 7}
TIMED = ("fit_seconds", "train/cf_search_seconds")


def kill_inside(overrides: dict, rng: random.Random) -> str:
    phase = rng.choice(["train", "val", "epoch_start", "epoch_end"])
    epoch = rng.randrange(CONFIG["max_epochs"])
    batch = rng.randrange(CONFIG["limit_train_batches"] if phase == "train" else CONFIG["limit_val_batches"])
    batch = 0 if phase in ("epoch_start", "epoch_end") else batch
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "kill_during_training.py"), json.dumps(overrides),
                           phase, str(epoch), str(batch)], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != -9:
        raise RuntimeError(f"child was not killed: {done.stderr[-2000:]}")
    return f"inside {phase} epoch {epoch} batch {batch}"


def kill_outside(overrides: dict, rng: random.Random, max_delay: float = 4.0) -> str:
    code = ("import json, sys, torch; torch.set_num_threads(1); from ct_lightning.experiment.runs.train import train; "
            "train(json.loads(sys.argv[1]))")
    # Output to a file, not a pipe: a pipe nobody reads fills up and stalls the child before it is killed.
    log = tempfile.NamedTemporaryFile("w+", prefix="ct-kill-", suffix=".log", delete=False)
    child = subprocess.Popen([sys.executable, "-u", "-c", code, json.dumps(overrides)], cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT, text=True)
    while child.poll() is None and "MLflow run " not in Path(log.name).read_text():  # printed as training starts
        time.sleep(0.05)
    delay = rng.uniform(0.0, max_delay)
    time.sleep(delay)
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.wait()
    return f"outside after {delay:.2f}s" + ("" if child.returncode == -9 else " (finished first)")


def compare(reference: dict, resumed: dict, client) -> list[str]:
    """Differences between two runs' weights, final metrics and per-epoch metric histories."""
    diffs = []
    a = torch.load(reference["checkpoints"]["last"], weights_only=True)["state_dict"]
    b = torch.load(resumed["checkpoints"]["last"], weights_only=True)["state_dict"]
    diffs += [f"weights {k}" for k in a if not torch.equal(a[k], b[k])]
    diffs += [f"metric {k}" for k, v in reference["metrics"].items() if k not in TIMED and resumed["metrics"].get(k) != v]
    for key in ("train/loss", "train/acc", "val/acc", "val/loss", "train/cf_converged"):
        histories = [{m.step: m.value for m in sorted(client.get_metric_history(s["run_id"], key),
                                                      key=lambda m: m.timestamp)} for s in (reference, resumed)]
        if histories[0] != histories[1]:
            diffs.append(f"history {key}")
    return diffs


def main(argv=None) -> dict:
    """Run the trials and print how many were bit-identical."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "resume_trials.json"))
    parser.add_argument("--max-delay", type=float, default=4.0,
                        help="outside kills land uniformly in [0, MAX_DELAY] s after training starts")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train

    quiet = lambda *a, **k: None  # noqa: E731
    folder = Path(tempfile.mkdtemp(prefix="ct-resume-trials-"))
    store = {"tracking_uri": f"sqlite:///{folder}/mlflow.db"}
    client = MlflowClient(tracking_uri=store["tracking_uri"])
    reference = train({**CONFIG, **store, "experiment": "reference"}, echo=quiet)
    rng = random.Random(args.seed)
    results = []
    for trial in range(args.trials):
        exp = {**store, "experiment": f"trial-{trial}"}
        how = kill_inside({**CONFIG, **exp}, rng) if trial % 2 == 0 else \
            kill_outside({**CONFIG, **exp}, rng, args.max_delay)
        try:
            if how.endswith("(finished first)"):
                raise ValueError("already trained all epochs")
            resumed = train({"resume": "latest", **exp, "progress": False}, echo=quiet)
            diffs = compare(reference, resumed, client)
            outcome = "identical" if not diffs else "different"
        except ValueError as error:
            if "no unfinished run with a checkpoint" not in str(error) and "already trained all" not in str(error):
                raise
            diffs, outcome = [], "not resumable" if "no unfinished" in str(error) else "finished before the kill"
        results.append({"trial": trial, "kill": how, "outcome": outcome, "differences": diffs})
        print(f"trial {trial:2d}: {how:45s} {outcome}{' ' + ', '.join(diffs[:4]) if diffs else ''}", flush=True)
    resumed = [r for r in results if r["outcome"] in ("identical", "different")]
    identical = sum(r["outcome"] == "identical" for r in resumed)
    summary = {"config": CONFIG, "trials": results, "resumed": len(resumed), "identical": identical,
               "not_resumable": sum(r["outcome"] == "not resumable" for r in results),
               "finished_before_kill": sum(r["outcome"] == "finished before the kill" for r in results)}
    print(f"{identical}/{len(resumed)} killed-and-resumed runs bit-identical to the uninterrupted run "
          f"({summary['not_resumable']} killed before their first checkpoint, correctly refused; "
          f"{summary['finished_before_kill']} finished before the kill)")
    Path(args.out).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
