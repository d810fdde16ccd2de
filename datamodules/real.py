"""The paper's five real data sets (SPEC §4 Table 2, §5), registered by name.

======================  =======  ======  ==============================  =====================
name (aliases)          train    test    target (1 =)                    protected (default)
======================  =======  ======  ==============================  =====================
adult                   26049    5010    income ``>50K``                 ``age``
california_housing/ch   16504    3101    median value ≥ its median       ``house_age``
credit/cred             10617    1923    no default next month           ``age``
gmsc                    13371    2474    no serious delinquency          ``age``
mnist                   11000    2000    the digit (10 classes)          top/bottom 5 pixel rows
======================  =======  ======  ==============================  =====================

Decisions where SPEC §5 is silent:

* Adult keeps the 2399 records with a missing value (``?``) and treats ``?`` as a category of
  its own (e.g. ``workclass=?``). Table 2's 26049 training rows are exactly 80% of all 32561
  records of ``adult.data``, and dropping those records would leave 30162 < 26049 + 5010.
* Train, test and validation come from one seeded permutation of the (balanced) table; the
  validation split is the rows used by neither train nor test (at most ``n_test``): Adult 1502,
  CH 1025, credit 732, GMSC 869. MNIST takes train and validation (2000) from the official
  training file and test from the official test file.
* Categorical codes keep their raw values in the feature names (credit ``sex=1``, ``sex=2``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datamodules.raw import SPLITS, RawDataModule, TabularDataModule
from datamodules.preprocess import take_validation
from datamodules.readers import (IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, read_csv_columns, read_headerless, read_idx,
                                 require_complete, require_numeric)
from datamodules.registry import register
from datamodules.sources import (ADULT_DATA, CAL_HOUSING, CREDIT, GMSC, MNIST_TEST_IMAGES, MNIST_TEST_LABELS,
                                 MNIST_TRAIN_IMAGES, MNIST_TRAIN_LABELS)

ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
                 "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week",
                 "native_country", "income"]
ADULT_CATEGORICAL = ("workclass", "education", "marital_status", "occupation", "relationship", "race", "sex",
                     "native_country")
CAL_HOUSING_COLUMNS = ["longitude", "latitude", "housing_median_age", "total_rooms", "total_bedrooms",
                       "population", "households", "median_income", "median_house_value"]
CREDIT_TARGET = "default.payment.next.month"
CREDIT_FEATURES = (["LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE", "PAY_0"]
                   + [f"PAY_{i}" for i in range(2, 7)] + [f"BILL_AMT{i}" for i in range(1, 7)]
                   + [f"PAY_AMT{i}" for i in range(1, 7)])
GMSC_TARGET = "SeriousDlqin2yrs"
GMSC_FEATURES = {
    "RevolvingUtilizationOfUnsecuredLines": "revolving_utilization_of_unsecured_lines",
    "age": "age",
    "NumberOfTime30-59DaysPastDueNotWorse": "number_of_time_30_59_days_past_due_not_worse",
    "DebtRatio": "debt_ratio",
    "MonthlyIncome": "monthly_income",
    "NumberOfOpenCreditLinesAndLoans": "number_of_open_credit_lines_and_loans",
    "NumberOfTimes90DaysLate": "number_of_times_90_days_late",
    "NumberRealEstateLoansOrLines": "number_real_estate_loans_or_lines",
    "NumberOfTime60-89DaysPastDueNotWorse": "number_of_time_60_89_days_past_due_not_worse",
    "NumberOfDependents": "number_of_dependents",
}
MNIST_SIDE = 28
PIXEL_HALF = 127.5
MNIST_PROTECTED_ROWS = tuple(range(5)) + tuple(range(MNIST_SIDE - 5, MNIST_SIDE))


def pixel_name(row: int, col: int) -> str:
    """Feature name of an MNIST pixel (0-based row and column)."""
    return f"pixel_r{row}_c{col}"


@register("adult")
class AdultDataModule(TabularDataModule):
    """UCI Adult (``adult.data`` only): income ``>50K`` = 1; 8 categoricals one-hot, 6 numerics standardised.

    Not balanced (SPEC §5). Records with ``?`` are kept, ``?`` being a category of its own.
    """

    raw_files = (ADULT_DATA,)
    table2_train, table2_test = 26049, 5010
    paper_label, cost_hint = "Adult", 6.0
    target_name, class_labels = "income", ("<=50K", ">50K")
    ct_defaults = {"tau": 0.75, "nce": 5000, "lambda_reg": 0.25}
    categorical = ADULT_CATEGORICAL
    integer_features = ("age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week")
    protected_features = ("age",)

    def read(self, paths: list[Path]) -> tuple[pd.DataFrame, np.ndarray]:
        """Features and labels of ``adult.data`` (records separated by ``, ``, no header)."""
        path = paths[0]
        frame = read_headerless(path, ADULT_COLUMNS, skipinitialspace=True, dtype=str)
        numeric = [c for c in ADULT_COLUMNS[:-1] if c not in ADULT_CATEGORICAL]
        frame = require_numeric(frame, numeric, path)
        require_complete(frame, ADULT_COLUMNS, path)
        income = frame["income"].str.strip().str.rstrip(".")
        unknown = sorted(set(income.unique()) - {"<=50K", ">50K"})
        if unknown:
            raise ValueError(f"{path}: unexpected income values {unknown[:5]}; expected '<=50K' or '>50K'")
        return frame.drop(columns="income"), (income == ">50K").to_numpy(np.int64)


HOUSING_FEATURES = ("med_inc", "house_age", "ave_rooms", "ave_bedrms", "population", "ave_occup", "latitude",
                    "longitude")


def housing_features(raw: pd.DataFrame) -> pd.DataFrame:
    """scikit-learn's eight California housing features from ``cal_housing.data``'s columns (per district)."""
    households = raw["households"]
    return pd.DataFrame({
        "med_inc": raw["median_income"], "house_age": raw["housing_median_age"],
        "ave_rooms": raw["total_rooms"] / households, "ave_bedrms": raw["total_bedrooms"] / households,
        "population": raw["population"], "ave_occup": raw["population"] / households,
        "latitude": raw["latitude"], "longitude": raw["longitude"]}, index=raw.index)


@register("california_housing", "ch")
class CaliforniaHousingDataModule(TabularDataModule):
    """California housing (StatLib ``cal_housing.data``), the 8 scikit-learn features, standardised.

    Target: median house value ≥ its median (over all 20640 districts) = 1; balanced by
    random under-sampling (20630 rows).
    """

    raw_files = (CAL_HOUSING,)
    table2_train, table2_test = 16504, 3101
    paper_label, cost_hint = "CH", 3.0
    target_name, class_labels = "median_house_value", ("below the median", "the median or above")
    ct_defaults = {"tau": 0.5, "nce": 5000, "lambda_reg": 0.25}
    balanced = True
    protected_features = ("house_age",)

    def read(self, paths: list[Path]) -> tuple[pd.DataFrame, np.ndarray]:
        """The scikit-learn features (MedInc, HouseAge, AveRooms, ...) and the median split target."""
        path = paths[0]
        raw = require_numeric(read_headerless(path, CAL_HOUSING_COLUMNS), CAL_HOUSING_COLUMNS, path)
        require_complete(raw, CAL_HOUSING_COLUMNS, path)
        value = raw["median_house_value"]
        return housing_features(raw), (value >= value.median()).to_numpy(np.int64)

    @classmethod
    def rows_in_model_columns(cls, frame: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
        """Districts given in ``cal_housing.data``'s columns (``total_rooms``, ``households``, ...) turned into the
        model's features as :meth:`read` turns them; other columns kept (so that unknown ones are still refused),
        the raw target left out. Rows already in the model's columns are returned as given."""
        raw = CAL_HOUSING_COLUMNS[:-1]
        derived_only = set(HOUSING_FEATURES) - set(raw)  # population, latitude and longitude are in both
        if not set(raw) <= set(frame.columns) or derived_only & set(frame.columns):
            return frame, None
        rest = frame.drop(columns=[*raw, CAL_HOUSING_COLUMNS[-1]], errors="ignore")
        return pd.concat([housing_features(frame), rest], axis=1), (
            "rows in cal_housing.data's columns, read as the model's features (ave_rooms = total_rooms / households, "
            "ave_bedrms = total_bedrooms / households, ave_occup = population / households)")


