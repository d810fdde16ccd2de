"""The training settings: defaults, command-line options, validation and CTModule's arguments.

Each :class:`Setting` says its default, type, help, command-line group and allowed values. From the
settings come ``DEFAULTS``, the options of ``recipes/train.py`` (:func:`options.add_arguments`), the checks of
:func:`validate_config` and the keyword arguments of ``CTModule`` (:func:`module_kwargs`). A setting has
one home: a ``CTModule`` argument annotated ``Annotated[type, {"help": ..., "group": ..., bounds}]`` is one
(its default and option are read from ``CTModule``'s source by ``catalogue.module_options``, without
importing torch); every other setting (data, trainer, tracking) is a row of ``TABLE`` below. The
per-data-set values of SPEC Table 2 (``tau``, ``nce``, ``lambda_reg``, ``batch_size``) come from the data
module classes (``ct_defaults``, ``default_batch_size``), their one source; ``configs/*.yaml`` are checked
against them.

A new setting is one edit (plus its use where it acts): an annotated ``CTModule`` argument, or a row here.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.configuration.store import DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI
from ct_lightning.experiment.configuration.validation import BATCHES_ALLOWED, NO_TRAINING, InputError, Rule

TABLE_FILE = "a .csv/.tsv/.txt/.parquet/.xlsx/.xlsm file"
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
EPOCH_LOOPS = ("auto", "fused", "lightning")


def csv_ints(text: str) -> list[int]:
    """``"64,64"`` → ``[64, 64]``."""
    return [int(part) for part in text.split(",") if part.strip()]


def batch_limit(text: str) -> int | float:
    """``--limit-*-batches`` text: ``"5"`` → 5 batches, ``"0.25"`` → a share (checked by the ``batches`` rule)."""
    value = float(text)
    return int(value) if value.is_integer() else value


def csv_floats(text: str) -> list[float]:
    """``"0.1,0.5,1"`` → ``[0.1, 0.5, 1.0]``."""
    return [float(part) for part in text.split(",") if part.strip()]


def csv_names(value) -> list[str]:
    """``"age, sex"`` (or a list) → ``["age", "sex"]``; empty or ``None`` → ``[]``."""
    if not value:
        return []
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else list(value)


TABLE_KEYS = ("target", "data_spec", "impute", "drop_columns", "balance")  # the settings that read a table file


def table_options(settings) -> dict[str, Any]:
    """The keyword arguments of :class:`datamodules.table.TableDataModule` that a run's settings give (a config
    dict or a recipe's parsed arguments): the one place that maps the table settings onto the data module."""
    get = settings.get if isinstance(settings, dict) else lambda name: getattr(settings, name, None)
    return {"target": get("target"), "spec": get("data_spec"), "impute": get("impute") or "none",
            "drop_columns": csv_names(get("drop_columns")), "balance": get("balance") or "none"}


def datasets_and_aliases() -> list[str]:
    """Every accepted ``--data`` value: canonical names, then aliases."""
    names = catalogue.available_datasets()
    return names + sorted(set(catalogue.datasets()) - set(names))


def lightning_devices(text):
    """Lightning's ``devices``: ``"auto"``, a count (``"2"``, ``"-1"`` for all) or indices (``"0,2"``)."""
    if isinstance(text, (int, list)):
        return text
    text = str(text).strip()
    if text == "auto":
        return text
    try:
        return [int(p) for p in text.split(",") if p.strip()] if "," in text else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"devices: {text!r} is not auto, a count or comma-separated indices") from None


def lightning_strategies() -> list[str]:
    """The strategy names Lightning knows (``auto``, ``ddp``, ``ddp_spawn``, ``fsdp``, ...)."""
    from lightning.pytorch.strategies import StrategyRegistry

    return ["auto", *sorted(StrategyRegistry.available_strategies())]


