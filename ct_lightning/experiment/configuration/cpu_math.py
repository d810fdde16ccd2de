"""Which CPU kernels torch uses: the machine's fastest (``native``) or the same on every x86 CPU (``portable``).

torch picks its vectorised ATen kernels (AVX-512, AVX2, scalar) and MKL its BLAS code path from the CPU it runs
on, and different kernels add floating-point numbers in different orders. On one machine a run is bit-for-bit
repeatable; across machines (issue 24: an Intel and an AMD VM) the last bits differ, training amplifies them,
and a Table 1 cell can move by several points. ``portable`` pins both choices: ATen's scalar kernels
(``ATEN_CPU_CAPABILITY=default``, which torch.compile's C++ code generation follows too) and MKL's Conditional
Numerical Reproducibility (``MKL_CBWR=COMPATIBLE``). Both are read when torch and MKL start, so the choice must be
made before ``import torch``: the recipes call :func:`apply_cpu_math` first, and :func:`check_cpu_math` refuses a
``portable`` training in a process whose torch already runs native kernels.
"""

from __future__ import annotations

import os
import sys

CPU_MATH = ("native", "portable")
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def apply_cpu_math(mode: str) -> str:
    """Set the environment for ``mode`` (before torch is imported); return the start-up line saying so."""
    if mode not in CPU_MATH:
        raise ValueError(f"cpu_math: unknown {mode!r}; allowed: {', '.join(CPU_MATH)}")
    if mode == "portable":
        os.environ.update(PORTABLE_ENV)
        check_cpu_math(mode)
        return "CPU math: portable (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE: the same arithmetic on any x86 CPU)"
    return "CPU math: native (the CPU's fastest kernels; --cpu-math portable for results independent of the CPU)"


def check_cpu_math(mode: str) -> None:
    """Raise ``RuntimeError`` when ``mode`` is ``portable`` but this process's torch or environment is not."""
    if mode != "portable":
        return
    wrong = {k: os.environ.get(k) for k, v in PORTABLE_ENV.items() if os.environ.get(k, "").lower() != v.lower()}
    if "torch" in sys.modules:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
        if capability != "DEFAULT":
            wrong["torch CPU capability"] = capability
    if wrong:
        raise RuntimeError(f"cpu_math: portable needs {PORTABLE_ENV} set before torch is imported; this process has "
                           f"{wrong} (start it with --cpu-math portable or with those variables in its environment)")


def cpu_math_state() -> dict[str, str]:
    """What this process computes with: torch's CPU capability, MKL_CBWR and the CPU model (for run tags)."""
    import platform

    import torch

    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""), "cpu_model": model}
