"""Tests of the real data modules (Adult, California housing, credit, GMSC, MNIST) on the raw files.

The raw files are read from ``$CT_DATA_DIR`` (CI: ``../shared/data/raw``), else from
``shared/data/raw`` beside the repository; the tests fail (not skip) when that folder is missing.
Each data set is built once per session into a temporary cache folder. Nothing here uses the
network: download tests use ``file://`` URLs and a closed local port.
"""

from __future__ import annotations

import gzip
import hashlib
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

RAW = Path(os.environ.get("CT_DATA_DIR") or Path(__file__).resolve().parents[1].parent / "shared/data/raw").resolve()
NAMES = ["adult", "california_housing", "credit", "gmsc", "mnist"]
TABULAR = NAMES[:4]
TABLE2 = {"adult": (26049, 5010), "california_housing": (16504, 3101), "credit": (10617, 1923),
          "gmsc": (13371, 2474), "mnist": (11000, 2000)}
VAL_SIZES = {"adult": 1502, "california_housing": 1025, "credit": 732, "gmsc": 869, "mnist": 2000}
CT_DEFAULTS = {"adult": (0.75, 0.25), "california_housing": (0.5, 0.25), "credit": (0.5, 0.25),
               "gmsc": (0.5, 0.5), "mnist": (0.5, 0.01)}
PROTECTED = {"adult": "age", "california_housing": "house_age", "credit": "age", "gmsc": "age"}
TIMINGS: dict[str, tuple[float, float]] = {}


@pytest.fixture(scope="session")
def raw_dir() -> Path:
    """The shared raw data folder; a missing folder is a failure, not a skip."""
    assert RAW.is_dir(), f"raw data folder {RAW} is missing: set CT_DATA_DIR to the shared data/raw folder"
    return RAW


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """A fresh processed-data cache for this test session (no stale caches)."""
    return tmp_path_factory.mktemp("ct-cache")


@pytest.fixture(scope="session")
def built(raw_dir, session_cache):
    """Builds each data set once (uncached), then loads it again from the cache with a new instance."""
    modules: dict[str, tuple] = {}

    def get(name: str):
        if name not in modules:
            started = time.perf_counter()
            first = get_datamodule(name, data_dir=raw_dir, cache_dir=session_cache, download=False)
            first.setup()
            middle = time.perf_counter()
            second = get_datamodule(name, data_dir=raw_dir, cache_dir=session_cache, download=False)
            second.setup()
            TIMINGS[name] = (middle - started, time.perf_counter() - middle)
            modules[name] = (first, second)
        return modules[name]

    return get


@pytest.fixture(params=NAMES)
def dm(request, built):
    """The cached (second) instance of each data set."""
    return built(request.param)[1]


def read_raw_labels(name: str) -> tuple[pd.Series, dict[int, int]]:
    """Labels computed independently from the raw file (indexed by data-row position), and known rows."""
    if name == "adult":
        frame = pd.read_csv(RAW / "adult/adult.data", header=None)
        labels = (frame[14].str.strip() == ">50K").astype(int)
        known = {0: 0, 7: 1}  # "39, State-gov, ..., <=50K" and "52, Self-emp-not-inc, ..., >50K"
    elif name == "california_housing":
        value = pd.read_csv(RAW / "california_housing/cal_housing.data", header=None)[8]
        labels = (value >= 179700.0).astype(int)  # median of medianHouseValue over 20640 districts
        known = {0: 1, 1: 1}  # 452600 and 358500
    elif name == "credit":
        labels = 1 - pd.read_csv(RAW / "credit/UCI_Credit_Card.csv")["default.payment.next.month"]
        known = {0: 0, 1: 0}  # IDs 1 and 2 defaulted
    else:
        labels = 1 - pd.read_csv(RAW / "gmsc/cs-training.csv")["SeriousDlqin2yrs"]
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


def test_sizes_match_table2(dm):
    n_train, n_test = TABLE2[dm.name]
    assert (len(dm.y_train), len(dm.y_test), len(dm.y_val)) == (n_train, n_test, VAL_SIZES[dm.name])
    assert len(dm.x_train) == n_train and dm.x_train.dtype == torch.float32 and dm.y_train.dtype == torch.int64
    assert dm.val_source == "unused" and dm.batch_size == 1000
    rows = dm.source_rows
    assert not set(rows["train"]) & set(rows["val"])
    if dm.name != "mnist":  # MNIST's test rows index the separate test file
        assert not (set(rows["train"]) | set(rows["val"])) & set(rows["test"])


def test_no_nan(dm):
    for _, x, y, _ in splits(dm):
        assert torch.isfinite(x).all() and (y >= 0).all() and (y < dm.n_classes).all()


