"""Keep the C allocator from returning large freed blocks to the OS between the search's steps.

A counterfactual search allocates several pool-sized tensors per step (an MNIST pool of 5 000 rows is
15 MB each). glibc serves blocks that large with ``mmap`` and unmaps them when freed, so every step
pays the kernel's page faults again for memory it just gave back: 20 000–130 000 faults per CT epoch on
MNIST, and 10–14 % of its CPU time (docs/performance.md). :func:`keep_freed_memory` raises glibc's mmap threshold to
its maximum (32 MiB) and its trim threshold to 1 GiB, so those blocks come from, and go back to, the
heap. The process then holds on to up to 1 GiB of freed memory instead of returning it at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit systems
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as described in the module docstring, once per process; ``False`` where there is no
    glibc (other systems and C libraries keep their own policy)."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):
                return False
            _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
                bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _applied
