"""Read model weights from checkpoints of several forms and load them with clear errors; read a checkpoint of this
project as the trained classifier an explanation needs, without Lightning (:func:`load_trained_classifier`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from ct_lightning.experiment.configuration.catalogue import module_defaults
from ct_lightning.experiment.configuration.checkpoint_peek import PREPROCESSING_KEYS, table_preprocessing
from ct_lightning.models import model_from_hparams

MODEL_PREFIX = "model."
CLASSES_KEY = "ct_classes"  # the table's classes of a checkpoint, in read_checkpoint's metadata


WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")  # where training scripts commonly put the weights


class Hyperparameters(dict):
    """A ``CTModule``'s hyperparameters, read as its ``hparams`` are: ``hp["tau"]`` or ``hp.tau``."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TrainedClassifier(nn.Module):
    """A trained ``CTModule`` as an explanation uses it: its classifier (``model``, the same ``model.`` weights),
    its hyperparameters (``hparams``) and the fitted preprocessing saved with it (``preprocessing``, or ``None``).
    Not its generator: an explanation builds its own search."""

    def __init__(self, model: nn.Module, hparams: Hyperparameters, preprocessing: dict | None = None):
        super().__init__()
        self.model, self.hparams, self.preprocessing = model, hparams, preprocessing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def load_trained_classifier(path: str | Path) -> TrainedClassifier:
    """A checkpoint of this project (a ``CTModule``'s, as ``train.py`` writes it) on the CPU in eval mode, read with
    ``torch.load(weights_only=True)`` and without Lightning, which ``CTModule.load_from_checkpoint`` takes seconds
    to import: the network its hyperparameters describe (built as ``CTModule`` builds it,
    :func:`~ct_lightning.models.model_from_hparams`) with its weights, and the hyperparameters as that load gives
    them (``CTModule``'s defaults, updated by the checkpoint's). A one-line ``ValueError`` for another file."""
    try:
        payload = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means: not a checkpoint we accept
        raise ValueError(f"checkpoint: got {str(path)!r} (not a readable checkpoint: {_first_line(error)}); allowed: "
                         "a checkpoint written by train.py (last.ckpt, best.ckpt)") from None
    given = payload.get("hyper_parameters") if isinstance(payload, dict) else None
    if not isinstance(given, dict) or not isinstance(payload.get("state_dict"), dict):
        raise ValueError(f"checkpoint: got {str(path)!r} (weights without the settings of a training of this "
                         "project); allowed: a checkpoint written by train.py (last.ckpt, best.ckpt), or the run id of "
                         "your model logged as it is (train.py --from-checkpoint FILE --limit-train-batches 0 ...: "
                         "--run-id ID)")
    defaults = {k: v for k, v in module_defaults().items() if k != "model"}
    hparams = Hyperparameters({**defaults, **{k: v for k, v in given.items() if k in defaults}})
    hparams["hidden_sizes"] = list(hparams["hidden_sizes"])  # as CTModule keeps them
    model = model_from_hparams(hparams)
    state = {k[len(MODEL_PREFIX):]: v for k, v in payload["state_dict"].items() if k.startswith(MODEL_PREFIX)}
    load_weights(model, state, source=f"checkpoint {path}")
    preprocessing = next((found for key in PREPROCESSING_KEYS
                          if (found := payload.get(key) or given.get(key))), None)
    preprocessing = json.loads(preprocessing) if isinstance(preprocessing, str) else preprocessing
    return TrainedClassifier(model, hparams, preprocessing).eval()


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Return ``(state_dict, metadata)`` of a checkpoint file.

    Accepted forms: a Lightning checkpoint of this project (``state_dict`` with ``model.``
    prefixed keys; metadata = its ``hyper_parameters``), a dict ``{"state_dict": ..., **metadata}`` (or
    ``model_state_dict``/``model`` in place of ``state_dict``, as training scripts save them), a plain PyTorch
    ``state_dict``, or a TorchScript file (``torch.jit.save``: its weights and, where it shows, its activation). A whole pickled
    module (``torch.save(model)``) is refused, with the line that saves its weights instead: loading it would
    run code from the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"from_checkpoint: no file at {path}")
    if _is_torchscript(path):
        try:
            scripted = torch.jit.load(str(path), map_location="cpu")
        except Exception as error:  # noqa: BLE001 - a damaged archive
            raise ValueError(f"from_checkpoint: {path} is a TorchScript file that does not load "
                             f"({_first_line(error)})") from None
        activation = scripted_activation(scripted, path)
        return dict(scripted.state_dict()), ({"activation": activation} if activation else {})
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means: not a checkpoint we accept
        pickled = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        if pickled:
            name = pickled.group(1)
            module, _, cls = name.rpartition(".")
            # a class of one's own: its weights load only into it, so say the --model that builds it at once
            own = "" if name.startswith("torch.") or not module else \
                f", with --model {module}:{cls} (or a factory of your own that returns one)"
            raise ValueError(f"from_checkpoint: {path} holds a pickled {name} (torch.save(model)), "
                             "which only loads by running code from the file; save its weights with "
                             f"torch.save(model.state_dict(), 'weights.pt') and pass that file{own} (allowed: a "
                             "state_dict, a checkpoint of this project, a TorchScript file)") from None
        raise ValueError(f"from_checkpoint: {path} is not a readable PyTorch checkpoint "
                         f"({_first_line(error)})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"from_checkpoint: {path} holds a {type(payload).__name__}, expected a state_dict")
    wrapped = next((key for key in WRAPPER_KEYS if isinstance(payload.get(key), dict)), None)
    if wrapped is not None and wrapped != "state_dict":  # torch.save({"model_state_dict": ..., "epoch": 3})
        payload = {**{k: v for k, v in payload.items() if k != wrapped}, "state_dict": payload[wrapped]}
    if "state_dict" in payload and isinstance(payload["state_dict"], dict):
        state, metadata = payload["state_dict"], dict(payload.get("hyper_parameters") or {})
        skipped = ("state_dict", "hyper_parameters", *PREPROCESSING_KEYS)
        metadata.update({k: v for k, v in payload.items() if k not in skipped
                         and isinstance(v, (int, float, str, list, tuple))})
        preprocessing = payload.get("ct_preprocessing")
        preprocessing = json.loads(preprocessing) if isinstance(preprocessing, str) else preprocessing  # JSON text
        if isinstance(preprocessing, dict) and isinstance(preprocessing.get("classes"), list):
            metadata[CLASSES_KEY] = list(preprocessing["classes"])  # what a --model-inputs "outputs" order names
        if any(k.startswith(MODEL_PREFIX) for k in state):
            state = {k[len(MODEL_PREFIX):]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    else:
        state, metadata = payload, {}
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"from_checkpoint: {path} holds no weight tensors")
    return tensors, metadata


def checkpoint_preprocessing(path: str | Path) -> dict | None:
    """The fitted preprocessing of a table (a ``TabularCodec``'s dict) that a checkpoint of this project carries
    (``ct_preprocessing``); ``None`` for any other file (a plain ``state_dict``, TorchScript, a model of no table)."""
    import warnings  # noqa: PLC0415

    try:
        with warnings.catch_warnings():  # a TorchScript archive: torch's note that it dispatches to torch.jit.load
            warnings.simplefilter("ignore")
            payload = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - read_checkpoint refused it in its own words already, or it carries none
        return None
    return table_preprocessing(payload)


def scripted_activation(scripted, path) -> str | None:
    """The activation of a TorchScript MLP, by our name (``tanh``): from its activation modules (``nn.Tanh()``) or,
    where there are none, from the functions its code calls (``torch.tanh(x)``); ``None`` where it uses none or
    several. An activation this project does not build is a one-line ``ValueError``: its weights would be run
    through another function."""
    from ct_lightning.models import ACTIVATIONS  # noqa: PLC0415

    ours = {cls.__name__: name for name, cls in ACTIVATIONS.items()}
    known = set(torch.nn.modules.activation.__all__) - {"MultiheadAttention"}
    classes = {getattr(module, "original_name", "") for _, module in scripted.named_modules()}
    foreign = sorted(c for c in classes if c in known and c not in ours)
    if foreign:
        raise ValueError(f"from_checkpoint: {path} uses the activation {foreign[0]}; allowed: "
                         f"{', '.join(ACTIVATIONS)} (for another architecture, pass --model package.module:Class)")
    found = {ours[c] for c in classes if c in ours}
    if not found:
        code = "\n".join(getattr(module, "code", "") or "" for _, module in scripted.named_modules())
        found = {name for name in ACTIVATIONS if re.search(rf"\b(torch|F|functional)\.{name}\(", code)}
    return found.pop() if len(found) == 1 else None


def _is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip holding ``constants.pkl`` and ``code/``)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any(name.endswith("/constants.pkl") for name in names) and any("/code/" in name for name in names)


