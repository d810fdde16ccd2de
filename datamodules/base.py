"""Base class for data modules that hold their splits as in-memory tensors."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

from datamodules.domain import infer_domain
from datamodules.feature_types import FeatureTypes

EVAL_BATCH_SIZE = 4096  # rows per forward pass of the validation and test loaders


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of ``x`` is finite. numpy's test makes one boolean mask; ``torch.isfinite`` makes a float
    copy and two masks first (238 MiB for a 200 000-row table's 140 000 x 252 training inputs)."""
    return bool(np.isfinite(x.detach().cpu().numpy()).all())


class IndexedTensorDataset(TensorDataset):
    """A ``TensorDataset`` that hands a ``DataLoader`` a whole batch at once: the batch sampler's indices
    slice every tensor once (``__getitems__``) instead of fetching and collating sample by sample."""

    def __getitems__(self, indices: list[int] | range) -> list[torch.Tensor]:
        if isinstance(indices, range) and indices.step == 1:  # from ContiguousBatchSampler: views, no copy
            return [tensor[indices.start:indices.stop] for tensor in self.tensors]
        index = torch.as_tensor(indices, dtype=torch.long)
        return [tensor[index] for tensor in self.tensors]


class ContiguousBatchSampler(BatchSampler):
    """A ``BatchSampler`` that hands the batches of a ``SequentialSampler`` over as ``range`` objects, which
    :class:`IndexedTensorDataset` slices as views: an evaluation batch then costs no Python list of row numbers
    and no copy of its rows (MNIST's validation split is 6 MB, about 3 ms to gather a copy of each epoch on one
    core). Any other sampler (Lightning swaps in a ``DistributedSampler`` on several processes) gets the usual
    lists of indices."""

    def __iter__(self):
        if type(self.sampler) is not SequentialSampler:
            yield from super().__iter__()
            return
        rows = len(self.sampler)
        stop = rows - rows % self.batch_size if self.drop_last else rows
        for start in range(0, stop, self.batch_size):
            yield range(start, min(start + self.batch_size, rows))


def keep_batch(batch):
    """Collate function of :class:`IndexedTensorDataset` loaders: the batch is already assembled."""
    return batch


class EpochSeededSampler(RandomSampler):
    """A random order that is a pure function of ``(seed, epoch)``: a resumed run replays the same batches.

    Lightning calls ``set_epoch`` before every epoch (as for ``DistributedSampler``); a
    ``RandomSampler`` with one generator would instead restart its sequence on resume.
    """

    def __init__(self, data_source, seed: int = 0):
        super().__init__(data_source)
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        """Select the order of epoch ``epoch``."""
        self.epoch = int(epoch)

    def order(self) -> torch.Tensor:
        """The current epoch's order of the row indices, as one tensor."""
        generator = torch.Generator().manual_seed(hash((self.seed, self.epoch)) % (2**63))
        return torch.randperm(len(self.data_source), generator=generator)

    def __iter__(self):
        return iter(self.order().tolist())


