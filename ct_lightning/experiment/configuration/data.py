"""The configured data module, set up, and the mutability it implies (the experiment layer's use of the registry)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

from ct_lightning.constraints import data_mutability, one_hot_groups, parse_mutability
from ct_lightning.experiment.configuration.settings import data_class, is_table_file, table_module
from ct_lightning.experiment.configuration.table_columns import check_data_kinds, named_features


def build_datamodule(config: dict, codec=None, widen: bool = False):
    """Instantiate and set up the configured data module: a registered data set, a table file
    (``--data PATH --target COLUMN``) or a ``package.module:Class``. ``codec``: a table's fitted preprocessing
    (a trained model's ``ct_preprocessing``) to encode with instead of fitting one; ``widen``: its domain widens to
    hold the table's training rows (a fine-tuning on another file). ``config`` needs only ``data``: a missing
    ``batch_size`` is the data set's default, ``seed`` 0."""
    cls = data_class(config["data"])
    config = {"seed": 0, "data_dir": None, **config}
    if config.get("batch_size") is None:
        config["batch_size"] = cls.default_batch_size
    if is_table_file(config["data"]):
        datamodule = table_module(config["data"], config, batch_size=config["batch_size"], seed=config["seed"],
                                  codec=codec, widen=widen)
        datamodule.setup("fit")
        return datamodule
    kwargs = {"batch_size": config["batch_size"], "seed": config["seed"]}
    if config.get("data_dir") and "data_dir" in inspect.signature(cls.__init__).parameters:
        kwargs["data_dir"] = config["data_dir"]
    if config.get("center_distance") is not None:
        kwargs["center_distance"] = config["center_distance"]
    datamodule = cls(**kwargs)
    datamodule.setup("fit")
    return datamodule


def model_datamodule(config: dict, module):
    """The data module a trained model reads (``config``: its run's): :func:`build_datamodule`, a table encoded with
    the model's own preprocessing (``module.preprocessing``), as evaluate.py reads it: the same encoding a fresh fit
    of the same file gives, and for a fine-tuning of a model that carried its preprocessing the only one (a column
    that model never read included, which a fresh fit could refuse)."""
    table = is_table_file(config.get("data"))
    return build_datamodule(config, codec=getattr(module, "preprocessing", None) if table else None)


def mutability_spec(config: dict, datamodule) -> dict[str, str]:
    """Merge the data's own mutability, ``mutability``, ``immutable`` and ``protect`` into one ``{feature: kind}``
    mapping, validated; ``mutability`` may hold a data spec's kind fixed, not loosen it (one-line error). A table's
    one-hot groups are its codec's (:func:`~ct_lightning.constraints.one_hot_groups`): a continuous column named
    ``ratio=debt/income`` may be ``decrease``."""
    groups, data_kinds = one_hot_groups(datamodule), data_mutability(datamodule)
    check_data_kinds(config, data_kinds)
    spec = {**data_kinds, **command_line_mutability(config, datamodule.feature_names, groups)}
    spec.update({feature: "none" for feature in (datamodule.protected if config.get("protect") else [])})
    parse_mutability(spec, datamodule.n_features, datamodule.feature_names, argument="mutability/immutable",
                     groups=groups)
    return spec


def command_line_mutability(config: dict, feature_names: Sequence[str], groups=None) -> dict[str, str]:
    """``mutability`` (``"FEATURE=KIND,..."``, split at each item's last ``=``) and ``immutable`` (names) as one
    ``{feature: kind}``, ``immutable`` last; each entry is checked against ``feature_names`` (and the one-hot
    ``groups`` where known, :func:`~ct_lightning.constraints.one_hot_groups`) by :func:`parse_mutability` and refused
    in one line naming the option that gave it (the one check of training and of ``train.py --write-data-spec``)."""
    given = named_features(config)
    for option, name, kind in given:
        parse_mutability({name: kind}, len(feature_names), feature_names, argument=option, groups=groups)
    return {name: kind for _, name, kind in given}


SHOWN_HELD = 8  # features of one kind the start-up line names before it counts the rest (MNIST protects 280 pixels)


def mutability_line(config: dict, held: Mapping[str, str], from_data: bool,
                    protect_by: str = "--protect", from_model: Mapping[str, str] | None = None,
                    kept: bool = False) -> str | None:
    """The start-up line saying what the searches keep to (``held``: the merged ``{feature: kind}``,
    :func:`mutability_spec`) and where it came from (``from_data``: the data spec gave some of it; ``protect_by``:
    who set ``protect``, where not the user's ``--protect``; a fine-tuning's ``from_model``: the pairs kept from the
    model's original run, added to ``config["mutability"]`` by ``kept_preprocessing.inherit_mutability``; ``kept``:
    the data spec is the one the model's preprocessing carries): ``mutability (--protect): age: none``; long lists
    of one kind are cut (``none: pixel_r0_c0, ..., pixel_r27_c27 (280 features)``). ``None`` where every feature may
    change both ways."""
    held = {name: kind for name, kind in held.items() if kind != "both"}
    if not held:
        return None
    inherited = {f"{name}={kind}" for name, kind in (from_model or {}).items()}
    given = [pair for pair in str(config.get("mutability") or "").split(",") if pair and pair not in inherited]
    sources = [words for words, given in (("the data spec the model was trained with" if kept else "data spec",
                                           from_data),
                                          ("kept from the run that trained the model", inherited),
                                          ("--immutable", config.get("immutable")), ("--mutability", given),
                                          (protect_by, config.get("protect"))) if given]
    by_kind: dict[str, list[str]] = {}
    for name, kind in held.items():
        by_kind.setdefault(kind, []).append(name)
    if all(len(names) <= SHOWN_HELD for names in by_kind.values()):
        shown = ", ".join(f"{name}: {kind}" for name, kind in held.items())
    else:
        shown = "; ".join(f"{kind}: " + (", ".join(names) if len(names) <= SHOWN_HELD else
                                          f"{', '.join(names[:SHOWN_HELD - 1])}, ..., {names[-1]} ({len(names)} "
                                          "features)") for kind, names in by_kind.items())
    return f"mutability ({', '.join(sources) or 'the data'}): {shown}"
