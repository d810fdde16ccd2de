"""Tests of the real data modules (Adult, California housing, credit, GMSC, MNIST).

The data-dependent tests run on two sources: ``fixtures``, the small raw-format files in
``tests/fixtures/raw`` (always, with the sizes in FIXTURE_SIZES), and ``raw``, the complete
original files (the full-size checks: SPEC Table 2 sizes, class balance, the same preprocessing
checks at full size), which conftest.py finds in ``$CT_DATA_DIR`` or ``../shared/data/raw`` and
skips with a one-line reason when absent. Each data set is built once per session and source into
a temporary cache folder. Nothing here uses the network: download tests use ``file://`` URLs and
a closed local port.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import os
import socket
import tarfile
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from ct_lightning import CTModule
from ct_lightning.constraints import NONE, parse_mutability
from datamodules import available, canonical_name, get_datamodule, get_datamodule_class
from datamodules.download import RawFile, fetch
from datamodules.paths import resolve_cache_dir, resolve_data_dir
from datamodules.preprocess import check_labels
from datamodules.readers import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, read_idx

NAMES = ["adult", "california_housing", "credit", "gmsc", "mnist"]
TABULAR = NAMES[:4]
SOURCES = ["fixtures", "raw"]
TABLE2 = {"adult": (26049, 5010), "california_housing": (16504, 3101), "credit": (10617, 1923),
          "gmsc": (13371, 2474), "mnist": (11000, 2000)}
VAL_SIZES = {"adult": 1502, "california_housing": 1025, "credit": 732, "gmsc": 869, "mnist": 2000}
# The fixtures hold 300 Adult records, 298 California rows after balancing, 230 credit rows, 182
# complete GMSC rows after balancing, and 300 + 100 MNIST images: train + test + validation use all.
FIXTURE_SIZES = {"adult": (200, 50), "california_housing": (198, 50), "credit": (150, 40), "gmsc": (122, 30),
                 "mnist": (200, 100)}
FIXTURE_VAL = {"adult": 50, "california_housing": 50, "credit": 40, "gmsc": 30, "mnist": 100}
FIXTURE_BATCH = 50
CT_DEFAULTS = {"adult": (0.75, 0.25), "california_housing": (0.5, 0.25), "credit": (0.5, 0.25),
               "gmsc": (0.5, 0.5), "mnist": (0.5, 0.01)}
PROTECTED = {"adult": "age", "california_housing": "house_age", "credit": "age", "gmsc": "age"}
RAW_PATHS = {"adult": "adult/adult.data", "california_housing": "california_housing/cal_housing.data",
             "credit": "credit/UCI_Credit_Card.csv", "gmsc": "gmsc/cs-training.csv"}
TIMINGS: dict[tuple[str, str], tuple[float, float]] = {}


def fixture_options(name: str) -> dict:
    """Sizes and batch size that fit the fixture files (the Table 2 defaults need the full files)."""
    n_train, n_test = FIXTURE_SIZES[name]
    return {"n_train": n_train, "n_test": n_test, "batch_size": FIXTURE_BATCH}


def load_make_fixtures():
    """``tests/fixtures/make_fixtures.py`` as a module."""
    path = Path(__file__).resolve().parent / "fixtures" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """A fresh processed-data cache for this test session (no stale caches)."""
    return tmp_path_factory.mktemp("ct-cache")


@pytest.fixture(params=SOURCES)
def source(request) -> tuple[str, Path]:
    """``("fixtures", tests/fixtures/raw)`` and ``("raw", the raw data folder)`` (skipped when absent)."""
    return request.param, request.getfixturevalue("raw_dir" if request.param == "raw" else "fixture_dir")


@pytest.fixture(scope="session")
def built(session_cache):
    """Builds a data set once per source (uncached), then loads it again from the cache with a new instance."""
    modules: dict[tuple[str, str], tuple] = {}

    def get(name: str, source: tuple[str, Path]):
        kind, folder = source
        if (name, kind) not in modules:
            options = fixture_options(name) if kind == "fixtures" else {}
            started = time.perf_counter()
            first = get_datamodule(name, data_dir=folder, cache_dir=session_cache / kind, download=False, **options)
            first.setup()
            middle = time.perf_counter()
            second = get_datamodule(name, data_dir=folder, cache_dir=session_cache / kind, download=False, **options)
            second.setup()
            TIMINGS[name, kind] = (middle - started, time.perf_counter() - middle)
            modules[name, kind] = (first, second)
        return modules[name, kind]

    return get


@pytest.fixture(params=NAMES)
def dm(request, built, source):
    """The cached (second) instance of each data set, from each source."""
    return built(request.param, source)[1]


def read_raw_labels(name: str, folder: Path) -> tuple[pd.Series, dict[int, int]]:
    """Labels computed independently from the raw file (indexed by data-row position), and known rows.

    The fixtures are the first records of the original files (GMSC's are synthetic, written with the
    same two first records' labels), so the known rows hold for both sources.
    """
    if name == "adult":
        frame = pd.read_csv(folder / "adult/adult.data", header=None)
        labels = (frame[14].str.strip() == ">50K").astype(int)
        known = {0: 0, 7: 1}  # "39, State-gov, ..., <=50K" and "52, Self-emp-not-inc, ..., >50K"
    elif name == "california_housing":
        value = pd.read_csv(folder / "california_housing/cal_housing.data", header=None)[8]
        labels = (value >= value.median()).astype(int)
        if len(value) == 20640:  # the full file: median of medianHouseValue over all districts
            assert value.median() == 179700.0
        known = {0: 1, 1: 1}  # 452600 and 358500
    elif name == "credit":
        labels = 1 - pd.read_csv(folder / "credit/UCI_Credit_Card.csv")["default.payment.next.month"]
        known = {0: 0, 1: 0}  # IDs 1 and 2 defaulted
    else:
        labels = 1 - pd.read_csv(folder / "gmsc/cs-training.csv")["SeriousDlqin2yrs"]
        known = {0: 0, 1: 1}  # row 1 delinquent, row 2 not
    return labels, known


def decode_idx(path: Path) -> np.ndarray:
    """Independent IDX decoding for the checks (gzip + fixed header lengths)."""
    data = gzip.decompress(path.read_bytes())
    header = 16 if data[3] == 3 else 8
    return np.frombuffer(data, np.uint8, offset=header)


def splits(module):
    """(name, x, y, raw rows) for train, val and test."""
    return [(s, getattr(module, f"x_{s}"), getattr(module, f"y_{s}"), module.source_rows[s])
            for s in ("train", "val", "test")]


# ---------------------------------------------------------------------------- registry, sizes
def test_registered_with_aliases_and_table2_defaults():
    assert set(NAMES) <= set(available())
    assert canonical_name("ch") == "california_housing" and canonical_name("cred") == "credit"
    for name, (tau, lambda_reg) in CT_DEFAULTS.items():
        cls = get_datamodule_class(name)
        assert cls.ct_defaults == {"tau": tau, "nce": 5000, "lambda_reg": lambda_reg}
        assert cls.default_batch_size == 1000
        assert cls.fixed_domain == ((-1.0, 1.0) if name == "mnist" else None)


def test_sizes(dm, source):
    """Table 2 sizes on the full files; on the fixtures the sizes asked for (all rows used)."""
    if source[0] == "fixtures":
        (n_train, n_test), n_val, batch = FIXTURE_SIZES[dm.name], FIXTURE_VAL[dm.name], FIXTURE_BATCH
    else:
        (n_train, n_test), n_val, batch = TABLE2[dm.name], VAL_SIZES[dm.name], 1000
    assert (len(dm.y_train), len(dm.y_test), len(dm.y_val)) == (n_train, n_test, n_val)
    assert len(dm.x_train) == n_train and dm.x_train.dtype == torch.float32 and dm.y_train.dtype == torch.int64
    assert dm.val_source == "unused" and dm.batch_size == batch
    rows = dm.source_rows
    assert not set(rows["train"]) & set(rows["val"])
    if dm.name != "mnist":  # MNIST's test rows index the separate test file
        assert not (set(rows["train"]) | set(rows["val"])) & set(rows["test"])


def test_no_nan(dm):
    for _, x, y, _ in splits(dm):
        assert torch.isfinite(x).all() and (y >= 0).all() and (y < dm.n_classes).all()


def test_cache_is_used_and_identical(built, source, session_cache):
    for name in NAMES:
        first, second = built(name, source)
        assert not first.from_cache and second.from_cache
        assert second.cache_path.is_file() and session_cache in second.cache_path.parents
        for (_, x1, y1, r1), (_, x2, y2, r2) in zip(splits(first), splits(second)):
            assert torch.equal(x1, x2) and torch.equal(y1, y2) and np.array_equal(r1, r2)
        assert first.feature_names == second.feature_names and first.protected == second.protected
        assert TIMINGS[name, source[0]][1] < 5.0, TIMINGS


def test_reproducible_and_seeded(fixture_dir, tmp_path):
    runs = [get_datamodule("ch", data_dir=fixture_dir, cache_dir=tmp_path / str(i), data_seed=seed,
                           **fixture_options("california_housing"))
            for i, seed in enumerate((0, 0, 1))]
    for run in runs:
        run.setup()
    assert not any(run.from_cache for run in runs)
    assert torch.equal(runs[0].x_train, runs[1].x_train) and torch.equal(runs[0].y_test, runs[1].y_test)
    assert not torch.equal(runs[0].y_train, runs[2].y_train)


# ---------------------------------------------------------------------------- preprocessing
@pytest.mark.parametrize("name", TABULAR)
def test_standardised_on_training_split(built, name, source):
    module = built(name, source)[1]
    numeric = [i for i, feature in enumerate(module.feature_names) if "=" not in feature]
    x = module.x_train.double().numpy()[:, numeric]
    assert np.allclose(x.mean(0), 0.0, atol=1e-4) and np.allclose(x.std(0), 1.0, atol=1e-4)
    assert not np.allclose(module.x_test.double().numpy()[:, numeric].mean(0), 0.0, atol=1e-6)


@pytest.mark.parametrize("name, groups", [
    ("adult", ["workclass", "education", "marital_status", "occupation", "relationship", "race", "sex",
               "native_country"]),
    ("credit", ["sex", "education", "marriage"])])
def test_one_hot_groups_sum_to_one(built, name, groups, source):
    module = built(name, source)[1]
    names = module.feature_names
    prefixes = sorted({f.split("=")[0] for f in names if "=" in f})
    assert prefixes == sorted(groups)
    for group in groups:
        columns = [i for i, f in enumerate(names) if f.startswith(f"{group}=")]
        for _, x, _, _ in splits(module):
            block = x[:, columns]
            assert torch.all((block == 0) | (block == 1)) and torch.all(block.sum(1) == 1)
    if name == "adult":
        assert "workclass=Private" in names and "workclass=?" in names  # '?' kept as a category
        assert {"age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"} <= set(names)
    else:
        assert {"sex=1", "sex=2", "limit_bal", "age", "pay_0", "bill_amt1", "pay_amt6"} <= set(names)


@pytest.mark.parametrize("name", TABULAR)
def test_labels_match_raw_file(built, name, source):
    module = built(name, source)[1]
    raw_labels, known = read_raw_labels(name, source[1])
    for row, label in known.items():  # the independent computation itself is right
        assert raw_labels.iloc[row] == label
    for _, _, y, rows in splits(module):
        assert np.array_equal(y.numpy(), raw_labels.iloc[rows].to_numpy())
    in_data = {int(r): int(y) for _, _, ys, rs in splits(module) for r, y in zip(rs, ys) if r in known}
    assert in_data and all(known[r] == y for r, y in in_data.items())


@pytest.mark.parametrize("name, raw_column", [("adult", 0), ("california_housing", 2), ("credit", "AGE"),
                                              ("gmsc", "age")])
def test_protected_feature_values_match_raw(built, name, raw_column, source):
    module = built(name, source)[1]
    header = None if isinstance(raw_column, int) else "infer"
    raw = pd.read_csv(source[1] / RAW_PATHS[name], header=header)[raw_column].to_numpy(float)
    column = module.feature_names.index(PROTECTED[name])
    for _, x, _, rows in splits(module):
        restored = x[:, column].double().numpy() * module.feature_scale[column] + module.feature_mean[column]
        assert np.allclose(restored, raw[rows], rtol=1e-5, atol=1e-3)


def test_class_balance(dm, source):
    all_y = torch.cat([dm.y_train, dm.y_val, dm.y_test])
    if dm.name == "mnist":
        counts = torch.bincount(dm.y_train, minlength=10)
        assert dm.n_classes == 10 and len(counts) == 10
        if source[0] == "raw":
            share = counts.float() / len(dm.y_train)
            assert share.min() > 0.08 and share.max() < 0.13
        else:  # 200 of the first 300 training images: every digit, none dominating
            assert counts.min() >= 10 and counts.max() <= 35
        return
    assert dm.n_classes == 2
    share = dm.y_train.float().mean().item()
    if dm.name == "adult":  # not balanced
        if source[0] == "raw":  # 7841 of 32561 records earn >50K
            assert abs(share - 7841 / 32561) < 0.01
        else:  # the fixture's 300 records, all used: 70 earn >50K
            assert len(all_y) == 300 and int(all_y.sum()) == 70
    else:  # balanced by under-sampling: exactly 50/50 before splitting
        assert int(all_y.sum()) * 2 == len(all_y)
        if source[0] == "raw":
            assert abs(share - 0.5) < 0.02


def test_protected_resolves_to_the_right_columns(dm):
    codes = parse_mutability({name: "none" for name in dm.protected}, dm.n_features, dm.feature_names)
    frozen = torch.nonzero(codes == NONE).flatten().tolist()
    if dm.name == "mnist":
        rows = list(range(5)) + list(range(23, 28))
        assert frozen == [r * 28 + c for r in rows for c in range(28)] and len(frozen) == 280
    else:
        assert dm.protected == [PROTECTED[dm.name]]
        assert frozen == [dm.feature_names.index(PROTECTED[dm.name])]


def test_mnist_pixels_and_labels(built, source):
    module = built("mnist", source)[1]
    folder = source[1] / "mnist"
    assert module.n_features == 784 and module.feature_names[0] == "pixel_r0_c0"
    assert module.feature_names[783] == "pixel_r27_c27"
    for _, x, _, _ in splits(module):
        assert x.min() == -1.0 and x.max() == 1.0
    lower, upper = module.domain()
    assert torch.all(lower == -1) and torch.all(upper == 1)
    images = {"train": decode_idx(folder / "train-images-idx3-ubyte.gz").reshape(-1, 784),
              "test": decode_idx(folder / "t10k-images-idx3-ubyte.gz").reshape(-1, 784)}
    labels = {"train": decode_idx(folder / "train-labels-idx1-ubyte.gz"),
              "test": decode_idx(folder / "t10k-labels-idx1-ubyte.gz")}
    assert labels["train"][0] == 5  # the first training image is a 5
    first_images, first_labels = module.read_pair(folder / "train-images-idx3-ubyte.gz",
                                                  folder / "train-labels-idx1-ubyte.gz")
    assert first_labels[0] == 5 and np.array_equal(first_images[0], images["train"][0])
    for split, x, y, rows in splits(module):
        source_file = "test" if split == "test" else "train"
        assert np.array_equal(y.numpy(), labels[source_file][rows])
        assert np.allclose(x.numpy(), images[source_file][rows] / 127.5 - 1.0, atol=1e-6)
    found = [(s, int(y[list(rows).index(0)])) for s, _, y, rows in splits(module)[:2] if 0 in rows]
    assert all(label == 5 for _, label in found)


def test_gmsc_drops_incomplete_rows(built, fixture_dir):
    module = built("gmsc", ("fixtures", fixture_dir))[1]
    raw = pd.read_csv(fixture_dir / "gmsc/cs-training.csv", na_values=["NA"], keep_default_na=False)
    incomplete = set(np.flatnonzero(raw.isna().any(axis=1).to_numpy()))
    assert len(incomplete) > 20  # the fixture has NA values in MonthlyIncome and NumberOfDependents
    used = {int(r) for _, _, _, rows in splits(module) for r in rows}
    assert not used & incomplete
    delinquent = set(np.flatnonzero((raw["SeriousDlqin2yrs"] == 1).to_numpy())) - incomplete
    assert {int(r) for _, _, y, rows in splits(module) for r, label in zip(rows, y) if label == 0} == delinquent


def test_adult_reads_test_file_labels(fixture_dir, tmp_path):
    """``adult.test`` writes the labels with a final dot (``>50K.``); the reader strips it."""
    lines = (fixture_dir / "adult/adult.test").read_text().splitlines(keepends=True)
    assert lines[0].startswith("|1x3 Cross validator")
    path = tmp_path / "data/adult/adult.data"
    path.parent.mkdir(parents=True)
    path.write_text("".join(lines[1:]))
    module = get_datamodule("adult", data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", n_train=70,
                            n_test=15, download=False)
    module.setup()
    assert len(module.y_train) + len(module.y_test) + len(module.y_val) == 100
    rich = {i for i, line in enumerate(lines[1:]) if line.rstrip().endswith(">50K.")}
    assert len(rich) == 24
    for _, _, y, rows in splits(module):
        assert [int(r) for r, label in zip(rows, y) if label == 1] == [int(r) for r in rows if r in rich]


def test_fixtures_are_the_documented_samples(raw_dir, fixture_dir):
    """Full-size check: each sampled fixture is the head of the original file that make_fixtures.py
    takes; the synthetic GMSC file has the original's header and field count."""
    make = load_make_fixtures()
    for relative, content in make.sample(raw_dir).items():
        assert (fixture_dir / relative).read_bytes() == content, relative
    fixture = (fixture_dir / "gmsc/cs-training.csv").read_bytes().split(b"\r\n")
    with open(raw_dir / "gmsc/cs-training.csv", "rb") as handle:
        original_header = handle.readline()
    assert fixture[0] + b"\r\n" == original_header
    assert all(line.count(b",") == 11 for line in fixture[1:-1]) and fixture[-1] == b""


def test_gmsc_fixture_regenerates(fixture_dir):
    """The committed synthetic GMSC file is exactly what its seeded generator writes."""
    make = load_make_fixtures()
    assert make.gmsc_csv() == (fixture_dir / "gmsc/cs-training.csv").read_bytes()
    assert make.gmsc_csv(seed=make.GMSC_SEED + 1) != make.gmsc_csv()


# ---------------------------------------------------------------------------- errors
def test_too_small_file_names_file_and_counts(fixture_dir, tmp_path):
    """The Table 2 defaults on a sample are an error naming the file and the counts, never other sizes."""
    credit = get_datamodule("credit", data_dir=fixture_dir, cache_dir=tmp_path, download=False)
    with pytest.raises(ValueError, match=r"UCI_Credit_Card.csv gives only 230 rows after preprocessing, but "
                                         r"n_train \+ n_test = 10617 \+ 1923 = 12540.*Table 2.*smaller n_train"):
        credit.setup()
    mnist = get_datamodule("mnist", data_dir=fixture_dir, cache_dir=tmp_path, download=False, n_train=200)
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz gives only 100 images, but n_test = 2000"):
        mnist.setup()
    too_many = get_datamodule("gmsc", data_dir=fixture_dir, cache_dir=tmp_path, n_train=170, n_test=13)
    with pytest.raises(ValueError, match=r"cs-training.csv gives only 182 rows.*170 \+ 13 = 183 are asked for; "):
        too_many.setup()
    assert not list(tmp_path.rglob("*.npz"))


def test_not_enough_rows_raises_full_size(raw_dir, tmp_path):
    module = get_datamodule("credit", data_dir=raw_dir, cache_dir=tmp_path, n_train=12000, n_test=2000)
    with pytest.raises(ValueError, match=r"gives only 13272 rows.*smaller n_train/n_test"):
        module.setup()


def test_validation_falls_back_to_train_split(fixture_dir, tmp_path):
    module = get_datamodule("ch", data_dir=fixture_dir, cache_dir=tmp_path, n_train=250, n_test=48)
    with pytest.warns(UserWarning, match="drawn from the training split"):
        module.setup()
    assert module.val_source == "train" and len(module.y_val) == 48
    assert set(module.source_rows["val"]) <= set(module.source_rows["train"])


def test_wrong_columns_name_missing_columns_and_file(fixture_dir, tmp_path):
    frame = pd.read_csv(fixture_dir / "credit/UCI_Credit_Card.csv", nrows=50).drop(columns=["AGE", "PAY_0"])
    path = tmp_path / "data/credit/UCI_Credit_Card.csv"
    path.parent.mkdir(parents=True)
    frame.to_csv(path, index=False)
    module = get_datamodule("credit", data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"missing columns \['AGE', 'PAY_0'\]") as error:
        module.setup()
    assert str(path) in str(error.value)


def test_adult_wrong_field_count(tmp_path):
    path = tmp_path / "adult/adult.data"
    path.parent.mkdir(parents=True)
    path.write_text("39, State-gov, 77516, Bachelors, 13, <=50K\n")
    with pytest.raises(ValueError, match="expected 15 comma-separated fields"):
        get_datamodule("adult", data_dir=tmp_path, cache_dir=tmp_path / "cache").setup()


def test_missing_target_is_a_clear_error(fixture_dir, tmp_path):
    frame = pd.read_csv(fixture_dir / "credit/UCI_Credit_Card.csv", nrows=50)
    frame.loc[3, "default.payment.next.month"] = np.nan
    path = tmp_path / "credit/UCI_Credit_Card.csv"
    path.parent.mkdir(parents=True)
    frame.to_csv(path, index=False)
    with pytest.raises(ValueError, match="missing values in columns.*default.payment.next.month"):
        get_datamodule("credit", data_dir=tmp_path, cache_dir=tmp_path / "cache").setup()
    with pytest.raises(ValueError, match="labels are NaN"):
        check_labels(np.array([0.0, np.nan, 1.0]), 2, "demo")


def test_truncated_idx_files(fixture_dir, tmp_path):
    mnist = fixture_dir / "mnist"
    labels = gzip.decompress((mnist / "t10k-labels-idx1-ubyte.gz").read_bytes())
    assert len(labels) == 8 + 100
    short = tmp_path / "short.gz"
    short.write_bytes(gzip.compress(labels[:-10]))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(short, IDX_LABELS_MAGIC)
    cut = tmp_path / "cut.gz"
    cut.write_bytes((mnist / "t10k-images-idx3-ubyte.gz").read_bytes()[:2000])
    with pytest.raises(ValueError, match="truncated or corrupt gzip"):
        read_idx(cut, IDX_IMAGES_MAGIC)
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        read_idx(mnist / "t10k-labels-idx1-ubyte.gz", IDX_IMAGES_MAGIC)
    # Through the data module: a truncated test-image file in an otherwise complete folder.
    folder = tmp_path / "data/mnist"
    folder.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (folder / name).symlink_to(mnist / name)
    images = gzip.decompress((mnist / "t10k-images-idx3-ubyte.gz").read_bytes())
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(images[:-784], compresslevel=1))
    with pytest.raises(ValueError, match="t10k-images.*truncated"):
        get_datamodule("mnist", data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", n_train=200,
                       n_test=99).setup()


