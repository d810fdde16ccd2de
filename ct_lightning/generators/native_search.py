"""The packed search loop with its own work in native code: C calls per iteration (``native_search.c``).

Per iteration a feature-space search (Generic, ECCo: the penalty's gradient in closed form) runs the model's passes and
the softmax in PyTorch, as :class:`~ct_lightning.generators.search.FeatureSpace` does. Everything else (the penalty's
and the loss's gradient at the target's logit and τ-convergence, the nascent ε-ball test, freezing the rows that
converged, the ℓ1 cost's gradient, the mutability mask, the SGD step, the projection, dropping frozen rows) was about
thirty small PyTorch operations per iteration in ``_search_packed``; on a CPU each costs its launch whatever its size,
and a search of a small model spent more on them than on the model (``bench/search_parts.py``). Here they are two calls
of plain C over the packed rows, which step the rows in place, operation for operation as PyTorch rounds them, so the
results are the PyTorch loop's to the bit where both pack the rows alike (tests/test_native_search.py);
``bench/native_search.py`` measures it. The native loop drops frozen rows at once (:data:`REPACK_SHARE`), the PyTorch
loop from a quarter of its rows: a matrix product over another number of rows may round differently, so the two may
differ in the last bit.

The C file is compiled on first use with the system's C compiler (about a second) into a cache folder
(``$CT_LIGHTNING_CACHE``, else ``~/.cache/ct-lightning``), one library per source and machine. Where there is no
compiler, or ``CT_NATIVE_SEARCH=0``, the search runs its PyTorch loop: the same results up to that last bit, more
slowly.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from ct_lightning.generators.base import SearchResult

SOURCE = Path(__file__).with_name("native_search.c")
# -ffp-contract=off: no fused multiply-add, each operation rounded as PyTorch rounds it. -march=native (where it builds)
# vectorises the step for this CPU; the library is then kept per CPU (its feature flags are part of its name).
FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
NATIVE_FLAGS = ("-march=native",)
SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}  # an integer as wide as the values

_enabled = os.environ.get("CT_NATIVE_SEARCH", "1") != "0"
# The native loop drops rows that froze from its packing at once (search.py's PyTorch loop waits until they are
# REPACK_SHARE of the rows): its step writes each row's next point into its packed place anyway, so a repacking costs
# next to nothing, and frozen rows no longer ride along in the model's passes (7 % of MNIST's converging search).
REPACK_SHARE = 0.0
_library: ctypes.CDLL | None | bool = False  # False: not tried yet; None: not available


class _Search(ctypes.Structure):
    """native_search.c's ``Search``: the pool's buffers and the search's settings."""

    _fields_ = [("n", ctypes.c_int64), ("d", ctypes.c_int64), ("m", ctypes.c_int64), ("n_searching", ctypes.c_int64),
                ("lr", ctypes.c_double), ("epsilon", ctypes.c_double), ("repack_share", ctypes.c_double),
                *((name, ctypes.c_void_p) for name in (
                    "x", "rows_x", "target", "active", "searching", "was_inside", "distance", "scratch", "x_cf",
                    "nascent", "nascent_steps", "steps", "converged", "lower", "upper", "codes"))]


def cache_folder() -> Path:
    """Where the compiled library is kept: ``$CT_LIGHTNING_CACHE``, else ``~/.cache/ct-lightning``."""
    return Path(os.environ.get("CT_LIGHTNING_CACHE") or Path.home() / ".cache" / "ct-lightning")


def _compiler() -> str | None:
    return next((path for name in (os.environ.get("CC"), "cc", "gcc", "clang") if name
                 for path in [shutil.which(name)] if path), None)


def _build() -> ctypes.CDLL | None:
    """The library, compiled into :func:`cache_folder` unless already there; ``None`` without a working compiler."""
    if sys.platform == "win32":
        return None
    compiler = _compiler()
    if compiler is None:
        return None
    source = SOURCE.read_bytes()
    cpu = _cpu_flags()
    for flags in ((*FLAGS, *NATIVE_FLAGS), FLAGS) if cpu else (FLAGS,):
        key = hashlib.sha256(source + " ".join((*flags, compiler, platform.machine(), cpu if flags != FLAGS else ""))
                             .encode()).hexdigest()[:16]
        library = cache_folder() / "native" / f"native_search-{key}.so"
        if library.exists() or _compile(compiler, flags, library):
            try:
                loaded = ctypes.CDLL(str(library))
                break
            except OSError:
                continue
    else:
        return None
    for suffix in SUFFIX.values():
        iteration = getattr(loaded, f"search_iteration_{suffix}")
        iteration.restype = ctypes.c_int64
        iteration.argtypes = [ctypes.POINTER(_Search), *[ctypes.c_void_p] * 5, ctypes.c_int64, ctypes.c_double]
        logits = getattr(loaded, f"search_logits_{suffix}")
        logits.restype = None
        logits.argtypes = [ctypes.POINTER(_Search), ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                           ctypes.c_void_p, ctypes.c_double]
        finish = getattr(loaded, f"search_finish_{suffix}")
        finish.restype = None
        finish.argtypes = [ctypes.POINTER(_Search), *[ctypes.c_void_p] * 4, ctypes.c_int64]
    return loaded


