"""``recipes/evaluate.py``: evaluate one trained model with the paper's protocol (SPEC §3), log the results and
plots to its MLflow run and write the JSON summary."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.runs.atomic_files import write_json_atomic, write_json_new
from ct_lightning.experiment.runs.registry import run_of_reference
from ct_lightning.experiment.runs.tracking_server import is_permission_denied, run_write_refused, write_refused_now
from ct_lightning.experiment.configuration.protocol_options import protocol_config
from ct_lightning.experiment.runner import checking, start
from ct_lightning.experiment.configuration.settings import DEFAULTS, SETTINGS_BY_NAME, TABLE_KEYS, is_table_file
from ct_lightning.experiment.configuration.validation import (InputError, check_accelerator, check_checkpoint_file, check_model_fits,
                                                check_output_file, check_run_ids, check_writable_folder)

GIVEN = (*TABLE_KEYS, "model", "hidden_sizes", "activation", "model_inputs")  # how to read a table or a model


def check_inputs(args: argparse.Namespace) -> None:
    """Every check that needs no model: output paths, the checkpoint file or the run id in its store."""
    check_accelerator("--accelerator", args.accelerator)
    if args.data:
        SETTINGS_BY_NAME["data"].checked(args.data, "--data")  # a table file must exist
    overwrite = bool(getattr(args, "overwrite", False))
    check_output_file("--summary-json", args.summary_json, overwrite)
    if args.out_dir:
        check_writable_folder("--out-dir", args.out_dir)
        check_no_earlier_evaluation(args.out_dir, overwrite)
    if args.checkpoint:
        check_checkpoint_file("--checkpoint", args.checkpoint)
    else:  # models:/NAME/VERSION, as train.py prints it, is the run that logged that version
        args.run_id = run_of_reference("--run-id", args.run_id, args.tracking_uri)
        check_run_ids("--run-id", [args.run_id], args.tracking_uri)


SUMMARY_FILE = "summary.json"  # in --out-dir, where the run does not take the results (a teammate's, READ only)


def check_no_earlier_evaluation(out_dir: str, overwrite: bool) -> None:
    """An ``--out-dir`` that holds an earlier evaluation's results (its ``summary.json``, kept there where the run
    could not take it, or its plots, ``*.png``) is refused in one line before any work, unless ``overwrite``: an
    evaluation never replaces another's results."""
    folder = Path(out_dir)
    found = sorted(p.name for p in folder.glob("*") if p.name == SUMMARY_FILE or p.suffix == ".png") \
        if folder.is_dir() and not overwrite else []
    if found:
        shown = ", ".join(found[:3]) + (f", ... ({len(found)} files)" if len(found) > 3 else "")
        raise InputError("--out-dir", out_dir, "a folder without an earlier evaluation's results (another --out-dir), "
                         "or --overwrite to replace them", f"it holds {shown} of an earlier evaluation")


def load(args: argparse.Namespace):
    """The model (``LoadedModel``), its data module, protocol and constraints; a refused input raises."""
    from ct_lightning.evaluation import evaluation_constraints  # noqa: PLC0415 - heavy
    from ct_lightning.experiment.configuration.data import model_datamodule  # noqa: PLC0415
    from ct_lightning.experiment.runs.kept_preprocessing import is_other_table  # noqa: PLC0415
    from ct_lightning.experiment.runs.loading import (check_run_data, load_any_checkpoint, load_logged_model,  # noqa: PLC0415
                                                      load_run, model_uri_run)
    from datamodules.workbook import table_file  # noqa: PLC0415

    given = {key: getattr(args, key) for key in GIVEN}
    logged = None if args.run_id else model_uri_run(args.checkpoint, args.tracking_uri)
    if args.run_id or logged:  # runs:/ID/model of a run of train.py: with that run's settings, as --run-id
        loaded = load_run(args.run_id, args.tracking_uri, args.which, weights_only=not args.unsafe_load) \
            if args.run_id else load_logged_model(logged, args.tracking_uri)
        if args.data:
            loaded.extra["trained_data"] = loaded.config.get("data")
            loaded.config["data"] = args.data
        else:
            check_run_data(loaded, "--run-id" if args.run_id else "--checkpoint")
        loaded.config.update({k: given[k] for k in TABLE_KEYS if given[k] is not None})
    else:
        loaded = load_any_checkpoint(args.checkpoint, args.data, given, args.tracking_uri,
                                     weights_only=not args.unsafe_load)
    if is_table_file(loaded.config.get("data")) and not loaded.config.get("target"):
        raise InputError("--target", None, "the column to predict in the table " + str(loaded.config["data"]))
    codec = getattr(loaded.module, "preprocessing", None) if is_table_file(loaded.config.get("data")) else None
    datamodule = loaded.extra.get("datamodule") or model_datamodule(loaded.config, loaded.module)
    if codec is not None:
        print(f"encoding {loaded.config['data']} with the model's own preprocessing (ct_preprocessing of the "
              f"checkpoint: {len(datamodule.feature_names)} inputs)", flush=True)
        for note in getattr(datamodule, "read_notes", []):  # rows without a label left out, columns not read, ...
            print(f"note: {note}", flush=True)
    trained = loaded.extra.get("trained_data")
    other = is_other_table(trained, args.data, datamodule, loaded.run_id, args.tracking_uri)
    loaded.extra["other_table"] = other and Path(table_file(trained)).name
    check_model_fits("--checkpoint" if args.checkpoint else "--run-id", args.checkpoint or args.run_id,
                     loaded.module, datamodule)
    known = catalogue.canonical_dataset(datamodule.name) is not None  # else a table file or package.module:Class
    config = protocol_config(args, datamodule.name if known else loaded.config["data"], cost_pair=args.protect)
    constraints = evaluation_constraints(loaded.module, datamodule, args.protect, args.all_mutable)
    return loaded, datamodule, config, constraints


