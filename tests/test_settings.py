"""The settings table: one source for defaults, command-line options, validation and CTModule's arguments."""

import argparse
import ast
import inspect
from pathlib import Path

import pytest
import yaml

from ct_lightning.experiment.configuration.options import add_arguments
from ct_lightning.experiment.configuration.settings import (DEFAULTS, SETTINGS, SETTINGS_BY_NAME, resolve_config,
                                              table2, validate_config)
from ct_lightning.module import CTModule
from datamodules import available

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_module_settings_take_ctmodule_defaults():
    parameters = inspect.signature(CTModule.__init__).parameters
    for setting in SETTINGS:
        if setting.module:
            default = parameters[setting.name].default
            assert DEFAULTS[setting.name] == (list(default) if isinstance(default, tuple) else default), setting.name


NEW_ARGUMENT = ('        lambda_smooth: Annotated[float, {"help": "weight of a smoothness penalty (default {DFLT})",\n'
                '                                         "group": "counterfactual training", "low": 0.0}] = 0.0,\n')
NEW_ROW = '    Setting("patience", 5, "epochs without val/acc gain before stopping (default {DFLT})", int, CT, low=1),\n'

ONE_EDIT = """
import contextlib, io, json, sys, tempfile
from pathlib import Path
from ct_lightning.experiment.configuration import settings
from recipe_loader import load_recipe

def refused(call):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            call()
    except SystemExit as stop:
        return stop.code, stderr.getvalue().strip()
    except ValueError as error:
        return None, str(error)
    raise AssertionError("accepted")

parser = load_recipe("train").build_parser()
yaml_file = Path(tempfile.mkdtemp()) / "c.yaml"
yaml_file.write_text("lambda-smooth: 0.5\\npatience: 3\\n")
bad_yaml = yaml_file.with_name("bad.yaml")
bad_yaml.write_text("lambda_smooth: -1\\n")
config = settings.resolve_config({"data": "moons", "lambda_smooth": 0.25, "patience": 7})
result = {
    "defaults": [settings.DEFAULTS["lambda_smooth"], settings.DEFAULTS["patience"]],
    "module": [settings.SETTINGS_BY_NAME["lambda_smooth"].module, settings.SETTINGS_BY_NAME["patience"].module],
    "parsed": [vars(parser.parse_args(["--lambda-smooth", "0.5"]))["lambda_smooth"],
               vars(parser.parse_args(["--patience", "7"]))["patience"]],
    "cli_errors": [refused(lambda: parser.parse_args(["--lambda-smooth", "-1"])),
                   refused(lambda: parser.parse_args(["--patience", "0"]))],
    "yaml": settings.load_config_file(yaml_file),
    "yaml_error": refused(lambda: settings.load_config_file(bad_yaml)),
    "config_error": refused(lambda: settings.resolve_config({"data": "moons", "patience": "ten"})),
    "kwargs": {k: v for k, v in settings.module_kwargs(config, 2, 2, ["x1", "x2"], None).items()
               if k in ("lambda_smooth", "patience")},
}
if "--module" in sys.argv:
    from ct_lightning.module import CTModule
    module = CTModule(**settings.module_kwargs(config, 2, 2, ["x1", "x2"], None))
    result["hparams"] = module.hparams.lambda_smooth
print(json.dumps(result))
"""


@pytest.mark.slow  # copies the package and runs a recipe in a subprocess
def test_a_new_setting_is_one_edit(tmp_path):
    """One annotated CTModule argument, or one row of the table, and nothing else: a default, an option of
    recipes/train.py, a YAML key and validation (and for the argument, CTModule receives it)."""
    from package_copy import copy_package, run_with_copy

    package = copy_package(tmp_path)
    module = package / "module.py"
    source = module.read_text()
    anchor = "        seed: Annotated[int,"
    assert source.count(anchor) == 1
    module.write_text(source.replace(anchor, NEW_ARGUMENT + anchor))
    settings = package / "experiment" / "configuration" / "settings.py"
    source = settings.read_text()
    anchor = '    Setting("burnin",'
    assert source.count(anchor) == 1
    settings.write_text(source.replace(anchor, NEW_ROW + anchor))
    sys_path = f"import sys; sys.argv.append('--module'); sys.path.insert(0, {str(Path(__file__).parent / 'helpers')!r})\n"
    result = run_with_copy(tmp_path, sys_path + ONE_EDIT)
    assert result["defaults"] == [0.0, 5] and result["module"] == [True, False]
    assert result["parsed"] == [0.5, 7]
    (code, lambda_smooth), (code_row, patience) = result["cli_errors"]
    assert code == code_row == 2
    assert lambda_smooth.startswith("error: --lambda-smooth: got -1; allowed: a finite number ≥ 0 ")
    assert patience.startswith("error: --patience: got 0; allowed: an integer ≥ 1 ")
    assert result["yaml"] == {"lambda_smooth": 0.5, "patience": 3}
    yaml_error = result["yaml_error"][1]
    assert yaml_error.startswith("config ") and "lambda_smooth: got -1; allowed: a finite number ≥ 0" in yaml_error
    assert result["config_error"] == [None, "patience: got 'ten'; allowed: an integer ≥ 1"]
    assert result["kwargs"] == {"lambda_smooth": 0.25} and result["hparams"] == 0.25


