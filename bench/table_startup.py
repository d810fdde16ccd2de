"""From a large CSV to training's first epoch: the table work ``train.py`` does before its MLflow run starts.

Run: ``.venv/bin/python bench/table_startup.py [--rows 200000] [--repeat 3] [--against DIR] [--json
bench/table_startup.json --label after]``. Writes a credit-scoring table (``--rows`` rows, 40 columns: 20 decimals, 8
whole-number columns, an identifier, four text columns of 50 levels, six of 2 to 7 levels, a yes/no target) and times,
each in a fresh interpreter, what ``recipes/train.py --data FILE --target default`` does with it before its run
starts: ``resolve_config`` (which chooses the CT settings from the training rows) and ``build_datamodule`` (reading,
checks, encoding, splits). Reports wall and CPU seconds (after the imports) and the peak resident memory of the process (VmHWM,
imports included).
``--against DIR`` times another checkout as well (``git archive BASE | tar -x -C DIR``), alternating with this one
run by run, so that both see the same load on a shared machine. Not a unit test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
MEASURE = """
import json, sys, time
wall = time.perf_counter()
from ct_lightning.experiment.configuration.data import build_datamodule
from ct_lightning.experiment.configuration.settings import resolve_config
imported, cpu = time.perf_counter(), time.process_time()
def peak_mib():  # VmHWM: ru_maxrss would carry the parent's high-water mark over fork+exec
    line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
    return int(line.split()[1]) / 1024
data = build_datamodule(resolve_config({"data": sys.argv[1], "target": "default"}))
print(json.dumps({"wall_s": time.perf_counter() - imported, "cpu_s": time.process_time() - cpu,
                  "imports_s": imported - wall, "peak_mib": peak_mib(),
                  "inputs": data.n_features}))
"""


def write_table(path: Path, rows: int) -> None:
    """A credit-scoring table of ``rows`` rows and 40 columns (see the module docstring)."""
    rng = np.random.default_rng(0)
    columns = {"applicant_id": np.arange(1_000_000, 1_000_000 + rows)}
    columns.update({f"num_{i}": np.round(rng.normal(50, 15, rows), 2) for i in range(20)})
    columns.update({f"count_{i}": rng.poisson(3, rows) for i in range(6)})
    columns.update(income=np.round(rng.lognormal(10.5, 0.5, rows)), age=rng.integers(18, 80, rows))
    columns.update({f"cat50_{i}": rng.choice([f"L{j:02d}" for j in range(50)], rows) for i in range(4)})
    for name, levels in (("region", 5), ("home", 3), ("purpose", 7), ("sex", 2), ("employment", 4), ("channel", 3)):
        columns[name] = rng.choice([f"{name}_{j}" for j in range(levels)], rows)
    frame = pd.DataFrame(columns)
    frame["default"] = np.where(rng.random(rows) < 1 / (1 + np.exp(-0.03 * (frame.num_0 - 50))), "no", "yes")
    frame.to_csv(path, index=False)


def measure(checkout: Path, table: Path) -> dict:
    """One fresh interpreter's timing of the table work in ``checkout``."""
    done = subprocess.run([sys.executable, "-c", MEASURE, str(table)], cwd=checkout, capture_output=True, text=True,
                          env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    """The median of each measured value over the runs."""
    return {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}


def main() -> None:
    """Time the checkouts and print (and with ``--json`` keep) the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout to time alternately")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--label", default="run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        table = Path(folder) / "credit.csv"
        write_table(table, args.rows)
        checkouts = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
        runs = {name: [] for name in checkouts}
        for _ in range(args.repeat):
            for name, checkout in checkouts.items():
                runs[name].append(measure(checkout, table))
    result = {"label": args.label, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": platform.processor() or platform.machine(), "rows": args.rows, "columns": 40,
              "repeat": args.repeat, **{name: median_of(found) for name, found in runs.items()},
              "against_dir": str(args.against) if args.against else None}
    print(json.dumps(result, indent=2))
    if args.json:
        kept = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([r for r in kept if r["label"] != args.label] + [result], indent=2) + "\n")


if __name__ == "__main__":
    main()