@dataclass(frozen=True)
class Setting:
    """One training setting: its default, how the command line reads it and which values it allows.

    ``module``: a ``CTModule`` argument, passed under the same name (made by :func:`module_setting`).
    ``table2``: the data set's SPEC Table 2 value replaces the default. ``choices`` may be a callable
    (evaluated when needed, e.g. the registered generators). ``low``/``high`` bound numbers, open
    at that end when ``low_open``/``high_open``. ``flag``/``action``/``nargs``/``const``/``metavar``
    shape the command-line option; ``group`` names its section in ``--help`` (``None``: not an option).

    The setting's role: ``defines`` (part of what defines the experiment: the key by which a reproduction reuses a
    training), ``run_only`` (where one run writes or how it shows itself: never in the logged configuration; implies
    not ``defines``) and ``on_resume`` (may be given with ``--resume``, and then applies to the resumed training).
    """

    name: str
    default: Any = None
    help: str = ""
    type: Callable | None = None
    group: str | None = "tracking and output"
    module: bool = False
    table2: bool = False
    choices: Any = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    flag: str | None = None
    action: str | None = None
    nargs: str | None = None
    const: Any = None
    metavar: str | None = None
    defines: bool = True
    run_only: bool = False
    on_resume: bool = False

    def __post_init__(self):
        if self.run_only and self.defines:
            object.__setattr__(self, "defines", False)  # a run-only setting never defines the experiment

    @property
    def value(self) -> Any:
        """The default value (sequences become lists)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default

    @property
    def option(self) -> str:
        """The command-line option as typed (``--max-epochs``)."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def rule(self) -> Rule:
        """The :class:`Rule` of allowed values (kind from ``type``/``action``, bounds, choices)."""
        kind = {int: "int", float: "float", csv_ints: "ints", csv_floats: "floats",
                batch_limit: "batches"}.get(self.type, "str")
        if self.action in ("store_true", "store_false"):
            kind = "bool"
        elif self.name in ("immutable", "drop_columns"):
            kind = "names"
        elif self.name == "model_inputs":
            kind = "inputs"
        return Rule(kind, self.low, self.high, self.low_open, self.high_open, self.choices,
                    nonempty=self.name in ("tracking_uri", "experiment", "data"))

    def allowed(self) -> list | None:
        """The allowed values, if the setting has a fixed list."""
        return self.rule.options()

    def describe_allowed(self) -> str:
        """The allowed values or range in words, for error messages."""
        return self.rule.describe()

    def checked(self, value, option: str | None = None):
        """``value`` converted to the setting's kind if allowed, else :class:`InputError` naming ``option``."""
        option = self.name if option is None else option
        value = self.rule.check(value, option)
        if value is not None and self.name in EXTRA_CHECKS:
            EXTRA_CHECKS[self.name](value, option)
        if self.name == "data" and catalogue.canonical_dataset(value) is not None:
            value = value.lower()  # data set names are case-insensitive; file paths keep their case
        if self.name == "registered_model" and value is not None and value.lower() == "none":
            value = "none"  # the logged param of an unset name reads "None"
        return value

    def check(self, value) -> str | None:
        """``None`` if ``value`` is allowed (``None`` always is: unset), else the one-line error."""
        try:
            self.checked(value)
        except ValueError as error:
            return str(error)
        return None


def _check_mutability(value, option: str) -> None:
    kinds = catalogue.mutability_kinds()
    allowed = f"FEATURE=KIND,... with KIND one of {', '.join(kinds)}"
    for item in filter(None, (part.strip() for part in str(value).split(","))):
        feature, _, kind = item.rpartition("=")
        if not feature.strip():
            raise InputError(option, value, allowed, f"{item!r} is not FEATURE=KIND")
        if kind.strip() not in kinds:  # the feature is fine: name the kind that is not
            from datamodules.suggest import did_you_mean  # noqa: PLC0415

            raise InputError(option, value, allowed,
                             f"{kind.strip()!r} is no kind{did_you_mean(kind.strip(), kinds)}, in {item!r}")


def _check_model(value, option: str) -> None:
    if value not in ("mlp", "cnn") and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        raise InputError(option, value, "mlp, cnn or package.module:factory")


REGISTERED_NAME = "a name of letters, digits, '.', '_' and '-' (e.g. loans-approval-ct), or none (register nothing)"


def _check_registered_model(value, option: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*", value):  # MLflow refuses '/' and ':'; quotes break its filters
        raise InputError(option, value, REGISTERED_NAME)


def _check_generator_options(value, option: str) -> None:
    try:
        parse_generator_options(value)
    except ValueError as error:
        raise InputError(option, value, "KEY=VALUE,... or a JSON object", str(error).split(": ", 1)[-1]) from None


def is_table_file(value) -> bool:
    """Whether a ``--data`` value names a table file (``datamodules.table.TABLE_SUFFIXES``, read from its source
    when first needed: the package is not imported here; a workbook perhaps with its ``#sheet``) instead of a data
    set."""
    from datamodules.workbook import table_file  # noqa: PLC0415 - plain Python

    return isinstance(value, str) and Path(table_file(value)).suffix.lower() in _table_suffixes()


@functools.cache
def _table_suffixes() -> tuple[str, ...]:
    return tuple(catalogue.constant("datamodules.table", "TABLE_SUFFIXES"))


def is_factory(value) -> bool:
    """Whether a ``--data`` value names a data-module class as ``package.module:Class``."""
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value) is not None


