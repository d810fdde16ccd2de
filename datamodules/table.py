"""A user's own table as a data module: a CSV, Parquet or Excel file, or a pandas DataFrame (the same code path).

``TableDataModule("loans.csv", target="approved")`` checks the table (one-line errors before any work),
splits it into seeded, stratified train/validation/test rows (70/15/15), fits a :class:`~datamodules.codec.
TabularCodec` on the training rows only and encodes all three splits. The codec (``self.codec``) travels with
every run, so explanations come back in the user's own units and categories. CT's per-data-set settings are
chosen from the training split's size (:func:`table_defaults`) unless given.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from datamodules.base import TensorDataModule
from datamodules.codec import TabularCodec, _plain, category_codes, number_text, ordinal_orders, read_spec
from datamodules.feature_types import FeatureTypes
from datamodules.kept_codec import model_columns, outside_domain_notes, refuse_unseen_categories, widen_domain
from datamodules.preprocess import undersample
from datamodules.row_bounds import breaking_rows, rule_name
from datamodules.table_checks import SPLIT, checked_table, raise_problems
from datamodules.table_format import as_written, read_table, tidy_frame
from datamodules.workbook import table_file, table_label
from datamodules.wording import row_number, unworded_note, worded

TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".parquet", ".pq", ".xlsx", ".xlsm")  # a CSV's delimiter is read from its header; also --data's list
CODE_LEVELS = 10  # an inferred integer column with at most this many values may be category codes (SEX 1/2)
BALANCE = ("none", "undersample")  # classes: as in the file, or each cut to the smallest's size
UNSEEN_FIX = ("the model has no input for them: leave those rows out of the file, or train a new model on it (without "
              "--from-checkpoint) to learn them")
# a model's rows read but not trained on (evaluate.py, train_generator.py, compare's evaluation): no --from-checkpoint
UNSEEN_READ_FIX = ("the model has no input for them: leave those rows out of the file, or use a model trained on rows "
                   "that hold them (recipes/train.py --data on this file)")


def is_table_path(data) -> bool:
    """Whether ``data`` names a table file (by its suffix; a workbook perhaps with its ``#sheet``) rather than a
    registered data set."""
    return isinstance(data, (str, Path)) and Path(table_file(data)).suffix.lower() in TABLE_SUFFIXES


def table_defaults(n_train: int) -> dict:
    """CT settings for a table of ``n_train`` training rows, in the spirit of SPEC Table 2: τ 0.5 and λ_reg 0.25
    (the paper's real tabular sets), nce 1000 up to 10 000 training rows and 5000 above (never more than the
    training rows), batch size 32 up to 10 000 rows and 1000 above (the paper's real sets)."""
    large = n_train > 10_000
    return {"tau": 0.5, "lambda_reg": 0.25, "nce": min(n_train, 5000 if large else 1000),
            "batch_size": 1000 if large else 32}


def identifier_candidates(features: pd.DataFrame) -> set[str]:
    """Columns of whole numbers that look like row identifiers: a different number in every row, spanning at most
    twice as many numbers as there are rows (consecutive, or with the gaps of rows removed from a register)."""
    found = set()
    for name in features.columns:
        values = features[name]
        if len(values) > 2 and pd.api.types.is_integer_dtype(values) and values.is_unique \
                and values.max() - values.min() < 2 * len(values):
            found.add(name)
    return found


def train_rows(source, target: str | None, data_seed: int = 0) -> int:
    """How many training rows the labelled rows of the table ``source`` give (its stratified split), without any
    other check of the table: what its CT defaults are chosen from where the table is read by a model's own
    preprocessing (a fine-tuning)."""
    frame = read_table(source)
    labels = frame[target].dropna().astype(str).to_numpy() if target in frame.columns else np.array([])
    return len(stratified_split(labels, data_seed)["train"]) if len(labels) else 0


def stratified_split(y: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Seeded train/val/test row positions with each class split 70/15/15, rounded per class: every split sees every
    class of at least :data:`~datamodules.table_checks.MIN_CLASS_ROWS` rows (a rarer class is refused,
    :func:`~datamodules.table_checks.rare_class_problems`)."""
    rng = np.random.default_rng(seed)
    parts = {"train": [], "val": [], "test": []}
    for label in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == label))
        n_val, n_test = int(round(len(rows) * SPLIT[1])), int(round(len(rows) * SPLIT[2]))
        parts["val"].append(rows[:n_val])
        parts["test"].append(rows[n_val:n_val + n_test])
        parts["train"].append(rows[n_val + n_test:])
    return {split: np.sort(np.concatenate(rows)) for split, rows in parts.items()}


def training_fills(frame: pd.DataFrame, train: np.ndarray, target: str, orders: Mapping | None = None) -> dict:
    """Per feature column, the value ``--impute median`` fills in: the training rows' median for numbers (rounded
    where every value is a whole number, so an integer column stays one), the most frequent value for other columns
    and for 0/1 columns, the category of the median rank (the lower of two) for an ordinal column (``orders``:
    :func:`ordinal_orders`). Every column gets one, also those with no gap in the file, so that a row to explain or
    serve that lacks a value is completed as the training rows were."""
    fills = {}
    orders = dict(orders or {})
    for column in frame.columns.drop(target):
        fitted = frame[column].iloc[train].dropna()
        if not len(fitted):
            continue
        if column in orders:  # the codec refuses a value outside the order, or text without one
            order = orders[column] or sorted(pd.unique(frame[column].dropna()))
            ranks = np.sort(category_codes(fitted, order))
            if ranks[0] >= 0:
                fills[column] = _plain(order[int(ranks[(len(ranks) - 1) // 2])])
            continue
        numeric = pd.api.types.is_numeric_dtype(fitted) and not pd.api.types.is_bool_dtype(fitted)
        if not numeric or set(pd.unique(fitted)) <= {0, 1}:
            fill = fitted.mode().iloc[0]
        else:
            whole = bool((fitted == np.round(fitted)).all())
            fill = float(np.round(fitted.median())) if whole else float(fitted.median())
            fill = int(fill) if whole else fill
        fills[column] = fill.item() if isinstance(fill, np.generic) else fill
    return fills


def _as_written(column, value):
    """A value of ``column`` as its file writes it, read from the column itself (a row of all-number columns is all
    floats): an integer column's whole number as an int (20900, not 20900.0, of a float dtype), a categorical or
    ordinal column's code as its category is (2, not 2.0)."""
    if column.kind == "integer" and float(value).is_integer():
        return int(value)
    if column.kind in ("categorical", "ordinal"):
        return _plain(next((c for c in column.categories or () if c == value and type(c) is not bool), value))
    return _plain(value)


class TableDataModule(TensorDataModule):
    """A user's table (file path or DataFrame) with a target column; see the module docstring.

    ``spec``: a dict or YAML file, ``columns: {name: {kind, mutability, lower, upper, order}}`` and ``positive`` (the
    target value that is the positive class, label 1); kinds not given are inferred from the dtypes.
    """

    name = "table"
    default_batch_size = 32

    def __init__(self, source, target: str | None = None, spec=None, impute: str = "none",
                 batch_size: int | None = None, seed: int = 0, num_workers: int = 0, data_seed: int = 0,
                 codec: TabularCodec | dict | None = None, drop_columns: Sequence[str] = (), balance: str = "none",
                 widen: bool = False):
        self.source = source
        self.kept = codec is not None  # encoded with a trained model's preprocessing, not one fitted here
        self.frame = tidy_frame(source.copy()) if isinstance(source, pd.DataFrame) else read_table(source)
        if codec is not None and (widen or not isinstance(codec, TabularCodec)):  # widened below: the caller's stays
            codec = TabularCodec.from_dict(codec if isinstance(codec, dict) else codec.to_dict())
        # a trained model's preprocessing holds what its data spec declared: the file, perhaps edited, moved or named
        # relative to another folder since, is not read again
        self.spec = read_spec(spec) if codec is None else {}
        orders = ordinal_orders(self.spec, codec)  # labels such as 10% or $1,000 match their order as written
        self.label_of_source = "DataFrame" if isinstance(source, pd.DataFrame) else str(source)
        if not isinstance(source, pd.DataFrame):
            self.name = table_label(source)  # loans.csv -> loans: table rows, plots and model names use it
        self.drop_columns = list(codec.dropped if codec is not None else drop_columns)
        # a fine-tuning's or evaluation's own --drop-columns beside those the model was trained without
        self.given_drop_columns = [c for c in drop_columns if c not in self.drop_columns and c in self.frame.columns] \
            if codec is not None else []
        kept_notes = []
        if codec is not None and codec.target != target:
            renamed = f" (the file names it {target!r}: rename that column {codec.target})" \
                if codec.target not in self.frame.columns else ""
            raise ValueError(f"target: got {target!r}, not the column the model was trained to predict "
                             f"({codec.target!r}, from its ct_preprocessing){renamed}; allowed: {codec.target}")
        if codec is not None:  # another month's file, perhaps: the model's columns in any order, categories it knows
            self.frame, kept_notes = model_columns(self.frame, codec, self.label_of_source, target, drop_columns)
        # the checks the recipes also make before torch is imported (preflight.check_table_columns): one home
        checked = checked_table(self.frame, target, impute, self.label_of_source, orders, self.drop_columns,
                                strict=codec is None, declared=dict(self.spec.get("columns") or {}) if codec is None
                                else None)
        self.frame, self.read_notes = checked.frame, checked.notes + kept_notes  # how the file was read, rows left out
        if codec is not None:  # after the reading: an ordinal's labels written as 10% are its order's text again
            labelled = self.frame[self.frame[target].notna()] if target in self.frame.columns else self.frame
            refuse_unseen_categories(labelled, codec, self.label_of_source, UNSEEN_FIX if widen else UNSEEN_READ_FIX)
        units = dict(checked.attrs.get("units", {}))  # numbers the file wrote as $36,428.20 or 7.5%
        self.decimal_comma = bool(checked.attrs.get("decimal_comma", False))
        self.thousands = dict(checked.attrs.get("thousands", {}))  # each column's thousands separator: 14 999,01 €
        self.target, self.impute, self.data_seed = target, impute, data_seed
        raise_problems(checked.problems, self.label_of_source)
        self.balance_by_model = codec is not None and codec.balance is not None and not widen
        if self.balance_by_model:  # a trained model's own rows (explain.py --data)
            balance = codec.balance
        self._identifier_candidates = identifier_candidates(self.frame.drop(columns=[target]))  # before balancing
        self.balance, self.rows_read = balance, len(self.frame)
        if balance not in BALANCE:
            raise ValueError(f"balance: got {balance!r}; allowed: {', '.join(BALANCE)}")
        if balance == "undersample":  # as the paper's Credit and GMSC: every class cut to the smallest's size
            kept = undersample(self.frame[target].astype(str).to_numpy(), np.random.default_rng(data_seed))
            self.frame = self.frame.iloc[kept].reset_index(drop=True)
        self.rows = stratified_split(self.frame[target].astype(str).to_numpy(), data_seed)
        fills = training_fills(self.frame, self.rows["train"], target, orders) if impute == "median" else None
        models_fills = set()  # the columns filled as the model's preprocessing fills them, not from these rows
        if fills and codec is not None:  # a trained model fills a gap as it was trained to, where it was
            models_fills = {c.name for c in codec.columns if c.fill is not None}
            fills.update({c.name: c.fill for c in codec.columns if c.fill is not None})
            if widen:  # and a fine-tuned one, trained on these filled rows, fills the other columns so from now on
                for column in codec.columns:
                    column.fill = fills.get(column.name) if column.fill is None else column.fill
        if fills:
            def filled(column, value) -> str:  # a number as the file writes numbers (0,31), a category quoted ('rent')
                text = number_text(value, self.decimal_comma, self.thousands.get(column))
                return text if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
            median = set(orders) | {name for name in self.frame.columns if pd.api.types.is_numeric_dtype(self.frame[name])}
            def whence(column) -> str:  # the model's own fill (its original run's training rows) or this file's
                what = "median" if column in median else "most frequent value"
                if column in models_fills:
                    return f"as the model's preprocessing fills it (the {what} of the rows it was trained on, " \
                        "not this file's)"
                return f"the training rows' {what} (--impute median)"
            self.read_notes += [f"{column}: missing in {count} row(s), filled with {filled(column, fills[column])}, "
                                f"{whence(column)}" for column, count in self.frame.isna().sum().items()
                                if count and column in fills]
            self.frame = self.frame.fillna(fills)
        if codec is not None:  # a trained model's own preprocessing, so the columns match its inputs
            self.codec = codec
            if widen:  # the fine-tuned model's own rows: explain.py --data rebuilds them so
                self.codec.balance = balance
            # fine-tuning (widen): its training rows widen the domain; else rows beyond it are scored as they are
            self.read_notes += widen_domain(codec, self.frame.iloc[self.rows["train"]], self.label_of_source) if widen \
                else outside_domain_notes(codec, self.frame, self.label_of_source)
        else:
            self.codec = TabularCodec.fit(self.frame, target, self.spec, train_rows=self.rows["train"],
                                          dropped=self.drop_columns, fills=fills)
            self.codec.decimal_comma = self.decimal_comma
            for column in self.codec.columns:  # shown with the file's currency or percent sign in explanations
                column.unit = units.get(column.name) if column.kind in ("continuous", "integer") else None
                column.thousands = self.thousands.get(column.name)  # and its thousands separator
            self.codec.balance = balance
        self.ct_defaults = table_defaults(len(self.rows["train"]))
        super().__init__(batch_size or self.ct_defaults["batch_size"], seed, num_workers)
        self.protected_features = tuple(c.name for c in self.codec.columns if c.mutability == "none")

    def load_splits(self) -> dict:
        features, target = self.frame.drop(columns=[self.target]), self.frame[self.target]
        splits = {}
        for split, rows in self.rows.items():  # split by split: the encoded table exists once, not also as a whole
            splits[f"x_{split}"] = self.codec.encode(features.iloc[rows])
            splits[f"y_{split}"] = self.codec.encode_target(target.iloc[rows])
        return {**splits, "feature_names": self.codec.feature_names, "protected": list(self.protected_features),
                "n_classes": len(self.codec.classes)}

    def domain(self, n_std: float = 3.0):
        """The codec's bounds: declared ones where the spec gives them, one-hot and binary inputs in [0, 1]."""
        import torch  # noqa: PLC0415

        lower, upper = self.codec.encoded_bounds()
        return torch.as_tensor(lower), torch.as_tensor(upper)

    def feature_types(self) -> FeatureTypes:
        """The codec's structure for valid counterfactuals (:meth:`TabularCodec.feature_types`)."""
        return self.codec.feature_types()

    def example_row(self) -> dict | None:
        """The first test row without a gap, as ``{column: value}`` of the model's columns in the file's own units
        (numbers as read: ``$12,500`` is 12500), for the explain command shown after training; ``None`` if every
        test row has a gap."""
        names = [c.name for c in self.codec.columns]
        rows = self.frame.iloc[self.rows["test"]][names].dropna()
        if rows.empty:
            return None
        return {c.name: _as_written(c, rows[c.name].iloc[0]) for c in self.codec.columns}

    def identifier_notes(self) -> list[str]:
        """One note per column that looks like an identifier (:meth:`identifier_like`), naming its ``--drop-columns``;
        of a model's own preprocessing (a fine-tuning), which reads the column and cannot leave it out, the new model
        that can."""
        fix = ("the model was trained on it as a feature and reads it; a model without it is a new training: "
               "--drop-columns {} without --from-checkpoint") if self.kept else \
            "it trains as a feature; leave it out with --drop-columns {}"
        return [f"{name!r} holds a different whole number in every row, numbered like rows: an identifier? "
                + fix.format(shlex.quote(name)) for name in self.identifier_like()]

    def describe(self) -> str:
        """What was read and inferred, for the start-up message."""
        sizes = " / ".join(f"{split} {len(rows)}" for split, rows in self.rows.items())
        def shown(c) -> str:  # 0, not np.int64(0); in the data spec's words where it gives some: no default [0]
            words = self.codec.class_label(c)
            return worded(c, words) if words is not None else repr(_plain(c))

        classes = ", ".join(shown(c) for c in self.codec.classes)
        # label 1 of a yes/no target; of three or more classes none is "the positive" one
        positive = f" (positive: {shown(self.codec.positive)})" if len(self.codec.classes) == 2 else ""
        balanced_by = "as in the run that trained the model, --balance undersample" if self.balance_by_model \
            else "--balance undersample"
        return (f"data {self.label_of_source}: {len(self.frame)} rows ({sizes}), target {self.target!r} with classes "
                f"{classes}{positive}"
                + (f"\n{self.codec.outcome_text()}" if getattr(self.codec, "order", None) else "")
                + ("\ncolumns (the model's own preprocessing: its kinds, categories and standardisation):"
                   if self.kept else "\ncolumns (kind from the data spec or inferred from the dtypes):")
                + f"\n{self.codec.describe()}"
                + (f"\nleft out (--drop-columns): {', '.join(self.drop_columns)}" if self.drop_columns and not self.kept
                   else "")
                + (f"\nleft out: {', '.join(self.drop_columns)}, which the model was trained without (--drop-columns of "
                   "the run that trained it)" if self.drop_columns and self.kept else "")
                + (f"\nleft out (--drop-columns): {', '.join(self.given_drop_columns)}" if self.given_drop_columns
                   else "")
                + (f"\nbalanced ({balanced_by}): kept {len(self.frame)} of {self.rows_read} rows, "
                   f"{len(self.frame) // len(self.codec.classes)} of each class" if self.balance == "undersample" else "")
                + "".join(f"\nnote: {line}" for line in self.identifier_notes())
                + "".join(f"\nnote: {line}" for line in self.read_notes + self.case_variants())
                + (f"\nnote: {unworded}" if (unworded := unworded_note(self.codec.columns)) else "")
                + "".join(f"\nnote: {line}" for line in self.outside_declared_bounds())
                + "".join(f"\nnote: {line}" for line in self.breaking_rules())
                + (f"\nnote: {', '.join(self.code_like())} "
                   f"{'hold' if len(self.code_like()) > 1 else 'holds'} at most {CODE_LEVELS} different whole numbers"
                   f"{' each' if len(self.code_like()) > 1 else ''}: if "
                   "they are codes of categories rather than amounts or counts, declare them categorical in --data-spec "
                   "(train.py --write-data-spec spec.yaml writes one to start from; docs/guide.md, 'Your own table')" if self.code_like() else ""))

    def case_variants(self) -> list[str]:
        """One line per text column with values that differ only in upper and lower case ('male', 'Male'): they stay
        different categories, which is seldom what the file meant (a target's classes are refused so:
        :func:`~datamodules.table_format.class_spellings_error`)."""
        lines = []
        named = [(c.name, c.categories) for c in self.codec.columns if c.kind in ("categorical", "binary")]
        for name, values in named:
            groups = {}
            for value in values:
                if isinstance(value, str):
                    groups.setdefault(value.casefold(), []).append(value)
            clashes = [group for group in groups.values() if len(group) > 1]
            if clashes:
                shown = "; ".join(", ".join(map(repr, group)) for group in clashes[:3])
                lines.append(f"{name}: {shown} differ only in case: they are different categories; write each the "
                             "same way in the file if they are one")
        return lines

    def code_like(self) -> list[str]:
        """Integer columns inferred from the dtypes (not declared) with few levels: perhaps category codes."""
        declared = {name for name, options in (self.spec.get("columns") or {}).items() if (options or {}).get("kind")}
        return [c.name for c in self.codec.columns if c.kind == "integer" and c.name not in declared
                and self.frame[c.name].nunique() <= CODE_LEVELS]

    def outside_declared_bounds(self) -> list[str]:
        """One line per column whose rows fall outside its declared ``lower``/``upper``: they train as they are,
        but a counterfactual keeps to the bounds and such a row is refused when explained or served."""
        lines = []
        for c in self.codec.columns:
            if c.kind not in ("continuous", "integer") or (c.lower is None and c.upper is None):
                continue
            values = pd.to_numeric(self.frame[c.name], errors="coerce")
            below = int((values < c.lower).sum()) if c.lower is not None else 0
            above = int((values > c.upper).sum()) if c.upper is not None else 0
            if below or above:
                lower, upper = (as_written(f"{v:g}", self.decimal_comma, c.thousands) if v is not None else None
                                for v in (c.lower, c.upper))
                parts = ([f"{below} below the declared lower bound {lower}"] if below else []) + \
                        ([f"{above} above the declared upper bound {upper}"] if above else [])
                lines.append(f"{c.name}: rows of the file lie outside the data spec's bounds ({', '.join(parts)}); they "
                             "train as they are, but counterfactuals keep to the bounds and such rows are refused when "
                             "explained or served")
        return lines

    def breaking_rules(self) -> list[str]:
        """One line per cross-column bound of the data spec (``experience: {upper: age - 16}``) that rows of the
        file break: ``3 of 2000 rows break experience <= age − 16 (first: row 17)``. They train as they are (a
        recorded fact, perhaps a typing error, is no reason to stop a training); counterfactuals keep to the rule,
        and such a row is refused when explained or served where the column may change."""
        lines = []
        for column, side, shown, broken, _ in breaking_rows(self.codec, self.frame):
            if broken.any():
                first = row_number(self.frame.index[int(np.flatnonzero(broken)[0])])
                lines.append(f"{int(broken.sum())} of {len(broken)} rows break {rule_name(column, side, shown)} "
                             f"(first: row {first}); they train as they are, but "
                             "counterfactuals keep to the rule and such rows are refused when explained or served")
        return lines

    def identifier_like(self) -> list[str]:
        """Integer feature columns that look like row identifiers (:func:`identifier_candidates`, in the file's rows
        before ``--balance`` kept some)."""
        return [c.name for c in self.codec.columns if c.kind == "integer" and c.name in self._identifier_candidates]
