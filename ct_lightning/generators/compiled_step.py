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

On a GPU the balance is different (issue 27, measured on an H100 by an earlier session): compiling took 10.6 s,
and the compiled step saved 12 ms per search of an MNIST pool (5 000 × 784 values), so a 100-epoch run lost
~9 s. There ``auto`` compiles only when the searches the process expects (:func:`set_expected_searches`;
``train()`` sets it from ``max_epochs`` and the pool mode) would save more than the compilation costs.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.fx.experimental._config as torch_fx_config

SEARCH_COMPILE_MODES = ("auto", "on", "off")
AUTO_MIN_VALUES = 250_000  # rows × features of a pool from which ``auto`` compiles the step
# Off the CPU (issue 27's H100 measurement): seconds one compilation costs, and seconds the compiled step saves
# per search and per pool value (12 ms on an MNIST pool of 5 000 × 784 values).
GPU_COMPILE_SECONDS = 10.6
GPU_SAVED_SECONDS_PER_VALUE = 12e-3 / (5_000 * 784)

_mode = "auto"
_expected_searches: int | None = None


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


def set_expected_searches(count: int | None) -> None:
    """Process-wide: how many searches this process expects to run (``None``: unknown). Used by ``auto`` off the
    CPU only, where one compilation costs as much as hundreds of searches save."""
    global _expected_searches
    if count is not None and count < 0:
        raise ValueError(f"expected searches: must be at least 0, got {count}")
    _expected_searches = count


def expected_searches() -> int | None:
    """The count set by :func:`set_expected_searches` (``None``: unknown)."""
    return _expected_searches


def compile_pays(n_values: int, device_type: str = "cpu", searches: int | None = None) -> bool:
    """``auto``'s rule: compile the step of a pool of ``n_values`` values on a ``device_type`` device?

    On the CPU: pools of at least :data:`AUTO_MIN_VALUES` values (the saving starts at the first search).
    Elsewhere: such pools, and only when ``searches`` of them save more than one compilation costs
    (:data:`GPU_COMPILE_SECONDS`); with ``searches`` unknown, never.
    """
    if n_values < AUTO_MIN_VALUES:
        return False
    if device_type == "cpu":
        return True
    return searches is not None and searches * n_values * GPU_SAVED_SECONDS_PER_VALUE > GPU_COMPILE_SECONDS


def constrained_step(rows, x, grad, lr, lambda_cost, limits):
    """The next points and their ℓ∞ distances from the factuals ``x``: ``limits.step`` (mutability mask, SGD step,
    projection; :class:`ct_lightning.constraints.Constraints`) on ``grad + λ_cst·sign(rows − x)``, written without
    in-place operations so that it compiles into one kernel. ``lr`` and ``lambda_cost`` are 0-d tensors.
    """
    grad = grad + lambda_cost * torch.sign(rows - x)
    moved = limits.project(rows - lr * limits.mask_gradient(grad), x)
    offset = moved - x
    return moved, torch.maximum(offset.amax(1), -offset.amin(1))