def _check_data(value, option: str) -> None:
    if catalogue.canonical_dataset(value) is not None or is_factory(value):
        return
    from datamodules.suggest import path_hint  # noqa: PLC0415 - plain Python
    from datamodules.workbook import OLD_EXCEL_FIX, is_old_excel, table_file  # noqa: PLC0415 - plain Python

    allowed = f"{', '.join(datasets_and_aliases())}, {TABLE_FILE}, or package.module:Class"
    if is_table_file(value):
        if not Path(table_file(value)).is_file():
            raise InputError(option, value, allowed, f"file not found{path_hint(table_file(value), '; {}')}")
        return
    if is_old_excel(value):  # pandas reads it with xlrd, which is not installed
        raise InputError(option, value, OLD_EXCEL_FIX, "an old binary Excel workbook (.xls)")
    raise InputError(option, value, allowed, path_hint(value, "{}"))  # loans.cvs: the file it probably means


def _check_data_spec(value, option: str) -> None:
    from datamodules.suggest import path_hint  # noqa: PLC0415 - plain Python

    if not Path(str(value)).is_file():
        raise InputError(option, value, "a YAML file", f"file not found{path_hint(value, '; {}')}")


def _check_model_inputs(value, option: str) -> None:
    """The inputs file reads and each entry has a form (what it names is checked against the table later)."""
    from ct_lightning.model_inputs import OPTION, read_model_inputs  # noqa: PLC0415 - neither torch nor pandas

    try:
        read_model_inputs(value)
    except ValueError as error:
        raise ValueError(option + str(error).removeprefix(OPTION)) from None


EXTRA_CHECKS: dict[str, Callable[[Any, str], None]] = {
    "data": _check_data, "data_spec": _check_data_spec, "model_inputs": _check_model_inputs,
    "mutability": _check_mutability, "model": _check_model,
    "generator_options": _check_generator_options, "registered_model": _check_registered_model}


DATA, CT, SEARCH, MODEL, START, TRACK = ("data", "counterfactual training", "counterfactual search",
                                         "model and optimiser", "fine-tuning and resuming", "tracking and output")

