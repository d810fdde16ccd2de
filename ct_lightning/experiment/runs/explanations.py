"""Explaining a trained run: its model and preprocessing from a run or a checkpoint, rows in original units,
and the explanations logged back to the run (a table and a plot)."""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ct_lightning.evaluation.explanation import FeatureCodec, codec_from_dict, explain, explanation_search, mark_filled
from ct_lightning.experiment.configuration.validation import InputError, show
from ct_lightning.experiment.runs.checkpoints import load_trained_classifier
from ct_lightning.models import ModuleNotImportable
from datamodules.codec import LABELLED, categories_by_case, category_codes, class_order

PREPROCESSING = "preprocessing.json"


@dataclass
class Explainable:
    """A trained module with the codec of its inputs, its training configuration and where it came from."""

    module: torch.nn.Module
    codec: object
    config: dict
    run_id: str | None
    has_preprocessing: bool


def _preprocessing_beside(path: str | Path) -> dict | None:
    sibling = Path(path).parent / PREPROCESSING
    return json.loads(sibling.read_text()) if sibling.is_file() else None


def _logged_preprocessing(run_id: str, tracking_uri: str | None) -> dict | None:
    """The ``preprocessing.json`` a run logged, ``None`` where it logged none."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri=tracking_uri)
    if not any(a.path == PREPROCESSING for a in client.list_artifacts(run_id)):
        return None
    with tempfile.TemporaryDirectory(prefix="ct-explain-") as folder:
        return json.loads(Path(client.download_artifacts(run_id, PREPROCESSING, folder)).read_text())


def _fallback_codec(module) -> FeatureCodec:
    hp = module.hparams
    return FeatureCodec(hp.feature_names or None, n_features=int(hp.n_features or 0) or None,
                        n_classes=int(hp.n_classes), mutability=hp.mutability or None)


def _from_logged_models(run_id: str, tracking_uri: str) -> Explainable:
    """A run without checkpoints: its logged ``model`` (the classifier) and ``predictor`` (the codec), with the
    settings of its ``config.json``."""
    import mlflow.pyfunc
    import mlflow.pytorch
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.run_artifacts import _tracking_uri
    from ct_lightning.experiment.configuration.settings import DEFAULTS, module_kwargs
    from ct_lightning.module import CTModule

    client = MlflowClient(tracking_uri=tracking_uri)
    folder = tempfile.mkdtemp(prefix="ct-explain-")
    try:
        config = {**DEFAULTS, **json.loads(Path(client.download_artifacts(run_id, "config.json", folder)).read_text())}
        with _tracking_uri(tracking_uri):
            model = mlflow.pytorch.load_model(f"runs:/{run_id}/model", map_location="cpu")
            predictor = mlflow.pyfunc.load_model(f"runs:/{run_id}/predictor").unwrap_python_model()
    except Exception as error:  # noqa: BLE001 - MLflow raises several types for missing artifacts
        raise FileNotFoundError(f"run {run_id}: no checkpoint and no logged model to explain "
                                f"({str(error).splitlines()[0]})") from None
    codec = predictor.codec
    names = list(codec.feature_names)
    mutability = dict(predictor.search.get("mutability") or {}) or None  # the run's trained constraints
    module = CTModule(model=model, **module_kwargs(config, len(names), len(codec.classes), names, mutability))
    return Explainable(module.eval(), codec, config, run_id, not isinstance(codec, FeatureCodec))


def load_explainable(run_id: str | None = None, checkpoint: str | None = None, tracking_uri: str | None = None,
                     which: str = "last") -> Explainable:
    """The model of an MLflow run (``checkpoints/WHICH.ckpt``, ``config.json``, ``preprocessing.json``; a run
    without checkpoints: its logged models) or of a checkpoint file (preprocessing stored in it or beside it). Without a preprocessing the model's own inputs
    are the columns (:class:`FeatureCodec`). A checkpoint is read without Lightning
    (:func:`~ct_lightning.experiment.runs.checkpoints.load_trained_classifier`), and MLflow is imported for a run only."""
    if run_id:
        from ct_lightning.experiment.runs.loading import download_checkpoint  # noqa: PLC0415 - MLflow

        try:
            checkpoint, config = download_checkpoint(run_id, tracking_uri, which)
        except FileNotFoundError:  # a model logged as it is (--limit-train-batches 0) has no checkpoint
            return _from_logged_models(run_id, tracking_uri)
    else:
        sibling = Path(checkpoint).parent / "config.json"
        config = json.loads(sibling.read_text()) if sibling.is_file() else {}
    if run_id:  # --model mynet:Net, explained from a folder where mynet.py is not importable: the run's copy
        from ct_lightning.experiment.runs.loading import with_logged_code  # noqa: PLC0415 - MLflow

        module = with_logged_code(lambda: load_trained_classifier(checkpoint), run_id, tracking_uri)
    else:
        try:
            module = load_trained_classifier(checkpoint)
        except ModuleNotImportable:  # the same from the checkpoint's run (MLflow only now), else a line on --checkpoint
            from ct_lightning.experiment.runs.loading import with_checkpoint_code  # noqa: PLC0415

            module = with_checkpoint_code(lambda: load_trained_classifier(checkpoint), checkpoint)
    payload = module.preprocessing or _preprocessing_beside(checkpoint)
    if payload is None and run_id:
        payload = _logged_preprocessing(run_id, tracking_uri)
    codec = codec_from_dict(payload) if payload else _fallback_codec(module)
    return Explainable(module.eval(), codec, config, run_id, payload is not None)


def known_classes(run_id: str | None, checkpoint: str | None, tracking_uri: str | None) -> tuple[list, list] | None:
    """``(classes, their words)`` of a model from the cheapest place that has them, without building the model: a
    checkpoint's preprocessing.json beside it or the preprocessing it carries, a run's logged preprocessing.json;
    ``None`` where neither holds them (a model of no table: its classes are known once it is loaded)."""
    payload = None
    if checkpoint:  # as load_explainable reads it: the preprocessing the checkpoint carries, else the file beside it
        from ct_lightning.experiment.configuration.checkpoint_peek import carried_table_preprocessing  # noqa: PLC0415

        payload = carried_table_preprocessing(checkpoint) or _preprocessing_beside(checkpoint)
    elif run_id:
        payload = _logged_preprocessing(run_id, tracking_uri)
    if not isinstance(payload, dict) or not isinstance(payload.get("classes"), list):
        return None
    return list(payload["classes"]), payload.get("class_labels") or None


def use_data(explainable: Explainable, data: str | None) -> str | None:
    """Take the model's training data from ``data`` (``--data``: a checkpoint copied without the config.json its
    training wrote beside it names none), for the generators that learn from it. ``data`` wins over the data its
    config names; a table's label column and its filling of missing values come from the model's own preprocessing
    where the config lacks them. Returns a note for the console where ``data`` replaces the config's data."""
    if not data:
        return None
    named = explainable.config.get("data")
    config = {**explainable.config, "data": data}
    from ct_lightning.experiment.configuration.settings import is_table_file  # noqa: PLC0415

    # a file's label column and fills (a built-in table's run has a preprocessing too, but its data module knows them)
    codec = explainable.codec if explainable.has_preprocessing and is_table_file(data) else None
    if codec is not None and getattr(codec, "target", None) is not None and not config.get("target"):
        config["target"] = codec.target
    if codec is not None and "impute" not in config and any(getattr(c, "fill", None) is not None
                                                             for c in getattr(codec, "columns", ())):
        config["impute"] = "median"  # trained with --impute median: the codec keeps the training's fills
    explainable.config = config
    if named and str(named) != str(data):
        return f"--data: the training data is {data}, not {named} that the model's config.json names (--data wins)"
    return None