def test_every_setting_is_a_command_line_option():
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    add_arguments(parser)
    assert {action.dest for action in parser._actions if action.dest != "help"} == set(DEFAULTS)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_config_files_agree_with_table2_and_defaults(path):
    content = yaml.safe_load(path.read_text())
    assert content["data"] in available()
    expected = {**DEFAULTS, **table2(content["data"]), "data": content["data"]}
    for key, value in content.items():
        assert value == expected[key], f"{path.name}: {key} = {value!r}, the settings table says {expected[key]!r}"


@pytest.mark.parametrize("name, value, allowed", [
    ("max_epochs", 0, "an integer ≥ 1"), ("max_epochs", -1, "an integer ≥ 1"), ("nce", 0, "an integer ≥ 1"),
    ("batch_size", 0, "an integer ≥ 1"), ("burnin", 1.0, "a finite number in [0, 1)"),
    ("tau", 0.0, "a finite number in (0, 1]"), ("tau", 1.5, "a finite number in (0, 1]"),
    ("tau", float("nan"), "a finite number in (0, 1]"), ("tau", "high", "a finite number in (0, 1]"),
    ("epsilon", -0.1, "a finite number ≥ 0"), ("lr", 0.0, "a finite number > 0"), ("lr", float("inf"), "a finite number > 0"),
    ("max_epochs", "ten", "an integer ≥ 1"), ("max_epochs", 1.5, "an integer ≥ 1"), ("max_epochs", True, "an integer ≥ 1"),
    ("objective", "nope", "one of full, vanilla"), ("mutability", "x1=sideways", "FEATURE=KIND"),
    ("model", "foo", "mlp, cnn or package.module:factory"), ("accelerator", "tpu9", "one of auto, cpu"),
])
def test_out_of_range_values_name_option_value_and_allowed(name, value, allowed):
    with pytest.raises(ValueError) as error:
        validate_config({name: value})
    message = str(error.value)
    assert message.startswith(f"{name}: got ") and f"allowed: {allowed}" in message and "\n" not in message
    with pytest.raises(ValueError, match=f"^{name}: "):
        resolve_config({"data": "moons", name: value})


def test_values_from_text_are_converted_and_ints_stay_ints():
    checked = validate_config({"max_epochs": "10", "tau": "0.5", "limit_train_batches": 5, "hidden_sizes": "64,64",
                               "immutable": "age, sex", "data": "CH"})
    assert checked == {"max_epochs": 10, "tau": 0.5, "limit_train_batches": 5, "hidden_sizes": [64, 64],
                       "immutable": ["age", "sex"], "data": "ch"}
    assert isinstance(checked["limit_train_batches"], int)


def test_catalogue_read_from_source_equals_the_imported_registries():
    from ct_lightning.constraints import MUTABILITY_KINDS
    from ct_lightning.experiment.configuration import catalogue
    from ct_lightning.generators import GENERATORS
    from ct_lightning.losses import OBJECTIVES
    from ct_lightning.metrics.names import METRICS, validation_metrics
    from ct_lightning.module import POOL_MODES
    from datamodules import canonical_name

    assert catalogue._static_generators() == sorted(GENERATORS)
    assert catalogue.available_datasets() == available()
    assert all(canonical_name(name) == canonical for name, canonical in catalogue._static_datasets().items())
    assert catalogue.objectives() == list(OBJECTIVES)
    assert catalogue.pool_modes() == tuple(POOL_MODES)
    assert catalogue.mutability_kinds() == tuple(MUTABILITY_KINDS)
    assert catalogue._static_validation_metrics() == tuple(METRICS[key].logged for key in validation_metrics())
    parameters = inspect.signature(CTModule.__init__).parameters
    assert catalogue.module_defaults() == {k: p.default for k, p in parameters.items()
                                           if p.default is not inspect.Parameter.empty}
    # The settings among CTModule's arguments: read from the source = read from the imported signature.
    imported = {name: catalogue._option(ast.parse(p.annotation, mode="eval").body) for name, p in parameters.items()
                if isinstance(p.annotation, str)}
    assert catalogue.module_options() == {name: {**option, "default": parameters[name].default}
                                          for name, option in imported.items() if option is not None}
    assert {s.name for s in SETTINGS if s.module} == set(catalogue.module_options())


