"""Small credit and California housing data modules on the shipped fixture files, for tests that train through
``--data package.module:Class`` (the full data sets' Table 2 sizes need the complete original files)."""

from conftest import FIXTURE_DIR
from datamodules.real import CaliforniaHousingDataModule, CreditDataModule


class SmallCredit(CreditDataModule):
    """Credit (one-hot groups and integer features) from ``tests/fixtures/raw``: 120 training rows."""

    def __init__(self, batch_size=None, seed: int = 0, data_dir=None, **kwargs):
        super().__init__(batch_size=batch_size or 40, seed=seed, data_dir=data_dir or FIXTURE_DIR, n_train=120,
                         n_test=40, n_val=40, **kwargs)


class SmallHousing(CaliforniaHousingDataModule):
    """California housing (features derived from ``cal_housing.data``) from ``tests/fixtures/raw``: 120 training
    rows."""

    def __init__(self, batch_size=None, seed: int = 0, data_dir=None, **kwargs):
        super().__init__(batch_size=batch_size or 40, seed=seed, data_dir=data_dir or FIXTURE_DIR, n_train=120,
                         n_test=40, n_val=40, **kwargs)