def test_missing_gmsc_names_file_path_and_source(tmp_path):
    module = get_datamodule("gmsc", data_dir=tmp_path, cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError) as error:
        module.setup()
    message = str(error.value)
    assert "cs-training.csv" in message and str(tmp_path / "gmsc/cs-training.csv") in message
    assert "kaggle.com" in message.lower()


def test_offline_missing_file_does_not_download(tmp_path, monkeypatch):
    monkeypatch.setenv("CT_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="CT_OFFLINE") as error:
        get_datamodule("adult", data_dir=tmp_path, cache_dir=tmp_path / "cache").setup()
    assert str(tmp_path / "adult/adult.data") in str(error.value)
    assert not (tmp_path / "adult").exists() or not any((tmp_path / "adult").iterdir())
    monkeypatch.delenv("CT_OFFLINE")
    with pytest.raises(FileNotFoundError, match="download=False"):
        get_datamodule("mnist", data_dir=tmp_path, download=False).prepare_data()


def closed_port_url() -> str:
    """An http URL on a local port that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/adult.data"


def test_failed_download_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.delenv("CT_OFFLINE", raising=False)  # this test downloads (from local URLs)
    source = tmp_path / "source.bin"
    source.write_bytes(b"x" * 5000)
    raw = RawFile("demo", "file.bin", 5000, "0" * 64, urls=(source.as_uri(), closed_port_url()),
                  source="nowhere")
    data = tmp_path / "data"
    with pytest.raises(FileNotFoundError) as error:
        fetch(raw, data)
    message = str(error.value)
    assert "sha256" in message and str(data / "demo/file.bin") in message and "127.0.0.1" in message
    assert list((data / "demo").iterdir()) == []  # neither the file nor a temporary part file


def test_download_verified_and_atomic(tmp_path, monkeypatch):
    monkeypatch.delenv("CT_OFFLINE", raising=False)  # this test downloads (from local URLs)
    payload = os.urandom(3 * (1 << 20) + 17)
    source = tmp_path / "source.bin"
    source.write_bytes(payload)
    raw = RawFile("demo", "file.bin", len(payload), hashlib.sha256(payload).hexdigest(), urls=(source.as_uri(),))
    path = fetch(raw, tmp_path / "data")
    assert path == tmp_path / "data/demo/file.bin" and path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["file.bin"]
    # An archive source (as for cal_housing.tgz): the member is extracted, the archive removed.
    archive = tmp_path / "archive.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("Folder/member.data")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    raw = RawFile("demo2", "member.data", len(payload), None, urls=(archive.as_uri(),),
                  archive_member="Folder/member.data", archive_sha256=hashlib.sha256(archive.read_bytes()).hexdigest())
    path = fetch(raw, tmp_path / "data")
    assert path.read_bytes() == payload and [p.name for p in path.parent.iterdir()] == ["member.data"]


def test_data_and_cache_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("CT_DATA_DIR", raising=False)
    monkeypatch.delenv("CT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_data_dir() == tmp_path / "xdg/ct-lightning/data"
    assert resolve_cache_dir() == tmp_path / "xdg/ct-lightning/processed"
    monkeypatch.setenv("CT_DATA_DIR", str(tmp_path / "raw"))
    monkeypatch.setenv("CT_CACHE_DIR", str(tmp_path / "cache"))
    assert resolve_data_dir() == tmp_path / "raw" and resolve_cache_dir() == tmp_path / "cache"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"


# ---------------------------------------------------------------------------- training smoke test
def test_counterfactual_training_smoke(dm):
    tau, lambda_reg = CT_DEFAULTS[dm.name]
    module = CTModule(n_features=dm.n_features, n_classes=dm.n_classes, objective="full", nce=64, tau=tau,
                      lambda_reg=lambda_reg, max_steps=10, feature_names=list(dm.feature_names),
                      mutability={name: "none" for name in dm.protected})
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 2
    assert all(torch.isfinite(p).all() for p in module.parameters())


@pytest.mark.parametrize("name", TABULAR)
def test_codec_encodes_and_decodes_the_files_own_rows(name, built, source):
    """A built-in table's codec (explanations and the served model read and write rows through it) encodes the raw
    file's rows as the data module's preprocessing did, in every split, and decodes the training inputs back to the
    file's values: categories as written, whole numbers exact, the rest to float32 rounding; the training rows lie
    inside its domain."""
    dm = built(name, source)[1]
    codec = dm.codec
    assert codec.feature_names == dm.feature_names and codec.classes == list(dm.class_labels)
    frame, _ = dm.read(dm.raw_paths())
    # the data module rounds raw values to float32 before standardising: up to 1.2e-7 of |raw| / scale (a few 1e-4
    # for the fixture's longitudes, whose scale is 0.03 degrees)
    scale = np.array([c.scale for c in codec.columns for _ in c.encoded_names])
    for split in ("train", "val", "test"):
        rows, x = frame.loc[dm.source_rows[split]], getattr(dm, f"x_{split}").numpy()
        magnitude = np.abs(x * scale + np.array([c.mean for c in codec.columns for _ in c.encoded_names])).max(0)
        tolerance = 2e-5 + 2.4e-7 * magnitude / scale  # per input: one-hot inputs (scale 1, values 0/1) get 2e-5
        assert (np.abs(codec.encode(rows) - x) <= tolerance).all(), split
    decoded, raw = codec.decode(dm.x_train.numpy()), frame.loc[dm.source_rows["train"]]
    for column in codec.columns:
        written = raw[column.name]
        if column.kind == "categorical":
            assert list(decoded[column.name]) == list(written), column.name  # credit's codes as numbers
        elif column.kind == "integer":
            assert (decoded[column.name].to_numpy() == written.to_numpy()).all(), column.name
        else:
            np.testing.assert_allclose(decoded[column.name], written, rtol=1e-5, atol=1e-5 * column.scale)
    lower, upper = codec.encoded_bounds()
    assert (dm.x_train.numpy() >= lower - 1e-6).all() and (dm.x_train.numpy() <= upper + 1e-6).all()