def _cpu_flags() -> str:
    """This CPU's feature flags (Linux), which a library built with -march=native depends on; "" where unknown (then
    the library is built without -march=native, for any CPU of the architecture)."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _compile(compiler: str, flags: tuple[str, ...], library: Path) -> bool:
    """Compile :data:`SOURCE` into ``library`` (whole or not at all: processes may race); whether it worked."""
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
            built = Path(scratch) / library.name
            subprocess.run([compiler, *flags, "-o", str(built), str(SOURCE)], check=True, capture_output=True,
                           timeout=120)
            os.replace(built, library)
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def library() -> ctypes.CDLL | None:
    """The native loop's library, built on first use; ``None`` where it is switched off or cannot be built."""
    global _library
    if not _enabled:
        return None
    if _library is False:
        _library = _build()
    return _library


@contextlib.contextmanager
def python_loop_only(packed_as_native: bool = False) -> Iterator[None]:
    """Within the block, every search runs its PyTorch loop (to compare the two; ``bench/``, tests). With
    ``packed_as_native`` that loop drops frozen rows when the native one does (:data:`REPACK_SHARE`), so that both pass
    the same rows through the model and their results compare to the bit."""
    from ct_lightning.generators import search  # noqa: PLC0415 - it imports this module

    global _enabled
    before, _enabled = _enabled, False
    share = search.REPACK_SHARE
    if packed_as_native:
        search.REPACK_SHARE = REPACK_SHARE
    try:
        yield
    finally:
        _enabled, search.REPACK_SHARE = before, share


def _own_closed_form(generator, max_steps: int) -> int | None:
    """The penalty's gradient at the target's logit as native_search.c's ``search_logits`` takes it: 0 for the
    library's Generic (none), 1 for ECCo's energy (:meth:`ECCo.energy_gradient`), or a subclass keeping theirs, with a
    per-search ``λ_cst``, step size and energy weight; ``None`` for any other generator. (That the penalty has its
    gradient in closed form, the space's ``passes`` say.)"""
    from ct_lightning.generators.feature_space import ECCo, Generic  # noqa: PLC0415 - they import the search

    method = type(generator).penalty_gradient
    if method not in (Generic.penalty_gradient, ECCo.penalty_gradient) or \
            not all(type(getattr(generator, name, None)) in (int, float) for name in ("lambda_cost", "lr")):
        return None
    if method is Generic.penalty_gradient:
        return 0
    return 1 if all(type(term) in (int, float) for term in generator.energy_gradient(0, max(max_steps, 1))) else None