def metric_label(key: str, config) -> str:
    """A summary key as printed: ``converged`` with the tau it counts (the protocol's, 0.95 by default: a
    counterfactual can be valid, the target predicted, without reaching it)."""
    return f"converged (p >= tau {config.tau:g})" if key == "converged" else key


def metrics_meaning(config) -> str:
    """One line saying what the printed metrics measure and which way is better (SPEC §3): numbers such as
    ``ip: 3.97`` say nothing to someone who has not read the paper."""
    return ("what they mean: ip, the mean distance of the valid counterfactuals to real test rows of their target "
            "class, and ip_star, the MMD² between the two sets: lower, more plausible; cost, the ℓ1 distance from the "
            "factual in the model's encoding: lower, smaller changes; validity, the share the model predicts as their "
            f"target; converged, the share reaching p >= tau {config.tau:g}; robust_accuracy, the accuracy on test rows "
            f"perturbed by {config.attack.upper()} at ε {config.robust_epsilon:g} (docs/evaluation.md)")


def order_note(datamodule) -> str | None:
    """The note under an ordered target's metrics: they count a counterfactual valid at its exact target only (the
    paper's protocol), where explain.py counts "at least"; ``None`` for an unordered target."""
    from ct_lightning.evaluation.explanation import class_text  # noqa: PLC0415 - torch, loaded by then

    codec = getattr(datamodule, "codec", None)
    order = getattr(codec, "order", None)
    if not order:
        return None
    return (f"note: {codec.target!r} is ordered ({' < '.join(class_text(codec, c) for c in order)}), but these "
            "metrics count a counterfactual valid only at its exact target, as the paper's protocol does; explain.py "
            "counts a class at or above the target as valid")


EVALUATED_TAG = "ct.evaluated_with"  # on a run that evaluate.py logged eval/* metrics to


def split_rows(datamodule, split: str):
    """``(x, y)`` of the factuals: the ``test`` or ``val`` split, or ``all`` the labelled rows (another table than the
    model's own: none of them trained it)."""
    import torch  # noqa: PLC0415

    if split == "all":
        parts = [(getattr(datamodule, f"x_{s}"), getattr(datamodule, f"y_{s}")) for s in ("train", "val", "test")]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])
    return (datamodule.x_test, datamodule.y_test) if split == "test" else (datamodule.x_val, datamodule.y_val)


def metric_prefix(datamodule) -> str:
    """The prefix of the metrics of an evaluation on another table than the model's own: ``eval/november`` (the
    table's name), so that the run's own ``eval/*`` stay its training table's."""
    return f"eval/{datamodule.name}"