def read_rows(rows_file: str | None = None, row: str | None = None) -> pd.DataFrame:
    """Rows in original units from a CSV file (``--rows``) or one JSON object (``--row``), numbered as people count
    them: the first row under the header (the first object) is row 1 (:func:`~datamodules.wording.row_number`), the
    number every message, the console, ``--json``, ``--csv`` and the letters give it; one-line errors."""
    from datamodules.wording import row_number  # noqa: PLC0415

    frame = _read_rows(rows_file, row)
    frame.index = pd.RangeIndex(row_number(0), row_number(len(frame)))
    return frame


def _read_rows(rows_file: str | None, row: str | None) -> pd.DataFrame:
    if row is not None:
        try:
            value = json.loads(row)
        except json.JSONDecodeError as error:
            raise InputError("--row", row, "a JSON object such as '{\"age\": 53, \"income\": 54600}'",
                             f"not JSON: {error.msg}") from None
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, dict) and v for v in values):
            raise InputError("--row", row, "a JSON object (or a list of them) of column: value")
        return pd.DataFrame(values)
    from datamodules.table_format import TableError, read_table  # noqa: PLC0415 - the training file's reader

    try:
        return read_table(rows_file, option="--rows")
    except FileNotFoundError:
        raise InputError("--rows", rows_file, "an existing CSV file", "not found") from None
    except TableError as error:
        raise InputError(error.option, error.value, error.allowed, error.problem) from None


