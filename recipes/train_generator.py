"""Train a conditional counterfactual generator (Van Looveren et al.) for a trained classifier.

The classifier comes from an MLflow run of recipes/train.py (its checkpoints/last.ckpt artifact)
or a checkpoint file. The generator G(x, y_M, y_T, z) is trained against the frozen classifier on
the training split (MMD or conditional-GAN in-distribution loss), then evaluated on the test split
like the paper: MMD² overall and per class, ℓ1, ℓ0 (one-hot groups count as one feature) and
validity, side by side with a gradient search (ECCo by default) on the same factuals and targets.
Everything is logged to a new MLflow run tagged with the classifier's run id.

Examples:
  .venv/bin/python recipes/train_generator.py --data moons --run-id 1a6d42...
  .venv/bin/python recipes/train_generator.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --variant gan
  .venv/bin/python recipes/train_generator.py --run-id 1a6d42... --max-epochs 50 --summary-json gen.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ct_lightning.experiment import catalogue
from ct_lightning.experiment.preflight import apply_threads, threads_for
from ct_lightning.experiment.settings import ACCELERATORS, add_arguments, datasets_and_aliases
from ct_lightning.experiment.tracking import (DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI, anchor_tracking_uri,
                                              check_tracking_reachable, store_location, write_json_atomic)
from ct_lightning.experiment.tracking_server import run_links
from ct_lightning.experiment.validation import (KNOWN_ERRORS, InputError, Parser, Rule, check_accelerator,
                                                check_checkpoint_file, check_model_fits, check_output_file,
                                                check_run_ids, console_entry, exit_on_error)

VARIANTS = catalogue.constant("ct_lightning.generators.amortised.training", "VARIANTS")


def _int(low: int):
    return Rule("int", low=low).argtype()


def _float(low: float, low_open: bool = False):
    return Rule("float", low=low, low_open=low_open).argtype()


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/train_generator.py``."""
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_argument_group("classifier (one of)")
    source.add_argument("--run-id", help="MLflow run of recipes/train.py")
    source.add_argument("--checkpoint", help="a checkpoint file (config.json beside it, else pass --data)")
    parser.add_argument("--data", type=Rule(choices=datasets_and_aliases, lower=True).argtype(), help="data set (default: the classifier's)")
    parser.add_argument("--which", choices=("last", "best"), default="last", help="checkpoint of the run (default %(default)s)")
    parser.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default %(default)s)")
    parser.add_argument("--run-name", help="MLflow run name (default: generator-VARIANT)")
    gen = parser.add_argument_group("generator")
    gen.add_argument("--variant", choices=VARIANTS, default="mmd", help="in-distribution loss (default %(default)s)")
    gen.add_argument("--max-epochs", type=_int(1), default=30, help="training epochs (default %(default)s)")
    gen.add_argument("--batch-size", type=_int(1), default=256, help="batch size (default %(default)s)")
    gen.add_argument("--hidden-sizes", type=Rule("ints", low=1).argtype(), default=[64, 64], help="hidden layers of G and D (default 64,64)")
    gen.add_argument("--noise-dim", type=_int(0), default=4, help="size of the injected noise z (default %(default)s)")
    gen.add_argument("--w-m", type=_float(0.0), default=1.0, help="weight of the prediction loss (default %(default)s)")
    gen.add_argument("--w-l1", type=_float(0.0), default=0.1, help="weight of the ℓ1 sparsity loss (default %(default)s)")
    gen.add_argument("--w-chi", type=_float(0.0), default=1.0, help="weight of the MMD / GAN loss (default %(default)s)")
    gen.add_argument("--lr", type=_float(0.0, True), default=1e-3, help="Adam learning rate of G and D (default %(default)s)")
    gen.add_argument("--seed", type=_int(0), default=0, help="seed (default %(default)s)")
    gen.add_argument("--protect", action="store_true", help="make the data set's protected features immutable")
    gen.add_argument("--all-mutable", action="store_true", help="ignore the classifier's training constraints")
    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--n-eval", type=_int(1), default=1000, help="test factuals evaluated (default %(default)s)")
    ev.add_argument("--baseline", default="ecco", type=Rule(choices=lambda: [*catalogue.generators(), "none"], lower=True).argtype(), help="gradient search compared on the same factuals, or 'none' (default %(default)s)")
    ev.add_argument("--summary-json", help="write the run id, settings and metrics here")
    ev.add_argument("--accelerator", default="cpu", type=Rule(choices=ACCELERATORS).argtype(), help="Lightning accelerator (default %(default)s)")
    ev.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    add_arguments(parser, ["threads"])
    return parser