TABLE: tuple[Setting, ...] = (
    Setting("config", None, "YAML file with any of these options (long names, e.g. max_epochs: 50)", group="",
            run_only=True),
    # data
    Setting("data", "circles", "data set: {AVAILABLE}; or your own table, a .csv (.tsv, .txt: any delimiter), .parquet or .xlsx (.xlsm) file (with --target; a "
            "workbook of several sheets: book.xlsx#SHEET), "
            "or package.module:Class (a TensorDataModule subclass) (default {DFLT})", group=DATA),
    Setting("target", None, "table files: the column to predict (the class label)", group=DATA),
    Setting("data_spec", None, "table files: a YAML file describing the columns (kind continuous|integer|"
            "categorical|binary|ordinal, mutability, lower, upper, order) and the positive class; default: kinds inferred from the "
            "dtypes", group=DATA),
    Setting("impute", "none", "table files: missing values are an error (none), drop those rows (drop), or are "
            "filled from the training rows: median / most frequent value (median) (default {DFLT})", group=DATA,
            choices=("none", "drop", "median")),
    Setting("balance", "none", "table files: keep every row (none), or cut every class to the size of the smallest "
            "by random under-sampling before the split (undersample), as the paper does for Credit and GMSC; for a "
            "rare class (defaults, fraud) that the model would otherwise never predict (default {DFLT})", group=DATA,
            choices=("none", "undersample")),
    Setting("drop_columns", [], "table files: comma-separated columns that are no features (identifiers, free "
            "text, leaked outcomes), e.g. applicant_id,notes: left out of training; rows to explain or serve may "
            "still carry them", group=DATA),
    Setting("data_dir", None, "folder with the raw data files (default: $CT_DATA_DIR, else the user cache)", group=DATA,
            defines=False, on_resume=True),
    Setting("batch_size", None, "training batch size [Table 2]", int, DATA, table2=True, low=1),
    Setting("center_distance", None, "blob data sets (ls, ol) only: move the two default centres along the line "
            "through them, about their midpoint, to this distance (sensitivity studies; default: the data set's "
            "random centres)", float, DATA, low=0.0, low_open=True),
    # counterfactual training
    Setting("max_epochs", 100, "training epochs (default {DFLT})", int, CT, low=1, on_resume=True),
    Setting("burnin", 0.0, "share of epochs trained conventionally before CT starts, in [0, 1) (default {DFLT})",
            float, CT, low=0.0, high=1.0, high_open=True),
    # counterfactual search
    Setting("immutable", [], "comma-separated feature names that must not change, e.g. age,sex (compare.py: a "
            "table's protected columns, immutable in the actionability pair only)", group=SEARCH),
    Setting("protect", False, "make the data set's default protected features immutable", group=SEARCH,
            action="store_true"),
    Setting("mutability", "", "per-feature constraints FEATURE=KIND,... with KIND in "
            + "|".join(catalogue.mutability_kinds()), group=SEARCH),
    Setting("domain", True, "do not project counterfactuals onto the data domain", group=SEARCH, flag="--no-domain",
            action="store_false"),
    Setting("search_compile", "auto", "compile the search step after the backward pass into one kernel with "
            "torch.compile (same results) where the search runs its PyTorch loop (on a CPU Generic and ECCo run "
            "their loop natively, see docs/guide.md): on, off, or auto: only for large pools (rows x features; MNIST "
            "and Adult at the paper's nce), where it pays off; on a GPU only when the run's searches repay the compilation "
            "(default {DFLT})", group=SEARCH,
            choices=catalogue.search_compile_modes, defines=False, on_resume=True),
    # model and optimiser
    Setting("model", "mlp", "mlp, cnn (LeNet-style, for MNIST) or package.module:factory returning an nn.Module "
            "(called with n_features, n_classes if it takes them) (default {DFLT})", group=MODEL),
    Setting("accelerator", "auto", "Lightning accelerator: auto, cpu, gpu, cuda, mps (default {DFLT})", group=MODEL,
            choices=ACCELERATORS, defines=False, on_resume=True),
    Setting("threads", None, "torch intra-op threads: default 1 for the paper's small MLPs (more threads only "
            "fight other processes), torch's own choice for --model cnn or a GPU; 0 = torch's default",
            int, MODEL, low=0, metavar="N", defines=False, on_resume=True),
    Setting("cpu_math", "native", "native: the CPU's fastest kernels (results differ in the last bits between "
            "CPUs, e.g. AVX-512 and AVX2, Intel and AMD, and training amplifies that); portable: the same arithmetic "
            "on any x86 CPU (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE, set before torch starts) "
            "(default {DFLT})", group=MODEL, choices=("native", "portable")),
    Setting("epoch_loop", "auto", "fused: run each epoch's optimisation steps inside one Lightning step (same "
            "results, without Lightning's per-step hooks; one process only); lightning: one Lightning step per "
            "batch; auto: fused where it applies (default {DFLT})", group=MODEL, choices=EPOCH_LOOPS,
            defines=False, on_resume=True),
    # scaling out (Lightning's meanings; see README "Scaling out")
    Setting("devices", "auto", "Lightning devices per node: auto, a count (-1: all) or indices like 0,1 "
            "(default {DFLT})", lightning_devices, MODEL, metavar="DEVICES", on_resume=True),
    Setting("num_nodes", 1, "Lightning num_nodes: machines taking part in DDP (default {DFLT})", int, MODEL, low=1),
    Setting("strategy", "auto", "Lightning strategy, e.g. ddp, ddp_spawn, fsdp (default {DFLT})", group=MODEL,
            choices=lightning_strategies, metavar="STRATEGY", on_resume=True),
    # fine-tuning and resuming
    Setting("from_checkpoint", None, "start from these weights: a checkpoint of this project, a state_dict of the "
            "default MLP, weights for --model, or an MLflow model runs:/RUN_ID/model or models:/NAME/VERSION",
            group=START),
    Setting("model_inputs", None, "table files: a JSON file listing, in order, the inputs the model of "
            "--from-checkpoint (evaluate.py: --checkpoint) was trained on, as your own preprocessing made them from "
            "the table's columns: "
            '{"feature": F, "center": C, "scale": S} (a number: (value - C) / S), {"feature": F, "category": V} '
            '(a one-hot column) or {"feature": F, "codes": {V: CODE, ...}}; a frozen layer maps ct-lightning\'s '
            "encoding onto them, and the trained network's own weights are written beside the checkpoints "
            "(model-weights.pt). Or the object {\"inputs\": [that list], \"outputs\": [the class of each output, "
            "in the model's order]} for outputs in another order than ct-lightning's, or one output unit (a single "
            "logit: [negative, positive]). Written by ct_lightning.model_inputs.model_inputs_from_sklearn (default: "
            "the model reads ct-lightning's encoding: numbers standardised, categories one-hot, in the table's column "
            "order, and returns its classes in its order)",
            group=START, metavar="FILE"),
    Setting("resume", None, "continue an interrupted run (default: the newest unfinished run of --experiment that has "
            "a checkpoint; runs killed before their first epoch ended are skipped) from its last epoch-end "
            "checkpoint, in the same MLflow run, with its logged configuration; the result is bit-identical to an "
            "uninterrupted run. With --max-epochs N the run is extended to N epochs in total (N must exceed the "
            "epochs already trained); other training options cannot change", group=START, nargs="?",
            const="latest", metavar="RUN_ID", run_only=True, on_resume=True),
    # tracking and output
    Setting("tracking_uri", DEFAULT_TRACKING_URI, "MLflow tracking URI (default {DFLT})", defines=False, on_resume=True),
    Setting("experiment", DEFAULT_EXPERIMENT, "MLflow experiment name (default {DFLT})", defines=False, on_resume=True),
    Setting("run_name", None, "MLflow run name (default: one that describes the run: DATA-OBJECTIVE-GENERATOR-sSEED-"
            "SHORTID for a training (no GENERATOR for vanilla), generator-VARIANT, consistency-DATA-MODE)", run_only=True),
    Setting("registered_model", None, "register the run's predictor in MLflow's model registry under this name, so "
            "that two models of one table (another target, another product) do not share one name's versions "
            "(default: ct-DATA-ROLE, e.g. ct-loans-ct; none: register nothing; a sweep: its best trial)",
            defines=False, on_resume=True),
    Setting("checkpoint_dir", None, "checkpoint folder (default: checkpoints/RUN_ID beside a local SQLite store, "
            "one per run); a folder that already holds files is refused unless --overwrite", run_only=True),
    Setting("summary_json", None, "write the summary here as JSON: run ids, settings and results (compare.py: default "
            "OUT_DIR/summary.json); train.py refuses an existing file unless --overwrite", run_only=True,
            on_resume=True),
    Setting("overwrite", False, "allow outputs to replace existing files: --summary-json and --checkpoint-dir "
            "(train.py), --json, --csv and --letters (explain.py), --summary-json and an --out-dir holding an earlier "
            "evaluation's summary.json or plots (evaluate.py), --summary-json (consistency.py, train_generator.py)",
            action="store_true", run_only=True, on_resume=True),
    Setting("checkpoint_seconds", 2.0, "write last.ckpt (and send the epochs' metrics to MLflow) at an epoch's end at "
            "most every SECONDS: always after the first and the last epoch and when a signal stops the run; a killed run "
            "loses at most that much training, and resumes bit-identical from the checkpoint. 0: every epoch (default "
            "{DFLT})", float, low=0.0, run_only=True, on_resume=True, metavar="SECONDS"),
    Setting("progress", True, "hide the progress bar", flag="--no-progress", action="store_false", run_only=True,
            on_resume=True),
    Setting("verbose", False, "also show Lightning's INFO lines and library warnings (hidden by default)",
            action="store_true", run_only=True, on_resume=True),
    Setting("limit_train_batches", None, "Lightning limit_train_batches, for quick runs: a whole number of training "
            "batches per epoch (≥ 1) or a share of them (0 < share ≤ 1); 0 with --from-checkpoint: no training, "
            "that model is validated and tested as it is", batch_limit, low=0.0),
    Setting("limit_val_batches", None, "Lightning limit_val_batches, for quick runs: a whole number of validation "
            "batches (≥ 1) or a share of them (0 < share ≤ 1)", batch_limit),
    Setting("fast_dev_run", False, "one batch of each loop, for smoke tests", action="store_true"),
    # > 0: CounterfactualEvaluation on the validation split every N epochs (val/ip, ...)
    Setting("eval_every", 0, "every N epochs, evaluate counterfactuals on the validation split and log val/ip, "
            "val/ip_star, val/cost, ... (default {DFLT}: off)", int, low=0),
)
GROUPS = ("", DATA, CT, SEARCH, MODEL, START, TRACK)  # the sections of --help, in this order
KINDS = {"int": int, "float": float, "str": None}