class TensorDataModule(L.LightningDataModule):
    """A data set held as tensors: ``x_*`` float32 of shape (n, n_features), ``y_*`` int64 labels.

    Subclasses implement :meth:`load_splits` and set the class attributes below: every fact about a
    data set lives on its class, so a new data set is one class. After :meth:`setup`,
    ``feature_names``, ``protected`` (names of the default protected features), ``n_classes`` and the
    six split tensors are available.
    """

    name = "tensor"
    default_batch_size = 32
    ct_defaults: dict = {}  # per-data-set CT settings of SPEC Table 2 (tau, nce, lambda_reg)
    fixed_domain: tuple[float, float] | None = None  # e.g. (-1, 1) for images; None: inferred
    integer_features: tuple[str, ...] = ()  # names of features that are whole numbers in original units
    synthetic: bool = False  # generated on the fly (no raw file)
    blob: bool = False  # a two-blob set whose module takes ``center_distance``
    paper_label: str | None = None  # the row label in the paper's tables; None: the registered name
    eval_individuals: int = 100  # individuals per evaluation run under the reference protocol
    protected_features: tuple[str, ...] = ()  # the default protected features (``--protect``)
    cost_hint: float = 1.0  # rough training cost relative to circles, to schedule long tasks first

    def __init__(self, batch_size: int | None = None, seed: int = 0, num_workers: int = 0):
        super().__init__()
        self.batch_size = batch_size or self.default_batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.feature_names: list[str] = []
        self.protected: list[str] = []
        self.n_classes = 0
        self._ready = False

    def load_splits(self) -> dict:
        """Return a dict with ``x_train, y_train, x_val, y_val, x_test, y_test`` tensors,
        ``feature_names`` and ``n_classes`` (``protected`` optional: default ``protected_features``)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        """Load the splits once; later calls are free."""
        if self._ready:
            return
        splits = self.load_splits()
        for key in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
            value = torch.as_tensor(splits[key])
            value = value.float() if key.startswith("x") else value.long()
            if key.startswith("x") and not all_finite(value):
                raise ValueError(f"data {self.name}: {key} contains NaN or infinite values after preprocessing")
            setattr(self, key, value)
        self.feature_names = list(splits["feature_names"])
        self.protected = [str(name) for name in splits.get("protected", self.protected_features)]
        self.n_classes = int(splits["n_classes"])
        self._ready = True

    @classmethod
    def label(cls) -> str:
        """The data set's row label in the paper's tables (its registered name if it has none)."""
        return cls.paper_label or cls.name

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Training inputs and labels, for drawing factuals and x⁺ in counterfactual training."""
        return self.x_train, self.y_train

    def domain(self, n_std: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-feature bounds: the fixed range if the data set has one, else inferred (SPEC §2)."""
        if self.fixed_domain is not None:
            lower = torch.full((self.n_features,), float(self.fixed_domain[0]))
            return lower, torch.full_like(lower, float(self.fixed_domain[1]))
        return infer_domain(self.x_train, n_std)

    def feature_types(self) -> FeatureTypes:
        """Categorical and integer structure for valid counterfactuals (a :class:`FeatureTypes`).

        By default one-hot groups are the ``feature=value`` columns sharing a prefix, integers are the
        class attribute ``integer_features``, and original units come from ``feature_mean``/``feature_scale``
        where the data module has them (``raw = x * scale + mean``). A data module with a codec of its own
        overrides this.
        """
        mean, scale = getattr(self, "feature_mean", None), getattr(self, "feature_scale", None)
        return FeatureTypes.from_names(self.feature_names, self.n_features, self.integer_features,
                                       None if mean is None else torch.as_tensor(mean),
                                       None if scale is None else torch.as_tensor(scale))

    def _loader(self, x, y, shuffle: bool) -> DataLoader:
        dataset = IndexedTensorDataset(x, y)
        # The order is a pure function of (seed, epoch), so a resumed run replays the same batches;
        # batches are sliced in one go (IndexedTensorDataset) instead of collated sample by sample.
        if shuffle:
            return DataLoader(dataset, batch_size=self.batch_size, sampler=EpochSeededSampler(dataset, self.seed),
                              num_workers=self.num_workers, collate_fn=keep_batch)
        # Evaluation batches only fix how many rows one forward pass takes: the per-split loss and accuracy
        # are row-weighted means, so large batches give the same values with far fewer loop steps.
        batches = ContiguousBatchSampler(SequentialSampler(dataset), max(self.batch_size, EVAL_BATCH_SIZE),
                                         drop_last=False)
        return DataLoader(dataset, batch_sampler=batches, num_workers=self.num_workers, collate_fn=keep_batch)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.x_train, self.y_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.x_val, self.y_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.x_test, self.y_test, shuffle=False)

    def summary(self) -> dict:
        """Sizes, features, class balance and protected features, for reports."""
        balance = torch.bincount(self.y_train, minlength=self.n_classes).float() / len(self.y_train)
        return {
            "name": self.name,
            "n_train": len(self.y_train),
            "n_val": len(self.y_val),
            "n_test": len(self.y_test),
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "protected": list(self.protected),
            "class_balance": [round(v, 4) for v in balance.tolist()],
            "batch_size": self.batch_size,
        }
