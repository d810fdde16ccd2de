"""``--no-progress`` is accepted by every recipe that has a progress display (README: "in every recipe that has
them"), and hides the display: a data download's bar, a grid's and a reproduction's progress lines (CT_PROGRESS)."""

import os
from pathlib import Path

import pytest

from ct_lightning.experiment.configuration.console import PROGRESS_ENV, progress_hidden, progress_shown
from datamodules import download
from recipe_loader import load_recipe

ROOT = Path(__file__).resolve().parents[1]
WITHOUT_PROGRESS = {"explain"}  # prints its explanations only: no bar, no progress lines


def recipes_with_progress() -> list[str]:
    names = sorted(path.stem for path in (ROOT / "recipes").glob("*.py") if path.stem != "__init__")
    return [name for name in names if name not in WITHOUT_PROGRESS]


@pytest.mark.parametrize("name", recipes_with_progress())
def test_every_recipe_with_a_progress_display_accepts_no_progress(name):
    actions = load_recipe(name).build_parser()._option_string_actions
    assert "--no-progress" in actions, name
    assert actions["--no-progress"].dest == "progress" and actions["--no-progress"].default is not False


def test_consistency_quiet_is_the_same_switch():
    parser = load_recipe("consistency").build_parser()
    assert parser.parse_args(["--quiet"]).progress is False and parser.parse_args([]).progress is True


def test_a_download_shows_its_bar_unless_progress_is_hidden(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    source = tmp_path / "raw.bin"
    source.write_bytes(b"x" * 300_000)
    download._stream(source.as_uri(), tmp_path / "a", "raw.bin", 5.0)
    assert "raw.bin" in capfd.readouterr().err  # tqdm's bar names the file
    with progress_hidden(True):
        assert not progress_shown()
        size, _ = download._stream(source.as_uri(), tmp_path / "b", "raw.bin", 5.0)
    assert size == 300_000 and capfd.readouterr().err == ""
    assert progress_shown() and PROGRESS_ENV not in os.environ  # restored after the recipe
