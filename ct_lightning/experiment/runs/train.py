"""One training run from a flat configuration: data, CTModule, Trainer, MLflow, summary."""

from __future__ import annotations

import errno
import json
import math
import os
import shlex
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from mlflow.tracking import MlflowClient

from ct_lightning.callbacks import BurnIn, ConvergenceWatch, CounterfactualEvaluation, EpochSeed
from ct_lightning.callbacks.epoch_lines import EpochLines, wants_epoch_lines
from ct_lightning.experiment.configuration.allocator import keep_freed_memory
from ct_lightning.experiment.runs.checkpoint_io import AtomicCheckpointIO
from ct_lightning.experiment.runs.checkpoint_upload import record_upload, shared_store, upload_last_checkpoint
from ct_lightning.experiment.runs.checkpoints import (CLASSES_KEY, check_layers, first_layer, infer_mlp_hidden_sizes,
                                                     last_layer, load_into, mlp_layer_names, read_checkpoint,
                                                     save_network_weights, split_adapted)
from ct_lightning.model_inputs import affine_map, output_order, read_model_spec, reordered_outputs
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.models import ACTIVATIONS, build_model
from ct_lightning.experiment.configuration.console import VERBOSE_ENV, quiet_console
from ct_lightning.constraints import data_mutability
from ct_lightning.experiment.configuration.data import build_datamodule, mutability_line, mutability_spec
from ct_lightning.experiment.runs.interrupt import INTERRUPTED_TAG, TrainingInterrupted
from ct_lightning.experiment.configuration.preflight import preflight_training
from ct_lightning.experiment.runs.lifecycle import (CHECKPOINT_DIR_TAG, CONSTRAINTS_TAG, ERROR_TAG,
                                                    KEPT_MUTABILITY_TAG, SUMMARY_JSON_TAG,
                                              check_outputs, trained_under,
                                              completed_epochs, create_run, defining_config,
                                              find_resumable_run, mark_failed, mark_interrupted,
                                              recipe_command, resume_command, start_label)
from ct_lightning.experiment.runs.run_artifacts import (EpochMetricsInCheckpoint, EpochStepMLFlowLogger, load_model_uri,
                                                   log_missing_epoch_metrics, log_training_inputs,
                                                   log_training_plots)
from ct_lightning.experiment.runs.served_model import example_rows, log_models, registered_text
from ct_lightning.experiment.runs.kept_preprocessing import (check_data_spec, inherit_mutability, kept_line,
                                                          kept_preprocessing)
from ct_lightning.experiment.runs.last_checkpoint import BestCheckpoint, LastCheckpoint
from ct_lightning.experiment.runs.stop_on_signal import StopOnSignal
from ct_lightning.experiment.configuration.settings import (DEFAULTS, RESUME_OPTIONS, SETTINGS_BY_NAME, fused_blocker,
                                              is_table_file, load_config_file, model_inputs_without_table,
                                              module_kwargs, resolve_config)
from ct_lightning.experiment.runs.atomic_files import write_json_atomic
from ct_lightning.experiment.runs.outbox import OUTBOX_DIR, OutboxClient, pending_upload, server_writable
from ct_lightning.experiment.runs.tracking import ensure_experiment, prepare_store
from ct_lightning.experiment.configuration.store import default_tracking_uri, local_store_dir
from ct_lightning.experiment.configuration.validation import InputError
from ct_lightning.experiment.runs.tracking_server import is_outage, is_server_uri, run_links
from ct_lightning.training.epoch_block import EpochBlockLoader, can_fuse
from ct_lightning.experiment.configuration.cpu_math import check_cpu_math, cpu_math_state
from ct_lightning.generators.compiled_step import set_expected_searches, set_search_compile
from ct_lightning.module import CTModule




def build_module(config: dict, datamodule, weights: dict | None = None) -> CTModule:
    """A ``CTModule`` with the configured architecture for the configured data set; with ``model_inputs``, the
    network behind the frozen input layer that maps the data module's encoding onto those inputs, and before the
    frozen output layer that puts its outputs in the table's class order where ``"outputs"`` lists them (or the
    model has one output unit). ``weights``: the weights it is to load (a state_dict of the network, of the model or
    of the module), whose last layer tells a single logit; else those of ``from_checkpoint`` where it is a file."""
    return module_and_unused(config, datamodule, weights)[0]


def module_and_unused(config: dict, datamodule, weights: dict | None = None) -> tuple[CTModule, list[str]]:
    """:func:`build_module`'s module and the table columns no model input reads (empty without ``model_inputs``),
    from the one computation of the input map."""
    entries, outputs = model_input_spec(config)
    mapped = input_map(config, entries, datamodule) if entries else None
    order = output_map(config, outputs, datamodule, weights, len(entries)) if entries else None
    module = CTModule(**module_kwargs(config, datamodule.n_features, datamodule.n_classes, datamodule.feature_names,
                                      mutability_spec(config, datamodule) or None), input_map=entries,
                      output_order=order)
    if order is not None:
        module.model.labels = output_labels(order, datamodule.codec.classes)
    if mapped is None:
        return module, []
    module.model.inputs.set_map(mapped[0], mapped[1])
    return module, mapped[2]


def model_input_entries(config: dict) -> list[dict] | None:
    """The checked entries of ``config["model_inputs"]`` (a file, the list or the object), or ``None`` without it."""
    return model_input_spec(config)[0]


def model_input_spec(config: dict) -> tuple[list[dict] | None, list | None]:
    """``(inputs, outputs)`` of ``config["model_inputs"]`` (:func:`ct_lightning.model_inputs.read_model_spec`),
    ``(None, None)`` without it."""
    source = config.get("model_inputs")
    return (None, None) if source is None else read_model_spec(source)


def input_map(config: dict, entries: list[dict], datamodule) -> tuple[list, list, list[str]]:
    """``(weight, bias, unused columns)`` of the input layer from the table's encoding to ``entries``
    (:func:`ct_lightning.model_inputs.affine_map`); a table's fitted codec is needed."""
    codec = getattr(datamodule, "codec", None)
    if codec is None:
        raise model_inputs_without_table(_inputs_shown(config["model_inputs"]), config["data"])
    return affine_map(entries, codec, config["model_inputs"])


def output_map(config: dict, outputs: list | None, datamodule, weights: dict | None,
               n_inputs: int) -> list[int] | None:
    """The table's class index of each output of the model (:func:`ct_lightning.model_inputs.output_order`), ``None``
    without ``outputs`` (its outputs are then the table's classes in their order); the model's output width is that
    of ``weights``, else of the ``from_checkpoint`` file, else of the network built for ``n_inputs`` inputs
    (:func:`network_width`)."""
    if weights is None and config.get("from_checkpoint") and ":/" not in config["from_checkpoint"] \
            and Path(config["from_checkpoint"]).is_file():
        weights = read_checkpoint(config["from_checkpoint"])[0]
    last = last_layer(split_adapted(_model_state(weights))) if weights else None
    width = last[1] if last is not None else network_width(config, n_inputs, len(outputs or datamodule.codec.classes))
    return output_order(outputs, datamodule.codec.classes, width, config["model_inputs"])