@register("credit", "cred")
class CreditDataModule(TabularDataModule):
    """Default of credit card clients (``UCI_Credit_Card.csv``): 1 = no default next month.

    ID dropped; SEX, EDUCATION, MARRIAGE one-hot (``sex=1``, ...); the rest standardised
    (names lower-cased: ``limit_bal``, ``age``, ``pay_0``, ``bill_amt1``, ...); balanced by
    random under-sampling (13272 rows).
    """

    raw_files = (CREDIT,)
    table2_train, table2_test = 10617, 1923
    paper_label, cost_hint = "Cred", 2.5
    target_name, class_labels, extra_columns = CREDIT_TARGET, ("default", "no default"), ("ID",)
    ct_defaults = {"tau": 0.5, "nce": 5000, "lambda_reg": 0.25}
    categorical = ("sex", "education", "marriage")
    integer_features = ("limit_bal", "age", "pay_0", *(f"pay_{i}" for i in range(2, 7)),
                        *(f"bill_amt{i}" for i in range(1, 7)), *(f"pay_amt{i}" for i in range(1, 7)))
    balanced = True
    protected_features = ("age",)

    def read(self, paths: list[Path]) -> tuple[pd.DataFrame, np.ndarray]:
        """Features (without ID) and the flipped default label."""
        path = paths[0]
        columns = CREDIT_FEATURES + [CREDIT_TARGET]
        frame = require_numeric(read_csv_columns(path, ["ID"] + columns), columns, path)
        require_complete(frame, columns, path)
        features = frame[CREDIT_FEATURES].rename(columns=str.lower)
        features[list(self.categorical)] = features[list(self.categorical)].astype(np.int64)
        return features, (1 - frame[CREDIT_TARGET]).to_numpy(np.int64)