def run(args: argparse.Namespace) -> dict:
    """Load, evaluate, log to the run, plot, and write the JSON summary; returns it."""
    if args.seed is not None:
        args.eval_seed = args.seed
    with checking():
        check_inputs(args)
        refused = run_write_refused(args.tracking_uri, args.run_id) if args.run_id and args.log else None
    start(args, store=False)
    from ct_lightning.evaluation import evaluate_model  # noqa: PLC0415 - heavy
    from ct_lightning.evaluation.plots import evaluation_figures, metric_history  # noqa: PLC0415
    from ct_lightning.experiment.configuration.preflight import evaluation_device  # noqa: PLC0415
    from ct_lightning.experiment.runs.loading import log_evaluation  # noqa: PLC0415
    from datamodules.workbook import split_sheet  # noqa: PLC0415
    from ct_lightning.generators.compiled_step import set_search_compile  # noqa: PLC0415

    set_search_compile(args.search_compile or DEFAULTS["search_compile"])
    with checking():
        loaded, datamodule, config, constraints = load(args)
    loaded.module.to(evaluation_device(args.accelerator))  # the data follow the model's device
    other = loaded.extra.get("other_table")  # next month's file: none of its rows trained the model
    split = args.split or ("all" if other else "test")
    x, y = split_rows(datamodule, split)
    table = Path(split_sheet(str(loaded.config["data"]))[0]).name
    if other:
        print(f"{table} is not the table the model was trained on ({other}): "
              f"{len(y)} labelled rows evaluated ({'every one' if split == 'all' else f'its {split} split'}; "
              "--split test takes the rows that a fine-tuning on it holds out, to compare with that model), logged "
              f"as {metric_prefix(datamodule)}/*, not over the run's own eval/*", flush=True)
    result = evaluate_model(loaded.module, x, y, datamodule.n_classes, config, constraints.mutability,
                            constraints.lower, constraints.upper, x_train=datamodule.x_train,
                            feature_names=list(datamodule.feature_names), y_train=datamodule.y_train,
                            data_name=datamodule.name, feature_types=constraints.feature_types)
    summary = result.summary()

    client = None
    convergence = None
    if loaded.run_id:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        client = MlflowClient(tracking_uri=args.tracking_uri)
        history = metric_history(client, loaded.run_id)
        convergence = {"CT" if loaded.config.get("objective") != "vanilla" else "BL": history} if history else None
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="ct-eval-plots-"))
    if refused:  # a teammate's run, READ permission: the results stay here, said before the evaluation's minutes
        print(not_logged(refused, args, out_dir), flush=True)
    label = "BL" if loaded.config.get("objective") == "vanilla" else f"CT ({loaded.config.get('objective', 'full')})"
    plots = evaluation_figures({label: {"module": loaded.module, "result": result, "constraints": constraints}},
                               datamodule, out_dir, convergence)
    logged = {}
    if client is not None and args.log and not refused:
        try:
            prefix = metric_prefix(datamodule) if other else "eval"
            logged = log_evaluation(client, loaded.run_id, summary, prefix)
            # how the eval/* metrics were made: a quick 2-run check and a full evaluation look alike otherwise
            client.set_tag(loaded.run_id, EVALUATED_TAG + (f".{datamodule.name}" if other else ""),
                           f"{getattr(args, 'protocol', None) or 'reference'} protocol, {config.n_runs} "
                           f"run{'s' if config.n_runs != 1 else ''} x "
                           f"{config.n_individuals} individuals, {split} {'rows' if split == 'all' else 'split'}"
                           f"{f' of {table}' if other else ''}; {constraints.in_words()}")
            for path in plots:
                client.log_artifact(loaded.run_id, str(path), artifact_path="plots")
        except Exception as error:
            if not is_permission_denied(error):
                raise
            refused, logged = write_refused_now(args.tracking_uri, loaded.run_id), {}
            print(not_logged(refused, args, out_dir))

    payload = {"run_id": loaded.run_id, "checkpoint": loaded.checkpoint, "data": datamodule.name,
               "split": split, **({"trained_on": other} if other else {}), "immutable": constraints.immutable, "evaluated_under": constraints.in_words(),
               "logged": logged,
               "plots": [str(p) for p in plots], **result.to_dict(include_samples=True)}
    if refused and not args.summary_json:  # kept here, as the note said
        args.summary_json = str(out_dir / SUMMARY_FILE)
    if args.summary_json and getattr(args, "overwrite", False):
        write_json_atomic(args.summary_json, payload)
    elif args.summary_json:  # refused at start where it existed; one written since is kept too, beside it
        written = str(write_json_new(args.summary_json, payload))
        if written != str(args.summary_json):
            print(f"note: {args.summary_json} was written by another process during this evaluation and is kept; "
                  f"this evaluation's summary is in {written}")
        args.summary_json = written
    shown = {k: v for k, v in summary.items() if k != "per_lambda"}
    print(f"data {datamodule.name} ({split} {'rows' if split == 'all' else 'split'}), {constraints.in_words()}")
    note = order_note(datamodule)
    if note:
        print(note)
    for key, value in shown.items():
        print(f"  {metric_label(key, config):>18}: {value:.4f}" if isinstance(value, float) else
              f"  {metric_label(key, config):>18}: {value}")
    print(metrics_meaning(config))
    if logged:
        print(f"logged {', '.join(logged)} to run {loaded.run_id}")
    print(f"plots: {out_dir}" + (f"; summary: {args.summary_json}" if refused else ""))
    return payload


def not_logged(reason: str, args: argparse.Namespace, out_dir: Path) -> str:
    """The one line on an evaluation the run's server does not take (``reason``): where its results are instead."""
    summary = args.summary_json or out_dir / SUMMARY_FILE
    return (f"note: the evaluation is not logged to the run: {reason}; its results are kept here: the summary in "
            f"{summary}, the plots in {out_dir}; --no-log skips logging")