def network_width(config: dict, n_inputs: int, n_outputs: int) -> int:
    """The output width of the configured network built for ``n_inputs`` inputs and asked for ``n_outputs``: that of
    a factory of your own (``--model``) from one forward pass, since it may return another (one unit, a single
    logit, whatever ``n_classes`` it is given); ``n_outputs`` for ct-lightning's own networks."""
    if ":" not in str(config["model"]):
        return n_outputs
    network = build_model(config["model"], n_inputs, n_outputs, config["hidden_sizes"], config["activation"])
    return output_width(network, n_inputs)


def output_width(model, n_inputs: int) -> int:
    """The number of outputs per row of ``model`` (inputs of width ``n_inputs``): one forward pass of two rows."""
    with eval_mode(model), torch.no_grad():
        return int(model(torch.zeros(2, n_inputs)).shape[-1])


def check_output_width(config: dict, module: CTModule, datamodule) -> None:
    """A model that does not give one output per class is refused in one line before the run exists (cross-entropy
    would fail at its first step with a traceback): a network of your own (``--model``) of one output unit, a single
    logit, names ``--model-inputs``' ``"outputs"``; another width, the classes it needs."""
    width, n_classes = output_width(module.model, datamodule.n_features), datamodule.n_classes
    if width == n_classes:
        return
    option = "model" if ":" in str(config["model"]) else "from_checkpoint"
    classes = getattr(getattr(datamodule, "codec", None), "classes", None)
    named = f" ({', '.join(map(str, classes))})" if classes else ""
    got = f"{option}: got {config[option]!r} (its network gives {width} output{'s' if width != 1 else ''} per row"
    if width == 1 and n_classes == 2 and classes:
        raise ValueError(f"{got}, a single logit, for the 2 classes{named} of {Path(config['data']).name}); allowed: "
                         + one_unit_advice(config, classes))
    raise ValueError(f"{got}; the data has {n_classes} classes{named}); allowed: a network of {n_classes} outputs, "
                     "one per class in this order (a factory taking n_classes is given it), or outputs in an order of "
                     'its own listed as "outputs" of --model-inputs FILE (docs/guide.md, "Fine-tune a model you '
                     'already have")')


def one_unit_advice(config: dict, classes) -> str:
    """What a model of one output unit on a table of two classes needs: ``--model-inputs``' ``"outputs"``."""
    return (f'describe the model with --model-inputs FILE, the object {{"inputs": [...], "outputs": '
            f'{json.dumps(list(map(str, classes)), ensure_ascii=False)}}} (the unit is the log-odds of the second; '
            'docs/guide.md, "Fine-tune a model you already have")')


def class_count_advice(config: dict, width: int, datamodule) -> str:
    """Why a model of ``width`` outputs does not fit a table of another number of classes, with each class's rows: a
    two-class model on a file whose target holds a third class (a few rows written apart) most often."""
    counts = datamodule.frame[datamodule.target].value_counts()
    balanced = (getattr(datamodule, "balance", None) or "none") != "none"  # its frame: the rows kept, evened out
    found = ", ".join(str(c) if balanced else f"{c}: {int(counts.get(c, 0))} row(s)" for c in datamodule.codec.classes)
    return (f"the model has {width} outputs, the target {datamodule.target!r} of {Path(config['data']).name} has "
            f"{datamodule.n_classes} classes ({found}): write each row's class as one of the model's {width} in the "
            f"file, or leave the rows of the others out")


def _model_state(state: dict) -> dict:
    """The model's weights of a module's ``state`` (``model.`` keys), or ``state`` as it is."""
    model = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    return model or state


def output_labels(order: list[int], classes: list) -> list:
    """The ``"outputs"`` list that ``order`` (:func:`ct_lightning.model_inputs.output_order`) stands for: the class
    of each output, ``[negative, positive]`` for one output unit."""
    if len(order) == 1:
        return [classes[1 - order[0]], classes[order[0]]]
    return [classes[i] for i in order]


def _inputs_shown(source) -> str:
    if isinstance(source, dict):
        outputs = json.dumps(source.get("outputs"), ensure_ascii=False)
        return f"an object of {len(source.get('inputs') or [])} inputs and outputs {outputs}"
    return source if isinstance(source, str) else f"a list of {len(source)} inputs"


def _architecture_from_file(path: str, given: dict) -> tuple[dict, dict]:
    """Weights of ``path`` and the architecture settings it implies, unless given explicitly."""
    state, metadata = read_checkpoint(path)
    implied = {key: metadata[key] for key in ("hidden_sizes", "activation") if key in metadata}
    if "architecture" in metadata:
        implied["model"] = metadata["architecture"]
    state, implied = _adapted_weights(state, metadata, implied)
    if "hidden_sizes" not in implied and given.get("model", metadata.get("architecture", "mlp")) == "mlp":
        inferred = infer_mlp_hidden_sizes(state)
        if inferred is not None:
            implied["hidden_sizes"] = inferred
    return state, {k: v for k, v in implied.items() if given.get(k) is None}


def _adapted_weights(state: dict, metadata: dict, implied: dict) -> tuple[dict, dict]:
    """A model trained with ``--model-inputs`` (its checkpoint, its MLflow model): its network's weights, and its
    inputs list (with its ``"outputs"`` where it had them) as the implied ``model_inputs`` (the input and output
    layers are made again from the data it is trained on)."""
    network = split_adapted(state)
    if network is not state and metadata.get("input_map"):
        outputs = metadata.get("outputs")
        if outputs is None and metadata.get("output_order") and metadata.get(CLASSES_KEY):
            outputs = output_labels(list(metadata["output_order"]), list(metadata[CLASSES_KEY]))
        inputs = list(metadata["input_map"])
        implied = {**implied, "model_inputs": inputs if outputs is None else {"inputs": inputs,
                                                                              "outputs": list(outputs)}}
    return network, implied