@register("gmsc")
class GMSCDataModule(TabularDataModule):
    """Give Me Some Credit (``cs-training.csv``): 1 = no serious delinquency in two years.

    Index column dropped; rows with a missing value dropped (120269 left); balanced by random
    under-sampling (16714 rows); all 10 features standardised (snake-case names).
    """

    raw_files = (GMSC,)
    table2_train, table2_test = 13371, 2474
    paper_label, cost_hint = "GMSC", 3.0
    target_name, class_labels = GMSC_TARGET, ("serious delinquency", "no serious delinquency")
    extra_columns = ("Unnamed: 0",)  # cs-training.csv's unnamed row number
    ct_defaults = {"tau": 0.5, "nce": 5000, "lambda_reg": 0.5}
    balanced = True
    protected_features = ("age",)

    def read(self, paths: list[Path]) -> tuple[pd.DataFrame, np.ndarray]:
        """Complete rows' features and the flipped delinquency label."""
        path = paths[0]
        columns = [GMSC_TARGET] + list(GMSC_FEATURES)
        frame = require_numeric(read_csv_columns(path, columns), columns, path)
        frame = frame[columns].dropna()
        features = frame[list(GMSC_FEATURES)].rename(columns=GMSC_FEATURES)
        return features, (1 - frame[GMSC_TARGET]).to_numpy(np.int64)


@register("mnist")
class MNISTDataModule(RawDataModule):
    """MNIST from the four IDX files: 784 pixels scaled to [−1, 1], 10 classes.

    Train (11000) and validation (2000 by default) are disjoint random subsets of the 60000
    training images, test (2000) a random subset of the 10000 test images; ``source_rows`` index
    the training file for train/val and the test file for test. Features ``pixel_r{row}_c{col}``
    (0-based); protected: the 280 pixels of the top and bottom five rows.
    """

    raw_files = (MNIST_TRAIN_IMAGES, MNIST_TRAIN_LABELS, MNIST_TEST_IMAGES, MNIST_TEST_LABELS)
    table2_train, table2_test = 11000, 2000
    paper_label, cost_hint = "MNIST", 40.0
    eval_individuals = 25
    protected_features = tuple(pixel_name(r, c) for r in MNIST_PROTECTED_ROWS for c in range(MNIST_SIDE))
    ct_defaults = {"tau": 0.5, "nce": 5000, "lambda_reg": 0.01}
    fixed_domain = (-1.0, 1.0)

    @staticmethod
    def read_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
        """Images (n, 784) as uint8 and labels (n,) from an IDX image file and its label file."""
        images = read_idx(images_path, IDX_IMAGES_MAGIC)
        labels = read_idx(labels_path, IDX_LABELS_MAGIC)
        if images.shape[1:] != (MNIST_SIDE, MNIST_SIDE) or len(images) != len(labels):
            raise ValueError(f"{images_path}, {labels_path}: expected n images of 28x28 and n labels, got "
                             f"images {images.shape} and labels {labels.shape}")
        return images.reshape(len(images), -1), labels

    def build(self, paths: list[Path]) -> dict[str, np.ndarray]:
        """Seeded subsets of the official training and test files, scaled to [−1, 1]."""
        train_images, train_labels = self.read_pair(paths[0], paths[1])
        test_images, test_labels = self.read_pair(paths[2], paths[3])
        for what, wanted, available, path in (("n_train", self.n_train, len(train_labels), paths[0]),
                                              ("n_test", self.n_test, len(test_labels), paths[2])):
            if wanted < 1:
                raise ValueError(f"{self.name}: {what} must be positive, got {wanted}")
            self.check_enough_rows(available, "images", [path], wanted, what)
        rng = np.random.default_rng(self.data_seed)
        order = rng.permutation(len(train_labels))
        train, rest = order[:self.n_train], order[self.n_train:]
        val, val_source = take_validation(train, rest, self.n_test, self.n_val, rng, self.name)
        index = {"train": train, "val": val, "test": rng.permutation(len(test_labels))[:self.n_test]}
        sources = {"train": (train_images, train_labels), "val": (train_images, train_labels),
                   "test": (test_images, test_labels)}
        arrays = {}
        for split in SPLITS:
            images, labels = sources[split]
            arrays[f"x_{split}"] = images[index[split]].astype(np.float32) / PIXEL_HALF - 1.0
            arrays[f"y_{split}"] = labels[index[split]].astype(np.int64)
            arrays[f"rows_{split}"] = index[split].astype(np.int64)
        names = [pixel_name(r, c) for r in range(MNIST_SIDE) for c in range(MNIST_SIDE)]
        scale = np.full(len(names), PIXEL_HALF, np.float32)  # raw pixel = x * 127.5 + 127.5
        return {**arrays, "feature_names": np.array(names), "protected": np.array(self.protected_features),
                "n_classes": np.array(10), "mean": scale.copy(), "scale": scale, "val_source": np.array(val_source)}