def module_setting(name: str, option: dict) -> Setting:
    """The setting of a ``CTModule`` argument from its option (:func:`catalogue.module_options`): the type from the
    annotation (a sequence default: comma-separated integers), ``choices`` naming a catalogue function."""
    option = dict(option)
    kind, default, choices = option.pop("type"), option.pop("default"), option.pop("choices", None)
    if option.get("group") not in GROUPS:
        raise ValueError(f"CTModule argument {name}: group must be one of {GROUPS}, got {option.get('group')!r}")
    kind = KINDS[kind] if kind in KINDS else csv_ints if isinstance(default, (tuple, list)) else None
    return Setting(name, default, type=kind, module=True, choices=getattr(catalogue, choices) if choices else None,
                   **option)


def in_group_order(settings) -> tuple[Setting, ...]:
    """``settings`` grouped as ``--help`` shows them (the table's rows first within a group)."""
    return tuple(sorted(settings, key=lambda setting: GROUPS.index(setting.group)))


SETTINGS: tuple[Setting, ...] = in_group_order(
    [*TABLE, *(module_setting(name, option) for name, option in catalogue.module_options().items())])
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}
# The roles of the rows, derived (one edit adds a setting whatever its role):
RUN_ONLY_KEYS = frozenset(s.name for s in SETTINGS if s.run_only)  # never in the logged configuration
NON_DEFINING_KEYS = frozenset(s.name for s in SETTINGS if not s.defines)  # not in a reproduction's training key
RESUME_OPTIONS = frozenset(s.name for s in SETTINGS if s.on_resume)  # may be given, and applies, with --resume
DEFAULTS: dict[str, Any] = {s.name: s.value for s in SETTINGS}
# Settings whose SPEC Table 2 value (the data module's ct_defaults) replaces the default.
DATA_DEFAULT_KEYS = tuple(s.name for s in SETTINGS if s.table2 and s.name != "batch_size")


