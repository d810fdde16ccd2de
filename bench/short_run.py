"""The fixed cost of a short training run: ``recipes/train.py --data circles --max-epochs 2`` from an empty folder, as a
user runs it (a fresh interpreter, ``python recipes/train.py ...``), and where its seconds go.

Run: ``.venv/bin/python bench/short_run.py [--repeat 3] [--against DIR] [--json bench/short_run.json --label after]``.
Each repeat makes an empty folder and runs the command there twice: the *first run* creates the MLflow store
(``./mlruns``, SQLite), the *repeat run* finds it. Prints the median wall time of each (to exit, from the start of the
interpreter) and of its CPU seconds (user and system: what waiting for a core on a shared machine inflates least). A
warm-up run per checkout comes first, not timed: it fills the file cache and the runs' own user cache
(``CT_CACHE_DIR``, empty at the start), where the first store MLflow creates is kept as the template of later new
stores (``ct_lightning/experiment/runs/store_template.py``; a user's very first store is made by MLflow as before).
Then an *anatomy* of one first and one repeat run (two more runs, in a folder of their own, under this script's timer,
``--anatomy-child``): the seconds of named stages (the functions of ``STAGES``, where the checkout has them:
configuration, store setup, run creation, training, checkpoints, model logging, registry, plots, run end, and the
MLflow and matplotlib steps inside them that cost most) and, inside each, the seconds spent importing modules (the
slowest imports named); stages nest, and each level's ``other`` is what its named stages leave (at the top: the
command line, its checks and the imports before ``train()``). ``--against DIR`` times another checkout as well (e.g.
``git archive BASE | tar -x -C DIR``), alternating with this one repeat by repeat, so that both see the same load on a
shared machine; its anatomy is taken by this script's timer too. ``--json`` keeps one entry per ``--label`` in the
file (an earlier entry under the same label is replaced). Not a unit test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ is a package of the checkout
from bench.startup import commit, write_json  # noqa: E402 - after the path
COMMAND = ["--data", "circles", "--max-epochs", "2"]
# (module, attribute: a function, or Class.method, label) of each timed stage; a checkout without one times the rest.
STAGES = [
    ("ct_lightning.experiment.runs.train", "train", "train(): from the checked options to the finished run"),
    ("ct_lightning.experiment.runs.train", "_prepare", "configuration (resolve_config, checks)"),
    ("ct_lightning.experiment.configuration.data", "build_datamodule", "data module"),
    ("ct_lightning.experiment.runs.train", "module_and_unused", "CTModule"),
    ("ct_lightning.experiment.runs.tracking", "prepare_store", "store setup (SQLite store, its tables)"),
    ("ct_lightning.experiment.runs.store_template", "copy_template", "copy of the empty store (store_template)"),
    ("ct_lightning.experiment.runs.store_template", "keep_template", "kept as the template (store_template)"),
    ("mlflow.store.db.utils", "_initialize_tables", "MLflow's schema migrations (a new store)"),
    ("ct_lightning.experiment.runs.tracking", "ensure_experiment", "experiment"),
    ("ct_lightning.experiment.runs.lifecycle", "create_run", "run creation (name, tags)"),
    ("ct_lightning.experiment.runs.run_artifacts", "log_training_inputs", "params, config.json/yaml, datasets"),
    ("lightning.pytorch", "Trainer.__init__", "Trainer()"),
    ("lightning.pytorch", "Trainer.fit", "fit (2 epochs, validation, checkpoints)"),
    ("ct_lightning.experiment.runs.checkpoint_io", "AtomicCheckpointIO.save_checkpoint", "checkpoint writes"),
    ("ct_lightning.experiment.runs.run_artifacts", "EpochStepMLFlowLogger.flush", "metrics sent to the store"),
    ("lightning.pytorch", "Trainer.test", "test"),
    ("ct_lightning.experiment.runs.served_model", "log_models", "model logging (model, predictor, registry)"),
    ("ct_lightning.experiment.runs.run_artifacts", "log_classifier", "PyTorch model (mlflow.pytorch.log_model)"),
    ("mlflow.utils.requirements_utils", "_init_modules_to_packages_map",
     "MLflow: every installed package's file list read (its requirement check; once a process)"),
    ("mlflow.models.utils", "_validate_serving_input", "MLflow: input example scored (validation)"),
    ("ct_lightning.experiment.runs.served_model", "log_predictor", "predictor (pyfunc)"),
    ("ct_lightning.experiment.runs.served_model", "register_predictor", "registry (register the predictor)"),
    ("ct_lightning.experiment.runs.served_model", "_link_quietly", "final metrics linked to the models"),
    ("ct_lightning.experiment.runs.run_artifacts", "log_training_plots", "training plots"),
    ("ct_lightning.evaluation.plots", "plot_convergence", "convergence plot"),
    ("ct_lightning.evaluation.plots", "plot_decision_boundaries", "decision-boundary plot"),
    ("matplotlib.figure", "Figure.savefig", "PNG (savefig: layout pass for the tight box, drawing, encoding)"),
    ("mlflow.tracking.client", "MlflowClient.log_artifact", "artifact upload (log_artifact)"),
    ("mlflow.tracking.client", "MlflowClient.log_artifacts", "artifact upload (log_artifacts)"),
    ("mlflow.tracking.client", "MlflowClient.get_run", "run reload (get_run)"),
    ("mlflow.tracking.client", "MlflowClient.set_terminated", "run end (FINISHED)"),
    ("ct_lightning.experiment.runs.train", "announce", "closing lines"),
]


# --- the timer, run inside the child interpreter: standard library only, installed before anything is imported ---

class StageClock:
    """Times the stages of one run in its main thread: inclusive seconds and the seconds spent importing inside
    each, nested."""

    def __init__(self):
        self.start = time.monotonic()
        self.stack = [{"label": "run", "seconds": 0.0, "imports_s": 0.0, "calls": 1, "children": {}}]
        self.importing = False
        self.wrapped: set = set()
        self.thread = threading.get_ident()  # the main thread's stages only

    def import_hook(self, original):
        """``_find_and_load`` timing the outermost import into the current stage, and wrapping new stage targets."""
        def find_and_load(name, import_):
            if self.importing or threading.get_ident() != self.thread:
                return original(name, import_)
            self.importing, started = True, time.monotonic()
            try:
                return original(name, import_)
            finally:
                self.importing = False
                spent = time.monotonic() - started
                for node in self.stack:
                    node["imports_s"] += spent
                modules = self.stack[-1].setdefault("modules", {})
                modules[name] = modules.get(name, 0.0) + spent
                self.wrap_new()
        return find_and_load

    def wrap_new(self) -> None:
        """Wrap each stage target whose module has been imported since the last look."""
        for module_name, attribute, label in STAGES:
            if (module_name, attribute) in self.wrapped or module_name not in sys.modules:
                continue
            owner, name = sys.modules[module_name], attribute
            if "." in attribute:
                class_name, name = attribute.split(".")
                owner = getattr(owner, class_name, None)
            original = getattr(owner, name, None) if owner is not None else None
            if original is None:
                continue
            self.wrapped.add((module_name, attribute))
            timed = self.timed(original, label)
            setattr(owner, name, timed)
            if "." not in attribute:  # `from X import f` copies in the project's modules
                for other in list(sys.modules.values()):
                    if getattr(other, "__name__", "").startswith(("ct_lightning", "datamodules")):
                        for key, value in list(vars(other).items()):
                            if value is original:
                                setattr(other, key, timed)

    def timed(self, function, label: str):
        """``function`` timed as the stage ``label`` (its calls add up)."""
        clock = self

        def stage(*args, **kwargs):
            if threading.get_ident() != clock.thread:  # another thread's calls (MLflow's own) are not stages
                return function(*args, **kwargs)
            parent = clock.stack[-1]
            node = parent["children"].setdefault(label, {"label": label, "seconds": 0.0, "imports_s": 0.0,
                                                         "calls": 0, "children": {}})
            node["calls"] += 1
            clock.stack.append(node)
            started = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                node["seconds"] += time.monotonic() - started
                clock.stack.pop()
        stage.__wrapped__ = function
        return stage


def anatomy_child(out: str, script: str, argv: list[str]) -> None:
    """Run ``script`` as ``__main__`` with ``argv`` under :class:`StageClock`; write its stages to ``out``."""
    import _frozen_importlib  # noqa: PLC0415 - the import machinery CPython calls

    clock = StageClock()
    _frozen_importlib._find_and_load = clock.import_hook(_frozen_importlib._find_and_load)
    import runpy  # noqa: PLC0415

    sys.argv = [script, *argv]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python recipes/train.py` has it
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    root = clock.stack[0]
    root["seconds"] = time.monotonic() - clock.start
    Path(out).write_text(json.dumps({"start": clock.start, "end": time.monotonic(), "root": root,
                                     "exit_status": status}))
    sys.exit(status)  # the interpreter's own exit, as the recipe's: timed by the parent, from "end" to the process's end


# --- the parent: wall times and the anatomy's table ---

def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process's finished children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed_run(tree: Path, folder: Path, env: dict) -> tuple[float, float, int]:
    """``(seconds to exit, CPU seconds, exit status)`` of the command run from ``tree`` in ``folder``. The CPU
    seconds are what the run itself computed, which waiting for a core on a shared machine does not inflate."""
    started, cpu = time.monotonic(), cpu_seconds()
    done = subprocess.run([sys.executable, str(tree / "recipes" / "train.py"), *COMMAND], cwd=folder,
                          env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
    return time.monotonic() - started, cpu_seconds() - cpu, done.returncode


def anatomy(tree: Path, folder: Path, env: dict) -> list[dict]:
    """The stages of one run of the command from ``tree`` in ``folder``, as table rows."""
    out = folder / "anatomy.json"
    started = time.monotonic()
    subprocess.run([sys.executable, os.environ.get("SHORT_RUN_CHILD", str(Path(__file__).resolve())), "--anatomy-child", str(out),
                    str(tree / "recipes" / "train.py"), *COMMAND], cwd=folder, env={**env, "PYTHONPATH": str(tree)},
                   capture_output=True, check=True)
    ended = time.monotonic()
    result = json.loads(out.read_text())
    rows = [{"stage": "interpreter start (before the recipe's first line)", "depth": 0,
             "seconds": round(result["start"] - started, 3)}]
    root = result["root"]

    def walk(node: dict, depth: int) -> None:
        named = 0.0
        for child in node["children"].values():
            rows.append({"stage": child["label"], "depth": depth, "seconds": round(child["seconds"], 3),
                         "imports_s": round(child["imports_s"], 3), "calls": child["calls"],
                         **({} if child["children"] else biggest(child))})
            named += child["seconds"]
            walk(child, depth + 1)
        if node["children"]:
            other = node["seconds"] - named
            imports = node["imports_s"] - sum(c["imports_s"] for c in node["children"].values())
            rows.append({"stage": "other" if depth else "other: command line, checks, imports before train()",
                         "depth": depth, "seconds": round(other, 3), "imports_s": round(imports, 3),
                         **biggest(node)})

    walk(root, 0)
    rows.append({"stage": "interpreter exit", "depth": 0, "seconds": round(ended - result["end"], 3)})
    rows.append({"stage": "total", "depth": 0, "seconds": round(ended - started, 3),
                 "imports_s": round(root["imports_s"], 3)})
    return rows


def biggest(node: dict, count: int = 3) -> dict:
    """``{"imported": {module: seconds}}``: the slowest outermost imports made in ``node`` itself (≥ 20 ms)."""
    modules = sorted(node.get("modules", {}).items(), key=lambda item: -item[1])
    shown = {name: round(seconds, 3) for name, seconds in modules[:count] if seconds >= 0.02}
    return {"imported": shown} if shown else {}


def show_anatomy(rows: list[dict], title: str) -> None:
    """Print the anatomy's rows, indented by depth."""
    print(f"\nanatomy of one {title}:  seconds (of which imports)")
    for row in rows:
        imports = f" ({row['imports_s']:.2f})" if row.get("imports_s") else ""
        calls = f" x{row['calls']}" if row.get("calls", 1) > 1 else ""
        imported = ", ".join(f"{name} {seconds:.2f}" for name, seconds in row.get("imported", {}).items())
        print(f"  {'  ' * row['depth']}{row['seconds']:6.2f}{imports:8}  {row['stage']}{calls}"
              + (f"  [imports: {imported}]" if imported else ""))