def load_classifier(args):
    """The classifier (``LoadedModel``) named by ``--run-id`` or ``--checkpoint``."""
    from ct_lightning.experiment.runs import load_checkpoint_with_config, load_run  # noqa: PLC0415 - heavy

    if bool(args.run_id) == bool(args.checkpoint):
        raise ValueError("give exactly one of --run-id and --checkpoint")
    if args.run_id:
        loaded = load_run(args.run_id, args.tracking_uri, args.which)
        if args.data:
            loaded.config["data"] = args.data
        return loaded
    return load_checkpoint_with_config(args.checkpoint, args.data)


def evaluate(net: CounterfactualNetworkModule, classifier, datamodule, constraints, args) -> dict:
    """Generator and baseline metrics on up to ``--n-eval`` test factuals with random targets."""
    import torch  # noqa: PLC0415 - heavy

    from ct_lightning.constraints import Constraints  # noqa: PLC0415
    from ct_lightning.generators import make_generator, search_counterfactuals  # noqa: PLC0415
    from ct_lightning.generators.amortised import one_hot_groups  # noqa: PLC0415
    from ct_lightning.metrics.quality import counterfactual_quality  # noqa: PLC0415
    from ct_lightning.training.pool import random_targets  # noqa: PLC0415

    rng = torch.Generator().manual_seed(args.seed + 1)
    x = datamodule.x_test[torch.randperm(len(datamodule.x_test), generator=rng)[:args.n_eval]]
    with torch.no_grad():
        y_model = classifier(x).argmax(1)
    y_target = random_targets(y_model, datamodule.n_classes, rng)
    groups = one_hot_groups(datamodule.feature_names)
    started = time.perf_counter()
    types = getattr(constraints, "feature_types", None)  # both sides give real categories and integers
    x_cf = Constraints(constraints.mutability, constraints.lower, constraints.upper, types=types).snap(
        net.generate(x, y_target, y_model), x)
    seconds = time.perf_counter() - started
    results = {"generator": {**counterfactual_quality(classifier, x, x_cf, y_target, groups, datamodule.n_classes),
                             "seconds": seconds}}
    if args.baseline.lower() != "none":
        search = make_generator(args.baseline)
        started = time.perf_counter()
        found = search_counterfactuals(classifier, x, y_target, search, tau=0.95, max_steps=50, epsilon=0.0,
                                       mutability=constraints.mutability, lower=constraints.lower,
                                       upper=constraints.upper, feature_types=types)
        seconds = time.perf_counter() - started
        results[args.baseline] = {**counterfactual_quality(classifier, x, found.counterfactual, y_target, groups,
                                                           datamodule.n_classes), "seconds": seconds}
    return results


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, train and evaluate the generator, log everything to MLflow."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.tracking_uri = anchor_tracking_uri(args.tracking_uri)
    try:
        if bool(args.run_id) == bool(args.checkpoint):
            raise InputError("--run-id/--checkpoint", args.run_id or args.checkpoint, "exactly one of the two")
        check_tracking_reachable(args.tracking_uri)
        check_output_file("--summary-json", args.summary_json)
        check_accelerator("--accelerator", args.accelerator)
        if args.checkpoint:
            check_checkpoint_file("--checkpoint", args.checkpoint)
        else:
            check_run_ids("--run-id", [args.run_id], args.tracking_uri)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    print(f"MLflow store: {store_location(args.tracking_uri)}", flush=True)
    print(apply_threads(threads_for(args.threads, accelerator=args.accelerator)), flush=True)
    import lightning as L  # noqa: PLC0415 - heavy: only after the checks
    import torch  # noqa: PLC0415
    from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: PLC0415
    from lightning.pytorch.loggers import MLFlowLogger  # noqa: PLC0415
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415

    from ct_lightning.evaluation import evaluation_constraints  # noqa: PLC0415
    from ct_lightning.experiment.data import build_datamodule  # noqa: PLC0415
    from ct_lightning.experiment.tracking import prepare_store  # noqa: PLC0415
    from ct_lightning.generators.amortised import CounterfactualNetworkModule, one_hot_groups  # noqa: PLC0415

    try:
        loaded = load_classifier(args)
        datamodule = build_datamodule(loaded.config)
        check_model_fits("--checkpoint" if args.checkpoint else "--run-id", args.checkpoint or args.run_id,
                         loaded.module, datamodule)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)
    classifier = loaded.module.model.eval()
    constraints = evaluation_constraints(loaded.module, datamodule, args.protect, args.all_mutable)
    L.seed_everything(args.seed, verbose=False)
    net = CounterfactualNetworkModule(datamodule.n_features, datamodule.n_classes, classifier, variant=args.variant,
                          hidden_sizes=args.hidden_sizes, d_hidden_sizes=args.hidden_sizes, noise_dim=args.noise_dim,
                          groups=one_hot_groups(datamodule.feature_names), w_m=args.w_m, w_l1=args.w_l1,
                          w_chi=args.w_chi, lr=args.lr, lr_d=args.lr, mutability=constraints.mutability,
                          lower=constraints.lower, upper=constraints.upper)
    tags = {"generator": args.variant, "data": datamodule.name}
    if loaded.run_id:
        tags["classifier_run_id"] = loaded.run_id
    logger = MLFlowLogger(experiment_name=args.experiment, run_name=args.run_name or f"generator-{args.variant}",
                          tracking_uri=args.tracking_uri, artifact_location=prepare_store(args.tracking_uri, args.experiment),
                          tags=tags)
    logger.log_hyperparams({**{k: v for k, v in vars(args).items() if k not in ("summary_json",)},
                            "classifier_checkpoint": loaded.checkpoint})
    workdir = Path(tempfile.mkdtemp(prefix="ct-generator-"))
    checkpoint = ModelCheckpoint(dirpath=workdir, filename="generator", save_top_k=0, save_last=True)
    train_loader = DataLoader(TensorDataset(datamodule.x_train), batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    val_loader = DataLoader(TensorDataset(datamodule.x_val), batch_size=4096)
    trainer = L.Trainer(max_epochs=args.max_epochs, accelerator=args.accelerator, devices=1, logger=logger,
                        callbacks=[checkpoint], enable_progress_bar=args.progress, enable_model_summary=args.progress,
                        log_every_n_steps=1)
    started = time.perf_counter()
    trainer.fit(net, train_loader, val_loader)
    fit_seconds = time.perf_counter() - started
    net = net.cpu().eval()
    results = evaluate(net, classifier, datamodule, constraints, args)
    client, run_id = logger.experiment, logger.run_id
    client.log_metric(run_id, "fit_seconds", fit_seconds)
    for method, metrics in results.items():
        prefix = "eval" if method == "generator" else f"eval_{method}"
        for key, value in metrics.items():
            if value == value:  # skip NaN
                client.log_metric(run_id, f"{prefix}/{key}", float(value))
    if checkpoint.last_model_path:
        client.log_artifact(run_id, checkpoint.last_model_path, artifact_path="checkpoints")
    summary = {"run_id": run_id, "experiment_id": logger.experiment_id, "tracking_uri": args.tracking_uri,
               "classifier_run_id": loaded.run_id, "classifier_checkpoint": loaded.checkpoint,
               "data": datamodule.name, "variant": args.variant, "fit_seconds": fit_seconds,
               "settings": {k: v for k, v in vars(args).items() if k != "summary_json"}, "metrics": results}
    summary_path = workdir / "generator_summary.json"
    write_json_atomic(summary_path, summary)
    client.log_artifact(run_id, str(summary_path))
    if args.summary_json:
        write_json_atomic(args.summary_json, summary)
    gen = results["generator"]
    print(f"generator ({args.variant}): validity {gen['validity']:.3f}, MMD² {gen['mmd2']:.4f}, "
          f"per-class mean {gen['mmd2_class_mean']:.4f}, ℓ1 {gen['l1']:.3f}, ℓ0 {gen['l0']:.2f}")
    print("\n".join([f"MLflow run id: {run_id}", *run_links(args.tracking_uri, logger.experiment_id, run_id)]))
    return summary


cli = console_entry(main)  # the console script ct-train-generator

if __name__ == "__main__":
    sys.exit(cli())