def _resume_config(overrides: dict, echo=print) -> tuple[dict, str, Path, dict[str, str]]:
    """The logged configuration of the run to resume, its id, its last checkpoint and, for a fine-tuning, the
    constraints it kept from its model's original run (``{feature: kind}``, its tag ``ct.kept_mutability``).

    ``max_epochs`` may extend the run (it must exceed the epochs already trained); every other
    setting that shapes training stays as logged, and giving one is an error.
    """
    base = {**DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}
    changed = sorted(k for k in overrides if k not in RESUME_OPTIONS and overrides[k] is not None)
    if changed:
        raise ValueError(f"resume: {', '.join('--' + k.replace('_', '-') for k in changed)} cannot change when "
                         f"resuming (the run continues with its logged configuration); allowed with --resume: "
                         + ", ".join(SETTINGS_BY_NAME[k].option for k in sorted(RESUME_OPTIONS) if k != "resume"))
    prepare_store(base["tracking_uri"])
    client = MlflowClient(tracking_uri=base["tracking_uri"])
    run, last = find_resumable_run(client, base["experiment"], base["tracking_uri"], base["resume"], echo)
    run_id = run.info.run_id
    try:
        logged = Path(client.download_artifacts(run_id, "config.json", tempfile.mkdtemp(prefix="ct-resume-")))
    except Exception as error:  # noqa: BLE001 - MLflow raises several types for a missing run/artifact
        raise ValueError(f"resume: run {run_id} has no logged config.json to resume from ({error})") from None
    config = {**DEFAULTS, **json.loads(logged.read_text())}
    done = completed_epochs(last)
    if overrides.get("max_epochs") is not None and overrides["max_epochs"] != config["max_epochs"]:
        if overrides["max_epochs"] <= done:
            raise ValueError(f"max_epochs: {overrides['max_epochs']} with --resume must exceed the {done} epochs run "
                             f"{run_id} has already trained")
        config["max_epochs"] = overrides["max_epochs"]
    elif run.info.status == "FINISHED" or done >= config["max_epochs"]:
        raise ValueError(f"resume: run {run_id} already trained all {config['max_epochs']} epochs; pass "
                         f"--max-epochs N (N > {done}) to extend it")
    for key in RESUME_OPTIONS - {"max_epochs", "resume"}:  # every option allowed with --resume applies
        if overrides.get(key) is not None:
            config[key] = overrides[key]
    if config.get("summary_json") is None and run.data.tags.get(SUMMARY_JSON_TAG):
        config["summary_json"] = run.data.tags[SUMMARY_JSON_TAG]  # where the interrupted run was to write it
    config["resume"] = run_id
    config["checkpoint_dir"] = str(last.parent)
    echo(f"resume: run {run_id} ({run.info.run_name}, {run.info.status}) from {last} after {done} epoch(s), "
         f"training to epoch {config['max_epochs']}", flush=True)
    return config, run_id, last, json.loads(run.data.tags.get(KEPT_MUTABILITY_TAG) or "{}")


def _scalar_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        out[key] = value if math.isfinite(value) else None
    return out


def _prepare(overrides: dict, echo=print) -> tuple[dict, str | None, Path | None, dict | None, bool, dict]:
    """Resolve the configuration (or the run to resume) and check outputs, before any run exists. Returns the
    configuration, the run id and checkpoint to resume, the ``from_checkpoint`` weights, whether its
    ``model_inputs`` came with them and the constraints a resumed fine-tuning kept from its model's original run."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if given.get("resume"):
        config, run_id, resume_from, from_model = _resume_config(given, echo)
        # the run's own summary path (not given again) may hold its summary already: an extended finished run
        check_outputs(config if given.get("summary_json") else {**config, "summary_json": None}, resuming=True)
        return config, run_id, resume_from, None, False, from_model
    if given.get("config"):
        given = {**load_config_file(given["config"]), **given}
    weights, inherited = None, False
    if given.get("from_checkpoint"):
        if ":/" not in given["from_checkpoint"]:  # the run's configuration names the file absolutely, as --data
            given["from_checkpoint"] = str(Path(given["from_checkpoint"]).resolve())
        weights, implied = _architecture_from_source(given["from_checkpoint"], given)
        given.update(implied)
        inherited = "model_inputs" in implied  # a --model-inputs run's checkpoint: its list comes with it
        mlp = given.get("model", "mlp") == "mlp"
        if mlp and infer_mlp_hidden_sizes(weights) is None:  # a class of your own: say so now, not after the data
            check_layers(mlp_layer_names(given.get("hidden_sizes") or DEFAULTS["hidden_sizes"]), weights,
                         f"--from-checkpoint {given['from_checkpoint']}")
        if given.get("activation") is None and mlp:
            echo(f"note: {given['from_checkpoint']} does not say which activation its MLP uses (a state_dict holds "
                 f"weights only): {DEFAULTS['activation']} is assumed; pass --activation if it was trained with another "
                 f"(allowed: {', '.join(ACTIVATIONS)})", flush=True)
    config = resolve_config(given)
    check_outputs(config)
    if weights is not None:
        entries = model_input_entries(config)
        if entries is not None:
            check_input_width(config, entries, weights)
    return config, None, None, weights, inherited, {}


def loaded_model_line(config: dict, model: torch.nn.Module, inherited: bool) -> str:
    """What ``from_checkpoint`` loaded: its architecture and its weights, the model's trainable parameters (a
    BatchNorm's running statistics are buffers, not weights), and the inputs it reads with ``model_inputs``
    (``inherited``: the list came with the checkpoint)."""
    entries = model_input_entries(config)
    shape = f"an MLP with hidden sizes {config['hidden_sizes']} and {config['activation']}" \
        if config["model"] == "mlp" else f"the model {config['model']}"
    verb = "the model as it is:" if config["limit_train_batches"] == 0 else "fine-tuning"
    reads = "" if not entries else f", reading the {len(entries)} inputs of " + \
        ("the --model-inputs list it was trained with" if inherited else "--model-inputs")
    weights = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    return f"{verb} {config['from_checkpoint']}: {shape}, {weights} weights{reads}"


def check_input_width(config: dict, entries: list[dict], weights: dict) -> None:
    """The inputs list has one entry per input of the model's first layer, else a one-line :class:`InputError`."""
    first = first_layer(weights)
    if first is not None and first[1] != len(entries):
        raise InputError("model_inputs", _inputs_shown(config["model_inputs"]),
                         f"a list of {first[1]} inputs, one per input of the model's first layer ({first[0]} of "
                         f"{config['from_checkpoint']} takes {first[1]})", f"it lists {len(entries)}")


def _architecture_from_source(source: str, given: dict) -> tuple[dict, dict]:
    if source.startswith(("runs:/", "models:/")):
        state, metadata = load_model_uri(source, given.get("tracking_uri") or default_tracking_uri())
        state, metadata = _adapted_weights(state, metadata, metadata)
        metadata.pop("input_map", None)
        metadata.pop("outputs", None)
        inferred = infer_mlp_hidden_sizes(state)
        if inferred is not None:
            metadata["hidden_sizes"] = inferred
        return state, {k: v for k, v in metadata.items() if given.get(k) is None}
    return _architecture_from_file(source, given)