def _per_feature(values: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor | None | bool:
    """``values`` (bounds or a mutability mask) as one contiguous value per feature of rows shaped ``shape``;
    ``False`` where they are not per feature (per row, another dtype)."""
    if values is None:
        return None
    if values.dtype != dtype or values.device.type != "cpu":
        return False
    try:
        return values.expand(shape).contiguous()
    except RuntimeError:
        return False


def _codes(limits, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor | None | bool:
    """The mutability code of each feature (native_search.c: both 0, increase 1, decrease 2, none 3), as integers as
    wide as values of ``dtype`` (so that the step's loops vectorise)."""
    masks = [(code, _per_feature(mask, shape, torch.bool)) for code, mask in
             ((1, limits.increase), (2, limits.decrease), (3, limits.none))]
    if any(mask is False for _, mask in masks):
        return False
    if all(mask is None for _, mask in masks):
        return None
    codes = torch.zeros(shape, dtype=BITS[dtype])
    for code, mask in masks:
        if mask is not None:
            codes[mask] = code
    return codes


def native_search(space, x: torch.Tensor, target: torch.Tensor, tau: float, max_steps: int,
                  epsilon: float) -> SearchResult | None:
    """``_search_packed(space, ...)`` with the loop's own work in native code, or ``None`` where that does not apply
    (no library, not a closed-form feature-space search of the library's generators on a CPU, bounds or mutability
    per row, a dtype other than float32/float64, targets other than one int64 per row): the caller then runs the
    PyTorch loop."""
    from ct_lightning.generators.search import FeatureSpace  # noqa: PLC0415 - it imports this module

    lib = library()
    generator = getattr(space, "generator", None)
    if lib is None or type(space) is not FeatureSpace or space.passes is None or x.device.type != "cpu" \
            or x.dtype not in SUFFIX or type(tau) not in (int, float) or x.dim() < 2 or len(x) == 0 \
            or target.dtype != torch.long or target.shape != (len(x),):
        return None
    energy = _own_closed_form(generator, max_steps)
    if energy is None:
        return None
    limits, features = space.limits, x.shape[1:]
    lower, upper = _per_feature(limits.lower, features, x.dtype), _per_feature(limits.upper, features, x.dtype)
    codes = _codes(limits, features, x.dtype)
    if lower is False or upper is False or codes is False:
        return None
    # Unbounded: infinite bounds; no mutability: every feature `both` (native_search.c: the same values).
    lower = torch.full(features, -math.inf, dtype=x.dtype) if lower is None else lower
    upper = torch.full(features, math.inf, dtype=x.dtype) if upper is None else upper
    codes = torch.zeros(features, dtype=BITS[x.dtype]) if codes is None else codes
    return _run(lib, space, x.contiguous(), target.contiguous(), float(tau), max_steps, epsilon, lower, upper, codes,
                energy)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _run(lib, space, x, target, tau, max_steps, epsilon, lower, upper, codes, energy) -> SearchResult:
    """The loop (see :func:`native_search`); ``lower``, ``upper``, ``codes``: one value per feature; ``energy``: the
    penalty's gradient at the target's logit (:func:`_own_closed_form`)."""
    from ct_lightning.generators.search import class_probabilities, target_reached  # noqa: PLC0415

    n, generator, limits, passes = len(x), space.generator, space.limits, space.passes
    suffix = SUFFIX[x.dtype]
    iteration, finish = getattr(lib, f"search_iteration_{suffix}"), getattr(lib, f"search_finish_{suffix}")
    logit_gradient = getattr(lib, f"search_logits_{suffix}")
    x_cf, nascent = x.clone(), x.clone()
    nascent_steps = torch.zeros(n, dtype=torch.long)
    steps = torch.full((n,), max_steps, dtype=torch.long)
    converged = torch.zeros(n, dtype=torch.bool)
    # Packed in place as rows freeze; the factuals only where snapping reads them (the C reads the pool's).
    rows_x, targets = x.clone() if limits.snaps else None, target.clone()
    active = torch.arange(n)
    searching = torch.ones(n, dtype=torch.uint8)
    was_inside = torch.zeros(n, dtype=torch.uint8)
    done_rows = torch.zeros(n, dtype=torch.uint8)  # the packed rows' τ-convergence, written each iteration
    distance = torch.zeros(n, dtype=BITS[x.dtype])
    rows_buffer = x.clone()  # the packed rows, stepped in place
    scratch = torch.empty(x[0].numel(), dtype=x.dtype)  # one row's next point
    state = _Search(n, x[0].numel(), n, n, float(generator.lr), float(epsilon), REPACK_SHARE, *map(_pointer, (
        x, rows_x, targets, active, searching, was_inside, distance, scratch, x_cf, nascent, nascent_steps, steps,
        converged, lower, upper, codes)))
    handle = ctypes.byref(state)
    m, previous = n, None
    rows, rows_x_in, target_in = rows_buffer, x, targets
    for step in range(max_steps + 1):
        points = limits.snap(rows, rows_x_in) if limits.snaps else rows
        if step == max_steps:  # convergence check only: no gradient, no step
            with torch.no_grad():
                done = target_reached(space.model(points), target_in, tau)
            finish(handle, rows.data_ptr(), points.data_ptr(), _pointer(previous), done.data_ptr(), step)
            break
        logits, saved = passes.forward(points)
        logits = logits.detach()
        # search.py's _logit_gradient: the probabilities and the penalty's gradient in PyTorch, the rest natively.
        probs = class_probabilities(logits)
        if step == 0:  # torch's own check of the classes: one out of range is its error, not a write out of bounds
            probs.gather(1, target_in[:, None])
        scale, slope = generator.energy_gradient(step, max_steps) if energy else (0.0, 0.0)
        logit_gradient(handle, probs.data_ptr(), probs.stride(0), probs.stride(1), logits.data_ptr(), logits.stride(0),
                       logits.stride(1), energy, scale, slope, done_rows.data_ptr(), tau)
        grad = passes.input_gradient(saved, probs).contiguous()
        left = iteration(handle, rows.data_ptr(), points.data_ptr(), _pointer(previous), grad.data_ptr(),
                         done_rows.data_ptr(), step, generator.lambda_cost)
        if left < 0:
            break
        # The step found the rows leaving the ε-ball where the points are the rows; else the next call compares.
        previous = None if points is rows else points
        if left != m:  # the packing dropped frozen rows: the first `left` rows of each packed buffer hold the rest
            m, previous = left, None if previous is None else previous[:left]
            rows, rows_x_in, target_in = rows_buffer[:m], rows_x[:m] if limits.snaps else x, targets[:m]
    return SearchResult(x_cf, nascent, converged, steps, nascent_steps)
