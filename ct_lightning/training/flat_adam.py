"""Adam over one flat buffer: PyTorch's CPU arithmetic, element for element, in seven kernels per step.

On a CPU ``torch.optim.Adam`` runs its single-tensor loop: seven elementwise kernels *per parameter*, each
with Python and dispatcher costs of a few microseconds, plus the bookkeeping around them. The paper's MLP has
four parameters of at most 64 values, so an Adam step (0.29 ms here) costs about as much as the forward and
backward pass it follows, a third of a circles training step. :class:`FlatAdam` keeps the parameters, their
gradients and Adam's two moments as views of one flat buffer each, and runs the same seven operations once over
all of them, in the same order and with the same scalars: every element goes through the arithmetic it would
have gone through in its own tensor (tests/test_flat_adam.py holds the weights to Adam's within 1e-6 over
hundreds of steps, and resumes from either optimiser's state).

It is a ``torch.optim.Adam``: its state dictionary, hooks, learning-rate schedulers and checkpoints are Adam's.
The flat step runs where Adam's default would be the single-tensor loop (CPU tensors of one floating dtype,
one parameter group, every parameter with a gradient, no weight decay, amsgrad, maximize, foreach, fused,
capturable, differentiable or tensor learning rate); anywhere else it is Adam's own step.
"""

from __future__ import annotations

import torch
import torch.optim.optimizer as _optimizer

_STEP_LIMIT = 2 ** 24  # Adam counts steps in a float32 tensor, exact up to here; beyond it, Adam's own step


def _wrapper_idle(optimizer: torch.optim.Optimizer) -> bool:
    """Whether torch's wrapper around ``optimizer.step`` has nothing to do: no step hooks of its own or global, no
    profiler running, ``step`` not replaced on the instance (a test's or a callback's wrapper). It reads torch's
    private names for these; a torch without one of them gets ``False``, and so the wrapped step, which is always
    right."""
    try:
        return not (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
                    or _optimizer._global_optimizer_pre_hooks or _optimizer._global_optimizer_post_hooks
                    or torch.autograd.profiler._is_profiler_enabled or "step" in optimizer.__dict__)
    except AttributeError:
        return False


