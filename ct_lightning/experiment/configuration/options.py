"""Command-line options from rows: every option that more than one recipe has is declared here, once.

The rows are the training settings (:data:`settings.SETTINGS`: ``recipes/train.py``'s options) and the
run-level options of the other recipes (:data:`RECIPE_OPTIONS`: which model to load, where outputs go, the
evaluation protocol...), which are not training settings (not in ``DEFAULTS``, never in a run's configuration).
A recipe declares its options with :func:`add_arguments` (``add_arguments(parser, ["tracking_uri", "seed"])``),
so an option has one flag, one type and check, one help text and one meaning in every recipe; a recipe may only
change its default (``seed=0``), which the help then shows. ``tests/test_recipes_thin.py`` checks it.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from ct_lightning.experiment.configuration import catalogue
from ct_lightning.experiment.configuration.settings import (SETTINGS, SETTINGS_BY_NAME, Setting, csv_floats, csv_ints,
                                                            csv_names, is_table_file)
from ct_lightning.experiment.configuration.validation import InputError
from ct_lightning.experiment.configuration.store import default_tracking_uri

PROTOCOL = "ct_lightning.evaluation.protocol"  # read without importing torch (see catalogue)
SOURCE, OUTPUT, EVAL = "model to load", "tracking and output", "evaluation protocol"

RECIPE_OPTIONS: tuple[Setting, ...] = (
    # the model a recipe loads (evaluate, explain, train_generator)
    Setting("run_id", None, "MLflow run of recipes/train.py: the model (its checkpoints/ and config.json artifacts); "
            "or a model it registered, as it prints it: models:/NAME/VERSION, models:/NAME@ALIAS, models:/NAME/latest "
            "(the run that logged that version)", group=SOURCE),
    Setting("checkpoint", None, "the model as a file: a checkpoint of recipes/train.py (its config.json beside it, "
            "else pass --data)", group=SOURCE),
    Setting("which", "last", "checkpoint of the run: last (end of training) or best val/acc (default {DFLT})",
            group=SOURCE, choices=("last", "best")),
    Setting("all_mutable", False, "ignore the mutability constraints the model was trained with (--immutable, "
            "--mutability, --protect); a table's data spec still holds: its mutability is a fact of the data",
            group=SOURCE, action="store_true"),
    # train.py's one action besides training
    Setting("write_data_spec", None, "table files: write the data spec the file gives (every column's kind and "
            "mutability, --data-spec, --immutable and --mutability merged in, each column's categories or range noted "
            "beside it) to this new YAML file, to edit and pass as --data-spec; nothing is trained", group=OUTPUT,
            metavar="PATH"),
    # how a recipe runs and where its outputs go
    Setting("data_sets", None, "data sets, comma-separated: {AVAILABLE}", group=OUTPUT, flag="--data",
            metavar="DATA"),
    Setting("jobs", 1, "worker processes: trainings or evaluations run at once (default {DFLT})", int, OUTPUT, low=1),
    Setting("stack", None, "appendix.py: CT trainings that differ only in penalty weights, tau, eta, lambda_cst or "
            "lambda_egy train up to STACK at a time as one stacked model (several times faster; on the CPU the "
            "same weights as lone trainings, on a GPU within rounding only); 1: each alone (default: 64 on the "
            "CPU, 1 on a machine with a GPU)", int, OUTPUT, low=1),
    Setting("out_dir", None, "folder of the outputs: tables, plots, results (default {DFLT})", group=OUTPUT),
    Setting("log", True, "do not log the results to the model's MLflow run", group=OUTPUT, flag="--no-log",
            action="store_false"),
    # the reproduction of Table 1 (compare)
    Setting("seeds", None, "several training seeds, comma-separated (e.g. 0,1,2,3,4): the reproduction runs once per "
            "seed (outputs in OUT_DIR/sSEED) and OUT_DIR gets the table over seeds", csv_ints, OUTPUT, low=0),
    Setting("n_seeds", None, "training seeds --seed, --seed+1, ..., --seed+N-1 (instead of --seeds)", int, OUTPUT,
            low=1),
    Setting("actionability", True, "skip the protected pair (no cost column)", group=OUTPUT,
            flag="--no-actionability", action="store_false"),
    Setting("n_boot", 100, "bootstrap rounds (default {DFLT})", int, OUTPUT, low=1),
    Setting("confidence", 0.99, "confidence of the interval (default {DFLT})", float, OUTPUT, low=0.0, high=1.0,
            low_open=True, high_open=True),
    Setting("statistic", None, "runs: per-run ratios and the quantile interval of per-run differences (the authors' "
            "code; default with --protocol reference; no * from fewer than 8 runs at 0.99); bootstrap: pooled per-sample bootstrap (the paper's text; "
            "default with --protocol paper)", group=OUTPUT, choices=("runs", "bootstrap")),
    # the evaluation protocol (evaluate, compare, appendix): unset values take the --protocol preset
    Setting("protocol", "reference", "reference: what the authors' code ran for Table 1 (η 0.1, λ_cst 0, ℓ1 IP, "
            "IP* length-scale 5, 100 runs, factuals balanced over predicted classes, τ 0.5 for the cost pair); paper: "
            "the values stated in the paper's text (η 0.25, λ_cst 0.001, ℓ2 IP, length-scale 0.5, 5 runs × 100) "
            "(default {DFLT})", group=EVAL, choices=lambda: list(catalogue.constant(PROTOCOL, "PROTOCOLS"))),
    Setting("n_individuals", None, "factuals per run (reference: 250 synthetic, 100 tabular, 25 MNIST; paper: 100)",
            int, EVAL, low=1),
    Setting("n_runs", None, "evaluation runs with different seeds (reference 100, paper 5)", int, EVAL, low=1),
    Setting("lambda_energies", tuple(catalogue.constant(PROTOCOL, "LAMBDA_ENERGIES")), "ECCo energy penalties of "
            "the evaluation, results averaged over them (default {DFLT})", csv_floats, EVAL, low=0.0,
            flag="--lambda-energy", metavar="LAMBDA_ENERGY"),
    Setting("eval_tau", None, "decision threshold τ (default 0.95; reference cost pair 0.5)", float, EVAL,
            low=0.0, high=1.0, low_open=True),
    Setting("eval_steps", 50, "maximum search steps T (default {DFLT})", int, EVAL, low=1),
    Setting("eval_lr", None, "SGD step size η of the search (reference 0.1, paper 0.25)", float, EVAL, low=0.0,
            low_open=True),
    Setting("eval_lambda_cost", None, "ℓ1 penalty λ_cst of the search (reference 0, paper 0.001)", float, EVAL,
            low=0.0),
    Setting("ip_norm", None, "p of the ℓp distance in IP (reference 1, paper 2)", float, EVAL, low=1.0),
    Setting("length_scale", None, "Gaussian kernel length-scale of IP* (reference 5, paper 0.5)", float, EVAL,
            low=0.0, low_open=True),
    Setting("eval_seed", 0, "seed of the first evaluation run (default {DFLT})", int, EVAL, low=0),
)
# A row's help in the one recipe that takes more than the row's own help says (which holds in every other recipe
# that has the row): (row, recipe) → that recipe's help. A recipe names itself to add_arguments (recipe="evaluate").
RECIPE_HELP: dict[tuple[str, str], str] = {
    ("checkpoint", "evaluate"): "the model as a file or an MLflow model: a checkpoint of recipes/train.py (its "
    "config.json beside it, else pass --data); or what train.py --from-checkpoint accepts: a plain state_dict (pass "
    "--data, and --model/--hidden-sizes where they cannot be inferred), runs:/RUN_ID/model (a run of train.py: "
    "read with that run's settings, as --run-id; no --data, --target or --model-inputs needed), "
    "models:/NAME/VERSION",
    ("checkpoint", "explain"): "the model as a file: a checkpoint of recipes/train.py (its config.json beside it, "
    "else pass --data); or an MLflow model: runs:/RUN_ID/model (read as --run-id RUN_ID, with that run's "
    "preprocessing and settings), models:/NAME/VERSION or models:/NAME@ALIAS (the run that logged that version)",
    ("data_sets", "compare"): "data sets, comma-separated: {AVAILABLE}, all, .csv/.tsv/.txt/.parquet/.xlsx/.xlsm files (with "
    "--target; a workbook's sheet: book.xlsx#SHEET) and package.module:Class (default with --bl-run-id/--ct-run-id...: the data the given runs were "
    "trained on)",
    ("data_sets", "appendix"): "data sets of the grid, comma-separated (of {AVAILABLE}; default: all the grid's)",
}
RECIPE_ROWS = {row.name: row for row in RECIPE_OPTIONS}
STORE = ("tracking_uri", "experiment")  # training settings whose default every other recipe uses as it is
ROWS: dict[str, Setting] = {**SETTINGS_BY_NAME, **RECIPE_ROWS}
# Flags that mean different things in different recipes (renaming one would break command lines): the only ones
# a recipe may declare apart from the rows, checked by tests/test_recipes_thin.py.
HOMONYMS = {
    "--data": "one data set (row data) or several, comma-separated (row data_sets: compare, appendix)",
    "--lambda-energy": "the training's energy penalty (row lambda_energy) or the evaluation's list (lambda_energies)",
    "--mode": "consistency: rs or loo retraining; sweep: maximise or minimise --metric",
    "--target": "a table's label column (row target); explain.py: the class to reach",
}


def shown(value: Any) -> str:
    """A default as the help shows it (``[64, 64]`` → ``64,64``)."""
    if isinstance(value, (list, tuple)):
        return ",".join(f"{item:g}" if isinstance(item, float) else str(item) for item in value)
    return str(value)


def help_text(setting: Setting, default: Any, overridden: bool, recipe: str | None = None) -> str:
    """The help of ``setting`` in a parser whose default is ``default``: ``{DFLT}`` filled in (an unset default
    drops the ``(default ...)`` note); a recipe's own default is named even where the row's text has no ``{DFLT}``.
    ``recipe``: the recipe's name, whose own help of the row (:data:`RECIPE_HELP`) replaces the row's."""
    text = RECIPE_HELP.get((setting.name, recipe), setting.help)
    if default is None:
        text = re.sub(r" ?\((?:SPEC )?default \{DFLT\}[^)]*\)", "", text)
    elif overridden and "{DFLT}" not in text and default is not False:
        text += f" (default {shown(default)})"
    elif overridden:
        text = text.replace("SPEC default {DFLT}", "default {DFLT}")  # the recipe's own default, not SPEC's
    text = text.replace("{DFLT}", shown(default)).replace("%", "%%")
    return text.replace("{AVAILABLE}", ", ".join(catalogue.available_datasets()))


def argtype(setting: Setting):
    """An argparse ``type`` that converts and checks a value as the row does (:meth:`Setting.checked`), but for the
    existence of a named file (a ``--data`` table, ``--data-spec``, ``--model-inputs``), which the recipe checks before its work."""

    def convert(text: str) -> Any:
        try:
            if setting.name == "drop_columns" and not csv_names(text):  # typed, yet names nothing: a slip
                raise InputError("", text, "comma-separated columns of the table, e.g. id,notes (leave the option "
                                 "out to drop none)", "no column named")
            if setting.name in ("data_spec", "model_inputs") or (setting.name == "data" and is_table_file(text)):
                return setting.rule.check(text, "")  # a file's existence is checked before the work, not here
            return setting.checked(text, "")
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(": ")) from None

    convert.__name__ = setting.rule.kind
    return convert


def add_arguments(parser, names: list[str] | tuple[str, ...] | None = None, recipe: str | None = None,
                  **defaults) -> None:
    """Add one command-line option per row, with its flag, type and check, help and default.

    ``names`` picks rows of :data:`ROWS` (default: every training setting, grouped as in the settings table, as
    ``recipes/train.py`` has them); picked rows go into ``parser``, which may be an argument group. ``defaults``
    replace a row's default in this parser (``max_epochs=10``). ``recipe``: the recipe's name, for a row whose help
    in that recipe is its own (:data:`RECIPE_HELP`). Values are checked while parsing.
    """
    if names is None:
        rows, groups = [s for s in SETTINGS if s.group is not None], {"": parser}
    else:
        unknown = [name for name in names if name not in ROWS]
        if unknown:
            raise KeyError(f"no option rows named {unknown}")
        rows, groups = [ROWS[name] for name in names], None
    for setting in rows:
        if groups is None:
            container = parser
        else:
            if setting.group not in groups:
                groups[setting.group] = parser.add_argument_group(setting.group)
            container = groups[setting.group]
        default = defaults.get(setting.name, default_tracking_uri() if setting.name == "tracking_uri" else setting.value)
        kwargs: dict[str, Any] = {"help": help_text(setting, default, setting.name in defaults, recipe),
                                  "dest": setting.name}
        if setting.name in defaults or setting.name in RECIPE_ROWS or (names is not None and setting.name in STORE):
            kwargs["default"] = default  # any other training setting left unset stays None: the training resolves it
        if setting.action:
            kwargs["action"] = setting.action
        else:
            kwargs["type"] = argtype(setting)
            for key in ("nargs", "const", "metavar"):
                if getattr(setting, key) is not None:
                    kwargs[key] = getattr(setting, key)
            if setting.choices is not None and setting.name != "data" and "metavar" not in kwargs:
                kwargs["metavar"] = "{" + ",".join(map(str, setting.allowed())) + "}"
        container.add_argument(setting.option, **kwargs)