def test_cache_is_used_and_identical(built, session_cache):
    for name in NAMES:
        first, second = built(name)
        assert not first.from_cache and second.from_cache
        assert second.cache_path.is_file() and session_cache in second.cache_path.parents
        for (_, x1, y1, r1), (_, x2, y2, r2) in zip(splits(first), splits(second)):
            assert torch.equal(x1, x2) and torch.equal(y1, y2) and np.array_equal(r1, r2)
        assert first.feature_names == second.feature_names and first.protected == second.protected
        assert TIMINGS[name][1] < 5.0, TIMINGS


def test_reproducible_and_seeded(raw_dir, tmp_path):
    runs = [get_datamodule("ch", data_dir=raw_dir, cache_dir=tmp_path / str(i), data_seed=seed)
            for i, seed in enumerate((0, 0, 1))]
    for run in runs:
        run.setup()
    assert not any(run.from_cache for run in runs)
    assert torch.equal(runs[0].x_train, runs[1].x_train) and torch.equal(runs[0].y_test, runs[1].y_test)
    assert not torch.equal(runs[0].y_train, runs[2].y_train)


# ---------------------------------------------------------------------------- preprocessing
@pytest.mark.parametrize("name", TABULAR)
def test_standardised_on_training_split(built, name):
    module = built(name)[1]
    numeric = [i for i, feature in enumerate(module.feature_names) if "=" not in feature]
    x = module.x_train.double().numpy()[:, numeric]
    assert np.allclose(x.mean(0), 0.0, atol=1e-4) and np.allclose(x.std(0), 1.0, atol=1e-4)
    assert not np.allclose(module.x_test.double().numpy()[:, numeric].mean(0), 0.0, atol=1e-6)


@pytest.mark.parametrize("name, groups", [
    ("adult", ["workclass", "education", "marital_status", "occupation", "relationship", "race", "sex",
               "native_country"]),
    ("credit", ["sex", "education", "marriage"])])
def test_one_hot_groups_sum_to_one(built, name, groups):
    module = built(name)[1]
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
def test_labels_match_raw_file(built, name):
    module = built(name)[1]
    raw_labels, known = read_raw_labels(name)
    for row, label in known.items():  # the independent computation itself is right
        assert raw_labels.iloc[row] == label
    for _, _, y, rows in splits(module):
        assert np.array_equal(y.numpy(), raw_labels.iloc[rows].to_numpy())
    in_data = {int(r): int(y) for _, _, ys, rs in splits(module) for r, y in zip(rs, ys) if r in known}
    assert in_data and all(known[r] == y for r, y in in_data.items())


@pytest.mark.parametrize("name, raw_column", [("adult", 0), ("california_housing", 2), ("credit", "AGE"),
                                              ("gmsc", "age")])
def test_protected_feature_values_match_raw(built, name, raw_column):
    module = built(name)[1]
    path = {"adult": "adult/adult.data", "california_housing": "california_housing/cal_housing.data",
            "credit": "credit/UCI_Credit_Card.csv", "gmsc": "gmsc/cs-training.csv"}[name]
    header = None if isinstance(raw_column, int) else "infer"
    raw = pd.read_csv(RAW / path, header=header)[raw_column].to_numpy(float)
    column = module.feature_names.index(PROTECTED[name])
    for _, x, _, rows in splits(module):
        restored = x[:, column].double().numpy() * module.feature_scale[column] + module.feature_mean[column]
        assert np.allclose(restored, raw[rows], rtol=1e-5, atol=1e-3)


def test_class_balance(dm):
    if dm.name == "mnist":
        share = torch.bincount(dm.y_train, minlength=10).float() / len(dm.y_train)
        assert dm.n_classes == 10 and share.min() > 0.08 and share.max() < 0.13
        return
    assert dm.n_classes == 2
    all_y = torch.cat([dm.y_train, dm.y_val, dm.y_test])
    share = dm.y_train.float().mean().item()
    if dm.name == "adult":  # not balanced: 7841 of 32561 records earn >50K
        assert abs(share - 7841 / 32561) < 0.01
    else:  # balanced by under-sampling: exactly 50/50 before splitting
        assert abs(share - 0.5) < 0.02 and int(all_y.sum()) * 2 == len(all_y)


def test_protected_resolves_to_the_right_columns(dm):
    codes = parse_mutability({name: "none" for name in dm.protected}, dm.n_features, dm.feature_names)
    frozen = torch.nonzero(codes == NONE).flatten().tolist()
    if dm.name == "mnist":
        rows = list(range(5)) + list(range(23, 28))
        assert frozen == [r * 28 + c for r in rows for c in range(28)] and len(frozen) == 280
    else:
        assert dm.protected == [PROTECTED[dm.name]]
        assert frozen == [dm.feature_names.index(PROTECTED[dm.name])]