def test_command_line_modules_do_not_import_torch():
    import json
    import subprocess
    import sys

    code = ("import json, sys; import ct_lightning.experiment.configuration.settings, ct_lightning.experiment.configuration.preflight, "
            "ct_lightning.experiment.configuration.protocol_options, ct_lightning.experiment.configuration.sweep_space; "
            "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert not modules & {"torch", "lightning", "mlflow", "datamodules"}


def test_allowed_values_pass():
    validate_config({"max_epochs": 1, "burnin": 0.0, "tau": 1.0, "epsilon": 0.0, "lr": 1e-3, "objective": "full"})
    assert SETTINGS_BY_NAME["generator"].check("ecco") is None
    assert resolve_config({"data": "moons"})["tau"] == 0.9


def test_threads_rule_and_start_up_line():
    import torch

    from ct_lightning.experiment.configuration.preflight import apply_threads, threads_for

    assert threads_for(None) == 1 and threads_for(None, "mlp", "cpu") == 1
    assert threads_for(None, "cnn") == 0 and threads_for(None, accelerator="gpu") == 0
    assert threads_for(3, "cnn", "gpu") == 3 and threads_for(0) == 0
    before = torch.get_num_threads()
    try:
        assert apply_threads(1) == "torch threads: 1 (--threads N to change; 0 = torch's default)"
        assert torch.get_num_threads() == 1
        assert apply_threads(0).startswith("torch threads: 1 (torch's default")  # 0 leaves the setting alone
    finally:
        torch.set_num_threads(before)


def test_default_store_is_anchored_to_an_absolute_path(tmp_path, monkeypatch):
    from ct_lightning.experiment.configuration.store import anchor_tracking_uri, store_location

    monkeypatch.chdir(tmp_path)
    assert anchor_tracking_uri("sqlite:///mlruns/mlflow.db") == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert anchor_tracking_uri(f"sqlite:///{tmp_path}/x.db") == f"sqlite:///{tmp_path}/x.db"
    assert anchor_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert store_location("sqlite:///mlruns/mlflow.db") == str(tmp_path / "mlruns" / "mlflow.db")
    assert not (tmp_path / "mlruns").exists()


ROLE_ROWS = '''    Setting("log_every", 1, "run-only test row", int, low=1, run_only=True),
    Setting("notes", "", "a non-defining row that may change on resume", defines=False, on_resume=True),
'''

ROLES_CHECK = '''
import json
from ct_lightning.experiment.runs import lifecycle
from ct_lightning.experiment.studies import reproduce
from ct_lightning.experiment.configuration import settings
config = settings.resolve_config({"data": "moons"})
key = reproduce.training_key(config)
print(json.dumps({
    "run_only": "log_every" in settings.RUN_ONLY_KEYS and lifecycle.RUN_ONLY_KEYS is settings.RUN_ONLY_KEYS,
    "not_logged": "log_every" not in lifecycle.defining_config(config) and "notes" in lifecycle.defining_config(config),
    "not_defining": {"log_every", "notes"} <= reproduce.NON_DEFINING_KEYS,
    "same_key": reproduce.training_key({**config, "log_every": 9, "notes": "x"}) == key,
    "resume": "notes" in settings.RESUME_OPTIONS and "log_every" not in settings.RESUME_OPTIONS}))
'''


@pytest.mark.slow  # copies the package and runs a recipe in a subprocess
def test_a_setting_role_is_part_of_its_one_edit(tmp_path):
    """A row's role (run-only, not defining, may change on --resume) is said in the row: the three key sets that
    the lifecycle, the reproduction key and --resume use are derived from the rows."""
    from package_copy import copy_package, run_with_copy

    settings = copy_package(tmp_path) / "experiment" / "configuration" / "settings.py"
    source = settings.read_text()
    anchor = '    Setting("burnin",'
    settings.write_text(source.replace(anchor, ROLE_ROWS + anchor))
    assert run_with_copy(tmp_path, ROLES_CHECK) == {"run_only": True, "not_logged": True, "not_defining": True,
                                                    "same_key": True, "resume": True}