def _first_line(error: Exception) -> str:
    """The first line of ``error``'s message without terminal escapes (torch's load errors span paragraphs)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    return (text.splitlines() or [type(error).__name__])[0][:300]


def infer_mlp_hidden_sizes(state: dict[str, torch.Tensor]) -> list[int] | None:
    """Hidden layer sizes of a ``build_mlp`` state_dict (``0.weight``, ``2.weight``, ...), or ``None``."""
    layers = sorted((int(m.group(1)), v.shape[0]) for k, v in state.items()
                    if (m := re.fullmatch(r"(\d+)\.weight", k)) and v.dim() == 2)
    if not layers or len(layers) != sum(1 for k in state if k.endswith(".weight")):
        return None
    return [size for _, size in layers[:-1]]


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load ``state`` into ``model`` strictly; on mismatch raise an error naming the layers."""
    check_layers({k: v.shape for k, v in model.state_dict().items()}, state, source)
    model.load_state_dict(state)


def mlp_layer_names(hidden_sizes) -> dict[str, None]:
    """The names of a ``build_mlp`` network's weights (``0.weight``, ``0.bias``, ``2.weight``, ...), shapes unknown:
    for :func:`check_layers` before the data gives the widths."""
    return {f"{2 * i}.{kind}": None for i in range(len(hidden_sizes) + 1) for kind in ("weight", "bias")}


