"""The feature-space search step after the backward pass, as one compiled kernel where that pays off.

After the model's backward pass, a Generic/ECCo search step is elementwise over the n×D pool: add the ℓ1
cost's gradient ``λ_cst·sign(x' − x)``, mask the gradient by mutability, take the SGD step, project onto the
domain and mutability, and measure the new point's ℓ∞ distance from its factual (the nascent ε-ball test).
Eager PyTorch runs that as about ten passes over the pool; ``torch.compile`` fuses them into one that reads
x', x and the gradient and writes the next x' and its distance. Measured on a 2-core CPU
(``bench/compile_bench.py``, docs/performance.md): MNIST-shaped searches 20–35 % faster, Adult-shaped (5 000
rows) ~10 %, and pools below ~250 000 values slower, because a compiled call costs more Python time than the
passes it saves. ``search_compile`` (``auto`` by default) chooses per search; the first compiled search in a
process pays the compilation (seconds; torch caches it on disk for later processes).
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.fx.experimental._config as torch_fx_config

SEARCH_COMPILE_MODES = ("auto", "on", "off")
AUTO_MIN_VALUES = 250_000  # rows × features of a pool from which ``auto`` compiles the step

_mode = "auto"


def set_search_compile(mode: str) -> None:
    """Process-wide choice: ``on`` compiles every feature-space search step, ``off`` none, ``auto`` those of
    pools of at least :data:`AUTO_MIN_VALUES` values."""
    global _mode
    if mode not in SEARCH_COMPILE_MODES:
        raise ValueError(f"search_compile: {mode!r} is not allowed; allowed: {', '.join(SEARCH_COMPILE_MODES)}")
    _mode = mode


def search_compile() -> str:
    """The current process-wide mode (see :func:`set_search_compile`)."""
    return _mode


def constrained_step(rows, x, grad, lr, lambda_cost, limits):
    """The next points and their ℓ∞ distances from the factuals ``x``: ``limits.step`` (mutability mask, SGD step,
    projection; :class:`ct_lightning.constraints.Constraints`) on ``grad + λ_cst·sign(rows − x)``, written without
    in-place operations so that it compiles into one kernel. ``lr`` and ``lambda_cost`` are 0-d tensors.
    """
    grad = grad + lambda_cost * torch.sign(rows - x)
    moved = limits.project(rows - lr * limits.mask_gradient(grad), x)
    offset = moved - x
    return moved, torch.maximum(offset.amax(1), -offset.amin(1))


class CompiledStep:
    """:func:`constrained_step` compiled once per process (``dynamic=True``: rows drop out as they converge).

    If compilation fails (no C++ compiler, an unsupported backend), it warns once and runs the step eagerly
    from then on: the same function, so the same results.
    """

    def __init__(self, backend="inductor"):
        self.compiled = torch.compile(constrained_step, dynamic=True, backend=backend)

    def __call__(self, *args):
        rows, x = args[0], args[1]
        with torch.no_grad():
            # Each of these would compile another variant of the kernel (seconds, in the middle of a search):
            # the first step, where the points are the factuals themselves (an aliasing guard), and one row
            # (sizes 0 and 1 are always specialised); they run eagerly. Without duck sizing, a pool whose
            # row count happens to equal its feature count does not get a variant of its own either.
            if self.compiled is not None and rows is not x and rows.shape[0] > 1:
                try:
                    with torch_fx_config.patch(use_duck_shape=False):
                        return self.compiled(*args)
                except Exception as error:  # noqa: BLE001 - any compiler failure: fall back to eager
                    cause = getattr(error, "inner_exception", None) or error  # the compiler's own error
                    first_line = (str(cause).strip().splitlines() or [""])[0][:200]
                    warnings.warn(f"search_compile: torch.compile failed ({type(cause).__name__}: {first_line}); "
                                  "searching with the eager step", RuntimeWarning, stacklevel=2)
                    self.compiled = None
            return constrained_step(*args)


@functools.cache
def _shared_step() -> CompiledStep:
    return CompiledStep()


def step_for(n_values: int) -> CompiledStep | None:
    """The compiled step for a search over a pool of ``n_values`` values (rows × features) under the current
    mode, or ``None`` for the eager step."""
    if _mode == "off" or (_mode == "auto" and n_values < AUTO_MIN_VALUES):
        return None
    return _shared_step()
