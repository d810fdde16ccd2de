"""Benchmark of counterfactual training (issue 7): search throughput, CT overhead, memory and scaling.

    python bench/run.py                      # full run (~10–15 min on 2 CPU cores)
    python bench/run.py --quick              # smoke run (< 1 min): circles only, small sizes
    python bench/run.py --data circles,adult,mnist --pool-sizes 100,1000,10000 --repeats 5 --epochs 4 \\
        --out docs/performance.md --json bench/results.json
    python bench/run.py --accelerator gpu    # the accelerator section only (every data set, vanilla and CT,
                                             # compile on/off, TF32 on/off; --quick: circles, adult, mnist)

Sections (``--sections``): ``search`` (batched ECCo search vs a per-instance loop vs bare
forward+backward passes), ``overhead`` (CT epoch vs vanilla epoch with the paper's defaults, and
where a CT epoch spends its time), ``memory`` (peak RSS of a CT epoch per data set, one fresh
process each) and ``scaling`` (time and memory against ``nce`` and the number of features).
Data sets that are not registered (or whose raw files are missing) are skipped with a message.

With ``--accelerator gpu`` (or ``cuda``) it runs ``bench/gpu_section.py`` instead and writes only the accelerator
section of the report (between its markers; the CPU sections stay) and ``bench/gpu_results.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import (REPO, load_average, load_datamodule, machine_info, pick_device,  # noqa: E402
                          setup_environment, train_vanilla)

SECTIONS = ("reference", "search", "compile", "overhead", "memory", "scaling")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="comma-separated data sets (default circles,adult,mnist; "
                                                     "--quick: circles)")
    parser.add_argument("--pool-sizes", default=None, help="pool sizes of the search benchmark "
                                                           "(default 100,1000,10000; --quick: 100,1000)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per search measurement "
                                                                 "(median; default 5, --quick 2)")
    parser.add_argument("--fit-repeats", type=int, default=None,
                        help="vanilla/full fits per data set, alternated (default 2, --quick 1)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per fit, the first one a warm-up left out (default 4, --quick 2)")
    parser.add_argument("--loop-subset", type=int, default=None,
                        help="factuals timed in the per-instance loop; larger pools are extrapolated "
                             "per instance (default 100, --quick 10)")
    parser.add_argument("--features", default=None, help="feature counts of the scaling runs "
                                                         "(default 2,10,100,1000; --quick 100)")
    parser.add_argument("--nce", default=None, help="nce values of the scaling runs, at 100 features "
                                                    "(default 1000,5000,20000; --quick 1000)")
    parser.add_argument("--hidden", default=None, help="hidden-layer widths of the model-size scaling runs, at 100 "
                                                       "features and nce 1 000 (default 32,256,1024; --quick 32)")
    parser.add_argument("--reference-epochs", type=int, default=None,
                        help="epochs per run of the plain-PyTorch reference comparison, the first a warm-up "
                             "(default 4, --quick 3)")
    parser.add_argument("--reference-repeats", type=int, default=None,
                        help="interleaved plain/vanilla/full runs per data set (default 2, --quick 1)")
    parser.add_argument("--reference-cnn", action="store_true",
                        help="also compare the LeNet CNN on MNIST with the plain loop (slow on a CPU)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS)}")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1; 0 keeps torch's default). See docs/performance.md")
    parser.add_argument("--device", default="auto", help="device of the search benchmark (auto: cuda if available)")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator of the fits (default auto)")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="call gc.freeze() once the data are loaded (moves every object alive then out of "
                             "the cyclic collector's reach; see docs/performance.md)")
    parser.add_argument("--baseline-search", default=None, metavar="PATH",
                        help="another version of ct_lightning/search.py to compare against (A/B on pool 1000, "
                             "identical outputs checked), e.g. from `git show REV:ct_lightning/search.py`")
    parser.add_argument("--quick", action="store_true", help="fast smoke run (< 1 min)")
    parser.add_argument("--out", default="docs/performance.md", help="Markdown report ('' for none)")
    parser.add_argument("--json", default="bench/results.json", help="raw results as JSON ('' for none)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one memory configuration
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "data": "circles" if quick else "circles,adult,mnist",
        "pool_sizes": "100,1000" if quick else "100,1000,10000",
        "repeats": 2 if quick else 5, "fit_repeats": 1 if quick else 2, "epochs": 2 if quick else 4,
        "loop_subset": 10 if quick else 100,
        "features": "100" if quick else "2,10,100,1000", "nce": "1000" if quick else "1000,5000,20000",
        "hidden": "32" if quick else "32,256,1024",
        "reference_epochs": 3 if quick else 4, "reference_repeats": 1 if quick else 2,
    }
    args.given = {key for key in defaults if getattr(args, key) is not None}  # set on the command line
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.epochs < 2 or args.reference_epochs < 2:
        parser.error("--epochs, --reference-epochs: at least 2 (the first epoch is a warm-up and is not measured)")
    args.data = [d.strip() for d in args.data.split(",") if d.strip()]
    args.pool_sizes = [int(v) for v in args.pool_sizes.split(",") if v.strip()]
    args.features = [int(v) for v in args.features.split(",") if v.strip()]
    args.nce = [int(v) for v in args.nce.split(",") if v.strip()]
    args.hidden = [int(v) for v in args.hidden.split(",") if v.strip()]
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if args.device not in ("auto", "cpu", "cuda"):
        parser.error(f"--device: unknown {args.device!r}; allowed: auto, cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device: 'cuda' given but no CUDA device is available; allowed here: auto, cpu")
    if args.accelerator not in ("auto", "cpu", "gpu", "cuda"):
        parser.error(f"--accelerator: unknown {args.accelerator!r}; allowed: auto, cpu, gpu, cuda")
    if args.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        parser.error(f"--accelerator: {args.accelerator!r} given but no CUDA device is available; allowed here: "
                     "auto, cpu")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; allowed: {', '.join(SECTIONS)}")
    return args


def log(message: str) -> None:
    print(message, flush=True)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.child:
        from bench.epoch_bench import child_main

        print(json.dumps([child_main(spec) for spec in json.loads(args.child)]), flush=True)
        return {}
    setup_environment()
    if args.accelerator in ("gpu", "cuda"):
        return accelerator_main(args, argv)
    from bench.epoch_bench import quiet, run_children, run_overhead_section
    from bench.search_bench import run_search_section

    quiet()
    started = time.perf_counter()
    device = pick_device(args.device)
    results = {"machine": machine_info(device), "settings": {
        k: getattr(args, k) for k in ("data", "pool_sizes", "repeats", "fit_repeats", "epochs", "loop_subset",
                                      "features", "nce", "hidden", "sections", "threads", "quick", "accelerator",
                                      "gc_freeze", "baseline_search", "reference_epochs", "reference_repeats",
                                      "reference_cnn")},
        "reference": {}, "search": {}, "overhead": {}, "memory": [], "scaling": [], "skipped": {}}
    log(f"bench: {results['machine']['cpu']}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"load {results['machine']['load_average_start']}")

    datamodules = {}
    for name in args.data:
        try:
            datamodules[name] = load_datamodule(name)
        except (LookupError, FileNotFoundError, OSError, RuntimeError) as error:
            message = f"skipped: {error}"
            results["skipped"][name] = message
            log(f"[{name}] {message}")

    if args.gc_freeze:
        import gc

        gc.collect()
        gc.freeze()
    if "reference" in args.sections:
        from bench.reference_bench import run_reference_section

        accelerator = "gpu" if device.type == "cuda" and args.accelerator == "auto" else args.accelerator
        runs = [(name, "mlp") for name in datamodules] + \
            ([("mnist", "cnn")] if args.reference_cnn and "mnist" in datamodules else [])
        for name, architecture in runs:
            label = name if architecture == "mlp" else f"{name}-{architecture}"
            log(f"[reference] {label}: plain loop vs train() vanilla vs full, "
                f"{args.reference_repeats}×{args.reference_epochs} epochs each")
            results["reference"][label] = run_reference_section(
                name, datamodules[name], args.reference_epochs, args.reference_repeats, accelerator,
                architecture, log=log)

    if "search" in args.sections:
        for name, datamodule in datamodules.items():
            log(f"[search] {name}: training the paper's MLP briefly (3 epochs, vanilla)")
            model, accuracy = train_vanilla(datamodule, device=device)
            section = run_search_section(datamodule, model, args.pool_sizes, args.repeats, args.loop_subset,
                                         device, anatomy_pool=1000 if 1000 in args.pool_sizes else
                                         max(args.pool_sizes), log=log)
            section.update({"train_accuracy": accuracy, "n_features": datamodule.n_features,
                            "n_classes": datamodule.n_classes, "n_train": len(datamodule.y_train)})
            results["search"][name] = section
            if args.baseline_search:
                from bench.search_bench import load_search_module, run_ab

                results["settings"]["baseline_note"] = baseline_note(args.baseline_search)

                baseline = load_search_module(args.baseline_search)
                results.setdefault("ab", {})[name] = run_ab(datamodule, model, baseline, 1000, args.repeats,
                                                            device, log=log)
            if "threads_check" not in results and device.type == "cpu" and not args.quick:
                results["threads_check"] = threads_check(name, datamodule, model, device, args.repeats, log)

    if "search" in args.sections and "mnist" in datamodules and not args.quick:
        # The same measurement with a heavier model: LeNet (ct_lightning.models), briefly trained; a small
        # pool, since one LeNet pass over 1 000 images takes ~0.5 s on one core.
        log("[search] mnist with the LeNet CNN (1 epoch, vanilla): pool 100")
        datamodule = datamodules["mnist"]
        model, accuracy = train_vanilla(datamodule, epochs=1, device=device, architecture="cnn")
        section = run_search_section(datamodule, model, [100], 3, 10, device, anatomy_pool=None, log=log)
        section.update({"train_accuracy": accuracy, "n_features": datamodule.n_features,
                        "n_classes": datamodule.n_classes, "n_train": len(datamodule.y_train), "model": "cnn"})
        results["search_extra"] = {"mnist (LeNet CNN)": section}

    if "compile" in args.sections:
        from bench.compile_bench import measure, search_end_to_end

        shapes = [name for name in ("circles", "adult", "mnist") if name in args.data]
        log(f"[compile] torch.compile against eager for the search step's two parts: {', '.join(shapes)}")
        results["compile"] = [measure(name, device) for name in shapes]
        results["compile_search"] = [row for name in shapes for row in search_end_to_end(name, device)]

    if "overhead" in args.sections:
        for name, datamodule in datamodules.items():
            log(f"[overhead] {name}: vanilla vs full, {args.fit_repeats}×{args.epochs} epochs each")
            results["overhead"][name] = run_overhead_section(datamodule, args.epochs, args.fit_repeats,
                                                             args.accelerator, log=log,
                                                             separate_profile=not args.quick)
            results["overhead"][name]["n_train"] = len(datamodule.y_train)

    if "scaling" in args.sections and "mnist" in datamodules and not args.quick:
        from bench.reference_bench import protocol_time

        try:
            results["protocol"] = protocol_time("mnist", datamodules["mnist"], device, log=log)
        except Exception as error:  # noqa: BLE001 - a failure here must not lose the other sections
            results["protocol"] = None
            log(f"[protocol] failed: {type(error).__name__}: {error}")

    child_epochs = max(2, min(args.epochs, 3))
    common = {"threads": torch.get_num_threads(), "accelerator": args.accelerator, "epochs": child_epochs,
              "gc_freeze": args.gc_freeze}
    specs = []
    if "memory" in args.sections:
        objectives = ("full",) if args.quick else ("vanilla", "full")
        specs += [("memory", {**common, "data": name, "objective": objective})
                  for name in datamodules for objective in objectives]
    if "scaling" in args.sections:
        grid = [(d, 1000, 32) for d in args.features] + [(100, n, 32) for n in args.nce if n != 1000] + \
            [(100, 1000, h) for h in args.hidden if h != 32]
        specs += [("scaling", {**common, "data": None, "features": features, "nce": nce, "hidden": hidden,
                               "objective": "full"}) for features, nce, hidden in grid]
    # One fresh process per configuration; --quick runs them all in one process to save start-up time.
    batches = [specs] if args.quick and specs else [[item] for item in specs]
    for batch in batches:
        for (section, _), entry in zip(batch, run_children([spec for _, spec in batch])):
            results[section].append(entry)
            if entry.get("error"):
                log(f"[{section}] {entry.get('data') or entry.get('features')}: {entry['error']}")
            elif section == "memory":
                log(f"[memory] {entry['data']} {entry['objective']}: peak RSS during fit {entry['peak_fit_mib']:.0f} MiB "
                    f"(after setup {entry['rss_setup_mib']:.0f} MiB), epoch {entry['epoch_s']:.2f} s")
            else:
                log(f"[scaling] {entry['features']} features, nce {entry['nce']}: epoch {entry['epoch_s']:.2f} s "
                    f"(search {entry['search_s']:.2f} s), peak RSS {entry['peak_fit_mib']:.0f} MiB")

    results["machine"]["load_average_end"] = load_average()
    results["elapsed_s"] = time.perf_counter() - started
    log(f"bench: done in {results['elapsed_s']:.0f} s, load {results['machine']['load_average_end']}")
    if args.json:
        path = Path(args.json)
        path = path if path.is_absolute() else REPO / path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
        log(f"bench: wrote {path}")
    if args.out:
        from bench.report import render

        path = Path(args.out)
        path = path if path.is_absolute() else REPO / path
        path.parent.mkdir(parents=True, exist_ok=True)
        from bench.gpu_section import keep_section

        text = render(results, argv if argv is not None else sys.argv[1:])
        path.write_text(keep_section(path.read_text() if path.exists() else "", text))  # the accelerator's stays
        log(f"bench: wrote {path}")
    return results


def accelerator_main(args, argv) -> dict:
    """``--accelerator gpu``: every data set (``--data`` to choose; ``--quick``: circles, adult, mnist), vanilla and
    CT, compile on/off, TF32 on/off, ``--epochs`` epochs each (default 5); writes the report's accelerator section."""
    import shlex

    from bench.epoch_bench import quiet
    from bench.gpu_section import render_section, run_accelerator_section, splice
    from datamodules import available

    quiet()
    started = time.perf_counter()
    names = args.data if "data" in args.given else (["circles", "adult", "mnist"] if args.quick else available())
    epochs = args.epochs if "epochs" in args.given else (3 if args.quick else 5)
    results = {"machine": machine_info(pick_device("cuda")), "epochs": epochs, "skipped": {}}
    datamodules = {}
    for name in names:
        try:
            datamodules[name] = load_datamodule(name)
        except (LookupError, FileNotFoundError, OSError, RuntimeError) as error:
            results["skipped"][name] = f"skipped: {error}"
            log(f"[{name}] skipped: {error}")
    results["accelerator"] = run_accelerator_section(datamodules, epochs, "gpu", log=log)
    results["elapsed_s"] = time.perf_counter() - started
    log(f"bench: accelerator section done in {results['elapsed_s']:.0f} s")
    json_path = args.json if args.json != "bench/results.json" else "bench/gpu_results.json"
    if json_path:
        path = Path(json_path) if Path(json_path).is_absolute() else REPO / json_path
        path.write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
        log(f"bench: wrote {path}")
    if args.out:
        path = Path(args.out) if Path(args.out).is_absolute() else REPO / args.out
        given = argv if argv is not None else sys.argv[1:]
        command = "python bench/run.py " + " ".join(shlex.quote(a) for a in given)
        path.write_text(splice(path.read_text() if path.exists() else "", render_section(results, command)))
        log(f"bench: wrote {path}")
    return results


