"""The opt-in ``center_distance`` of the blob data sets (LS, OL): off leaves the data unchanged, on sets the distance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import datasets

from ct_lightning.experiment.configuration.data import build_datamodule
from ct_lightning.experiment.studies.reproduce import training_key
from ct_lightning.experiment.configuration.settings import resolve_config
from datamodules.synthetic import LinearlySeparable, Overlapping

N = 3600 + 600 + 600


def _old_splits(std: float) -> dict:
    """The splits exactly as the data modules built them before the option existed."""
    x, y = datasets.make_blobs(N, centers=2, cluster_std=std, n_features=2, random_state=42)
    order = np.random.default_rng(42).permutation(N)
    x, y = x[order].astype(np.float32), y[order].astype(np.int64)
    return {"x_train": x[:3600], "y_train": y[:3600], "x_val": x[3600:4200], "y_val": y[3600:4200],
            "x_test": x[4200:], "y_test": y[4200:]}


@pytest.mark.parametrize("cls,std", [(LinearlySeparable, 0.5), (Overlapping, 2.0)])
def test_no_center_distance_leaves_the_data_bit_identical(cls, std):
    dm = cls(center_distance=None)
    dm.setup()
    for key, value in _old_splits(std).items():
        assert torch.equal(getattr(dm, key), torch.as_tensor(value)), key


def _expected_centers(distance: float) -> np.ndarray:
    # scikit-learn draws the two centres first, uniformly from (-10, 10)^2, with RandomState(seed).
    default = np.random.RandomState(42).uniform(-10.0, 10.0, size=(2, 2))
    mid = (default[0] + default[1]) / 2
    unit = (default[1] - default[0]) / np.hypot(*(default[1] - default[0]))
    return np.array([mid - distance / 2 * unit, mid + distance / 2 * unit])


@pytest.mark.parametrize("distance", [2.0, 6.0, 14.0])
def test_center_distance_gives_that_distance(distance):
    base, moved = LinearlySeparable(), LinearlySeparable(center_distance=distance)
    base.setup()
    moved.setup()
    expected = _expected_centers(distance)
    np.testing.assert_allclose(moved.centers, expected, atol=1e-12)
    assert np.hypot(*(moved.centers[1] - moved.centers[0])) == pytest.approx(distance, abs=1e-12)
    # The samples: same labels, each class shifted rigidly, so the class means are `distance` apart.
    assert torch.equal(moved.y_train, base.y_train)
    x = torch.cat([moved.x_train, moved.x_val, moved.x_test]).double().numpy()
    y = torch.cat([moved.y_train, moved.y_val, moved.y_test]).numpy()
    means = np.array([x[y == k].mean(0) for k in (0, 1)])
    assert np.hypot(*(means[1] - means[0])) == pytest.approx(distance, abs=0.05)
    shift = (moved.x_train - base.x_train).double().numpy()
    for k in (0, 1):
        np.testing.assert_allclose(shift[base.y_train.numpy() == k], np.broadcast_to(
            expected[k] - base.centers[k], shift[base.y_train.numpy() == k].shape), atol=1e-5)


def test_default_distance_reproduces_the_default_data():
    base = LinearlySeparable()
    base.setup()
    same = LinearlySeparable(center_distance=float(np.hypot(*(base.centers[1] - base.centers[0]))))
    same.setup()
    torch.testing.assert_close(same.x_train, base.x_train, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bad_center_distance_is_refused(bad):
    with pytest.raises(ValueError, match="center_distance"):
        LinearlySeparable(center_distance=bad)


def test_center_distance_through_the_experiment_settings():
    config = resolve_config({"data": "ls", "center_distance": 4.0})
    dm = build_datamodule(config)
    assert np.hypot(*(dm.centers[1] - dm.centers[0])) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="center_distance.*circles"):
        resolve_config({"data": "circles", "center_distance": 4.0})
    with pytest.raises(ValueError, match="center_distance"):
        resolve_config({"data": "ls", "center_distance": -2.0})


def test_training_key_unchanged_while_center_distance_is_unset():
    config = resolve_config({"data": "ls"})
    assert config["center_distance"] is None
    before = {k: v for k, v in config.items() if k != "center_distance"}  # a run stored before the option
    assert training_key(config) == training_key(before)
    assert training_key({**config, "center_distance": 4.0}) != training_key(config)
