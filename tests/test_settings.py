"""The settings table: one source for defaults, command-line options, validation and CTModule's arguments."""

import argparse
import inspect
from pathlib import Path

import pytest
import yaml

from ct_lightning.experiment.settings import (DEFAULTS, SETTINGS, SETTINGS_BY_NAME, add_arguments, resolve_config,
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
    ("max_epochs", 0, "[1, inf]"), ("nce", 0, "[1, inf]"), ("batch_size", 0, "[1, inf]"),
    ("burnin", 1.0, "[0, 1)"), ("tau", 0.0, "(0, 1]"), ("tau", 1.5, "(0, 1]"), ("epsilon", -0.1, "[0, inf]"),
    ("lr", 0.0, "(0, inf]"), ("objective", "nope", "full, vanilla"),
])
def test_out_of_range_values_name_option_value_and_allowed(name, value, allowed):
    with pytest.raises(ValueError) as error:
        validate_config({name: value})
    message = str(error.value)
    assert message.startswith(f"{name}: {value!r}") and allowed in message and "\n" not in message
    with pytest.raises(ValueError, match=f"^{name}: "):
        resolve_config({"data": "moons", name: value})


def test_allowed_values_pass():
    validate_config({"max_epochs": 1, "burnin": 0.0, "tau": 1.0, "epsilon": 0.0, "lr": 1e-3, "objective": "full"})
    assert SETTINGS_BY_NAME["generator"].check("ecco") is None
    assert resolve_config({"data": "moons"})["tau"] == 0.9