def main() -> None:
    """Time the first and the repeat run ``--repeat`` times per checkout, print the medians and the anatomy."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here (one entry per --label)")
    parser.add_argument("--label", default="latest", help="name of this run's entry in --json (default latest)")
    parser.add_argument("--against", type=Path, help="another checkout to time the same command in, alternately")
    parser.add_argument("--no-anatomy", action="store_true", help="wall times only")
    args = parser.parse_args()
    trees = [ROOT] + ([args.against.resolve()] if args.against else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("CT_DATA_DIR", "/work/shared/data/raw")
    loads, times = [os.getloadavg()[0]], {tree: {kind: [] for kind in ("first", "repeat", "first_cpu",
                                                                                "repeat_cpu")} for tree in trees}
    anatomies = {}
    with tempfile.TemporaryDirectory(prefix="ct-short-run-") as scratch:
        env["CT_CACHE_DIR"] = str(Path(scratch) / "cache")  # the user cache of these runs: an empty one
        for tree in trees:  # not timed: warms the file cache, and the user cache's empty store (store_template)
            warm = Path(scratch) / f"warm-up-{trees.index(tree)}"
            warm.mkdir()
            if timed_run(tree, warm, env)[2]:
                sys.exit(f"{tree}: the warm-up run failed")
        for index in range(args.repeat):
            for tree in trees:  # alternating: both trees see the same load
                folder = Path(scratch) / f"{index}-{trees.index(tree)}"
                folder.mkdir()
                for kind in ("first", "repeat"):
                    seconds, cpu, status = timed_run(tree, folder, env)
                    if status:
                        sys.exit(f"{tree}: the {kind} run failed (exit {status})")
                    times[tree][kind].append(seconds)
                    times[tree][f"{kind}_cpu"].append(cpu)
                if index == args.repeat - 1 and not args.no_anatomy:  # extra runs: the timer costs a little
                    fresh = Path(scratch) / f"anatomy-{trees.index(tree)}"
                    fresh.mkdir()
                    anatomies[tree] = {kind: anatomy(tree, fresh, env) for kind in ("first", "repeat")}
    loads.append(os.getloadavg()[0])
    result = {}
    for tree, prefix in zip(trees, ("", "against_")):
        where = "" if tree == ROOT else f"  [{tree}]"
        for kind in ("first", "repeat"):
            median, cpu = (statistics.median(times[tree][key]) for key in (kind, f"{kind}_cpu"))
            print(f"{median:6.2f} s  {kind} run, {cpu:6.2f} s CPU (medians of {args.repeat}: "
                  f"{', '.join(f'{s:.2f}' for s in times[tree][kind])} s){where}")
            result[f"{prefix}{kind}_run_s"] = round(median, 3)
            result[f"{prefix}{kind}_run_cpu_s"] = round(cpu, 3)
            result[f"{prefix}{kind}_runs_s"] = [round(s, 3) for s in times[tree][kind]]
        for kind, rows in anatomies.get(tree, {}).items():
            show_anatomy(rows, f"{kind} run {where.strip() or f'[{ROOT}]'}")
            result[f"{prefix}anatomy_{kind}_run"] = rows
    if args.json:
        from bench.common import cpu_model  # noqa: PLC0415 - imports torch: only after the timings

        write_json(args.json, {"label": args.label, "commit": commit(),
                               **({"against": str(args.against)} if args.against else {}),
                               "command": "recipes/train.py " + " ".join(COMMAND),
                               "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                               "machine": f"{cpu_model()}, {os.cpu_count()} logical CPUs",
                               "python": platform.python_version(), "repeat": args.repeat,
                               "load_average_1min_start_end": [round(v, 2) for v in loads], **result})


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--anatomy-child":
        anatomy_child(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.path.insert(0, str(ROOT))
        main()
