"""Whether a checkpoint file carries a table's fitted preprocessing, told before torch is imported.

A fine-tuning on a table whose checkpoint carries its model's preprocessing (``ct_preprocessing``, a checkpoint of
this project) reads the file its own way (:mod:`datamodules.kept_codec`); any other weights (a plain ``state_dict``,
TorchScript, a checkpoint of a model of no table) get the table read and checked as a fresh training does. The
recipes check a table before torch is imported, so the checkpoint's top-level dictionary is read here with a
restricted unpickler: only plain containers are built, every other object (tensors, their storages, Lightning's
classes, a TorchScript module) becomes an inert placeholder, and nothing in the file is run.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

PREPROCESSING_KEYS = ("ct_preprocessing", "preprocessing")  # where a checkpoint (or its hyperparameters) holds it
SAFE = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "list"),
        ("builtins", "dict"), ("builtins", "tuple")}


def table_preprocessing(payload) -> dict | None:
    """The fitted preprocessing of a table (a ``TabularCodec``'s dict) a checkpoint's top-level ``payload`` holds
    under :data:`PREPROCESSING_KEYS` (a dict or its JSON text); ``None`` where it holds none."""
    if not isinstance(payload, dict):
        return None
    found = next((payload[key] for key in PREPROCESSING_KEYS if payload.get(key)), None)
    try:
        found = json.loads(found) if isinstance(found, str) else found
    except ValueError:
        return None
    return found if isinstance(found, dict) and found.get("kind") == "tabular" else None


class _Placeholder(dict):
    """Whatever the unpickler does not build: takes any arguments, state and items, and means nothing."""

    def __new__(cls, *args, **kwargs):
        return dict.__new__(cls)

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __setstate__(self, state) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in SAFE:
            return super().find_class(module, name)
        return _Placeholder

    def persistent_load(self, pid):  # a tensor's storage, in another member of the archive
        return None


_UNREAD = object()  # a file this module cannot read: torch reads it (or refuses it) in its own words


def _top_level(path):
    """The top-level object of the checkpoint file ``path`` (torch.save's zip or legacy pickle format), tensors and
    other objects as placeholders; ``_UNREAD`` where it cannot be read so."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                members = [name for name in archive.namelist() if name.endswith("/data.pkl") or name == "data.pkl"]
                if not members:
                    return _UNREAD
                member = min(members, key=lambda name: name.count("/"))  # the archive's own, not a nested one
                with archive.open(member) as handle:
                    return _Unpickler(handle).load()
        with open(path, "rb") as handle:  # legacy: magic number, protocol, system info, then the object
            for _ in range(3):
                _Unpickler(handle).load()
            return _Unpickler(handle).load()
    except Exception:  # noqa: BLE001 - read otherwise (TorchScript's own classes, a file not of torch.save)
        return _UNREAD


def _readable(path) -> bool:
    return bool(path) and ":/" not in str(path) and Path(path).is_file()


def carried_table_preprocessing(path) -> dict | None:
    """The table's fitted preprocessing the checkpoint file ``path`` carries, read without torch (and without its
    tensors); ``None`` where it carries none or cannot be read so."""
    payload = _top_level(path) if _readable(path) else _UNREAD
    return None if payload is _UNREAD else table_preprocessing(payload)


def carries_table_preprocessing(path) -> bool | None:
    """Whether the checkpoint file ``path`` (torch.save's zip or legacy pickle format) holds a table's fitted
    preprocessing; ``None`` where this cannot be told without torch (a file read otherwise, or an MLflow model
    URI, ``runs:/``, ``models:/``, looked up in its store only when the training starts)."""
    payload = _top_level(path) if _readable(path) else _UNREAD
    return None if payload is _UNREAD else table_preprocessing(payload) is not None