class FlatAdam(torch.optim.Adam):
    """``torch.optim.Adam`` with a flat CPU step (see the module's docstring); same arguments."""

    _flat: "_FlatState | None" = None

    def load_state_dict(self, state_dict: dict) -> None:
        """Adam's; the flat buffers are rebuilt from the loaded state at the next step."""
        super().load_state_dict(state_dict)
        self._flat = None

    def add_param_group(self, param_group: dict) -> None:
        """Adam's; the flat buffers are rebuilt at the next step."""
        super().add_param_group(param_group)
        self._flat = None

    def gradient_views(self) -> dict | None:
        """Each parameter's gradient as a view of the flat gradient buffer (set as its ``.grad``), keyed by the
        parameter, for a step that writes its gradients in place (``training.mlp_step``); ``None`` where the next
        step would not be flat. The views' contents are whatever the last step left."""
        flat = self._ready(need_grads=False)
        if flat is None:
            return None
        for param, view in zip(flat.params, flat.grad_views):
            if param.grad is not view:
                param.grad = view
        return flat.grad_by_param

    def step_unlabelled(self) -> None:
        """:meth:`step` without torch's wrapper around every optimiser's ``step`` where it has nothing to do (no
        step hooks registered, no profiler running, ``step`` not replaced on the instance): the wrapper's profiler
        label and hook loops cost about 40 µs a call, as much as the flat step itself on the paper's MLP.
        ``CTModule``'s direct training loop calls it."""
        if _wrapper_idle(self):
            _flat_adam_step(self)
        else:
            self.step()

    def step(self, closure=None):
        """One Adam step: flat where it applies, else ``torch.optim.Adam.step``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flat = self._ready(need_grads=True)
        if flat is None:
            self._flat = None  # Adam's step may change the state's tensors: rebuild from them next time
            _adam_step(self)
            return loss
        with torch.no_grad():
            flat.step(self.param_groups[0])
        return loss

    def _ready(self, need_grads: bool) -> "_FlatState | None":
        """The flat state, built or rebuilt as needed, if the flat step applies now; else ``None``."""
        if len(self.param_groups) != 1 or not _flat_group(self.param_groups[0]):
            return None
        flat = self._flat
        if flat is None or not flat.current(self.param_groups[0]["params"]):
            flat = self._flat = _FlatState.build(self.param_groups[0]["params"], self.state)
        if flat is None or flat.step_value + 1 >= _STEP_LIMIT:
            return None
        if need_grads and not flat.take_grads():
            return None
        return flat


_flat_adam_step = FlatAdam.step  # before torch wraps it (at the first FlatAdam made)


def _adam_step(optimizer: FlatAdam) -> None:
    """``torch.optim.Adam.step`` without the step hooks that already ran around :meth:`FlatAdam.step` (once any
    optimiser of a class is made, torch wraps that class's ``step`` in a function that runs the hooks)."""
    adam_step = torch.optim.Adam.step
    (adam_step.__wrapped__ if getattr(adam_step, "hooked", False) else adam_step)(optimizer)


def _flat_group(group: dict) -> bool:
    """Whether ``group``'s options are those under which Adam's CPU step is the single-tensor loop we mirror."""
    beta1, beta2 = group["betas"]
    return (group["weight_decay"] == 0 and not group["amsgrad"] and not group["maximize"]
            and not group["foreach"] and not group["fused"] and not group["capturable"]
            and not group["differentiable"] and isinstance(group["lr"], float)
            and isinstance(beta1, float) and isinstance(beta2, float))


class _FlatState:
    """Parameters, gradients, moments and step counts as views of four flat buffers."""

    def __init__(self, params, flat, grad, exp_avg, exp_avg_sq, steps, step_value):
        self.params, self.flat, self.grad = params, flat, grad
        self.exp_avg, self.exp_avg_sq, self.steps, self.step_value = exp_avg, exp_avg_sq, steps, step_value
        self.grad_views = [_view(grad, p, o) for p, o in zip(params, _offsets(params))]
        self.grad_by_param = dict(zip(params, self.grad_views))
        self.pointers = [p.data_ptr() for p in params]

    @staticmethod
    def build(params: list, state) -> "_FlatState | None":
        """Move ``params`` and their Adam state into flat buffers (the parameters keep their identity, their
        ``.data`` becomes a view); ``None`` if they are not all dense CPU tensors of one floating dtype, or their
        states are not all empty or all at one step."""
        dtypes = {p.dtype for p in params}
        if not params or len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point or any(
                p.device.type != "cpu" or p.layout != torch.strided or not p.requires_grad for p in params):
            return None
        states = [state[p] for p in params]
        if any(states) and not all(s.keys() >= {"step", "exp_avg", "exp_avg_sq"} for s in states):
            return None
        counts = {float(s["step"]) for s in states} if all(states) else {0.0}
        if len(counts) != 1 or any(states) and any(s["exp_avg"].shape != p.shape for s, p in zip(states, params)):
            return None
        n = sum(p.numel() for p in params)
        dtype = params[0].dtype
        flat, grad = torch.empty(n, dtype=dtype), torch.zeros(n, dtype=dtype)
        exp_avg, exp_avg_sq = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
        steps = torch.full((len(params),), counts.pop(), dtype=torch.float32)
        for i, (param, offset) in enumerate(zip(params, _offsets(params))):
            with torch.no_grad():
                _view(flat, param, offset).copy_(param)
                if param.grad is not None and param.grad.shape == param.shape:
                    _view(grad, param, offset).copy_(param.grad)
            param.data = _view(flat, param, offset)
            if states[i]:
                _view(exp_avg, param, offset).copy_(states[i]["exp_avg"])
                _view(exp_avg_sq, param, offset).copy_(states[i]["exp_avg_sq"])
            states[i]["step"] = steps[i]
            states[i]["exp_avg"] = _view(exp_avg, param, offset)
            states[i]["exp_avg_sq"] = _view(exp_avg_sq, param, offset)
        return _FlatState(list(params), flat, grad, exp_avg, exp_avg_sq, steps, float(steps[0]))

    def current(self, params: list) -> bool:
        """Whether ``params`` are still the parameters of these buffers, in place (not moved or replaced)."""
        return len(params) == len(self.params) and all(
            p is q and p.data_ptr() == ptr for p, q, ptr in zip(params, self.params, self.pointers))

    def take_grads(self) -> bool:
        """Bring every parameter's gradient into the flat buffer (a copy unless it is already its view);
        ``False`` if one has none or one of another shape or kind."""
        copies = []
        for param, view in zip(self.params, self.grad_views):
            grad = param.grad
            if grad is view:
                continue
            if grad is None or grad.shape != view.shape or grad.dtype != view.dtype or grad.is_sparse \
                    or grad.device != view.device:
                return False
            copies.append((view, grad))
        if copies:
            torch._foreach_copy_([view for view, _ in copies], [grad for _, grad in copies])
        return True

    def step(self, group: dict) -> None:
        """Adam's single-tensor step (torch.optim.adam._single_tensor_adam, no weight decay or amsgrad) over
        the flat buffers: the same operations and scalars, once."""
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        self.steps.add_(1)
        self.step_value += 1.0
        step = self.step_value
        self.exp_avg.lerp_(self.grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.grad, self.grad, value=1 - beta2)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5
        denom = (self.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-step_size)


def _offsets(params: list) -> list[int]:
    offsets, offset = [], 0
    for param in params:
        offsets.append(offset)
        offset += param.numel()
    return offsets


def _view(buffer: torch.Tensor, like: torch.Tensor, offset: int) -> torch.Tensor:
    return buffer[offset:offset + like.numel()].view(like.shape)