def cache_per_cpu_capability() -> str:
    """Point torch.compile's on-disk cache (``$TORCHINDUCTOR_CACHE_DIR``, else torch's default folder) at a subfolder
    named by this process's CPU capability (``avx512``, ``avx2``, ``default``), and return it.

    Torch's compiled-graph cache does not tell kernels apart by the CPU capability they were generated for: a step
    compiled under AVX-512 and read back by a process running AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``, or another
    node sharing the cache folder) computed wrong points (16 800 of 35 000 values, measured on torch 2.13; the reverse
    order 6). One folder per capability keeps them apart. Idempotent: a process started by this one keeps the folder.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # noqa: PLC0415 - torch's own default

    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    capability = torch.backends.cpu.get_cpu_capability().lower()
    folder = base if os.path.basename(os.path.normpath(base)) == capability else os.path.join(base, capability)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def inductor_vectorises() -> bool:
    """Whether Inductor's CPU kernels in this process use the vector instructions ATen's use (always, under ATen's
    scalar kernels, ``ATEN_CPU_CAPABILITY=default``).

    Inductor decides once per process, by compiling and loading a probe; where that probe fails it writes scalar
    kernels. Such a step took twice the eager step's time on MNIST (161 against 83 ms a search, one thread, torch 2.13),
    and torch's compiled-graph cache, which does not key kernels by that choice, served it to every later process
    reading the same folder: it happened on this project's machine (cause of the probe's failure unknown).
    """
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        return True
    from torch._inductor import cpu_vec_isa  # noqa: PLC0415 - Inductor only where a step compiles

    return bool(cpu_vec_isa.pick_vec_isa())


_NOT_YET = object()  # CompiledStep's compiled function before its first use


class CompiledStep:
    """:func:`constrained_step` compiled once per process (``dynamic=True``: rows drop out as they converge).

    If compilation fails (no C++ compiler, an unsupported backend), it warns once and runs the step eagerly
    from then on: the same function, so the same results. So it does where Inductor would write scalar kernels for a
    CPU whose ATen kernels are vectorised (:func:`inductor_vectorises`): slower than eager, and they would be cached
    for other processes.
    """

    def __init__(self, backend="inductor"):
        self._backend = backend
        self._compiled = _NOT_YET
        self._vectorises: bool | None = None  # inductor_vectorises(), asked at the first compiled CPU call
        # Made once: a new patch object costs more Python time a call than guarding the compiled kernel.
        self._without_duck_shape = torch_fx_config.patch(use_duck_shape=False)

    @property
    def compiled(self):
        """The compiled function, set up at the first call (``torch.compile``'s set-up takes 0.7–1.6 s, and a search
        whose loop runs natively, ``native_search``, never calls it); ``None`` once a compilation failed."""
        if self._compiled is _NOT_YET:
            self._compiled = torch.compile(constrained_step, dynamic=True, backend=self._backend)
        return self._compiled

    @compiled.setter
    def compiled(self, value) -> None:
        self._compiled = value

    def __call__(self, *args):
        rows, x = args[0], args[1]
        with torch.no_grad():
            # At the first step the points are the factuals themselves: passed as one tensor twice, they would
            # compile a variant of their own (an aliasing guard; seconds, in the middle of a search), so the points
            # go in as a view of the factuals. One row (sizes 0 and 1 are always specialised) runs eagerly. Without
            # duck sizing, a pool whose row count happens to equal its feature count does not get a variant either.
            if rows is x:
                args = (rows.detach(), *args[1:])
            if self._compiled is not None and rows.shape[0] > 1:
                # At each call, not once: torch reads the folder at each compilation, and a process may have reset
                # its environment since (a test harness restoring os.environ did, and the next graph was compiled
                # into, and read back from, the folder shared by every capability: a crash). Inductor's probe of
                # the vector instructions writes there too.
                cache_per_cpu_capability()
                if rows.device.type == "cpu" and not self._cpu_vectorises():
                    self._fall_back("Inductor found no vector instructions in this process, and its scalar kernel is "
                                    "slower than the eager step")
            if self.compiled is not None and rows.shape[0] > 1:
                try:
                    with self._without_duck_shape:
                        return self.compiled(*args)
                except Exception as error:  # noqa: BLE001 - any compiler failure: fall back to eager
                    cause = getattr(error, "inner_exception", None) or error  # the compiler's own error
                    first_line = (str(cause).strip().splitlines() or [""])[0][:200]
                    self._fall_back(f"torch.compile failed ({type(cause).__name__}: {first_line})")
            return constrained_step(*args)

    def _cpu_vectorises(self) -> bool:
        if self._vectorises is None:
            self._vectorises = inductor_vectorises()
        return self._vectorises

    def _fall_back(self, why: str) -> None:
        """From now on the eager step, with one warning saying ``why``."""
        warnings.warn(f"search_compile: {why}; searching with the eager step", RuntimeWarning, stacklevel=3)
        self.compiled = None


@functools.cache
def _shared_step() -> CompiledStep:
    return CompiledStep()


def step_for(n_values: int, device_type: str = "cpu") -> CompiledStep | None:
    """The compiled step for a search over a pool of ``n_values`` values (rows × features) on a ``device_type``
    device under the current mode, or ``None`` for the eager step."""
    if _mode == "off" or (_mode == "auto" and not compile_pays(n_values, device_type, _expected_searches)):
        return None
    return _shared_step()