def check_rows(frame: pd.DataFrame, explainable: Explainable, option: str, skip_bad_rows: bool = False,
               held=()) -> tuple[pd.DataFrame, list[str], list[tuple[int, str]]]:
    """The rows ready to explain, notes for the console and the rows left out; a one-line ``InputError`` for rows the
    model cannot read, before any search: missing or unknown columns, unseen categories, non-numbers in numeric
    columns, fractions in integer columns, missing values (filled as in training where the model was trained with
    ``--impute median``), numbers outside the model's domain (the one the search keeps to), a row that breaks a
    data spec's rule on a column that may change (``experience`` above ``age - 16``; not on one the training's
    ``--immutable`` or ``held``, explain.py's, keeps): what the served model refuses too. The target column and the columns the model was trained without (``--drop-columns``) may come
    along, as in rows taken from the training file. With ``skip_bad_rows`` a row with a problem of its own (a value,
    not a column) is left out and listed as ``(row, problem)`` instead; the error then comes only when no row is
    left."""
    from datamodules.codec import ordinal_orders, text_ordinals  # noqa: PLC0415
    from datamodules.table_format import TableError, labels_as_written  # noqa: PLC0415

    codec = explainable.codec
    columns = [c.name for c in codec.columns]
    try:  # a file's 10%, 20% of an ordinal column whose order lists them: its labels as written, not numbers
        frame = labels_as_written(frame, text_ordinals(ordinal_orders(None, codec)), option)
    except TableError as error:
        raise InputError(error.option, error.value, error.allowed, error.problem) from None
    frame, derived = _rows_in_model_columns(explainable, frame)
    frame, notes = _matched_names(frame, [*columns, *getattr(codec, "dropped", ()), getattr(codec, "target", "")],
                                  option)
    notes = [f"{option}: {derived}", *notes] if derived else notes
    target = getattr(codec, "target", None)
    if target is not None and target in frame.columns and target not in columns:
        frame = frame.drop(columns=[target])
        notes.append(f"{option}: the target column {target!r} is left out (the model predicts it)")
    ignored = set(getattr(codec, "dropped", ()))  # trained without them (--drop-columns)
    missing = [c for c in columns if c not in frame.columns]
    unknown = [c for c in frame.columns if c not in columns and c not in ignored]
    note = "" if explainable.has_preprocessing else " (the run has no preprocessing.json, so the columns are the " \
                                                    "model's own inputs)"
    others = _other_columns(frame, [c for c in frame.columns if c not in columns])  # ids: they name the rows
    if unknown and not missing:  # a CRM export's extra columns (customer_id, notes): the model's are all there
        frame = frame.drop(columns=unknown)
        notes.append(f"{option}: columns the model does not read left out: {', '.join(map(str, unknown))}")
    elif unknown:  # a column missing beside an unknown one: a misspelt name, most likely
        from datamodules.suggest import name_hint  # noqa: PLC0415

        hinted = [(c, name_hint(c, missing, "; {}")) for c in unknown]
        found = next(((c, h) for c, h in hinted if h), None)  # the misspelt one, not an extra id column
        if found is None:  # a column renamed (employment_years for years_employed): the model's that is missing
            raise InputError(option, missing[0], f"rows holding every column: {', '.join(columns)}{note}",
                             f"missing column; the rows have columns the model does not know: "
                             f"{', '.join(map(str, unknown))} (one renamed? give it the model's name)")
        raise InputError(option, found[0], f"the model's columns {', '.join(columns)}{note}", f"unknown column{found[1]}")
    if missing:
        raise InputError(option, missing[0], f"rows holding every column: {', '.join(columns)}", "missing column")
    from datamodules.table_format import rows_as_written, thousands_points  # noqa: PLC0415

    numeric = [c.name for c in codec.columns if c.kind in ("continuous", "integer")]
    decimal_comma = getattr(codec, "decimal_comma", False)
    if not decimal_comma:
        notes += [f"{option}: {line}" for line in thousands_points(frame, numeric)]
    frame = rows_as_written(frame, numeric, decimal_comma)
    frame, matched = _matched_categories(frame, codec.columns)
    notes += [f"{option}: {line}" for line in matched]
    gaps = {}  # row: the columns whose missing value is filled in below (an explanation marks them)
    if hasattr(codec, "fill_missing"):
        for column in codec.columns:
            if getattr(column, "fill", None) is not None and column.name in frame.columns:
                for row in frame.index[frame[column.name].isna()]:
                    gaps.setdefault(row, []).append(column.name)
        frame, filled = codec.fill_missing(frame)
        notes += [f"{option}: {line}" for line in filled]
    found: dict[int, tuple] = {}  # position of a row with a problem: its first (value, allowed, problem)
    for column in codec.columns:
        for bad, describe in _value_problems(column, frame[column.name], getattr(codec, "decimal_comma", False)):
            for p in (int(p) for p in np.flatnonzero(bad) if int(p) not in found):
                found[p] = describe(p)
    from ct_lightning.experiment.runs.request_checks import rule_problems  # noqa: PLC0415

    held = {*held, *(explainable.config.get("immutable") or [])}
    for bad, describe in rule_problems(codec, frame, held):  # a row that breaks a data spec's rule (upper: age - 16)
        for p in (int(p) for p in np.flatnonzero(bad) if int(p) not in found):
            name, value, allowed, problem = describe(p)
            found[p] = (f"{name}={value}", allowed, problem)
    if found and not skip_bad_rows:  # the first row in the file, not the first column's: it is fixed first
        first = min(found)
        value, allowed, what = found[first]
        more = f" and the {len(found) - 1} more with a problem" if len(found) > 1 else ""
        hint = f"; --skip-bad-rows explains the other rows and lists this one{more}" if len(frame) > 1 else ""
        raise InputError(option, value, allowed + hint, f"{what} in row {frame.index[first]}")
    problems = {p: f"{show(value)}: {what}; allowed: {allowed}" for p, (value, allowed, what) in found.items()}
    kept = [p for p in range(len(frame)) if p not in problems]
    if problems and not kept:
        first = min(problems)
        raise InputError(option, f"{len(frame)} row(s)", "at least one row the model can read",
                         f"every row has a problem, e.g. row {frame.index[first]}: {problems[first]}")
    skipped = [(frame.index[p], problems[p]) for p in sorted(problems)]
    frame = frame.iloc[kept].copy()  # the numeric columns are converted below, not in the caller's frame
    for column in codec.columns:
        if not _is_category(column):
            values = pd.to_numeric(frame[column.name])
            if column.kind == "integer" and (values.abs() < 2 ** 53).all():  # whole (fractions refused above), filled
                values = values.astype("int64")  # a gap made the column float: 60800, not 60800.0, in --json
            frame[column.name] = values
    frame.attrs["filled"] = {row: columns for row, columns in gaps.items() if row in frame.index}
    frame.attrs["other_columns"] = others  # every row's, those left out too: they name the rows in the output
    return frame, notes, skipped


