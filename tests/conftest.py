"""Test-wide settings, and where the real data sets' files are: the fixtures and the raw data.

``fixture_dir``: the small raw-format files shipped in ``tests/fixtures/raw`` (see the README
there); the tests of the real data modules run on them, so a fresh clone passes on its own.
``raw_dir``: the original raw files, for the full-size checks (SPEC Table 2 sizes, class
balance): ``$CT_DATA_DIR``, else ``../shared/data/raw`` beside the repository. When neither is
there, those tests are skipped with a one-line reason; a folder that is named by
``$CT_DATA_DIR`` (or present beside the repository) but lacks a file is a failure.
"""

import os
from pathlib import Path

# Small models run fastest on one thread, and oversubscribed threads stall on a loaded 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tests' `mlflow server`s (and the worked example's `mlflow ui`) need no background job runner: MLflow 3 starts
# seven huey consumer processes beside every server otherwise, most of a core for the server's first minute.
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")

import matplotlib  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

matplotlib.use("Agg")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DIR = ROOT / "tests" / "fixtures" / "raw"
REAL_SETS = ("adult", "california_housing", "credit", "gmsc", "mnist")
RAW_DATA_ABSENT = ("raw data absent: set CT_DATA_DIR to a folder with adult/adult.data, "
                   "california_housing/cal_housing.data, credit/UCI_Credit_Card.csv, gmsc/cs-training.csv and "
                   "mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (see README 'Data')")


def raw_file_names() -> list[str]:
    """``<set>/<file>`` of every raw file the real data modules read."""
    from datamodules import get_datamodule_class

    return [f"{raw.dataset}/{raw.filename}" for name in REAL_SETS for raw in get_datamodule_class(name).raw_files]


def raw_data_location() -> tuple[Path, bool]:
    """The raw data folder the full-size checks use, and whether ``$CT_DATA_DIR`` named it."""
    explicit = os.environ.get("CT_DATA_DIR")
    return Path(explicit or ROOT.parent / "shared" / "data" / "raw").expanduser().resolve(), bool(explicit)


def pytest_report_header(config) -> str:
    folder, explicit = raw_data_location()
    if explicit or folder.is_dir():
        return f"raw data: {folder} (full-size checks run); fixtures: {FIXTURE_DIR}"
    return f"raw data: absent, full-size checks skip; fixtures: {FIXTURE_DIR}"


@pytest.fixture(autouse=True)
def restore_environment():
    """Undo what a test (or code it calls, such as a bench section's set-up) writes to ``os.environ``,
    so that no test sees another's variables (a leaked ``CT_OFFLINE=1`` once failed the download tests)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """The fixture files, laid out like a raw data folder (``<set>/<file>``)."""
    return FIXTURE_DIR


@pytest.fixture(scope="session")
def raw_dir() -> Path:
    """The complete original raw files; skips when absent, fails when present but incomplete."""
    folder, explicit = raw_data_location()
    if not explicit and not folder.is_dir():
        pytest.skip(RAW_DATA_ABSENT)
    missing = [name for name in raw_file_names() if not (folder / name).is_file()]
    if missing:
        where = "named by $CT_DATA_DIR" if explicit else "beside the repository"
        pytest.fail(f"raw data folder {folder} ({where}) lacks {missing}", pytrace=False)
    return folder


# Whole files of slow tests: they start recipes or servers in subprocesses, kill and resume runs, or train DDP, Ray
# and grid studies. `pytest -m "not slow"` leaves them out for a quick run while working.
SLOW_FILES = {"test_worked_example.py", "test_served_model.py", "test_lifecycle.py", "test_ddp.py", "test_sweep.py",
              "test_grids.py", "test_finetune_resume.py", "test_checkpoint_faults.py", "test_bad_inputs.py",
              "test_console_scripts.py", "test_seeds.py", "test_store_concurrency.py", "test_explain.py",
              "test_reproduce.py", "test_consistency.py", "test_table_data.py"}


def _reads_raw_data(path: Path, seen: dict[Path, bool] = {}) -> bool:  # noqa: B006 - a cache per session
    """Whether a test file asks for the raw data (the ``raw_dir`` fixture, also through ``getfixturevalue``)."""
    if path not in seen:
        seen[path] = path.name != "conftest.py" and "raw_dir" in path.read_text()
    return seen[path]


def pytest_collection_modifyitems(config, items):
    """Mark the tests of files that read the raw data (`raw_data`: CI's second pass runs only these) and the
    slow ones."""
    for item in items:
        if _reads_raw_data(Path(item.path)):
            item.add_marker(pytest.mark.raw_data)
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
