"""Base classes for data modules built from raw files: locate, download, preprocess once, cache.

``RawDataModule`` finds (or downloads) its ``raw_files``, and loads its splits from the
``.npz`` cache when one exists for the same raw files and options; otherwise it calls
:meth:`RawDataModule.build` and caches the result. ``TabularDataModule`` implements ``build``
for tables: a subclass only reads its file into features and labels (:meth:`TabularDataModule.read`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from datamodules.base import TensorDataModule
from datamodules.codec import TabularCodec, standardised_codec
from datamodules.npz_cache import cache_file, cache_key, load_arrays, save_arrays
from datamodules.download import RawFile, fetch
from datamodules.paths import resolve_cache_dir, resolve_data_dir
from datamodules.preprocess import check_labels, one_hot, split_indices, standardise, undersample

SPLITS = ("train", "val", "test")


class RawDataModule(TensorDataModule):
    """A data set read from raw files, with Table 2 sizes, a seeded split and a preprocessing cache.

    ``data_dir``: folder with ``<set>/<file>`` raw files (default ``$CT_DATA_DIR``, else
    ``~/.cache/ct-lightning/data``); ``cache_dir``: folder for the processed ``.npz`` (default
    ``$CT_CACHE_DIR``, else ``~/.cache/ct-lightning/processed``). ``n_train``/``n_test`` default to
    SPEC Table 2 (class attributes ``table2_train``/``table2_test``); a raw file with too few rows
    for them is an error naming the file and the counts (pass smaller sizes to use a sample, as the
    tests do with ``tests/fixtures``); ``n_val=None`` takes every row
    used by neither split, at most ``n_test`` of them, and falls back to a subset of the training
    split when none is left. ``data_seed`` fixes balancing and splitting; ``seed`` only the
    shuffling of training batches. ``download=False`` (or ``CT_OFFLINE=1``) never downloads.

    After ``setup()``: ``source_rows`` (per split, the 0-based data-row positions in the raw file
    each row came from), ``feature_mean``/``feature_scale`` (``raw = x * scale + mean``),
    ``val_source`` (``"unused"`` or ``"train"``) and ``from_cache``.
    """

    default_batch_size = 1000
    raw_files: tuple[RawFile, ...] = ()
    table2_train = 0
    table2_test = 0

    def __init__(self, batch_size: int | None = None, seed: int = 0, num_workers: int = 0,
                 data_dir: str | os.PathLike | None = None, n_train: int | None = None,
                 n_test: int | None = None, n_val: int | None = None, data_seed: int = 0,
                 cache_dir: str | os.PathLike | None = None, download: bool = True):
        super().__init__(batch_size, seed, num_workers)
        self.data_dir = resolve_data_dir(data_dir)
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.n_train = self.table2_train if n_train is None else int(n_train)
        self.n_test = self.table2_test if n_test is None else int(n_test)
        self.n_val = None if n_val is None else int(n_val)
        self.data_seed = data_seed
        self.download = download
        self.from_cache = False
        self.cache_path: Path | None = None
        self.source_rows: dict[str, np.ndarray] = {}
        self.val_source = ""

    def raw_paths(self) -> list[Path]:
        """Paths of the raw files, downloading missing ones where a public source exists."""
        return [fetch(raw, self.data_dir, self.download) for raw in self.raw_files]

    def prepare_data(self) -> None:
        """Lightning hook (runs once per node): make sure the raw files are there."""
        self.raw_paths()

    def options(self) -> dict:
        """The preprocessing options that the cache key depends on."""
        return {"n_train": self.n_train, "n_test": self.n_test, "n_val": self.n_val, "data_seed": self.data_seed}

    def build(self, paths: list[Path]) -> dict[str, np.ndarray]:
        """Preprocess the raw files into the arrays that are cached (see :meth:`load_splits`)."""
        raise NotImplementedError

    def check_enough_rows(self, available: int, what: str, paths: list[Path], wanted: int | None = None,
                          sizes: str | None = None) -> None:
        """Raise a ``ValueError`` naming the files and counts when they hold fewer than ``wanted`` rows.

        ``wanted`` defaults to ``n_train + n_test``. A raw file smaller than the original (a sample,
        a truncated copy) never silently gives other sizes than those asked for: the Table 2
        defaults need the complete file, and smaller sizes must be passed explicitly.
        """
        if wanted is None:
            wanted, sizes = self.n_train + self.n_test, f"n_train + n_test = {self.n_train} + {self.n_test}"
        if wanted <= available:
            return
        defaults = (self.n_train, self.n_test) == (self.table2_train, self.table2_test)
        files = ", ".join(str(path) for path in paths)
        raise ValueError(f"{self.name}: {files} gives only {available} {what}, but {sizes} = {wanted} are asked for"
                         + (" (the SPEC Table 2 sizes, which need the complete original file)" if defaults else "")
                         + "; pass smaller n_train/n_test (and n_val) to use a smaller file")

    def load_splits(self) -> dict:
        """Splits from the cache, or built from the raw files and then cached."""
        paths = self.raw_paths()
        self.cache_path = cache_file(self.cache_dir, self.name, cache_key(self.name, paths, self.options()))
        arrays = load_arrays(self.cache_path)
        self.from_cache = arrays is not None
        if arrays is None:
            arrays = self.build(paths)
            for split in SPLITS:
                arrays[f"y_{split}"] = check_labels(arrays[f"y_{split}"], int(arrays["n_classes"]), self.name)
            save_arrays(self.cache_path, arrays)
        self.source_rows = {split: arrays[f"rows_{split}"] for split in SPLITS}
        self.feature_mean, self.feature_scale = arrays["mean"], arrays["scale"]
        self.val_source = str(arrays["val_source"])
        return {**{f"{xy}_{split}": arrays[f"{xy}_{split}"] for xy in "xy" for split in SPLITS},
                "feature_names": [str(n) for n in arrays["feature_names"]],
                "protected": [str(n) for n in arrays["protected"]], "n_classes": int(arrays["n_classes"])}


class TabularDataModule(RawDataModule):
    """A table: read, optionally balance by under-sampling, split, one-hot encode, standardise.

    Subclasses implement :meth:`read` and set ``categorical`` (columns to one-hot encode; all
    other columns are standardised with training-split statistics), ``balanced`` and ``protected_features``.
    """

    categorical: tuple[str, ...] = ()
    balanced = False
    target_name = "label"  # the raw file's target column: rows taken from the file may carry it
    class_labels: tuple = (0, 1)  # what labels 0 and 1 stand for, in the words of explanations and the served model
    extra_columns: tuple[str, ...] = ()  # the raw file's columns that are no features (an ID): rows may carry them

    @property
    def codec(self) -> TabularCodec | None:
        """The preprocessing as a :class:`~datamodules.codec.TabularCodec` (after ``setup()``), so that explanations
        and the served model take and give rows in the file's units and categories, as for a user's table."""
        if not self._ready:
            return None
        if getattr(self, "_codec", None) is None:
            self._codec = standardised_codec(self.feature_names, self.categorical, self.integer_features,
                                             self.feature_mean, self.feature_scale, self.x_train, self.target_name,
                                             self.class_labels, self.extra_columns)
        return self._codec

    def read(self, paths: list[Path]) -> tuple[pd.DataFrame, np.ndarray]:
        """Features (final base names; index = 0-based raw data-row position) and 0/1 labels."""
        raise NotImplementedError

    @classmethod
    def rows_in_model_columns(cls, frame: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
        """Rows to explain, given in the raw file's columns where the model reads features derived from them, in the
        model's columns, with a note; ``(frame, None)`` where nothing is derived (here: every table but one)."""
        return frame, None

    def build(self, paths: list[Path]) -> dict[str, np.ndarray]:
        """Read, balance, split, one-hot encode and standardise; arrays ready for the cache."""
        frame, y = self.read(paths)
        y = check_labels(y, 2, self.name)
        rng = np.random.default_rng(self.data_seed)
        if self.balanced:
            keep = undersample(y, rng)
            frame, y = frame.iloc[keep], y[keep]
        self.check_enough_rows(len(y), "rows after preprocessing", paths)
        index, val_source = split_indices(len(y), self.n_train, self.n_test, self.n_val, rng, self.name)
        encoded = one_hot(frame, list(self.categorical))
        names = list(encoded.columns)
        is_numeric = np.array([name in frame.columns and name not in self.categorical for name in names])
        x, mean, scale = standardise(encoded.to_numpy(np.float32), index["train"], is_numeric)
        rows = frame.index.to_numpy(np.int64)
        arrays = {f"{key}_{split}": value[index[split]] for split in SPLITS for key, value in
                  (("x", x), ("y", y), ("rows", rows))}
        return {**arrays, "feature_names": np.array(names), "protected": np.array(self.protected_features),
                "n_classes": np.array(2), "mean": mean, "scale": scale, "val_source": np.array(val_source)}