def test_mnist_pixels_and_labels(built):
    module = built("mnist")[1]
    assert module.n_features == 784 and module.feature_names[0] == "pixel_r0_c0"
    assert module.feature_names[783] == "pixel_r27_c27"
    for _, x, _, _ in splits(module):
        assert x.min() == -1.0 and x.max() == 1.0
    lower, upper = module.domain()
    assert torch.all(lower == -1) and torch.all(upper == 1)
    images = {"train": decode_idx(RAW / "mnist/train-images-idx3-ubyte.gz").reshape(-1, 784),
              "test": decode_idx(RAW / "mnist/t10k-images-idx3-ubyte.gz").reshape(-1, 784)}
    labels = {"train": decode_idx(RAW / "mnist/train-labels-idx1-ubyte.gz"),
              "test": decode_idx(RAW / "mnist/t10k-labels-idx1-ubyte.gz")}
    assert labels["train"][0] == 5  # the first training image is a 5
    first_images, first_labels = module.read_pair(RAW / "mnist/train-images-idx3-ubyte.gz",
                                                  RAW / "mnist/train-labels-idx1-ubyte.gz")
    assert first_labels[0] == 5 and np.array_equal(first_images[0], images["train"][0])
    for split, x, y, rows in splits(module):
        source = "test" if split == "test" else "train"
        assert np.array_equal(y.numpy(), labels[source][rows])
        assert np.allclose(x.numpy(), images[source][rows] / 127.5 - 1.0, atol=1e-6)
    found = [(s, int(y[list(rows).index(0)])) for s, _, y, rows in splits(module)[:2] if 0 in rows]
    assert all(label == 5 for _, label in found)


# ---------------------------------------------------------------------------- errors
def test_not_enough_rows_raises(raw_dir, tmp_path):
    module = get_datamodule("credit", data_dir=raw_dir, cache_dir=tmp_path, n_train=12000, n_test=2000)
    with pytest.raises(ValueError, match=r"only 13272 rows.*smaller n_train/n_test"):
        module.setup()


def test_validation_falls_back_to_train_split(raw_dir, tmp_path):
    module = get_datamodule("ch", data_dir=raw_dir, cache_dir=tmp_path, n_train=18000, n_test=2630)
    with pytest.warns(UserWarning, match="drawn from the training split"):
        module.setup()
    assert module.val_source == "train" and len(module.y_val) == 2630
    assert set(module.source_rows["val"]) <= set(module.source_rows["train"])


def test_wrong_columns_name_missing_columns_and_file(tmp_path):
    frame = pd.read_csv(RAW / "credit/UCI_Credit_Card.csv", nrows=50).drop(columns=["AGE", "PAY_0"])
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


def test_missing_target_is_a_clear_error(tmp_path):
    frame = pd.read_csv(RAW / "credit/UCI_Credit_Card.csv", nrows=50)
    frame.loc[3, "default.payment.next.month"] = np.nan
    path = tmp_path / "credit/UCI_Credit_Card.csv"
    path.parent.mkdir(parents=True)
    frame.to_csv(path, index=False)
    with pytest.raises(ValueError, match="missing values in columns.*default.payment.next.month"):
        get_datamodule("credit", data_dir=tmp_path, cache_dir=tmp_path / "cache").setup()
    with pytest.raises(ValueError, match="labels are NaN"):
        check_labels(np.array([0.0, np.nan, 1.0]), 2, "demo")


def test_truncated_idx_files(tmp_path):
    labels = gzip.decompress((RAW / "mnist/t10k-labels-idx1-ubyte.gz").read_bytes())
    short = tmp_path / "short.gz"
    short.write_bytes(gzip.compress(labels[:-100]))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(short, IDX_LABELS_MAGIC)
    cut = tmp_path / "cut.gz"
    cut.write_bytes((RAW / "mnist/t10k-labels-idx1-ubyte.gz").read_bytes()[:2000])
    with pytest.raises(ValueError, match="truncated or corrupt gzip"):
        read_idx(cut, IDX_LABELS_MAGIC)
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        read_idx(RAW / "mnist/t10k-labels-idx1-ubyte.gz", IDX_IMAGES_MAGIC)
    # Through the data module: a truncated test-image file in an otherwise complete folder.
    folder = tmp_path / "data/mnist"
    folder.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (folder / name).symlink_to(RAW / "mnist" / name)
    images = gzip.decompress((RAW / "mnist/t10k-images-idx3-ubyte.gz").read_bytes())
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(images[:-784], compresslevel=1))
    with pytest.raises(ValueError, match="t10k-images.*truncated"):
        get_datamodule("mnist", data_dir=tmp_path / "data", cache_dir=tmp_path / "cache").setup()


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


def test_failed_download_leaves_no_partial_file(tmp_path):
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


def test_download_verified_and_atomic(tmp_path):
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