def ct_settings_line(config: dict) -> str:
    """The start-up line of a table's CT settings that depend on its size (given, or chosen by ``resolve_config``)."""
    chosen = {k: config[k] for k in ("tau", "nce", "lambda_reg", "batch_size")}
    return "CT settings (given, else chosen from the training rows' size): " + ", ".join(
        f"{k} {v}" for k, v in chosen.items())


def train(overrides: dict, *, callbacks: list | None = None, tags: dict | None = None, echo=print,
          resume_hint: str | None = None, protect_by: str = "--protect") -> dict:
    """Train one model as configured, track it in MLflow and return the run summary.

    ``overrides`` may hold ``config`` (a YAML file, below the other overrides), ``from_checkpoint``
    (start from those weights: a checkpoint file, ``runs:/RUN_ID/model`` or ``models:/NAME/VERSION``)
    and ``resume`` (a run id or ``"latest"``: continue an interrupted run from its last checkpoint
    in the same MLflow run). ``callbacks`` are added to the Trainer's; ``tags`` are set on the
    MLflow run (e.g. ``{"mlflow.parentRunId": ID, "role": "CT"}``). A run that fails after it
    started ends FAILED with the error message as its ``error`` tag. ``echo`` prints progress lines;
    ``resume_hint`` replaces the resume command they name (a sweep's trial: re-run the sweep). ``protect_by`` names
    who set ``protect`` in the start-up line of what the searches keep to, where not the user (compare's
    actionability pair).
    """
    overrides = preflight_training(overrides).overrides  # every check before anything is created
    quiet_console(bool(overrides.get("verbose")) or os.environ.get(VERBOSE_ENV) == "1")
    keep_freed_memory()  # the search's pool-sized tensors are reused instead of page-faulted in at every step
    stopper = StopOnSignal(echo)  # SIGTERM/SIGINT: stop at the end of the epoch, after its checkpoint
    stopper.install()
    try:
        result = _train(overrides, callbacks, tags, echo, stopper, resume_hint, protect_by)
    finally:
        stopper.restore()
    stopper.pass_on()  # a signal in the last epoch still stops the study that called this
    return result


def _train(overrides: dict, callbacks, tags, echo, stopper: StopOnSignal, resume_hint: str | None = None,
           protect_by: str = "--protect") -> dict:
    config, run_id, resume_from, weights, inherited, from_model = _prepare(overrides, echo)
    check_cpu_math(config.get("cpu_math", "native"))  # portable must have been chosen before torch started
    set_search_compile(config["search_compile"])
    L.seed_everything(config["seed"], workers=True, verbose=False)
    kept = kept_preprocessing(config, resume_from)  # a fine-tuning on a table reads it as its model was trained to
    if kept is not None:  # from_model: the constraints kept from the model's original run (a resumed run's tag)
        check_data_spec(config, kept)
        echo(kept_line(config, resume_from is not None), flush=True)
        if resume_from is None:  # a resumed run's config has them
            note, from_model = inherit_mutability(config, kept)
            if note:
                echo(note, flush=True)
    datamodule = build_datamodule(config, codec=kept, widen=kept is not None)
    check_batch_shares(config, datamodule)
    set_expected_searches(expected_searches(config, datamodule))
    # the weights it loads tell a model of one output unit (a resumed run's: its checkpoint's)
    resumed = resume_from is not None and config.get("model_inputs") is not None
    module, unused = module_and_unused(config, datamodule, read_checkpoint(resume_from)[0] if resumed else weights)
    codec = getattr(datamodule, "codec", None)
    if codec is not None:  # a user's table or a built-in one: explanations and the served model read raw rows
        module.preprocessing = codec.to_dict()
    if codec is not None and hasattr(datamodule, "describe"):  # a user's table: what was read, inferred and chosen
        echo(datamodule.describe(), flush=True)
        echo(ct_settings_line(config), flush=True)
    given = module.hparams.mutability  # the data spec's and --immutable/--mutability/--protect's: what searches keep to
    held = mutability_line(config, given if isinstance(given, dict) else {}, bool(data_mutability(datamodule)),
                           protect_by, from_model, kept is not None)
    if held:
        echo(held, flush=True)
    if resume_from is None and config.get("from_checkpoint"):
        load_given_weights(config, module, weights, datamodule)
    check_output_width(config, module, datamodule)
    loaded = None  # a fine-tuned model's validation accuracy as loaded, for the note after training
    if resume_from is None and config.get("from_checkpoint"):
        echo(loaded_model_line(config, module.model, inherited), flush=True)
        loaded = echo_loaded_accuracy(config, module, datamodule, echo)
    if resume_from is None and unused:
        echo(f"note: --model-inputs: no input of the model reads {', '.join(unused)}: "
             f"{'it does' if len(unused) == 1 else 'they do'} not change its decisions, and counterfactuals leave "
             f"{'it' if len(unused) == 1 else 'them'} as given (leave a column that is no feature out with "
             f"--drop-columns)", flush=True)

    stopper.store_in_use()  # a signal from here on stops before training, not in the middle of a store write
    artifact_location = prepare_store(config["tracking_uri"], config["experiment"])  # created once, under a lock
    client = MlflowClient(tracking_uri=config["tracking_uri"])
    if not _is_rank_zero():
        # Under DDP (one process per rank) only rank 0 owns the MLflow run and writes outputs.
        return _train_in_run(config, None, None, None, None, datamodule, module, resume_from,
                             [*(callbacks or []), stopper], lambda *a, **k: None)
    experiment_id = ensure_experiment(client, config["experiment"], artifact_location)
    if is_server_uri(config["tracking_uri"]):  # an outage of the server, once the run exists, is survived
        client = OutboxClient(client, config["tracking_uri"], lambda *a, **k: echo(*a, file=sys.stderr, **k))
    since = None if run_id is not None else time.time()  # a new run's own checkpoints are written from now on
    if run_id is None:
        run_id, run_name = create_run(client, experiment_id, config,
                                      {**(tags or {}), **{f"ct.{k}": v for k, v in cpu_math_state().items()},
                                       CONSTRAINTS_TAG: trained_under(module, datamodule),
                                       **({KEPT_MUTABILITY_TAG: json.dumps(from_model)} if from_model else {})})
    else:
        run = client.get_run(run_id)
        run_name = run.info.run_name
        client.update_run(run_id, status="RUNNING")
        for tag in (ERROR_TAG, INTERRUPTED_TAG):  # an earlier attempt's end no longer describes the run
            if tag in run.data.tags:
                client.delete_tag(run_id, tag)
        if config["max_epochs"] != int(run.data.params.get("max_epochs", config["max_epochs"])):
            client.set_tag(run_id, "ct.max_epochs_extended_to", str(config["max_epochs"]))
    try:
        if loaded is not None:  # beside the run's val/acc in MLflow's UI: the model's as loaded, before fine-tuning
            client.log_metric(run_id, LOADED_METRIC, loaded, step=0)
        summary = _train_in_run(config, run_id, run_name, experiment_id, client, datamodule, module, resume_from,
                                [*(callbacks or []), stopper], echo, resume_hint)
        if loaded is not None:
            summary["loaded_val_acc"] = loaded
        return summary
    except TrainingInterrupted as interrupted:
        command = resume_command(run_id, config["tracking_uri"], config["experiment"])
        upload_on_stop(client, run_id, config, echo, since)
        mark_interrupted(client, run_id, interrupted, command)
        requeued = stopper.requeue_job()
        echo(f"interrupted ({interrupted}): run {run_id} is KILLED; "
             + (f"{requeued}; it resumes with --resume" if requeued else resume_hint or f"resume it with:\n  {command}"),
             file=sys.stderr, flush=True)
        raise
    except BaseException as error:
        upload_on_stop(client, run_id, config, echo, since)
        mark_failed(client, run_id, error)
        raise


