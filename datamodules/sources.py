"""Catalogue of the raw files of the real data sets: expected size, sha256 and public source.

Sizes and checksums are those of the unmodified public files in ``shared/data/raw`` (see its
SOURCES.md). Credit (the Kaggle ``UCI_Credit_Card.csv`` layout) and GMSC (Kaggle competition
data) have no public unauthenticated download: a missing copy raises a clear error instead.
"""

from __future__ import annotations

from datamodules.download import RawFile

UCI_ADULT = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")

ADULT_DATA = RawFile(
    "adult", "adult.data", 3974305, "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    urls=(UCI_ADULT + "adult.data",),
    source="the UCI Machine Learning Repository, https://archive.ics.uci.edu/dataset/2/adult")

CAL_HOUSING = RawFile(
    # The archive scikit-learn's fetch_california_housing uses (L. Torgo's cal_housing.tgz);
    # the archive is checked against scikit-learn's sha256, the extracted file by its parser.
    "california_housing", "cal_housing.data", None, None,
    urls=("https://ndownloader.figshare.com/files/5976036",),
    archive_member="CaliforniaHousing/cal_housing.data",
    archive_sha256="aaa5c9a6afe2225cc2aed2723682ae403280c4a3695a2ddda4ffb5d8215ea681",
    source="StatLib / L. Torgo's cal_housing.tgz (https://ndownloader.figshare.com/files/5976036, "
           "member CaliforniaHousing/cal_housing.data)")

CREDIT = RawFile(
    "credit", "UCI_Credit_Card.csv", 2862995, "a0f0ab49d6326671d6cd83be5c88dcf18007025fe9a53ecd699119c871176ca1",
    source="Kaggle, https://www.kaggle.com/datasets/uciml/default-of-credit-card-clients-dataset "
           "(needs a Kaggle login; UCI only offers the original .xls, "
           "https://archive.ics.uci.edu/dataset/350/default+of+credit+card+clients, in another layout)")

GMSC = RawFile(
    "gmsc", "cs-training.csv", 7564965, "1bd46da486a5708c58c7b01a034fae2a13b327f6f7b62ea7ba4fe3b5824b24ac",
    source="the Kaggle competition 'Give Me Some Credit', https://www.kaggle.com/c/GiveMeSomeCredit/data "
           "(needs a Kaggle login and accepting the competition rules)")


def _mnist(filename: str, size: int, sha256: str) -> RawFile:
    """An MNIST IDX file with its mirrors."""
    return RawFile("mnist", filename, size, sha256, urls=tuple(m + filename for m in MNIST_MIRRORS),
                   source="the MNIST database (LeCun, Cortes & Burges), e.g. " + MNIST_MIRRORS[0] + filename)


MNIST_TRAIN_IMAGES = _mnist("train-images-idx3-ubyte.gz", 9912422,
                            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609")
MNIST_TRAIN_LABELS = _mnist("train-labels-idx1-ubyte.gz", 28881,
                            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c")
MNIST_TEST_IMAGES = _mnist("t10k-images-idx3-ubyte.gz", 1648877,
                           "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6")
MNIST_TEST_LABELS = _mnist("t10k-labels-idx1-ubyte.gz", 4542,
                           "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6")
