"""Vectorised preprocessing steps: under-sampling, seeded splits, one-hot encoding, standardising."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd


def undersample(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of a class-balanced subset: every class is cut to the size of the smallest one."""
    classes, counts = np.unique(y, return_counts=True)
    keep = [rng.choice(np.flatnonzero(y == c), size=counts.min(), replace=False) for c in classes]
    return np.sort(np.concatenate(keep))


def split_indices(n_available: int, n_train: int, n_test: int, n_val: int | None,
                  rng: np.random.Generator, name: str) -> tuple[dict[str, np.ndarray], str]:
    """Seeded random train/val/test indices into ``n_available`` rows.

    Train and test are disjoint; validation is chosen by :func:`take_validation` from the rest.
    Returns the indices and where the validation rows came from (``"unused"`` or ``"train"``).
    """
    if min(n_train, n_test) < 1:
        raise ValueError(f"{name}: n_train and n_test must be positive, got {n_train} and {n_test}")
    if n_train + n_test > n_available:
        raise ValueError(f"{name}: n_train + n_test = {n_train} + {n_test} = {n_train + n_test} but only "
                         f"{n_available} rows are available after preprocessing; pass smaller n_train/n_test")
    order = rng.permutation(n_available)
    train, test, rest = order[:n_train], order[n_train:n_train + n_test], order[n_train + n_test:]
    val, source = take_validation(train, rest, n_test, n_val, rng, name)
    return {"train": train, "val": val, "test": test}, source


def take_validation(train: np.ndarray, rest: np.ndarray, cap: int, n_val: int | None,
                    rng: np.random.Generator, name: str) -> tuple[np.ndarray, str]:
    """Validation indices: from ``rest`` (rows in no other split) where enough exist, else from ``train``.

    ``n_val=None`` takes all of ``rest``, at most ``cap`` rows (the test size). When ``rest`` is
    empty (``n_val=None``) or smaller than an explicit ``n_val``, the validation split is a random
    subset of ``train`` (it then overlaps the training split; a warning says so). Returns the
    indices and ``"unused"`` or ``"train"``.
    """
    if n_val is not None and n_val < 0:
        raise ValueError(f"{name}: n_val must be non-negative, got {n_val}")
    wanted = min(len(rest), cap) if n_val is None else n_val
    if len(rest) >= wanted and (wanted > 0 or n_val == 0):
        return rest[:wanted], "unused"
    wanted = min(cap if n_val is None else n_val, len(train))
    warnings.warn(f"{name}: only {len(rest)} rows are left outside the other splits; the validation split "
                  f"is {wanted} rows drawn from the training split (it overlaps train)", stacklevel=3)
    return rng.choice(train, size=wanted, replace=False), "train"


def one_hot(frame: pd.DataFrame, categorical: list[str]) -> pd.DataFrame:
    """Expand each ``categorical`` column in place into 0/1 columns named ``feature=value``.

    Categories are the sorted values present in ``frame`` (all rows of the data set, so every
    split has the same columns); other columns keep their position and values.
    """
    parts = []
    for column in frame.columns:
        if column in categorical:
            values = frame[column].astype(str).str.strip()
            parts.append(pd.get_dummies(values, prefix=column, prefix_sep="=", dtype=np.float32))
        else:
            parts.append(frame[[column]].astype(np.float32))
    return pd.concat(parts, axis=1)


def standardise(x: np.ndarray, train: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardise the boolean-masked ``columns`` with mean and std (ddof 0) of the ``train`` rows.

    Returns the transformed array and the per-column ``mean`` and ``scale`` (0 and 1 for columns
    left alone; a constant training column keeps scale 1), so ``x = z * scale + mean``.
    """
    mean = np.zeros(x.shape[1])
    scale = np.ones(x.shape[1])
    fitted = x[train][:, columns].astype(np.float64)
    mean[columns] = fitted.mean(0)
    std = fitted.std(0)
    scale[columns] = np.where(std > 0, std, 1.0)
    return ((x - mean) / scale).astype(np.float32), mean.astype(np.float32), scale.astype(np.float32)


def check_labels(y: np.ndarray, n_classes: int, name: str) -> np.ndarray:
    """Labels as int64, or a ``ValueError`` if any is missing, non-integer or out of range."""
    y = np.asarray(y, dtype=np.float64)
    if not np.isfinite(y).all():
        raise ValueError(f"data {name}: {int((~np.isfinite(y)).sum())} labels are NaN or infinite after preprocessing")
    if (y != np.round(y)).any() or y.min(initial=0) < 0 or y.max(initial=0) >= n_classes:
        raise ValueError(f"data {name}: labels must be integers in [0, {n_classes}), got values {np.unique(y)[:10]}")
    return y.astype(np.int64)
