"""What the project's native GEMM kernels (:mod:`asic_backend.sim.int16_gemm`,
:mod:`asic_backend.sim.amx_gemm`) share: the checks of their operands, the accumulator a call
writes into, and how many threads it takes.

>>> into = accumulator(None, 2, 3)           # a new int32 [2, 3]: no out given
>>> finished(None, into) is into
True
"""

from __future__ import annotations

import torch

__all__ = [
    "PARALLEL_MIN_MACS",
    "accumulator",
    "check_int8",
    "check_product",
    "finished",
    "gemm_threads",
]

#: From this much work on (multiply-adds, or values packed), a call shares it among torch's
#: threads.
PARALLEL_MIN_MACS = 1 << 18


def check_int8(kernel: str, name: str, t: torch.Tensor) -> None:
    """A ``ValueError`` unless ``t`` (kernel ``kernel``'s ``name``) is a 2-D int8 CPU tensor."""
    if t.dtype != torch.int8 or t.dim() != 2 or t.device.type != "cpu":
        raise ValueError(
            f"asic: the {kernel} kernel takes {name} as a 2-D int8 CPU tensor, "
            f"got {t.dtype} {list(t.shape)} on {t.device}"
        )


def check_product(kernel: str, a_q: torch.Tensor, n: int, k: int, out: torch.Tensor | None) -> None:
    """A ``ValueError`` unless int8 activations ``a_q [M, k]`` multiply a packed ``[n, k]``
    into ``out`` (int32 ``[M, n]``, or None)."""
    check_int8(kernel, "activations", a_q)
    m, a_k = a_q.shape
    if a_k != k:
        raise ValueError(f"asic: {kernel} GEMM of [{m}, {a_k}] by a packed [{n}, {k}]")
    if out is not None and (out.dtype != torch.int32 or tuple(out.shape) != (m, n)):
        raise ValueError(
            f"asic: {kernel} GEMM into {out.dtype} {list(out.shape)}, not int32 [{m}, {n}]"
        )


def accumulator(out: torch.Tensor | None, m: int, n: int) -> torch.Tensor:
    """Where a kernel writes its ``[m, n]`` product: ``out`` itself where the kernel can (rows of
    unit stride, none over another), else a new int32 tensor (:func:`finished` copies it)."""
    if out is not None and out.stride(-1) == 1 and (m < 2 or out.stride(0) >= n):
        return out
    return torch.empty((m, n), dtype=torch.int32)


def finished(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """The call's product: ``result`` copied into ``out`` where the kernel could not write
    there itself."""
    if out is not None and result is not out:
        return out.copy_(result)
    return result


def gemm_threads(macs: int) -> int:
    """The threads a GEMM of ``macs`` multiply-adds (or a packing of as many values) shares."""
    return torch.get_num_threads() if macs >= PARALLEL_MIN_MACS else 1