def upload_on_stop(client, run_id: str, config: dict, echo, since: float | None = None) -> None:
    """On a shared store, upload the last checkpoint of a run that stops early, so that ``--resume`` continues it on
    any machine (:mod:`~ct_lightning.experiment.runs.checkpoint_upload`), and say so; a failed upload (or one a second
    signal cuts short) is one warning line and never hides why the run stopped. ``since``: when a new run started (a
    ``last.ckpt`` older than that in its folder, kept with ``--overwrite``, is another run's); ``None`` resumed."""
    if not shared_store(config["tracking_uri"]) or not config.get("checkpoint_dir"):
        return
    folder = config["checkpoint_dir"]
    last = Path(folder) / "last.ckpt"
    if since is not None and (not last.is_file() or last.stat().st_mtime < since - 1):
        return
    try:
        line = upload_last_checkpoint(client, run_id, folder)
    except BaseException as error:  # noqa: BLE001 - a second signal too: the stop goes on, without the upload
        why = "a second signal" if isinstance(error, KeyboardInterrupt) else \
            (str(error).splitlines()[0][:200] if str(error) else type(error).__name__)
        echo(f"warning: the last checkpoint was not uploaded to run {run_id} ({why}); resume it where {folder} is",
             file=sys.stderr, flush=True)
        return
    if line and getattr(client, "offline", False):
        line = (f"the last checkpoint of run {run_id} waits in the outbox with the run's other records (the server is "
                f"unreachable); until they are sent, resume it where {folder} is")
    if line:
        echo(line, file=sys.stderr, flush=True)


def load_given_weights(config: dict, module: CTModule, weights: dict, datamodule, source: str | None = None) -> None:
    """Load the ``from_checkpoint`` weights (``source`` names them, by default so) into the module's model (into the
    network behind the input layer with ``model_inputs``); a first layer of another width on a table names
    ``--model-inputs``, a last one of another width than the table's classes names them."""
    source = source or f"from_checkpoint {config['from_checkpoint']}"
    try:
        load_into(module.model, weights, source=source)
    except ValueError as error:
        first, codec = first_layer(weights), getattr(datamodule, "codec", None)
        last = last_layer(weights)
        if codec is not None and config.get("model_inputs") is None and last is not None and last[1] == 1 \
                and datamodule.n_classes == 2:
            raise ValueError(f"{error} | the model has one output unit (a single logit), ct-lightning's classes of "
                             f"{Path(config['data']).name} are two: {one_unit_advice(config, codec.classes)}") from None
        if codec is not None and last is not None and last[1] not in (1, datamodule.n_classes):
            raise ValueError(f"{error} | {class_count_advice(config, last[1], datamodule)}") from None
        if codec is None or config.get("model_inputs") is not None or first is None \
                or first[1] == datamodule.n_features:
            raise
        identifiers = datamodule.identifier_like() if callable(getattr(datamodule, "identifier_like", None)) else []
        # a row number pandas wrote (Unnamed: 0) or an applicant id: the one input too many, most often
        without = (f"leave the identifier{'s' if len(identifiers) > 1 else ''} {', '.join(map(repr, identifiers))} "
                   f"out with --drop-columns {shlex.quote(','.join(identifiers))} ({first[1]} inputs then), or, ") \
            if identifiers and datamodule.n_features - len(identifiers) == first[1] else ""
        raise ValueError(f"{error} | ct-lightning encodes {Path(config['data']).name} as {datamodule.n_features} "
                         f"inputs (numbers standardised, categories one-hot, in the table's column order), the model "
                         f"takes {first[1]}: {without}if it was trained on an encoding of your own, describe its inputs "
                         f"with --model-inputs FILE (docs/guide.md, \"Fine-tune a model you already have\")") from None


def loaded_accuracy(module: CTModule, datamodule) -> tuple[float, float, list[list[int]]] | None:
    """``(accuracy, majority share, counts)`` of the module's model on the validation split, before any training
    (``counts[p][t]``: rows of class ``t`` predicted as ``p``); ``None`` for a data module without validation
    tensors."""
    if getattr(datamodule, "x_val", None) is None or not len(datamodule.y_val):
        return None
    x, y = datamodule.x_val.float(), datamodule.y_val.long()
    with eval_mode(module.model), torch.no_grad():
        predicted = module.model(x).argmax(1)
    n = max(int(y.max()), int(predicted.max())) + 1
    counts = torch.bincount(predicted * n + y, minlength=n * n).view(n, n).tolist()
    # both shares from counts, in Python floats: a float32 mean of 36/60 is 0.6000000238 > 0.6, no warning
    return int((predicted == y).sum()) / len(y), torch.bincount(y).max().item() / len(y), counts


