"""``recipes/train_generator.py``: train a conditional counterfactual generator against a trained classifier,
evaluate it beside a gradient search on the same test factuals, and log both to one new MLflow run."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ct_lightning.experiment.runs.atomic_files import write_json_atomic
from ct_lightning.experiment.runner import checking, open_store, start
from ct_lightning.experiment.configuration.store import check_tracking_reachable
from ct_lightning.experiment.runs.tracking_server import run_links
from ct_lightning.experiment.configuration.validation import (InputError, check_accelerator, check_checkpoint_file,
                                                check_model_fits, check_output_file, check_run_ids)


def load_classifier(args: argparse.Namespace):
    """The classifier (``LoadedModel``) named by ``--run-id`` or ``--checkpoint``."""
    from ct_lightning.experiment.runs.loading import load_checkpoint_with_config, load_run  # noqa: PLC0415 - heavy

    if bool(args.run_id) == bool(args.checkpoint):
        raise ValueError("give exactly one of --run-id and --checkpoint")
    if args.run_id:
        loaded = load_run(args.run_id, args.tracking_uri, args.which)
        if args.data:
            loaded.config["data"] = args.data
        return loaded
    return load_checkpoint_with_config(args.checkpoint, args.data)


def evaluate(net, classifier, datamodule, constraints, args: argparse.Namespace) -> dict:
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


def check_inputs(args: argparse.Namespace) -> None:
    """Every check before any work: one classifier source, the store, the output file, the device."""
    if bool(args.run_id) == bool(args.checkpoint):
        raise InputError("--run-id/--checkpoint", args.run_id or args.checkpoint, "exactly one of the two")
    check_tracking_reachable(args.tracking_uri)
    check_output_file("--summary-json", args.summary_json, args.overwrite)
    check_accelerator("--accelerator", args.accelerator)
    if args.checkpoint:
        check_checkpoint_file("--checkpoint", args.checkpoint)
    else:  # models:/NAME/VERSION, as train.py prints it, is the run that logged that version
        from ct_lightning.experiment.runs.registry import run_of_reference  # noqa: PLC0415

        args.run_id = run_of_reference("--run-id", args.run_id, args.tracking_uri)
        check_run_ids("--run-id", [args.run_id], args.tracking_uri)


def run(args: argparse.Namespace) -> dict:
    """Check the inputs, train and evaluate the generator, log everything to MLflow; returns the summary."""
    with checking():
        check_inputs(args)
    start(args)
    import lightning as L  # noqa: PLC0415 - heavy: only after the checks
    import torch  # noqa: PLC0415
    from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: PLC0415
    from lightning.pytorch.loggers import MLFlowLogger  # noqa: PLC0415
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415

    from ct_lightning.evaluation import evaluation_constraints  # noqa: PLC0415
    from ct_lightning.experiment.configuration.data import model_datamodule  # noqa: PLC0415
    from ct_lightning.generators.amortised import CounterfactualNetworkModule, one_hot_groups  # noqa: PLC0415

    with checking():
        loaded = load_classifier(args)
        datamodule = model_datamodule(loaded.config, loaded.module)
        check_model_fits("--checkpoint" if args.checkpoint else "--run-id", args.checkpoint or args.run_id,
                         loaded.module, datamodule)
    classifier = loaded.module.model.eval()
    constraints = evaluation_constraints(loaded.module, datamodule, args.protect, args.all_mutable)
    L.seed_everything(args.seed, verbose=False)
    net = CounterfactualNetworkModule(datamodule.n_features, datamodule.n_classes, classifier, variant=args.variant,
                                      hidden_sizes=args.hidden_sizes, d_hidden_sizes=args.hidden_sizes,
                                      noise_dim=args.noise_dim, groups=one_hot_groups(datamodule.feature_names),
                                      w_m=args.w_m, w_l1=args.w_l1, w_chi=args.w_chi, lr=args.lr, lr_d=args.lr,
                                      mutability=constraints.mutability, lower=constraints.lower,
                                      upper=constraints.upper)
    tags = {"generator": args.variant, "data": datamodule.name}
    if loaded.run_id:
        tags["classifier_run_id"] = loaded.run_id
    _, _, artifact_location = open_store(args.tracking_uri, args.experiment)
    logger = MLFlowLogger(experiment_name=args.experiment, run_name=args.run_name or f"generator-{args.variant}",
                          tracking_uri=args.tracking_uri, artifact_location=artifact_location, tags=tags)
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