def _other_columns(frame: pd.DataFrame, names: list) -> dict[int, dict]:
    """``{row: {column: value}}`` of the columns the model does not read (an applicant's id, left out of training
    with ``--drop-columns``), in the file's order, missing values as ``None``: explanations carry them."""
    if not names:
        return {}
    from datamodules.codec import _plain  # noqa: PLC0415

    names = [c for c in frame.columns if c in set(names)]
    return {row: {str(c): None if pd.isna(v) else _plain(v) for c, v in zip(names, values)}
            for row, values in zip(frame.index, frame[names].itertuples(index=False))}


def _plain_name(name) -> str:
    return re.sub(r"[^0-9a-z]", "", str(name).lower())


def _rows_in_model_columns(explainable: Explainable, frame: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The model's data module turns rows in its raw file's columns into the model's (California housing's derived
    features), where the run names a built-in data set; else ``frame`` as given."""
    data = explainable.config.get("data")
    if not data or not explainable.has_preprocessing:
        return frame, None
    from ct_lightning.experiment.configuration.settings import data_class, is_table_file  # noqa: PLC0415

    if is_table_file(data):
        return frame, None
    try:
        cls = data_class(str(data))
    except (ValueError, LookupError, ImportError):  # a data set this process cannot name: rows as given
        return frame, None
    convert = getattr(cls, "rows_in_model_columns", None)
    return convert(frame) if convert is not None else (frame, None)


def _matched_names(frame: pd.DataFrame, names: list[str], option: str) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with each column the model lacks renamed to the one of ``names`` it spells otherwise (case and
    punctuation aside: a raw file's ``LIMIT_BAL`` or ``DebtRatio`` for the model's ``limit_bal``, ``debt_ratio``),
    where exactly one column of each matches; a note per renamed column."""
    wanted = {}
    for name in names:
        if name and name not in frame.columns:
            wanted.setdefault(_plain_name(name), []).append(name)
    found = {}
    for column in frame.columns:
        if column not in names and len(wanted.get(_plain_name(column), [])) == 1:
            found.setdefault(_plain_name(column), []).append(column)
    renames = {columns[0]: wanted[key][0] for key, columns in found.items() if len(columns) == 1}
    if not renames:
        return frame, []
    pairs = [f"{a} as {b}" for a, b in renames.items()]
    shown = ", ".join(pairs[:3]) + (f" and {len(pairs) - 3} more" if len(pairs) > 3 else "")
    return frame.rename(columns=renames), [f"{option}: columns read by the model's names, case and punctuation "
                                           f"aside: {shown}"]


