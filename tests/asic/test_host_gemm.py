"""Every exact host kernel gives the golden model's bits: the DUT's numbers do not depend on
which one this host picks (``$ASIC_HOST_GEMM``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from asic_backend import host_gemm, numerics
from asic_backend.conv import ConvGeometry, conv_i32
from tests.asic import golden
from tests.asic.test_numerics import OVERFLOW, GemmCase, gemm_case, run_linear_i32

KERNELS = pytest.mark.parametrize("name", host_gemm.KERNELS)


@KERNELS
@settings(max_examples=40, deadline=None)
@given(case=gemm_case(), overflow=OVERFLOW)
def test_linear_i32_equals_golden_with_each_kernel(
    name: str, case: GemmCase, overflow: numerics.AccOverflow
) -> None:
    with host_gemm.forced(name):
        assert run_linear_i32(case, overflow).tolist() == case.golden(overflow)


@KERNELS
@pytest.mark.parametrize(
    "k", [1, 2, host_gemm.FLOAT32_SLICE, host_gemm.FLOAT32_SLICE + 1, 3000, numerics.INT_MM_MAX_K]
)
def test_extreme_values_at_and_above_the_float32_slice(name: str, k: int) -> None:
    """-128 · -128 everywhere is the largest sum: K · 2^14, which float32 alone cannot hold
    above a slice of 1024 (2^24), and a mix that cancels to small values."""
    a = torch.full((3, k), -128, dtype=torch.int8)
    a[1] = 127
    a[2, ::2] = 127
    w = torch.full((2, k), -128, dtype=torch.int8)
    w[1, 1::2] = 1
    expected = a.long() @ w.long().t()
    with host_gemm.forced(name):
        out = numerics.linear_i32(a, w)
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), expected)


@KERNELS
def test_batched_and_conv_products_use_each_kernel_exactly(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (3, 5, 40), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (3, 7, 40), dtype=torch.int8, generator=gen)
    x = torch.randint(-128, 128, (2, 3, 6, 6), dtype=torch.int8, generator=gen)
    f = torch.randint(-128, 128, (4, 3, 3, 3), dtype=torch.int8, generator=gen)
    geo = ConvGeometry.of(x.shape, f.shape, stride=1, padding=1, dilation=1, groups=1)
    with host_gemm.forced(name):
        batched = numerics.bmm_i32(a, w)
        conv = conv_i32(x, f, geo, a_zp=3)
    assert torch.equal(batched.long(), a.long() @ w.long().transpose(1, 2))
    want = golden.conv_i32(x.tolist(), f.tolist(), [1, 1], [(1, 1), (1, 1)], [1, 1], 1, a_zp=3)
    assert conv.tolist() == want


def test_the_kernel_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in host_gemm.KERNELS:
        monkeypatch.setenv(host_gemm.ENV_VAR, name)
        assert host_gemm.kernel() == name
    monkeypatch.setenv(host_gemm.ENV_VAR, "auto")
    assert host_gemm.kernel() == ("int_mm" if host_gemm.has_int8_unit() else "float32")
    monkeypatch.setenv(host_gemm.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=r"\$ASIC_HOST_GEMM='fast' is not one of int_mm, "):
        host_gemm.kernel()
    with (
        pytest.raises(ValueError, match="unknown host GEMM kernel 'fast'"),
        host_gemm.forced("fast"),
    ):
        pass
