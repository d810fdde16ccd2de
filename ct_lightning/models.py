"""Classifiers built from primitive settings: the paper's MLP, a LeNet-style CNN, or a user factory, and a model of
your own behind the frozen input layer that ``--model-inputs`` describes, and the frozen output layer that puts its
classes in ct-lightning's order (:class:`AdaptedModel`)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU,
               "leaky_relu": nn.LeakyReLU, "elu": nn.ELU}
BUILTIN_ARCHITECTURES = ("mlp", "cnn")
# The activations whose backward is a function of their output alone (what autograd keeps for them): a plain MLP's
# passes by hand (ct_lightning.generators.input_gradient, ct_lightning.training.mlp_step).
ACTIVATION_BACKWARD = {
    nn.ReLU: lambda grad, output: torch.ops.aten.threshold_backward(grad, output, 0),
    nn.Tanh: torch.ops.aten.tanh_backward,
    nn.Sigmoid: torch.ops.aten.sigmoid_backward,
}
ACTIVATION_FORWARD = {nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid}


def build_mlp(n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (32,),
              activation: str | Callable[[], nn.Module] = "relu") -> nn.Sequential:
    """MLP ``Linear, act, ..., Linear`` (the one MLP builder of the project); as a classifier it returns logits.

    The paper's default is one hidden layer of 32 ReLU units. ``activation`` is a name of
    ``ACTIVATIONS`` or a callable returning a fresh activation module (e.g. ``lambda: nn.LeakyReLU(0.2)``).
    """
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: unknown {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        activation = ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    width = n_features
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), activation()]
        width = size
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


class LeNet(nn.Module):
    """LeNet-5-style CNN on flat square images (e.g. 784 MNIST pixels), returning logits.

    It takes the same flat feature vectors as the MLP, so the counterfactual search, mutability
    and domain work on pixels unchanged.
    """

    def __init__(self, n_features: int = 784, n_classes: int = 10, channels: int = 1):
        super().__init__()
        side = math.isqrt(n_features // channels)
        if side * side * channels != n_features or side < 8:
            raise ValueError(f"model cnn: needs square images of at least 8×8, got {n_features} features")
        self.shape = (channels, side, side)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 16 * (side // 4) ** 2
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84),
                                        nn.ReLU(), nn.Linear(84, n_classes))

    def forward(self, x):
        return self.classifier(self.features(x.reshape(-1, *self.shape)))


def _import_from_path_or_cwd(module_name: str, lookup: Callable = importlib.import_module):
    """``lookup(module_name)`` (import it, by default) from ``sys.path``, else from the current directory (a user's
    own ``my_models.py``)."""
    try:
        return lookup(module_name)
    except ModuleNotFoundError as error:
        cwd = os.getcwd()
        if cwd in sys.path or error.name != module_name.split(".")[0]:
            raise
        sys.path.insert(0, cwd)
        try:
            return lookup(module_name)
        finally:
            sys.path.remove(cwd)


def _module_spec(module_name: str):
    """``importlib.util.find_spec`` of ``module_name`` without running it, raising ``ModuleNotFoundError`` as an
    import would where there is none."""
    found = importlib.util.find_spec(module_name)
    if found is None:
        raise ModuleNotFoundError(f"No module named {module_name!r}", name=module_name.split(".")[0])
    return found


def _where(error: Exception) -> str:
    """``error`` in one line, with the file and line of the user's module where it arose."""
    if isinstance(error, SyntaxError):
        return f"{type(error).__name__}: {error.msg} in {error.filename}, line {error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if "importlib" not in frame.filename and frame.filename != __file__]
    place = f" in {own[-1].filename}, line {own[-1].lineno}" if own else ""
    return f"{type(error).__name__}: {error}{place}"


def factory_file(spec: str) -> Path | None:
    """The file of ``package.module:factory``'s module, found as :func:`load_factory` imports it (``sys.path``, else
    the current directory) but without running it, or ``None`` where there is none (a built-in network, a module
    not found, one with no file)."""
    module_name = spec.partition(":")[0] if ":" in spec else ""
    if not module_name:
        return None
    try:
        found = _import_from_path_or_cwd(module_name, _module_spec)
    except (ImportError, ValueError):
        return None
    return Path(found.origin).resolve() if found.origin and Path(found.origin).is_file() else None


