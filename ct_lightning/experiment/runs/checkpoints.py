"""Read model weights from checkpoints of several forms and load them with clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

MODEL_PREFIX = "model."


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Return ``(state_dict, metadata)`` of a checkpoint file.

    Accepted forms: a Lightning checkpoint of this project (``state_dict`` with ``model.``
    prefixed keys; metadata = its ``hyper_parameters``), a dict ``{"state_dict": ..., **metadata}``,
    or a plain PyTorch ``state_dict``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"from_checkpoint: no file at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means: not a checkpoint we accept
        raise ValueError(f"from_checkpoint: {path} is not a readable PyTorch checkpoint ({error})") from None
    if not isinstance(payload, dict):
        raise ValueError(f"from_checkpoint: {path} holds a {type(payload).__name__}, expected a state_dict")
    if "state_dict" in payload and isinstance(payload["state_dict"], dict):
        state, metadata = payload["state_dict"], dict(payload.get("hyper_parameters") or {})
        metadata.update({k: v for k, v in payload.items() if k not in ("state_dict", "hyper_parameters")
                         and isinstance(v, (int, float, str, list, tuple))})
        if any(k.startswith(MODEL_PREFIX) for k in state):
            state = {k[len(MODEL_PREFIX):]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    else:
        state, metadata = payload, {}
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"from_checkpoint: {path} holds no weight tensors")
    return tensors, metadata


def infer_mlp_hidden_sizes(state: dict[str, torch.Tensor]) -> list[int] | None:
    """Hidden layer sizes of a ``build_mlp`` state_dict (``0.weight``, ``2.weight``, ...), or ``None``."""
    layers = sorted((int(m.group(1)), v.shape[0]) for k, v in state.items()
                    if (m := re.fullmatch(r"(\d+)\.weight", k)) and v.dim() == 2)
    if not layers or len(layers) != sum(1 for k in state if k.endswith(".weight")):
        return None
    return [size for _, size in layers[:-1]]


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load ``state`` into ``model`` strictly; on mismatch raise an error naming the layers."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
              for k, v in expected.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append("shape mismatch in " + "; ".join(shapes))
        if missing:
            parts.append("missing in checkpoint: " + ", ".join(missing))
        if unexpected:
            parts.append("not in model: " + ", ".join(unexpected))
        raise ValueError(f"{source} does not fit the model: " + " | ".join(parts))
    model.load_state_dict(state)
