"""Which exact host kernel computes the DUT's int8 × int8 → int32 products.

The simulated DUT's numbers do not depend on how the host computes them, only that it does so
exactly. Three kernels are exact for every reduction length the int32 fast path takes
(``K <= INT_MM_MAX_K``):

- ``int_mm``: ``torch._int_mm``, fast where the CPU has an int8 dot-product unit (AVX-512 VNNI,
  AVX-VNNI, AMX), and 10-20x slower than a float GEMM where it has not (AVX2 alone);
- ``float32``: float32 GEMMs over slices of at most :data:`FLOAT32_SLICE` of K, summed in
  int32: every product of two int8 values is at most 2^14 in magnitude, so each slice's partial
  sums are integers of at most 2^24, which float32 holds exactly, in any summation order;
- ``float64``: one float64 GEMM, exact while K·2^14 < 2^53.

:func:`kernel` picks one: ``$ASIC_HOST_GEMM`` (``int_mm``, ``float32``, ``float64`` or
``auto``), else ``auto``: ``int_mm`` on a CPU with an int8 dot-product unit, ``float32``
otherwise. The CPU is read once per process; the variable on each use (a dictionary lookup),
so a test or a benchmark can set it. :func:`mm_i32` is the product every DUT GEMM goes through.

>>> kernel()                                  # on an AVX2-only host
'float32'
>>> mm_i32(a_q, w_q).dtype                    # a_q int8 [M, K], w_q int8 [N, K]
torch.int32
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch

__all__ = ["ENV_VAR", "FLOAT32_SLICE", "KERNELS", "describe", "forced", "kernel", "mm_i32"]

#: The kernels, by name.
KERNELS: tuple[str, ...] = ("int_mm", "float32", "float64")
#: The environment variable that forces one (or ``auto``).
ENV_VAR = "ASIC_HOST_GEMM"
#: The longest slice of K one float32 GEMM reduces: 1024 · 2^14 = 2^24, float32's last exact
#: integer step.
FLOAT32_SLICE = 1024
#: CPU flags of an int8 dot-product unit (Linux ``/proc/cpuinfo`` names).
_INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")

_forced: list[str] = []


def kernel() -> str:
    """The kernel this process uses (see the module docstring); a bad ``$ASIC_HOST_GEMM`` is
    a ``ValueError`` naming the allowed values."""
    if _forced:
        return _forced[-1]
    return _from_env(os.environ.get(ENV_VAR, "auto").strip().lower() or "auto")


@functools.cache
def _from_env(value: str) -> str:
    if value == "auto":
        return "int_mm" if has_int8_unit() else "float32"
    if value not in KERNELS:
        raise ValueError(f"${ENV_VAR}={value!r} is not one of {', '.join((*KERNELS, 'auto'))}")
    return value


def describe() -> str:
    """One line for report headers: the kernel and why it was chosen."""
    name = kernel()
    if _forced:
        return f"{name} (forced)"
    spec = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if spec != "auto":
        return f"{name} (${ENV_VAR}={spec})"
    unit = "an int8 dot-product unit" if has_int8_unit() else "no int8 dot-product unit"
    return f"{name} (auto: {unit} on this CPU)"


@functools.cache
def has_int8_unit() -> bool:
    """Whether this CPU has an int8 dot-product unit ``torch._int_mm``'s kernels use."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    if flags:
        return any(flag in flags for flag in _INT8_FLAGS)
    # No cpuinfo (not Linux): torch's own reading; AVX-512 there usually comes with VNNI.
    capability = str(torch.backends.cpu.get_cpu_capability()).upper()
    return "AVX512" in capability or "AMX" in capability


@contextlib.contextmanager
def forced(name: str) -> Iterator[None]:
    """Use kernel ``name`` in the block (tests run the numerics under each one)."""
    if name not in KERNELS:
        raise ValueError(f"unknown host GEMM kernel {name!r}; known: {', '.join(KERNELS)}")
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()


def mm_i32(
    a_q: torch.Tensor, w_q: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``a_q [M, K] · w_q [N, K]ᵀ`` of int8 operands as int32 ``[M, N]``, exactly.

    The caller guarantees ``K <= INT_MM_MAX_K`` (no int32 overflow) and, for ``int_mm``,
    operands ``torch._int_mm`` reads right (see :func:`asic_backend.numerics.int_mm_applies`).
    """
    name = kernel()
    if name == "int_mm":
        return (
            torch._int_mm(a_q, w_q.t(), out=out) if out is not None else torch._int_mm(a_q, w_q.t())
        )
    if name == "float64":
        result = (a_q.double() @ w_q.double().t()).to(torch.int32)
    else:
        result = _float32_sliced(a_q, w_q)
    if out is None:
        return result
    return out.copy_(result)


def _float32_sliced(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    k = a_q.shape[1]
    a, w = a_q.float(), w_q.float()
    if k <= FLOAT32_SLICE:
        return (a @ w.t()).to(torch.int32)
    acc: torch.Tensor | None = None
    for start in range(0, k, FLOAT32_SLICE):
        part = (a[:, start : start + FLOAT32_SLICE] @ w[:, start : start + FLOAT32_SLICE].t()).to(
            torch.int32
        )
        acc = part if acc is None else acc.add_(part)
    assert acc is not None
    return acc