def validate_config(config: dict, label: Callable[[str], str] | None = None) -> dict:
    """``config`` with each value checked and converted to its setting's kind.

    Raises :class:`InputError` (a ``ValueError``) naming the first setting whose value is not allowed:
    ``label(name)`` (default: the name), the value and the allowed values.
    """
    checked = dict(config)
    for name, value in config.items():
        setting = SETTINGS_BY_NAME.get(name)
        if setting is not None:
            checked[name] = setting.checked(value, label(name) if label else name)
    return checked


def command_line(settings: dict) -> list[str]:
    """The ``train.py`` options that give these settings (``{"lambda_reg": 0.25, "protect": True}`` →
    ``["--lambda-reg", "0.25", "--protect"]``), in ``--help``'s order: each setting's own option and form (a flag
    for a switch, lists comma-separated, a JSON object as JSON); ``None`` values are left out."""
    options = []
    for setting in SETTINGS:
        value = settings.get(setting.name)
        if value is None or setting.name not in settings:
            continue
        if setting.action in ("store_true", "store_false"):
            if bool(value) != (setting.action == "store_false"):  # the switch's flag changes the default
                options.append(setting.option)
            continue
        if isinstance(value, (list, tuple)):
            text = ",".join(map(str, value))
        elif isinstance(value, dict):
            text = json.dumps(value)
        else:
            text = str(value)
        options += [setting.option, text]
    return options


def data_class(data: str):
    """The data module class of ``data``: a registered name, a table file (``TableDataModule``) or
    ``package.module:Class`` (imports torch: not needed to check inputs)."""
    if is_table_file(data):
        from datamodules.table import TableDataModule  # noqa: PLC0415

        return TableDataModule
    if is_factory(data):
        import importlib  # noqa: PLC0415

        from datamodules import TensorDataModule  # noqa: PLC0415

        module_name, _, attribute = data.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise InputError("data", data, "package.module:Class of an importable TensorDataModule subclass",
                             str(error)) from None
        if not (isinstance(found, type) and issubclass(found, TensorDataModule)):
            raise InputError("data", data, "package.module:Class of a TensorDataModule subclass",
                             f"{attribute} is {type(found).__name__}")
        return found
    from datamodules import get_datamodule_class  # noqa: PLC0415

    return get_datamodule_class(data)