def baseline_note(path: str) -> str:
    """Which committed version ``path`` is, if it equals ct_lightning/search.py at git HEAD."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        committed = subprocess.run(["git", "show", "HEAD:ct_lightning/search.py"], cwd=REPO, capture_output=True,
                                   text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    if Path(path).read_text() == committed:
        return f"identical to `ct_lightning/search.py` at commit {head} (before the changes below)"
    return f"not the version at commit {head}"


def threads_check(name, datamodule, model, device, repeats: int, log) -> dict:
    """Batched search (pool 1000, fixed T) with 1 thread and with one thread per logical CPU."""
    import os

    from bench.common import Clock, median
    from bench.search_bench import EPSILON, MAX_STEPS, draw_pool
    from ct_lightning.generators import make_generator
    from ct_lightning.generators.search import search_counterfactuals

    before = torch.get_num_threads()
    x, target = draw_pool(datamodule, model, 1000, seed=1000, device=device)
    lower, upper = datamodule.domain(3.0)
    generator = make_generator("ecco")
    out = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        times = []
        for _ in range(repeats + 1):
            clock = Clock()
            search_counterfactuals(model, x, target, generator, tau=1.0, max_steps=MAX_STEPS, epsilon=EPSILON,
                                   lower=lower, upper=upper)
            times.append(clock.read()[0])
        out[str(threads)] = median(times[1:])
    torch.set_num_threads(before)
    log("[threads] search pool 1000 fixed-T: " + ", ".join(f"{k} thread(s) {v * 1e3:.1f} ms" for k, v in out.items()))
    return {"data": name, "pool": 1000, "repeats": repeats, "search_s": out}


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)


if __name__ == "__main__":
    main()
