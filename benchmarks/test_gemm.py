"""The simulated int8 GEMM against the host's native int8 GEMM and fp32 GEMM, one table per shape.

    .venv/bin/pytest benchmarks/test_gemm.py --benchmark-only --benchmark-columns=min,median,mean
    .venv/bin/pytest benchmarks/test_gemm.py --benchmark-disable      # as plain tests

Every row of a group computes the same [M,K]·[N,K]ᵀ product, so the bracketed ratios in a group
(relative to its fastest row, normally ``torch._int_mm``) are the simulator's overhead. Target:
``run_mm_i32`` and ``asic::mm_i32`` within 1.2x of ``int_mm``. Each test first checks its result,
so a fast wrong kernel fails.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import asic_backend.ops.primitives  # noqa: F401  (registers torch.ops.asic.*)
from asic_backend.sim.device import get_device, run_mm_i32
from benchmarks.conftest import smoke_rows

SHAPES = [(1024, 1024, 1024), (256, 4096, 4096)]  # M, K, N
DEVICE = get_device("default")


def operands(m: int, k: int, n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    return {
        "a": a,
        "w": w,
        "w_kn": w.t().contiguous(),  # [K, N] packed: _int_mm's other natural layout
        "a_f": a.float(),
        "w_f": w.float(),
        "zp_rows": torch.randint(-128, 128, (m, 1), dtype=torch.int32, generator=g),
        "zp_none": torch.zeros((), dtype=torch.int32),
        "bias": torch.randint(-(2**20), 2**20, (n,), dtype=torch.int32, generator=g),
    }


VARIANTS: dict[str, Callable[[dict[str, torch.Tensor]], torch.Tensor]] = {
    # The host's native int8 GEMM on the simulator's operands (weights [N, K], viewed as [K, N]).
    "int_mm": lambda t: torch._int_mm(t["a"], t["w"].t()),
    "int_mm[w packed KxN]": lambda t: torch._int_mm(t["a"], t["w_kn"]),
    "fp32 mm": lambda t: torch.mm(t["a_f"], t["w_f"].t()),
    "sim run_mm_i32": lambda t: run_mm_i32(t["a"], t["w"], device=DEVICE),
    "sim run_mm_i32 +zp/row +bias": lambda t: run_mm_i32(
        t["a"], t["w"], a_zp=t["zp_rows"], bias_i32=t["bias"], device=DEVICE
    ),
    "sim op asic::mm_i32": lambda t: torch.ops.asic.mm_i32(
        t["a"], t["w"], None, t["zp_none"], DEVICE.key
    ),
}


def reference(t: dict[str, torch.Tensor], variant: str) -> torch.Tensor:
    exact = t["a"].double() @ t["w"].double().t()
    if "+zp" in variant:
        exact = (t["a"].double() - t["zp_rows"].double()) @ t["w"].double().t() + t["bias"].double()
    return exact


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm(benchmark, shape: tuple[int, int, int], variant: str) -> None:  # type: ignore[no-untyped-def]
    m, k, n = shape
    if variant.startswith("int_mm"):  # raw torch._int_mm: slow where the CPU has no int8 unit
        m = smoke_rows(m, benchmark.disabled)
    t = operands(m, k, n)
    fn = VARIANTS[variant]
    out, ref = fn(t).double(), reference(t, variant)
    if variant.startswith("fp32"):
        assert torch.allclose(out, ref, rtol=1e-6, atol=0)  # fp32 need not be exact at large K
    else:
        assert torch.equal(out, ref)  # exact: every |sum| here is below 2^31 (and 2^53)
    benchmark.group = "gemm MxKxN=" + "x".join(map(str, shape))
    benchmark.name = variant
    DEVICE.reset()
    benchmark(fn, t)
    if variant.startswith("sim"):
        cost = DEVICE.last_costs[-1]
        benchmark.extra_info.update(
            sim_cycles=cost.cycles,
            sim_utilization=round(cost.utilization, 4),
            sim_bound=cost.bound,
            sim_time_s=cost.roofline_time_s,
        )
