"""The four synthetic 2-D data sets of the paper (SPEC §4, §5)."""

from __future__ import annotations

import numpy as np
from sklearn import datasets

from datamodules.base import TensorDataModule
from datamodules.registry import register

DATA_SEED = 42
SYNTHETIC_FEATURES = ["x1", "x2"]


class SyntheticDataModule(TensorDataModule):
    """Two features, two classes; 3600 train / 600 test (Table 2) plus 600 validation samples.

    The samples come from one scikit-learn call with a fixed data seed and are then split at
    random (also with the data seed), so every run sees the same data.
    """

    default_batch_size = 30
    synthetic = True
    eval_individuals = 250
    protected_features = ("x1",)

    def __init__(self, batch_size: int | None = None, seed: int = 0, num_workers: int = 0,
                 n_train: int = 3600, n_val: int = 600, n_test: int = 600, data_seed: int = DATA_SEED):
        super().__init__(batch_size, seed, num_workers)
        self.n_train, self.n_val, self.n_test, self.data_seed = n_train, n_val, n_test, data_seed

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` samples and labels from the generating process."""
        raise NotImplementedError

    def load_splits(self) -> dict:
        n = self.n_train + self.n_val + self.n_test
        x, y = self.sample(n)
        order = np.random.default_rng(self.data_seed).permutation(n)
        x, y = x[order].astype(np.float32), y[order].astype(np.int64)
        a, b = self.n_train, self.n_train + self.n_val
        return {"x_train": x[:a], "y_train": y[:a], "x_val": x[a:b], "y_val": y[a:b],
                "x_test": x[b:], "y_test": y[b:], "feature_names": SYNTHETIC_FEATURES,
                "n_classes": 2}


def rescale_centers(centers: np.ndarray, distance: float) -> np.ndarray:
    """Two centres moved along the line through them, about their midpoint, to ``distance`` apart."""
    midpoint = centers.mean(0)
    direction = (centers[1] - centers[0]) / np.linalg.norm(centers[1] - centers[0])
    return np.stack([midpoint - 0.5 * distance * direction, midpoint + 0.5 * distance * direction])


class Blobs(SyntheticDataModule):
    """Two Gaussian blobs with centres drawn uniformly from the box (−10, 10)² (the authors' loader).

    ``center_distance`` (opt-in, for sensitivity studies): move the two default centres along
    the line through them, about their midpoint, until they are this far apart; every sample
    keeps its own noise draw and class, so only the distance changes. ``None`` (default): the
    default data, unchanged.
    """

    cluster_std = 1.0
    blob = True

    def __init__(self, *args, center_distance: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if center_distance is not None and not (np.isfinite(center_distance) and center_distance > 0):
            raise ValueError(f"center_distance: {center_distance!r} is not allowed; allowed: a number > 0 or None")
        self.center_distance = center_distance

    def sample(self, n):
        x, y, centers = datasets.make_blobs(n, centers=2, cluster_std=self.cluster_std, n_features=2,
                                            random_state=self.data_seed, return_centers=True)
        self.centers = centers
        if self.center_distance is None:
            return x, y
        self.centers = rescale_centers(centers, self.center_distance)
        return x + (self.centers - centers)[y], y


@register("ls", "linearly_separable")
class LinearlySeparable(Blobs):
    """Two Gaussian blobs, std 0.5."""

    paper_label = "LS"
    ct_defaults = {"tau": 0.5, "nce": 1000, "lambda_reg": 0.01}
    cluster_std = 0.5


@register("ol", "overlapping")
class Overlapping(Blobs):
    """Two Gaussian blobs, std 2.0."""

    paper_label = "OL"
    ct_defaults = {"tau": 0.5, "nce": 1000, "lambda_reg": 0.25}
    cluster_std = 2.0


@register("circles", "circ")
class Circles(SyntheticDataModule):
    """Concentric circles, noise 0.15, factor 0.01."""

    paper_label = "Circ"
    ct_defaults = {"tau": 0.5, "nce": 1000, "lambda_reg": 0.5}

    def sample(self, n):
        return datasets.make_circles(n, noise=0.15, factor=0.01, random_state=self.data_seed)


@register("moons", "moon")
class Moons(SyntheticDataModule):
    """Interlocking moons, noise 0.1 (the default of MLJ's make_moons, which the authors used)."""

    paper_label = "Moon"
    ct_defaults = {"tau": 0.9, "nce": 1000, "lambda_reg": 0.25}

    def sample(self, n):
        return datasets.make_moons(n, noise=0.1, random_state=self.data_seed)