def echo_loaded_accuracy(config: dict, module: CTModule, datamodule, echo) -> float | None:
    """Say how well the loaded model does before any training, and warn where it is no better than always predicting
    the majority class: its inputs are likely not those it was trained on. The validation accuracy (``None``: none
    measured)."""
    scores = loaded_accuracy(module, datamodule)
    if scores is None:
        return None
    accuracy, majority, counts = scores
    table = getattr(datamodule, "codec", None) is not None
    fed = " on the inputs of --model-inputs" if config.get("model_inputs") is not None else \
        f" on {Path(config['data']).name}, encoded as in its training" if getattr(datamodule, "kept", False) else \
        f" on ct-lightning's encoding of {Path(config['data']).name}" if table else ""
    echo(f"{start_label(config['from_checkpoint'])} as loaded, before any training: validation accuracy {accuracy:.3f}"
         f"{fed} (the majority class alone: {majority:.3f})", flush=True)
    if accuracy > majority:
        return accuracy
    classes = getattr(getattr(datamodule, "codec", None), "classes", None)
    order = f"; its outputs must be the classes {', '.join(map(str, classes))}, in this order, or listed in " \
        f'theirs as "outputs" of --model-inputs' if classes else ""
    if classes and len(counts) == len(classes) and not getattr(datamodule, "kept", False):
        outputs, reordered = reordered_outputs(counts, getattr(module.model, "labels", None) or classes, classes)
        if reordered > majority:  # trained with another label order (label 1 for the rejection): say which
            shown = json.dumps(list(map(str, outputs)), ensure_ascii=False)
            return _warn_loaded(config, accuracy, majority, echo,
                                f"read as the classes {shown}, in the model's order, its outputs score {reordered:.3f}:"
                                f" it was likely trained with another label order; write \"outputs\": {shown} in "
                                f"--model-inputs FILE (the object {{\"inputs\": [...], \"outputs\": {shown}}}; "
                                "docs/guide.md, \"Fine-tune a model you already have\")")
    if config.get("model_inputs") is not None:
        hint = f"check that --model-inputs lists the inputs it was trained on, in their order{order}"
    elif getattr(datamodule, "kept", False):  # its own preprocessing: the inputs are read as in its training
        hint = (f"it reads {Path(config['data']).name} with the preprocessing it was trained with, so the rows differ "
                "from its training rows (another month, another population) or it learnt little; check its own "
                "evaluation, or train a new model on this file without --from-checkpoint")
    elif table:
        hint = ("if it was trained on an encoding of your own (its own scaling, one-hot columns or order), describe "
                f"its inputs with --model-inputs FILE (docs/guide.md, \"Fine-tune a model you already have\"){order}")
    else:
        hint = "check that it was trained on this data set, with --data's own features"
    return _warn_loaded(config, accuracy, majority, echo, hint)


def _warn_loaded(config: dict, accuracy: float, majority: float, echo, hint: str) -> float:
    echo(f"warning: {config['from_checkpoint']} predicts no better than the majority class before training "
         f"({accuracy:.3f} <= {majority:.3f}): {hint}", file=sys.stderr, flush=True)
    return accuracy


def expected_searches(config: dict, datamodule) -> int:
    """The counterfactual searches a training run makes: one per epoch (``pool`` epoch) or one per training step
    (``pool`` step); 0 for a vanilla run. ``search_compile`` ``auto`` weighs them against a compilation off the CPU."""
    if config["objective"] == "vanilla":
        return 0
    per_epoch = 1
    if config["pool"] == "step":
        n_train = len(datamodule.train_tensors[1])
        per_epoch = math.ceil(n_train / datamodule.batch_size)
        limit = config.get("limit_train_batches")
        if isinstance(limit, int) and not isinstance(limit, bool):  # a count of batches (a float is a share)
            per_epoch = min(per_epoch, limit)
    return int(config["max_epochs"]) * per_epoch


def check_batch_shares(config: dict, datamodule) -> None:
    """A ``limit_*_batches`` share that leaves no batch of the data set's loader is refused (:class:`InputError`)
    before the run exists: Lightning would fail on it only once the run had started."""
    loaders = {"limit_train_batches": datamodule.train_dataloader, "limit_val_batches": datamodule.val_dataloader}
    for name, make_loader in loaders.items():
        share = config.get(name)
        if not isinstance(share, float) or share >= 1:
            continue
        try:
            length = len(make_loader())
        except TypeError:  # a loader of unknown length: Lightning allows no share there and says so itself
            continue
        if length and int(length * share) == 0:
            least = "1 (the split is one batch)" if length == 1 else f"≥ 1/{length} (one of the {length} batches)"
            raise InputError(name, share, f"a share {least} or a whole number of batches ≥ 1",
                             f"{share} of {length} batch{'es' if length > 1 else ''} is none")


def _choose_epoch_loop(config: dict, trainer: L.Trainer, module: CTModule, datamodule) -> None:
    """Fuse each epoch into one Lightning step (``epoch_loop`` fused, or auto where it applies)."""
    blocker = fused_blocker(config) or (f"{trainer.world_size} processes" if trainer.world_size > 1 else None)
    make_loader = datamodule.train_dataloader
    if blocker is None and not can_fuse(make_loader()):
        blocker = f"a training DataLoader that is not over tensors ({type(datamodule).__name__})"
    if config["epoch_loop"] == "lightning" or (config["epoch_loop"] == "auto" and blocker):
        return
    if blocker:
        raise ValueError(f"epoch_loop: 'fused' is not allowed with {blocker}; allowed: auto or lightning")
    module.fuse_epochs(True)
    datamodule.train_dataloader = lambda: EpochBlockLoader(make_loader())