def check_layers(expected: dict, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """``state`` has the weights ``expected`` names (``{name: shape}``, a shape of ``None`` unchecked), else a
    ``ValueError`` naming the layers that differ and, for a model class of your own, ``--model``."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v)}"
              for k, v in expected.items() if v is not None and k in state and state[k].shape != v]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append("shape mismatch in " + "; ".join(shapes))
        if missing:
            parts.append("missing in checkpoint: " + ", ".join(missing))
        if unexpected:
            parts.append("not in model: " + ", ".join(unexpected))
        numbered = all(re.fullmatch(r"\d+\.\w+", k) for k in [*missing, *unexpected])
        if missing and unexpected and not set(expected) & set(state):  # no layer name in common: another class
            parts.append("the layers have other names, so the weights come from another model class than the one "
                         "built: pass --model package.module:factory for the class they were saved from (a function "
                         "or class that returns it, given n_features and n_classes if it takes them)")
        elif missing and unexpected and numbered:  # nn.Sequential layers at other places: Dropout, BatchNorm between
            parts.append("its layers sit at other places of an nn.Sequential (a Dropout or BatchNorm between the "
                         "Linear layers?): pass --model package.module:factory that builds the same Sequential")
        raise ValueError(f"{source} does not fit the model: " + " | ".join(parts))


ADAPTER, NETWORK = "inputs.", "network."  # an AdaptedModel's parts (--model-inputs)
MODEL_WEIGHTS = "model-weights.pt"  # beside a --model-inputs run's checkpoints: the network alone, for your pipeline


def split_adapted(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The network's weights of an adapted model's ``state`` (``network.0.weight`` → ``0.weight``, the input layer
    left out: it is made again from the data); any other ``state`` as it is."""
    if f"{ADAPTER}weight" in state and any(k.startswith(NETWORK) for k in state):
        return {k[len(NETWORK):]: v for k, v in state.items() if k.startswith(NETWORK)}
    return state


def last_layer(state: dict[str, torch.Tensor]) -> tuple[str, int] | None:
    """``(name, outputs)`` of the last matrix of ``state`` (a ``Linear``'s ``weight``: its output width), or
    ``None``."""
    return next(((k, int(v.shape[0])) for k, v in reversed(list(state.items()))
                 if k.endswith("weight") and v.dim() == 2), None)


def first_layer(state: dict[str, torch.Tensor]) -> tuple[str, int] | None:
    """``(name, inputs)`` of the first matrix of ``state`` (a ``Linear``'s ``weight``: its input width), or ``None``."""
    return next(((k, int(v.shape[1])) for k, v in state.items() if k.endswith("weight") and v.dim() == 2), None)


def load_into(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load ``state`` strictly (:func:`load_weights`); into an adapted model's network (its input layer is set from the
    data, not from the weights)."""
    from ct_lightning.models import AdaptedModel  # noqa: PLC0415

    if isinstance(model, AdaptedModel):
        load_weights(model.network, split_adapted(state), source)
    else:
        load_weights(model, state, source)


def network_state_dict(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The weights of your own network in a ``--model-inputs`` run's checkpoint (``best.ckpt``, ``last.ckpt``), without
    the input layer: ``torch.save(network_state_dict("run/best.ckpt"), "best-weights.pt")``, then
    ``your_model.load_state_dict(torch.load("best-weights.pt"))`` reads your own encoding."""
    state, _ = read_checkpoint(checkpoint)
    network = split_adapted(state)
    if network is state:
        raise ValueError(f"checkpoint: {checkpoint} holds no model trained with --model-inputs (no input layer)")
    return network


def save_network_weights(model: nn.Module, folder: str | Path) -> Path | None:
    """Write an adapted model's network weights (a plain ``state_dict``, on the CPU) as ``folder/model-weights.pt``,
    atomically; ``None`` for any other model."""
    from ct_lightning.experiment.runs.atomic_files import atomic_file  # noqa: PLC0415
    from ct_lightning.models import AdaptedModel  # noqa: PLC0415

    if not isinstance(model, AdaptedModel):
        return None
    path = Path(folder) / MODEL_WEIGHTS
    state = {k: v.detach().cpu().clone() for k, v in model.network.state_dict().items()}
    with atomic_file(path) as temporary:
        torch.save(state, temporary)
    return path