def table_key(data: str, settings) -> tuple:
    """What a table file's data module is made of: the file's content (:func:`datamodules.table_format.content_key`)
    and its table options (:func:`table_options`; a data spec file by its content, wherever it is named from)."""
    from datamodules.table_format import content_key  # noqa: PLC0415 - pandas

    options = table_options(settings)
    spec = options["spec"]
    if isinstance(spec, (str, Path)) and Path(spec).is_file():
        spec = content_key(spec)
    return (content_key(data), options["target"], repr(spec), options["impute"], tuple(options["drop_columns"]),
            options["balance"])


# A table's CT defaults by table_key: a command that resolves several trainings on one table (compare's roles,
# a sweep's trials) builds its data module once, not once per training
_CHOSEN: dict[tuple, dict] = {}


def table_module(data: str, settings, **kwargs):
    """A table file's data module, ``TableDataModule(data, **table_options(settings), **kwargs)``; fitted here (no
    ``codec``), its CT defaults are kept for :func:`table2`."""
    from datamodules.table import TableDataModule  # noqa: PLC0415

    module = TableDataModule(data, **table_options(settings), **kwargs)
    if kwargs.get("codec") is None:
        _CHOSEN[table_key(data, settings)] = module.ct_defaults
    return module


def table2(data: str, config: dict | None = None) -> dict[str, Any]:
    """The SPEC Table 2 values of a data set (``tau``, ``nce``, ``lambda_reg``, ``batch_size``); for a table
    file, the values chosen from its training split's size (:func:`datamodules.table.table_defaults`)."""
    if is_table_file(data):
        from datamodules.table import TableDataModule, table_defaults, train_rows  # noqa: PLC0415

        config = config or {}
        try:
            chosen = _CHOSEN.get(table_key(data, config)) or table_module(data, config).ct_defaults
        except ValueError:
            if not config.get("from_checkpoint"):
                raise
            # a fine-tuning reads the file with its model's own preprocessing (runs.kept_preprocessing), which takes
            # what a fresh fit refuses (a constant column the model does not read) or refuses it in its own words:
            # the defaults come from the file's size alone
            chosen = table_defaults(train_rows(data, config.get("target"), table_options(config).get("data_seed", 0)))
        return {**{k: v for k, v in chosen.items() if k in DATA_DEFAULT_KEYS}, "batch_size": chosen["batch_size"]}
    cls = data_class(data)
    return {**{k: v for k, v in cls.ct_defaults.items() if k in DATA_DEFAULT_KEYS}, "batch_size": cls.default_batch_size}


def resolve_config(overrides: dict) -> dict:
    """Fill a configuration: explicit values win, then the data set's Table 2 values, then SPEC defaults."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}; allowed: {', '.join(sorted(DEFAULTS))}")
    given = {k: v for k, v in overrides.items() if v is not None}
    given["data"] = SETTINGS_BY_NAME["data"].checked(given.get("data", DEFAULTS["data"]))
    data = catalogue.canonical_dataset(given["data"]) or given["data"]
    if is_table_file(data):
        from datamodules.workbook import resolved  # noqa: PLC0415 - plain Python

        data = resolved(data)  # the run's configuration names the file absolutely (a workbook's sheet kept)
    for name in ("model_inputs", "data_spec"):  # so that a run is evaluated and explained from any folder
        if isinstance(given.get(name), str):
            given[name] = str(Path(given[name]).resolve())
    config = {**DEFAULTS, **table2(data, {**DEFAULTS, **given}), **given, "data": data}
    for name in ("immutable", "drop_columns"):
        if isinstance(config[name], str):
            config[name] = csv_names(config[name])
    config = validate_config(config)
    check_combination(config)
    return config


def model_inputs_without_table(value, data) -> InputError:
    """The one-line refusal of ``model_inputs`` (``value``, as shown) for ``data`` that is no table file: the inputs
    are made from a table's columns."""
    return InputError("model_inputs", value, "a file with --data FILE.csv/.parquet/.xlsx --target COLUMN (the inputs "
                      "are made from a table's columns)", f"--data is {data}")