def _is_rank_zero() -> bool:
    """Whether this process is global rank 0 (always, outside a DDP launch)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def _train_in_run(config, run_id, run_name, experiment_id, client, datamodule, module, resume_from, callbacks,
                  echo, resume_hint: str | None = None) -> dict:
    """Fit, test and log one run; ``client`` is ``None`` on DDP ranks other than 0 (they only train)."""
    logger = EpochStepMLFlowLogger(experiment_name=config["experiment"], tracking_uri=config["tracking_uri"],
                                   run_id=run_id, flush_seconds=None)  # sent as last.ckpt is written (LastCheckpoint)
    if isinstance(client, OutboxClient):
        logger._mlflow_client = client  # Lightning's logger writes through it too (metrics, hyperparameters)
    if client is None:
        # ModelCheckpoint takes rank 0's folder on every rank; this one is never written.
        config["checkpoint_dir"] = str(Path(config["checkpoint_dir"] or local_store_dir(config["tracking_uri"])
                                            / "checkpoints" / "rank-not-zero").resolve())
    elif resume_from is None:
        config["checkpoint_dir"] = str(Path(config["checkpoint_dir"] or
                                            local_store_dir(config["tracking_uri"]) / "checkpoints" / run_id).resolve())
    if isinstance(client, OutboxClient):
        client.attach(Path(config["checkpoint_dir"]) / OUTBOX_DIR, run_id, experiment_id)
    if client is not None and config["summary_json"]:  # also given with --resume: the summary goes there from now on
        client.set_tag(run_id, SUMMARY_JSON_TAG, str(Path(config["summary_json"]).resolve()))
    if client is not None and resume_from is None:
        client.set_tag(run_id, CHECKPOINT_DIR_TAG, config["checkpoint_dir"])
        # Lightning logs the module's hyperparameters itself; add the run-level settings it lacks.
        log_training_inputs(client, logger, run_id, config, module, datamodule)
    elif client is not None:
        client.set_tag(run_id, CHECKPOINT_DIR_TAG, config["checkpoint_dir"])  # fetched here from the server: here now
        client.log_dict(run_id, defining_config(config), "config.json")  # records an extended max_epochs
        client.log_dict(run_id, defining_config(config), "config.yaml")
        log_missing_epoch_metrics(client, run_id, resume_from)
    folder = Path(config["checkpoint_dir"])
    earlier_files = folder.is_dir() and any(p.name != "config.json" for p in folder.iterdir())
    if client is not None:  # beside the checkpoints too, so a copied folder still names its data and settings
        write_json_atomic(folder / "config.json", defining_config(config))
    echo(f"MLflow run {run_id} ({run_name}); if it is interrupted, " + (resume_hint or "resume it with:\n  "
         f"{resume_command(run_id, config['tracking_uri'], config['experiment'])}"), flush=True)
    if config["limit_train_batches"] == 0:
        echo(f"no training (--limit-train-batches 0): the model of {config['from_checkpoint']} is validated and "
             "tested as it is", flush=True)
    # last.ckpt is written at an epoch's very end (after validation and logging), so that a resumed run starts the
    # next epoch from exactly the state an uninterrupted run has there; at most every --checkpoint-seconds.
    last = LastCheckpoint(config["checkpoint_dir"], config["checkpoint_seconds"])
    best = BestCheckpoint(config["checkpoint_dir"])  # gathered when val/acc improves, written with last.ckpt
    # Both save at the epoch's end in list order: best first, so that last.ckpt holds best's state after this
    # epoch's comparison (a resume would otherwise compare against the previous epoch's best score).
    checkpoints = [best, last]
    trainer_kwargs = {k: config[k] for k in ("limit_train_batches", "limit_val_batches") if config[k] is not None}
    warn = lambda text: echo(text, file=sys.stderr, flush=True)  # noqa: E731 - a recipe's warning line
    extra_callbacks = list(callbacks or [])
    if config["eval_every"]:
        extra_callbacks.append(CounterfactualEvaluation(int(config["eval_every"])))
    epoch_lines = wants_epoch_lines(config["progress"])  # a log file or a pipe: no redrawn bars
    if epoch_lines:
        extra_callbacks.append(EpochLines(echo))
    trainer = L.Trainer(max_epochs=config["max_epochs"], accelerator=config["accelerator"], devices=config["devices"],
                        num_nodes=config["num_nodes"], strategy=config["strategy"], logger=logger,
                        callbacks=[EpochSeed(config["seed"]), EpochMetricsInCheckpoint(), *checkpoints,
                                   BurnIn(config["burnin"]), ConvergenceWatch(echo=warn),
                                   *extra_callbacks], deterministic=False,
                        enable_progress_bar=config["progress"] and not epoch_lines,
                        enable_model_summary=config["progress"],
                        fast_dev_run=config["fast_dev_run"], log_every_n_steps=1, plugins=[AtomicCheckpointIO()],
                        **trainer_kwargs)
    _choose_epoch_loop(config, trainer, module, datamodule)
    module.log_epochs_directly(True)  # where it applies: one process, EpochStepMLFlowLogger (see its docstring)
    started = time.perf_counter()
    with warnings.catch_warnings():
        if resume_from is not None or not earlier_files:  # the run's own folder: its checkpoints, its config.json
            warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty")
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        except OSError as error:
            raise _unwritable(error, config, last, run_id) from None
    fit_seconds = time.perf_counter() - started
    stopper = next((c for c in trainer.callbacks if isinstance(c, StopOnSignal)), None)
    interrupted = stopper.stopped(trainer) if stopper else None
    if interrupted is not None:
        interrupted.checkpoint = last.best_model_path or None
        raise interrupted
    if trainer.interrupted:
        raise KeyboardInterrupt("training interrupted")
    if config["limit_train_batches"] == 0:  # Lightning's fit skips validation too when it trains no batch
        trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = _scalar_metrics(trainer.callback_metrics)
    trainer.test(module, datamodule=datamodule, verbose=False)
    metrics.update(_scalar_metrics(trainer.callback_metrics))
    metrics["fit_seconds"] = fit_seconds
    metrics["epochs"] = trainer.current_epoch

    if client is None:
        return {"run_id": None, "metrics": metrics, "rank": trainer.global_rank}
    summary = {
        "run_id": run_id, "run_name": run_name, "experiment_id": experiment_id,
        "tracking_uri": config["tracking_uri"], "config": config, "data": datamodule.summary(), "metrics": metrics,
        "checkpoints": {"last": last.best_model_path or None, "best": best.best_model_path or None},
    }
    example = explain_example(datamodule)
    if example:  # a table: the next step, explaining one of its decisions, as a command that runs as printed
        summary["explain_command"] = recipe_command("explain", ["--run-id", run_id, "--tracking-uri",
                                                                config["tracking_uri"], "--row",
                                                                json.dumps(example, ensure_ascii=False)])
    client.log_metric(run_id, "fit_seconds", fit_seconds)
    weights = save_network_weights(module.model, config["checkpoint_dir"])  # --model-inputs: for your own pipeline
    if weights is not None:
        summary["model_weights"] = str(weights)
    for path in (set(summary["checkpoints"].values()) | {summary.get("model_weights")}) - {None, ""}:
        client.log_artifact(run_id, path, artifact_path="checkpoints")
    if shared_store(config["tracking_uri"]) and summary["checkpoints"]["last"]:  # --resume extends it anywhere
        record_upload(client, run_id, Path(summary["checkpoints"]["last"]))
    ended = False
    if server_writable(client):  # a server that went away during training is asked once more, its outbox sent
        try:
            summary["models"] = log_models(client, config["tracking_uri"], experiment_id, run_id, module, datamodule,
                                           config, metrics, mutability_spec(config, datamodule) or None)
            summary["plots"] = log_training_plots(client, run_id, module, datamodule)
            ended = True
        except Exception as error:
            if not (isinstance(client, OutboxClient) and is_outage(error)):
                raise
            client.went_offline(error)
    if ended:
        client.set_terminated(run_id, "FINISHED")  # kept in the outbox if the server went away just now
    else:  # the models, the plots and FINISHED wait, with the final weights, for the upload command
        client.defer_end(run_id, experiment_id, config, metrics, module)
    pending = pending_upload(client)
    if pending:
        summary["tracking"] = pending
        echo(f"warning: tracking server {config['tracking_uri']} unreachable at the end of training: run {run_id} "
             f"is trained (checkpoints in {config['checkpoint_dir']}) but not complete on the server; "
             f"{pending['records']} record(s) wait in {pending['outbox']}; send them and end the run with:\n  "
             f"{pending['command']}", file=sys.stderr, flush=True)
    if config["summary_json"]:
        write_json_atomic(config["summary_json"], summary)
    return summary


def _unwritable(error: OSError, config: dict, last: ModelCheckpoint, run_id: str | None) -> OSError:
    """A one-line error for a checkpoint folder that became unwritable or full during training."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS):
        return error
    good = last.best_model_path or None
    kept = f"the last good checkpoint {good} is intact" if good else "no checkpoint was written yet"
    hint = f"; free space or fix the folder, then resume with: {resume_command(run_id, config['tracking_uri'], config['experiment'])}" \
        if run_id and good else ""
    unwritable = OSError(f"checkpoint_dir: cannot write a checkpoint in {config['checkpoint_dir']} "
                         f"({error.strerror or error}); {kept}{hint}")
    unwritable.errno = error.errno
    return unwritable