class ModuleNotImportable(ValueError):
    """The module of ``--model package.module:factory`` is not on the path here (another folder than its file's)."""

    def __init__(self, spec: str, error: Exception):
        self.spec, self.module_name = spec, spec.partition(":")[0]
        super().__init__(f"model: cannot import module {self.module_name!r} of {spec!r} ({error}); run from the "
                         f"folder that holds {self.top_file}, or add that folder to PYTHONPATH")

    @property
    def top_file(self) -> str:
        """The file or package folder the import looks for (``credit_model.py`` of ``credit_model:Net``)."""
        top, dotted = self.module_name.split(".")[0], "." in self.module_name
        return top if dotted else f"{top}.py"


def load_factory(spec: str):
    """Import ``package.module:factory`` and return the factory, with a clear error if it fails."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"model: expected mlp, cnn or package.module:factory, got {spec!r}")
    try:
        module = _import_from_path_or_cwd(module_name)
    except ImportError as error:
        missing = getattr(error, "name", None) or ""
        if isinstance(error, ModuleNotFoundError) and missing and not f"{module_name}.".startswith(f"{missing}."):
            raise ValueError(f"model: got {spec!r} (module {module_name!r} imports {missing!r}, which is not "
                             f"installed); allowed: a module whose imports are installed: install {missing}, or "
                             f"fix the import in {module_name}") from None
        raise ModuleNotImportable(spec, error) from None
    except Exception as error:  # noqa: BLE001 - the user's own file: a syntax error, or one raised at its top level
        raise ValueError(f"model: got {spec!r} (importing {module_name!r} failed: {_where(error)}); allowed: a "
                         f"module that imports without error: fix the file") from None
    if not callable(getattr(module, attribute, None)):  # missing, or a module or a value it imports (torch)
        from datamodules.suggest import name_hint  # noqa: PLC0415

        own = [name for name, value in vars(module).items() if not name.startswith("_") and callable(value)
               and getattr(value, "__module__", None) == module.__name__]  # its classes and functions, not imports
        problem = f"{attribute!r} is no class or function" if hasattr(module, attribute) else \
            f"module {module_name!r} has no {attribute!r}{name_hint(attribute, own, '; {}')}"
        raise ValueError(f"model: got {spec!r} ({problem}); allowed: a class or function of {module_name}: "
                         f"{', '.join(own) or '(none)'}")
    return getattr(module, attribute)


OFFERED = ("n_features", "n_classes", "hidden_sizes", "activation")  # what a factory of one's own may take


def factory_arguments(architecture: str, factory) -> list[str]:
    """The arguments of :data:`OFFERED` that ``factory`` (``architecture``: its ``package.module:factory``) takes:
    those it names, all with ``**kwargs``, none where its signature cannot be read. A one-line ``ValueError`` where it
    requires another (a class of your own, ``CreditNet(n_inputs, hidden)``: a ``TypeError`` deep in the loading
    otherwise); checked before any training by ``compare.py`` and when the model is built."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return []
    takes_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    taken = [name for name in OFFERED if takes_all or name in parameters]
    unmet = [name for name, p in parameters.items() if p.default is p.empty and name not in taken
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if unmet:
        raise ValueError(f"model: got {architecture!r} (it requires {', '.join(map(repr, unmet))}, which "
                         f"ct-lightning does not give); allowed: a function or class whose required arguments "
                         f"are among {', '.join(OFFERED)}, e.g. a factory of your own beside it: "
                         f"def make(n_features): return {architecture.partition(':')[2]}(n_features, ...), "
                         f"then --model yourfile:make")
    return taken


def build_model(architecture: str, n_features: int, n_classes: int, hidden_sizes: Sequence[int] = (32,),
                activation: str = "relu") -> nn.Module:
    """Build ``mlp``, ``cnn`` or a user factory ``package.module:factory``.

    A factory is called with whichever of ``n_features``, ``n_classes``, ``hidden_sizes`` and
    ``activation`` it accepts and must return an ``nn.Module`` that maps inputs to logits.
    """
    if architecture == "mlp":
        return build_mlp(n_features, n_classes, hidden_sizes, activation)
    if architecture == "cnn":
        return LeNet(n_features, n_classes)
    factory = load_factory(architecture)
    offered = {"n_features": n_features, "n_classes": n_classes, "hidden_sizes": list(hidden_sizes),
               "activation": activation}
    model = factory(**{name: offered[name] for name in factory_arguments(architecture, factory)})
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: factory {architecture!r} returned {type(model).__name__}, not an nn.Module")
    return model


def model_from_hparams(hp: Mapping) -> nn.Module:
    """The untrained classifier that a ``CTModule``'s hyperparameters describe (``architecture``, ``n_features``,
    ``n_classes``, ``hidden_sizes``, ``activation``, and ``input_map`` and ``output_order``: a model of your own
    behind its frozen input and output layers, ``--model-inputs``): what ``CTModule`` builds when given no model, and
    so the network that its checkpoints' ``model.`` weights fit."""
    if hp["n_features"] is None:
        raise ValueError("n_features: required when no model is given (to build the default MLP)")
    if hp.get("input_map"):
        return build_adapted(hp["architecture"], hp["n_features"], hp["n_classes"], hp["input_map"],
                             hp["hidden_sizes"], hp["activation"], hp.get("output_order"))
    return build_model(hp["architecture"], hp["n_features"], hp["n_classes"], hp["hidden_sizes"], hp["activation"])


def describe_model(model: nn.Module) -> dict:
    """The architecture settings that rebuild ``model`` with :func:`build_mlp`, else ``{"architecture": "custom"}``.

    A user's own network is recorded as what it is, so that logged hyperparameters never claim the
    default MLP for, say, a 64-32 network.
    """
    layers = list(model) if isinstance(model, nn.Sequential) else []
    linear = [m for m in layers[::2] if isinstance(m, nn.Linear)]
    acts = layers[1::2]
    names = {name for m in acts for name, cls in ACTIVATIONS.items() if type(m) is cls}
    if (layers and len(linear) == len(layers[::2]) and len(acts) == len(linear) - 1 and len(names) <= 1
            and all(any(type(m) is cls for cls in ACTIVATIONS.values()) for m in acts)
            and all(a.out_features == b.in_features for a, b in zip(linear, linear[1:]))):
        return {"architecture": "mlp", "hidden_sizes": [m.out_features for m in linear[:-1]],
                "activation": names.pop() if names else "relu", "n_features": linear[0].in_features}
    return {"architecture": "custom"}


class InputAdapter(nn.Module):
    """A frozen affine layer ``x ↦ weight @ x + bias``: ct-lightning's encoding of a row in, the inputs a model of
    your own was trained on out (``--model-inputs``, :mod:`ct_lightning.model_inputs`). It has no parameters: its
    matrix and bias are buffers, set once with :meth:`set_map` (or loaded with the module's ``state_dict``), so
    training never changes them and a checkpoint carries them."""

    def __init__(self, n_features: int, n_inputs: int):
        super().__init__()
        self.register_buffer("weight", torch.zeros(n_inputs, n_features))
        self.register_buffer("bias", torch.zeros(n_inputs))
        self.mapped = False  # a zero map would feed the network constants: refuse to run until it is set

    def set_map(self, weight, bias) -> InputAdapter:
        """Set the matrix ``[n_inputs, n_features]`` and the bias ``[n_inputs]``."""
        weight = torch.as_tensor(weight, dtype=self.weight.dtype)
        if tuple(weight.shape) != tuple(self.weight.shape):
            raise ValueError(f"model_inputs: a map of shape {tuple(weight.shape)} for an adapter of "
                             f"{tuple(self.weight.shape)}")
        self.weight.copy_(weight)
        self.bias.copy_(torch.as_tensor(bias, dtype=self.bias.dtype))
        self.mapped = True
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.mapped = self.mapped or f"{prefix}weight" in state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.mapped:
            raise RuntimeError("InputAdapter: its map is not set (set_map, or load a checkpoint that holds it)")
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"n_features={self.weight.shape[1]}, n_inputs={self.weight.shape[0]}, frozen"


class OutputAdapter(nn.Module):
    """A frozen linear layer from a model's own outputs to ct-lightning's logits, in ct-lightning's class order
    (``"outputs"`` of ``--model-inputs``): ``order[j]`` is the class of output ``j``. One output unit ``z`` (a
    single logit) scores the class ``order[0]`` against the other of two: logits ``-z/2`` for the other and ``z/2``
    for it, so that softmax gives ``σ(z)`` to that class and cross-entropy equals binary cross-entropy on ``z``.
    Centred, because CT's energies are single logits (SPEC §1): with ``0`` and ``z`` the other class's energy was a
    constant, its counterfactuals added no penalty, and the ridge term pulled ``z`` to 0 on the scored class alone,
    tilting the model towards the other (a fine-tuned one-logit model predicted 'yes' for 18 % of rows, 55 % true);
    centred, both classes are treated alike and which class the unit scores does not change training. Its matrix is
    a buffer made from ``order`` alone: no parameters, and a checkpoint's hyperparameters rebuild it (a checkpoint
    trained with ``0`` and ``z`` keeps its own matrix)."""

    def __init__(self, order: Sequence[int], n_classes: int):
        super().__init__()
        order = [int(i) for i in order]
        if len(order) == 1 and n_classes != 2 or len(order) > 1 and sorted(order) != list(range(n_classes)):
            raise ValueError(f"output_order: got {order} for {n_classes} classes; allowed: each class index once, "
                             f"or one index of two classes (a single logit)")
        self.order = order
        weight = torch.zeros(n_classes, len(order))
        for unit, index in enumerate(order):
            weight[index, unit] = 1.0
        if len(order) == 1:  # one logit: centred (see above)
            weight[order[0], 0], weight[1 - order[0], 0] = 0.5, -0.5
        self.register_buffer("weight", weight)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(z, self.weight)

    def extra_repr(self) -> str:
        return f"order={self.order}, n_classes={self.weight.shape[0]}, frozen"


class AdaptedModel(nn.Module):
    """Your network behind an :class:`InputAdapter` (and before an :class:`OutputAdapter` where its classes are
    in another order, or it has one output unit): ``outputs(network(inputs(x)))``. CT trains the network only;
    ``network.state_dict()`` loads into your own ``nn.Module``, which then reads your own encoding and returns your
    own outputs."""

    def __init__(self, inputs: InputAdapter, network: nn.Module, entries: list[dict] | None = None,
                 outputs: OutputAdapter | None = None, labels: list | None = None):
        super().__init__()
        self.inputs, self.network, self.outputs = inputs, network, outputs
        self.entries = entries  # the --model-inputs list the map was made from (kept with a pickled model)
        self.labels = labels  # the classes of the network's outputs, as "outputs" listed them (likewise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.network(self.inputs(x))
        outputs = getattr(self, "outputs", None)  # None in a model pickled before there were output layers
        return z if outputs is None else outputs(z)


def build_adapted(architecture: str, n_features: int, n_classes: int, entries: list[dict],
                  hidden_sizes: Sequence[int] = (32,), activation: str = "relu",
                  output_order: Sequence[int] | None = None) -> AdaptedModel:
    """``architecture`` built for the inputs ``entries`` lists, behind an (unset) :class:`InputAdapter` from
    ``n_features``; with ``output_order``, of that many outputs, before its :class:`OutputAdapter`."""
    width = len(output_order) if output_order else n_classes
    outputs = OutputAdapter(output_order, n_classes) if output_order else None
    return AdaptedModel(InputAdapter(n_features, len(entries)),
                        build_model(architecture, len(entries), width, hidden_sizes, activation), list(entries),
                        outputs)