def _matched_categories(frame: pd.DataFrame, columns) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with each category value spelt otherwise than the model's, case aside, read as the model's
    (``false``, ``False`` or JSON's ``false`` for a file's ``FALSE``), where exactly one category matches; a note per
    column. Other values stay as they are (an unseen category is refused after)."""
    notes = []
    for column in columns:
        if not _is_category(column) or column.name not in frame.columns:
            continue
        known = {str(c) for c in column.categories}
        by_case = categories_by_case(column.categories)
        values = frame[column.name]
        spelt = values.notna() & ~values.astype(str).isin(known)
        read = {v.item() if isinstance(v, np.generic) else v: by_case[str(v).casefold()]
                for v in pd.unique(values[spelt]) if str(v).casefold() in by_case}
        if read:
            frame = frame.copy() if not notes else frame
            frame[column.name] = values.astype(object).map(lambda v: read.get(v, v) if isinstance(v, (str, bool))
                                                           else v)
            pairs = ", ".join(f"{show(v)} as {show(c)}" for v, c in read.items())
            notes.append(f"{column.name}: read {pairs} (the model's spelling)")
    return frame, notes


def _is_category(column) -> bool:
    return column.kind in LABELLED and bool(column.categories)


def _value_problems(column, values: pd.Series, decimal_comma: bool = False):
    """The checks of one column's values, in order: ``(rows failing it, (value, allowed, problem) at a position)``
    for a missing value, then an unseen category, or a non-number, a fraction in an integer column (``age`` 45.5:
    the served model's check, :func:`~ct_lightning.experiment.runs.request_checks.fraction_mask`) and a number
    outside the model's domain. Numbers are written as the training file writes them (``decimal_comma``: ``32,5``;
    the column's unit: ``7,3%``; its thousands separator: ``95 403,1 €``), as the explanations are."""
    from datamodules.table_format import as_written  # noqa: PLC0415
    from ct_lightning.experiment.runs.request_checks import (NOT_WHOLE, WHOLE_NUMBERS, domain_mask,  # noqa: PLC0415
                                                             fraction_mask)
    from ct_lightning.experiment.runs.request_checks import number_text as plain_text  # noqa: PLC0415

    unit, thousands = getattr(column, "unit", None), getattr(column, "thousands", None)

    def number_text(value) -> str:  # as the file writes it: 4.251,72 where it writes decimal commas, 7,3% with its %
        text = as_written(plain_text(value), decimal_comma, thousands)
        return (f"-{unit.format(text[1:])}" if text.startswith("-") else unit.format(text)) if unit else text

    name = column.name
    missing = values.isna().to_numpy()
    yield missing, lambda p: (f"{name}=<missing>", f"a value in every row for {name} (or a model trained with "
                              "--impute median, which fills it in)", "missing value")
    if _is_category(column):
        # a category or grade 2.0 (in a column a missing value made float) is 2
        unseen = ~missing & (category_codes(values, column.categories) < 0)
        yield unseen, lambda p: (f"{name}={values.iloc[p]}", f"one of {', '.join(map(str, column.categories))}",
                                 "unseen category")
        return
    numbers = pd.to_numeric(values, errors="coerce")
    # a number as the file writes them (1.234,5 €): the text that was no number may be one written another way
    styled = f" (as the training file writes them: {number_text(1234.5)}; or plain: 1234.5)" \
        if unit or (decimal_comma or thousands) and column.kind == "continuous" else ""
    yield ~missing & numbers.isna().to_numpy(), lambda p: (f"{name}={values.iloc[p]}", f"a number for {name}{styled}",
                                                           "not a number")
    yield fraction_mask(column, numbers), lambda p: (f"{name}={number_text(numbers.iloc[p])}", WHOLE_NUMBERS,
                                                     NOT_WHOLE)
    outside, allowed = domain_mask(column, numbers.astype(float), number_text)
    yield outside, lambda p: (f"{name}={number_text(numbers.iloc[p])}", allowed, "outside the model's domain")


def explanation_mutability(explainable: Explainable, immutable=None, mutability: str | None = None
                           ) -> dict[str, str]:
    """``{column: kind}`` from explain.py's ``--immutable`` (names) and ``--mutability`` (``FEATURE=KIND,...``), by
    the model's own column names, as a served request's params of the same names
    (:func:`~ct_lightning.experiment.runs.request_checks.requested_mutability`); a one-line ``InputError`` naming
    the option for an unknown column or a direction on a categorical one, before any search."""
    from ct_lightning.experiment.runs.request_checks import MutabilityRefused, requested_mutability  # noqa: PLC0415

    try:
        return requested_mutability(explainable.codec, {"immutable": ",".join(immutable or []),
                                                        "mutability": mutability or ""})
    except MutabilityRefused as refused:
        raise InputError(f"--{refused.param}", refused.value, refused.allowed, refused.detail) from None


def explanation_steps(explainable: Explainable, given: str | None = None, param: str = "step",
                      mutability: dict | None = None) -> dict[str, float]:
    """``{column: number}`` from explain.py's ``--step`` or ``--max-change`` (``param``: ``max_change``)
    ``COLUMN=NUMBER,...``, as a served request's params of the same names
    (:func:`~ct_lightning.experiment.runs.request_checks.requested_steps`); a one-line ``InputError`` naming the option
    for an unknown column, a column that is no number, or a number that cannot be, before any search; and, given
    explain.py's own ``mutability`` (:func:`explanation_mutability`), for a column no explanation may change (the
    model's data spec or training ``--immutable``, or ``--immutable`` here): a step or a largest change of it would
    do nothing."""
    from ct_lightning.evaluation.explanation import trained_mutability  # noqa: PLC0415
    from ct_lightning.experiment.runs.request_checks import (  # noqa: PLC0415
        STEP_KINDS, MutabilityRefused, requested_steps)

    option = f"--{param.replace('_', '-')}"
    try:
        chosen = requested_steps(explainable.codec, {param: given or ""}, param)
    except MutabilityRefused as refused:
        raise InputError(option, refused.value, refused.allowed, refused.detail) from None
    if mutability is None or not chosen:
        return chosen
    kinds = {**trained_mutability(explainable.module),
             **{name: "none" for name in explainable.config.get("immutable") or []}, **mutability}
    for name, number in chosen.items():
        if kinds.get(name) == "none":
            free = [str(c.name) for c in explainable.codec.columns if kinds.get(str(c.name)) != "none"
                    and getattr(c, "kind", "continuous") in STEP_KINDS]
            why = "--immutable here" if mutability.get(name) == "none" else \
                "held in the model's training: its data spec or --immutable"
            raise InputError(option, f"{name}={number:g}", f"COLUMN=NUMBER for the columns that may change: "
                             f"{', '.join(free) or 'none'}", f"{name!r} may not change at all ({why})")
    return chosen


def use_target_order(explainable: Explainable, given: str | None) -> str | None:
    """explain.py's ``--target-order LOWEST,...,HIGHEST``: explain the model's classes as an ordered outcome ("at
    least" the target, :mod:`~ct_lightning.evaluation.ordered_outcomes`), as a data spec's ``target: {order: [...]}``
    would; the weights do not depend on it (training reads the same tensors with and without an order). Returns the
    outcome's start-up line, or ``None`` without ``given``. A one-line ``ValueError`` naming the option for an order
    that is not the classes once each, for a model without a table's classes, and for one whose data spec orders them
    otherwise."""
    if not given:
        return None
    codec = explainable.codec
    if not callable(getattr(codec, "outcome_text", None)):
        raise InputError("--target-order", given, "an order for a model trained on a table (its classes have names; "
                         "this model's preprocessing has none)")
    order = class_order([part.strip() for part in given.split(",")], list(codec.classes), codec.target,
                        "--target-order")
    if codec.order and list(map(str, codec.order)) != list(map(str, order)):
        raise InputError("--target-order", given, f"the order of the model's data spec, "
                         f"{','.join(map(str, codec.order))}, or leave it out")
    codec.order = order
    return codec.outcome_text()


def search_settings(module, given: dict) -> dict:
    """The search settings: those given, else the model's own for explanations (``generator``, ``tau``, λs ...,
    with finer steps than in training: :func:`~ct_lightning.evaluation.explanation.explanation_search`)."""
    own = explanation_search(module.hparams)
    renamed = {"search_lr": "lr"}
    for key, value in given.items():
        if value is not None:
            own[renamed.get(key, key)] = value
    return own


def explain_loaded(explainable: Explainable, rows: pd.DataFrame, target=None, settings: dict | None = None,
                   seed: int = 0) -> pd.DataFrame:
    """:func:`explain` on a loaded model, with its training data for generators that learn from it; the
    explanations carry the rows' index (their numbers in the input, where :func:`check_rows` left some out)."""
    settings = dict(settings or {})
    x_train = y_train = None
    from ct_lightning.generators import generator_class

    name = settings.get("generator", "ecco")
    if getattr(generator_class(name), "needs_fit", False):
        x_train, y_train = _training_data(explainable, name)
    # explain() adds the mutability the module was trained under (its hparams); config.json's --immutable is kept
    # for modules without one (a run's logged nn.Module); settings["mutability"] (explain.py's own) holds over both.
    mutability = {**{name: "none" for name in explainable.config.get("immutable") or []},
                  **(settings.pop("mutability", None) or {})}
    explained = explain(explainable.module, rows, target=target, codec=explainable.codec, mutability=mutability,
                        x_train=x_train, y_train=y_train, seed=seed, **settings)
    if not isinstance(rows, pd.DataFrame):
        return explained
    explained = explained.set_axis(rows.index)  # rows keep their numbers
    others = rows.attrs.get("other_columns") or {}
    if others:
        explained["other_columns"] = [others.get(row, {}) for row in rows.index]
    mark_filled(explained["changes"], rows.attrs.get("filled", {}))  # rows --only-predicted left out have none
    return explained


def _training_data(explainable: Explainable, generator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The training split a learning ``generator`` fits on: the data the model's config names (or ``--data``,
    :func:`use_data`), a table encoded with the model's own preprocessing."""
    from ct_lightning.experiment.configuration.console import quiet_console, verbose_console
    from ct_lightning.experiment.configuration.data import build_datamodule
    from ct_lightning.experiment.configuration.settings import is_table_file
    from ct_lightning.experiment.configuration.validation import check_model_fits
    from ct_lightning.generators.registry import GENERATORS

    quiet_console(verbose_console())  # the generator trains with Lightning: its INFO lines only with CT_VERBOSE

    data = explainable.config.get("data")
    if not data:  # a checkpoint copied without the config.json written beside it, and no --data
        search_only = ", ".join(sorted(n for n, g in GENERATORS.items() if not getattr(g, "needs_fit", False)))
        raise InputError("--generator", generator, f"{search_only} (they need no training data), or --data with "
                         "the data the model was trained on, or the model's run with --run-id, or its checkpoint "
                         "with the config.json its training wrote beside it",
                         "it learns from the training data, which this checkpoint does not name")
    codec = explainable.codec if explainable.has_preprocessing and is_table_file(data) else None
    datamodule = build_datamodule(explainable.config, codec=codec)
    check_model_fits("--data", data, explainable.module, datamodule)
    return datamodule.x_train, datamodule.y_train


FLAT = ["row", "explained", "prediction", "prediction_probability", "target", "probability", "valid",
        "counterfactual_prediction", "changes", "problem"]


def flat_table(records: list[dict]) -> pd.DataFrame:
    """One line per input row, for a spreadsheet: ``row`` (its number in the input, from 1), the row's columns the
    model does not read (an applicant's id) as they were given, then the prediction, target, probabilities (three
    decimals), validity, the class the changes lead to (and, for an ordered outcome, the classes that count as
    valid: ``interview, offer``) and the changes as text in the row's own units (``income: 31,000 → 38,400; ...``), and for
    a row left out (``--skip-bad-rows``) its ``problem``. ``records``: explain.py's JSON objects. Where the model's data
    spec words its classes or columns (``label``, ``unit``, ``values``), the classes' words follow them
    (``prediction_label``, ...) and ``changes_in_words`` the changes (``Repayment status, September: two months late →
    paid on time``); ``changes`` and the classes stay raw, for programs."""
    from ct_lightning.evaluation.explanation import WORDED, change_text, change_words  # noqa: PLC0415

    lines, ordered = [], any("valid_classes" in record for record in records)
    classes = [key for key in WORDED[:-1] if any(key in record for record in records)]
    worded = any(len(change) > 0 and any(key in change for key in ("label", "unit_label", "from_label", "to_label"))
                 for record in records for change in record.get("changes", ()))
    for record in records:
        line = {"row": record["row"]}
        for name, value in (record.get("other_columns") or {}).items():
            line[name if name not in FLAT else f"input {name}"] = value  # a column named like ours keeps its value
        line.update({key: record.get(key) for key in FLAT[1:-2]})
        for key in classes:  # the class in the data spec's words, after the class
            line = _insert_after(line, key.removesuffix("_label"), key, record.get(key))
        for key in ("prediction_probability", "probability"):
            line[key] = None if line[key] is None else round(float(line[key]), 3)
        if ordered:  # an ordered outcome: the classes that count as valid
            line["valid_classes"] = ", ".join(map(str, record.get("valid_classes") or ()))
        line["changes"] = "; ".join(change_text(c) for c in record.get("changes", ()))
        if worded:
            line["changes_in_words"] = "; ".join(change_words(c) for c in record.get("changes", ()))
        line["problem"] = record.get("problem", "")
        lines.append(line)
    return pd.DataFrame(lines)


def _insert_after(line: dict, after: str, key: str, value) -> dict:
    """``line`` with ``key: value`` placed right after ``after``."""
    items = list(line.items())
    at = next(i for i, (name, _) in enumerate(items) if name == after) + 1
    return dict(items[:at] + [(key, value)] + items[at:])


def write_table(path: str | Path, records: list[dict], decimal_comma: bool = False) -> None:
    """:func:`flat_table` as a CSV a spreadsheet opens as written: UTF-8 with a byte-order mark (Excel reads a CSV
    without one as Windows-1252, and ``→`` as ``â†’``); with ``decimal_comma`` (the model's training file wrote
    decimal commas) ``;``-separated with decimal commas, as Excel in that file's locale reads a CSV (a ``,``-separated
    one opens there as one column of text)."""
    from ct_lightning.experiment.runs.atomic_files import atomic_file  # noqa: PLC0415

    dialect = {"sep": ";", "decimal": ","} if decimal_comma else {}
    with atomic_file(path) as temporary:
        flat_table(records).to_csv(temporary, index=False, encoding="utf-8-sig", **dialect)


def plot_explanations(explanations: pd.DataFrame, path: str | Path) -> Path:
    """:func:`explanation_figure` saved as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = explanation_figure(explanations)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def explanation_figure(explanations: pd.DataFrame):
    """One panel per row (at most 8, the rows with changes first: a batch whose first rows need none showed no
    change at all): the target's probability at the factual and at the decoded counterfactual, and the changes in
    original units, as written (``$99,000 → $80,950``: no mathtext between two ``$``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ct_lightning.evaluation.explanation import change_words, class_shown, row_label

    changed = explanations[[bool(changes) for changes in explanations["changes"]]]
    shown = pd.concat([changed, explanations.drop(index=changed.index)]).head(8)
    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 2.2 * len(shown)), squeeze=False)
    if len(explanations) > len(shown):
        fig.suptitle(f"{len(shown)} of {len(explanations)} rows, those with changes first (all: explanations.csv)",
                     fontsize=9, x=0.01, ha="left")
    for ax, (i, row) in zip(axes[:, 0], shown.iterrows()):
        ax.barh([0, 1], [row["factual_probability"], row["probability"]], color=["#999999", "#2a7ab0" if row["valid"] else "#c0392b"])
        ax.set_yticks([0, 1], ["factual", "counterfactual"])
        ax.set_xlim(0, 1)
        ax.axvline(0.5, color="k", lw=0.5, ls=":")
        classes = f"{class_shown(row, 'prediction')} → {class_shown(row, 'target')}"  # in words where there are some
        ax.set_title(f"{row_label(i, row.get('other_columns'))}: {classes}", fontsize=9,
                     loc="left", parse_math=False)
        text = "\n".join(change_words(c) for c in row["changes"][:6]) or "no change"
        ax.text(1.02, 0.5, text, transform=ax.transAxes, va="center", fontsize=8, parse_math=False)
    axes[-1, 0].set_xlabel("probability of the target")
    fig.tight_layout()
    return fig


def log_explanations(tracking_uri: str, run_id: str, explanations: pd.DataFrame, records: list[dict],
                     decimal_comma: bool = False) -> str:
    """Log the explanations to the run itself under ``explanations/UTC-TIME/``: ``explanations.json`` and
    ``explanations.csv`` (``records``, explain.py's ``--json`` and ``--csv``, written as :func:`write_table` writes
    it) and ``explanations.png`` (where a row was explained). Returns that artifact folder."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    folder = f"explanations/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    with tempfile.TemporaryDirectory(prefix="ct-explain-") as local:
        local = Path(local)
        (local / "explanations.json").write_text(json.dumps(records, indent=2, default=str))
        write_table(local / "explanations.csv", records, decimal_comma)
        if len(explanations):
            plot_explanations(explanations, local / "explanations.png")
        client.log_artifacts(run_id, str(local), artifact_path=folder)
    return folder
