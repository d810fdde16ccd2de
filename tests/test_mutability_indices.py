"""The authors' integer mutability lists are 1-based indices of the features they froze (issue 24).

``configs/satml/mutability/mlp/*/mutability_*.toml`` of CounterfactualTraining.jl give the protected features
as integers; this checks that, read as 1-based indices into our data modules' feature order, each names the
feature we protect (on the small fixture files, so it runs without the raw data; credit on the full file only,
because its one-hot columns are made from the categories present, and the fixture lacks some of them).
"""

from __future__ import annotations

import pytest

from datamodules import get_datamodule

AUTHORS_INDICES = {  # data set → data_params.mutability of the satml (and final_run) mutability configs
    "adult": [1], "california_housing": [2], "gmsc": [2], "credit": [15],
    "mnist": list(range(1, 141)) + list(range(645, 785)),
    "ls": [1], "circles": [1], "moons": [1], "ol": [1],
}
FIXTURE_OPTIONS = {"adult": (200, 50), "california_housing": (198, 50), "credit": (150, 40), "gmsc": (122, 30),
                   "mnist": (200, 100)}


@pytest.mark.parametrize("name", sorted(AUTHORS_INDICES))
def test_one_based_indices_name_our_protected_features(name, request, tmp_path):
    options = {}
    if name == "credit":  # index 15 counts the one-hot columns of the full data
        options = {"data_dir": request.getfixturevalue("raw_dir"), "cache_dir": tmp_path, "download": False}
    elif name in FIXTURE_OPTIONS:
        fixture_dir = request.getfixturevalue("fixture_dir")
        n_train, n_test = FIXTURE_OPTIONS[name]
        options = {"data_dir": fixture_dir, "cache_dir": tmp_path, "download": False, "n_train": n_train,
                   "n_test": n_test, "batch_size": 50}
    datamodule = get_datamodule(name, **options)
    datamodule.setup()
    names = list(datamodule.feature_names)
    chosen = sorted(names[i - 1] for i in AUTHORS_INDICES[name])
    assert chosen == sorted(map(str, datamodule.protected))