def check_combination(config: dict) -> None:
    """Refuse settings that are allowed alone but not together (``center_distance`` with data that is no blob set,
    a feature given two kinds by ``mutability`` and ``immutable`` or ``protect``,
    ``model_inputs`` without a table, 0 training batches without ``from_checkpoint``, the fused loop with a setting
    that rules it out). ``config``: every setting, checked (:func:`validate_config`); reads no data, so it also
    checks a configuration before its data is loaded."""
    data = catalogue.canonical_dataset(config["data"]) or config["data"]
    if config["center_distance"] is not None and not data_class(data).blob:
        from datamodules import available  # noqa: PLC0415

        blobs = ", ".join(name for name in available() if data_class(name).blob)
        raise ValueError(f"center_distance: {config['center_distance']!r} is not allowed for data {data!r}; "
                         f"allowed only for the blob data sets {blobs} (or unset)")
    if config["model_inputs"] is not None and not is_table_file(data):
        raise model_inputs_without_table(config["model_inputs"], data)
    if config["limit_train_batches"] == 0 and not config.get("from_checkpoint"):
        raise InputError("limit_train_batches", 0, f"{BATCHES_ALLOWED}, {NO_TRAINING}",
                         "no --from-checkpoint: the run would log the untrained initial weights")
    from ct_lightning.experiment.configuration.table_columns import named_features  # noqa: PLC0415 - a cycle

    named_features(config)  # a feature given two kinds (--mutability and --immutable), for any data
    if config.get("protect") and config.get("mutability"):  # --protect held them fixed and dropped the kind given
        from ct_lightning.feature_names import immutable_conflict, mutability_pairs  # noqa: PLC0415

        protected = getattr(data_class(data), "protected_features", ())
        conflict = immutable_conflict(protected, mutability_pairs(str(config["mutability"])),
                                      held_by=f"protected: --protect holds {', '.join(protected)} fixed")
        if conflict is not None:
            raise conflict
    blocker = fused_blocker(config)
    if config["epoch_loop"] == "fused" and blocker:
        raise ValueError(f"epoch_loop: 'fused' is not allowed with {blocker}; allowed: auto or lightning")


def fused_blocker(config: dict) -> str | None:
    """The setting that rules out the fused epoch loop (several processes, partial epochs), or ``None``."""
    if config.get("fast_dev_run"):
        return "fast_dev_run"
    limit = config.get("limit_train_batches")
    if limit is not None and not (isinstance(limit, float) and limit == 1.0):  # an int counts batches
        return f"limit_train_batches={config['limit_train_batches']}"
    if int(config.get("num_nodes") or 1) > 1:
        return f"num_nodes={config['num_nodes']}"
    devices = config.get("devices", "auto")
    if devices not in ("auto", 1, -1) and not (isinstance(devices, list) and len(devices) == 1):
        return f"devices={devices}"
    if any(name in str(config.get("strategy") or "auto") for name in ("ddp", "fsdp", "deepspeed")):
        return f"strategy={config['strategy']}"
    return None


def load_config_file(path: str | Path) -> dict:
    """Read a YAML (or JSON) configuration; keys are the long option names (``max_epochs`` or ``max-epochs``).

    Values are checked here, so a wrong type (``max_epochs: "ten"``) is an error naming the file and key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config: no file at {path}")
    from datamodules.yaml_file import load_yaml, yaml_problem  # noqa: PLC0415 - the package loads its registry

    try:
        content = load_yaml(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise InputError("config", str(path), "a YAML file of option names and values",
                         f"not valid YAML: {yaml_problem(error)}") from None
    if not isinstance(content, dict):
        raise ValueError(f"config: {path} must hold a mapping of option names to values")
    content = {str(k).replace("-", "_"): v for k, v in content.items()}
    unknown = sorted(set(content) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config: unknown keys {unknown} in {path}; allowed: {', '.join(sorted(DEFAULTS))}")
    return validate_config(content, label=lambda name: f"config {path}: {name}")


def parse_generator_options(options) -> dict | None:
    """Generator settings from a mapping, a JSON object or ``key=value,...`` (values read as JSON if they can be)."""
    if not options:
        return None
    if isinstance(options, dict):
        return dict(options)
    text = str(options).strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"generator_options: invalid JSON {text!r} ({error})") from None
    parsed = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise ValueError(f"generator_options: expected KEY=VALUE, got {item!r}")
        key, value = (part.strip() for part in item.split("=", 1))
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def module_kwargs(config: dict, n_features: int, n_classes: int, feature_names: list[str],
                  mutability: dict | None) -> dict:
    """``CTModule`` keyword arguments of a resolved configuration: every module setting, plus the translated ones."""
    kwargs = {s.name: config[s.name] for s in SETTINGS if s.module}
    kwargs.update(n_features=n_features, n_classes=n_classes, hidden_sizes=list(config["hidden_sizes"]),
                  architecture=config["model"], generator_options=parse_generator_options(config["generator_options"]),
                  mutability=mutability, feature_names=list(feature_names),
                  domain="infer" if config["domain"] else None)
    return kwargs