def result_lines(summary: dict) -> list[str]:
    """What the training reached (test and validation accuracy after its epochs) and where its checkpoints are."""
    metrics = summary.get("metrics") or {}
    scores = [f"{label} {metrics[key]:.3f}" for key, label in (("test/acc", "test accuracy"),
                                                                 ("val/acc", "validation accuracy"))
              if isinstance(metrics.get(key), (int, float))]
    lines = []
    if scores:
        epochs = metrics.get("epochs")
        lines.append("result" + (f" after {int(epochs)} epoch(s)" if epochs else "") + ": " + ", ".join(scores))
    majority = max((summary.get("data") or {}).get("class_balance") or [1.0])
    if isinstance(metrics.get("test/acc"), (int, float)) and metrics["test/acc"] <= majority + _share_slack(summary) \
            and majority < 1.0:
        # a runaway model is still logged and registered: the user decides, but must not miss it
        config = summary.get("config") or {}
        rare = ", or, for a rare class, --balance undersample" if is_table_file(config.get("data")) and \
            config.get("balance", "none") == "none" else ""
        lines.append(f"warning: test accuracy {metrics['test/acc']:.3f} is no better than always predicting the most "
                     f"frequent class ({majority:.3f} of the training rows): train longer{rare}, or check the data and, "
                     "for a model of your own, its --model-inputs (inputs in its order, \"outputs\" in its order)")
    fell = fine_tuning_note(summary)
    if fell:
        lines.append(fell)
    saved = {k: v for k, v in (summary.get("checkpoints") or {}).items() if v}
    if saved:
        lines.append("checkpoints: " + ", ".join(f"{k} {v}" for k, v in saved.items()))
    if summary.get("model_weights"):
        untrained = (summary.get("config") or {}).get("limit_train_batches") in (0, 0.0)  # the model logged as it is
        when = "as loaded (nothing was trained)" if untrained else "after training"
        lines.append(f"your network's weights {when}, without the input layer (load them into your own model, "
                     f"which reads your own encoding): {summary['model_weights']}")
    return lines


LOADED_METRIC = "loaded/val_acc"  # a fine-tuning's validation accuracy as loaded, before any training (MLflow)
FELL = 0.05  # a CT fine-tuning whose validation accuracy ends this far below the loaded model's gets a note


def fine_tuning_note(summary: dict) -> str | None:
    """After a CT fine-tuning whose validation accuracy ended :data:`FELL` or more below the model's as loaded, a note
    on why and what to try; ``None`` otherwise. CT's penalties first reshape the logits of a confident model (its
    ridge term started at 32 against a classification loss of 0.3): on a one-logit MLP of a 1 000-row lending table,
    0.713 as loaded ended at 0.613 after 5 epochs at the defaults, 0.707 at --lr 1e-4, 0.687 after 20 epochs."""
    config, metrics = summary.get("config") or {}, summary.get("metrics") or {}
    loaded, ended = summary.get("loaded_val_acc"), metrics.get("val/acc")
    if not isinstance(loaded, float) or not isinstance(ended, (int, float)) or loaded - ended < FELL \
            or config.get("objective") == "vanilla" or config.get("limit_train_batches") in (0, 0.0):
        return None
    lr = config.get("lr")
    lower = f" (e.g. {lr / 10:g}; it is {lr:g})" if isinstance(lr, (int, float)) else ""
    return (f"note: validation accuracy fell from {loaded:.3f} as loaded to {ended:.3f}: CT's penalties reshape the "
            f"logits of a model trained without them, most in the first epochs (the ridge term, λ_reg "
            f"{config.get('lambda_reg')}, grows with their square); to keep more of it try a lower --lr{lower}, "
            f"a smaller --lambda-reg or more --max-epochs, and --objective vanilla for what fine-tuning alone costs "
            f"(docs/guide.md, \"Fine-tune a model you already have\")")


def explain_example(datamodule) -> dict | None:
    """A test row of a table in its own units, for the explain command shown after training: a user's table's row as
    the file gives it, else a built-in table's first test row decoded by its codec (to 6 significant digits);
    ``None`` for data without a codec (circles, MNIST)."""
    if hasattr(datamodule, "example_row"):
        return datamodule.example_row()
    codec = getattr(datamodule, "codec", None)
    if codec is None or not hasattr(codec, "decode"):
        return None
    from datamodules.codec import _plain  # noqa: PLC0415 - numpy scalars as JSON keeps them

    row = example_rows(codec, datamodule.x_test, 1).iloc[0].to_dict()
    return {k: float(f"{v:.6g}") if isinstance(v, float) else _plain(v) for k, v in row.items()}


def _share_slack(summary: dict) -> float:
    """How far a test accuracy may lie above the training rows' majority share and still be that of always predicting
    the majority class: the test split's shares differ from the training rows' by the rounding of each class's rows
    (up to a row per class), the logged accuracy is a float32 (0.97 reads 0.9700000286) and the share is rounded to
    four decimals."""
    data = summary.get("data") or {}
    return data["n_classes"] / data["n_test"] if data.get("n_test") and data.get("n_classes") else 1e-4


def registered_lines(summary: dict) -> list[str]:
    """The registered predictor's name and version, how to load it and the command that serves it (none if the run
    registered none)."""
    models = summary.get("models") or {}
    if not (models.get("registered") and models.get("version")):
        return []
    return [f"registered model {registered_text(models['registered'], models['version'], summary['tracking_uri'])}"]


def announce(summary: dict) -> str:
    """Human-readable lines naming the run and how to look at it (a server's own UI, or the command that opens
    the UI on a local store), and the upload command when the run's end waits for its server."""
    lines = [*result_lines(summary), *registered_lines(summary), f"MLflow run id: {summary['run_id']}",
             *run_links(summary["tracking_uri"], summary["experiment_id"], summary["run_id"])]
    if summary.get("explain_command"):
        lines.append(f"Explain a decision in the table's own units (its first test row; --rows FILE.csv for many):\n"
                     f"  {summary['explain_command']}")
    pending = summary.get("tracking")
    if pending:
        lines.append(f"Pending upload ({pending['records']} record(s) in {pending['outbox']}); once the server "
                     f"answers, run:  {pending['command']}")
    return "\n".join(lines)
