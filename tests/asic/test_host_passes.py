"""The fused native host passes (``asic_backend.sim.host_passes``): bit for bit the golden
model's float32 steps and the aten kernels', where they apply; the aten kernels elsewhere; the
build, its cache and its failures, each with one clear line."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from asic_backend.ops.linear import F32_EPS, quantize_sym_rows
from asic_backend.sim import amx_gemm, host_passes, int16_gemm, numerics
from tests.amx import needs_amx
from tests.asic import golden

MODES = pytest.mark.parametrize("mode", host_passes.MODES)


@pytest.fixture(autouse=True)
def _native_built() -> None:
    # The machines this suite runs on have a C compiler (Inductor needs one too): a build that
    # fails here is a defect, not a reason to test the aten kernels twice.
    assert host_passes.mode() == "native", host_passes.describe()


def _both(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``fn`` under the native passes and under the aten kernels, each on fresh copies."""
    results = []
    for mode in ("native", "aten"):
        fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with host_passes.forced(mode):
            results.append(fn(*fresh, **kwargs))
    return results


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` in the block (the fused passes share rows
    among them past PARALLEL_MIN_NUMEL)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _golden_quantized(x: torch.Tensor) -> tuple[list[list[int]], list[float]]:
    rows = [golden.quantize_sym_row(row, F32_EPS) for row in x.tolist()]
    return [q for q, _ in rows], [s for _, s in rows]


# -- quantization ------------------------------------------------------------------------------

_FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 9),
    k=st.integers(2, 70),
    data=st.data(),
)
def test_quantization_is_the_golden_model(rows: int, k: int, data: st.DataObject) -> None:
    """Any float32 values, from subnormals to 3e38, rounded half to even at every tie."""
    magnitude = data.draw(st.sampled_from([1e-40, 1e-30, 1e-3, 1.0, 1e5, 1e30, 3e38]))
    values = data.draw(st.lists(_FLOAT32, min_size=rows * k, max_size=rows * k))
    x = torch.tensor(values, dtype=torch.float32).reshape(rows, k)
    x = (x / max(1.0, float(x.abs().max())) * magnitude).nan_to_num(posinf=3e38, neginf=-3e38)
    with host_passes.forced("native"):
        q, scale = quantize_sym_rows(x)
    want_q, want_scale = _golden_quantized(x)
    assert q.tolist() == want_q
    assert scale.reshape(-1).tolist() == want_scale


@pytest.mark.parametrize(
    "case",
    ["ties", "zeros", "negative zeros", "subnormal", "largest", "one large value", "wide"],
)
def test_quantization_edge_values_are_the_golden_model(case: str) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 40, generator=g)
    if case == "ties":  # every x · (1/scale) a half: 127.5 fixes the scale at 1
        x = torch.arange(-127.5, 128.0, 1.0)[: 5 * 40].reshape(5, 40).clone()
        x[:, 0] = 127.5
    elif case == "zeros":
        x[2] = 0.0
    elif case == "negative zeros":
        x[:] = -0.0
    elif case == "subnormal":
        x = x * 1e-42
    elif case == "largest":
        x[1, 3] = torch.finfo(torch.float32).max
        x[4, 0] = -torch.finfo(torch.float32).max
    elif case == "one large value":
        x[0, 17] = 1e6
    else:  # rows of 70,000 values: parallel, and wider than any vector
        x = torch.randn(3, 70_000, generator=g)
    with host_passes.forced("native"):
        q, scale = quantize_sym_rows(x)
    want_q, want_scale = _golden_quantized(x)
    assert q.tolist() == want_q
    assert scale.reshape(-1).tolist() == want_scale


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("form", ["int8", "float32 out", "strided rows"])
def test_quantization_equals_the_aten_kernels(form: str, threads: int) -> None:
    """Past :data:`PARALLEL_MIN_NUMEL` with threads to share the rows; into the float32 kernel's
    ``out``; rows read from a wider tensor."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(300, 500, generator=g) * 3
    x = wide[:, :400] if form == "strided rows" else wide[:, :400].contiguous()
    assert x.numel() >= host_passes.PARALLEL_MIN_NUMEL

    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty(x.shape) if form == "float32 out" else None
        q, scale = quantize_sym_rows(x, out=out)
        assert q is out or out is None
        return q, scale

    with torch_threads(threads):
        (q_native, s_native), (q_aten, s_aten) = _both(quantize, x)
    assert q_native.dtype == (torch.float32 if form == "float32 out" else torch.int8)
    assert torch.equal(_bits(q_native), _bits(q_aten))  # the float32 zeros' signs too
    assert torch.equal(s_native, s_aten)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def test_float32_quantization_keeps_the_sign_of_zero() -> None:
    """torch.round gives -0.0 for -0.25; the float32 kernel's GEMM reads the quantized values
    as they are, so the native pass gives -0.0 too."""
    x = torch.tensor([[127.5, -0.25, -0.0, 0.25, -0.5, 0.5, -1e-30, -127.5]])
    (q_native, _), (q_aten, _) = _both(lambda t: quantize_sym_rows(t, out=torch.empty(t.shape)), x)
    assert q_aten[0, 1].item() == 0.0
    assert str(q_aten[0, 1].item()) == "-0.0"
    assert torch.equal(_bits(q_native), _bits(q_aten))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap's fallback
@pytest.mark.parametrize("wrapper", ["functionalize", "vmap", "jit.trace"])
def test_wrapped_tensors_take_the_aten_kernels(wrapper: str) -> None:
    """A wrapper's tensor is a plain ``torch.Tensor`` to ``type()``: functionalization's has no
    data of its own (its pointer is null), vmap's no storage, and a JIT trace records the aten
    ops it sees (a fused loop would leave constants in the traced graph)."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 30, generator=g)
    later = torch.randn(4, 30, generator=g) * 5

    def scales(t: torch.Tensor) -> torch.Tensor:
        return quantize_sym_rows(t)[1]

    with host_passes.forced("native"):
        if wrapper == "functionalize":
            got = torch.func.functionalize(scales)(later)
        elif wrapper == "vmap":
            got = torch.vmap(lambda row: scales(row.unsqueeze(0)))(later)
        else:
            got = torch.jit.trace(scales, x)(later)
    with host_passes.forced("aten"):
        want = scales(later)
    assert torch.equal(got.reshape(want.shape), want)


def test_rescale_aliases_its_accumulator_exactly_where_the_aten_kernels_do() -> None:
    """Small or large, int32 or float32: not consumed, where the aten kernels would; consumed
    (the caller's to give up), always, where the aten kernels may not."""
    shapes = [(3, 64), (3000, 64), (2, 3, 64), (4, 800, 64)]  # and batches of matrices
    for shape, dtype, consume in itertools.product(
        shapes, (torch.int32, torch.float32), (False, True)
    ):
        acc = torch.randint(-1000, 1000, shape, dtype=torch.int32).to(dtype)
        a = torch.rand(*shape[:-1], 1)
        b = torch.rand(64) if len(shape) == 2 else torch.rand(shape[0], 1, 64)
        aliased = []
        for mode in host_passes.MODES:
            work = acc.clone()
            with host_passes.forced(mode):
                y = numerics.scale_acc(work, a, b, consume=consume)
            aliased.append(y.data_ptr() == work.data_ptr())
        native, aten = aliased
        assert native == (consume or aten), (shape, dtype, consume)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_row_holding_inf_or_nan_takes_the_aten_kernels(bad: float) -> None:
    """Its values are whatever the aten kernels make of it (NaN scales), not new ones."""
    x = torch.randn(4, 30)
    x[2, 5] = bad
    assert host_passes.quantize_sym(x, F32_EPS) is None
    (q_native, s_native), (q_aten, s_aten) = _both(quantize_sym_rows, x)
    assert torch.equal(q_native, q_aten)
    torch.testing.assert_close(s_native, s_aten, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("form", ["rows", "columns", "int16 linear"])
def test_a_zero_scale_quantizes_a_zero_row_to_zeros(form: str) -> None:
    """With ``eps`` 0 a zero row's scale is 0 and its reciprocal inf: no bound on
    ``x * recip`` (0 · inf is NaN), so the loops' integer clamp, which needs one, is not used
    (it would give -128 where the float steps give 0)."""
    x = torch.zeros(2, 70)
    if form == "rows":
        result = host_passes.quantize_sym(x, 0.0)
        assert result is not None
        assert torch.equal(result[0], torch.zeros(2, 70, dtype=torch.int8))
    elif form == "columns":
        result = host_passes.quantize_sym_cols(x.reshape(1, 70, 2), 0.0)
        assert result is not None
        assert torch.equal(result[0], torch.zeros(1, 70, 2, dtype=torch.int8))
    else:
        if not int16_gemm.available():
            pytest.skip(int16_gemm.unavailable_reason())
        w_q = torch.ones(3, 70, dtype=torch.int8)
        packed = int16_gemm.pack(w_q)
        gemm = host_passes.NativeGemm("int16", packed.data, 3, 70, 1, lambda: None)
        y = host_passes.linear(x, None, 0.0, lambda: (torch.ones(3), gemm))
        assert y is not None  # -0.0 where -128s would have made a negative accumulator
        assert torch.equal(y, torch.zeros(2, 3))
        assert not torch.signbit(y).any()


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(4, 30, dtype=torch.bfloat16),
        torch.randn(2, 4, 30),
        torch.randn(4, 1),
        torch.randn(30, 4).t(),
        torch.randn(0, 30),
    ],
    ids=["bfloat16", "3-D", "one value a row", "column-major", "no rows"],
)
def test_what_the_fused_quantization_does_not_take(x: torch.Tensor) -> None:
    assert host_passes.quantize_sym(x, F32_EPS) is None


def test_a_tracer_sees_the_aten_kernels() -> None:
    """Under a dispatch mode (make_fx, a flop counter), the fused loop would be invisible."""

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as record:
        q, _ = quantize_sym_rows(torch.randn(4, 30))
    assert q.dtype == torch.int8
    assert "aten.round_.default" in record.ops


def test_fake_tensors_take_the_aten_kernels() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, scale = quantize_sym_rows(torch.empty(4, 30))
    assert (q.shape, scale.shape) == ((4, 30), (4, 1))


# -- quantization by columns (a matmul's right operand) ----------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    batch=st.integers(1, 3),
    k=st.integers(2, 40),
    n=st.integers(1, 9),
    data=st.data(),
)
def test_quantization_by_columns_is_the_golden_model(
    batch: int, k: int, n: int, data: st.DataObject
) -> None:
    """Each column of each matrix as the golden model quantizes a row, any float32 values."""
    magnitude = data.draw(st.sampled_from([1e-40, 1e-3, 1.0, 1e30, 3e38]))
    values = data.draw(st.lists(_FLOAT32, min_size=batch * k * n, max_size=batch * k * n))
    x = torch.tensor(values, dtype=torch.float32).reshape(batch, k, n)
    x = (x / max(1.0, float(x.abs().max())) * magnitude).nan_to_num(posinf=3e38, neginf=-3e38)
    with host_passes.forced("native"):
        fused = host_passes.quantize_sym_cols(x, F32_EPS)
    assert fused is not None
    q, scale = fused
    assert (q.shape, scale.shape) == ((batch, k, n), (batch, 1, n))
    for b in range(batch):
        want_q, want_scale = _golden_quantized(x[b].t())
        assert q[b].t().tolist() == want_q
        assert scale[b, 0].tolist() == want_scale


@pytest.mark.parametrize("threads", [1, 2])
def test_quantization_by_columns_equals_the_aten_kernels_on_the_transposed_rows(
    threads: int,
) -> None:
    """The values ``quantize_sym_rows`` gives the transposed copy, past PARALLEL_MIN_NUMEL."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 300, 70, generator=g) * torch.rand(6, 1, 70, generator=g) * 50
    x[2, :, 3] = 0.0  # a column of zeros: the scale floors at eps
    x[4, 7, 5] = x[4, 8, 5] = -x[4, :, 5].abs().max()  # its largest value twice, negative
    with torch_threads(threads):
        fused = host_passes.quantize_sym_cols(x, F32_EPS)
        with host_passes.forced("aten"):
            q_rows, scale_rows = quantize_sym_rows(x.transpose(1, 2).reshape(-1, 300))
    assert fused is not None
    q, scale = fused
    assert torch.equal(q.transpose(1, 2).reshape(-1, 300), q_rows)
    assert torch.equal(
        scale.reshape(-1).view(torch.int32), scale_rows.reshape(-1).view(torch.int32)
    )


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(3, 30, 4, dtype=torch.bfloat16),
        torch.randn(30, 4),
        torch.randn(3, 1, 4),
        torch.randn(3, 4, 30).mT,
        torch.randn(0, 30, 4),
        torch.randn(3, 30, 0),
    ],
    ids=["bfloat16", "2-D", "one value a column", "transposed", "no matrices", "no columns"],
)
def test_what_the_quantization_by_columns_does_not_take(x: torch.Tensor) -> None:
    assert host_passes.quantize_sym_cols(x, F32_EPS) is None


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_column_holding_inf_or_nan_takes_the_aten_kernels(bad: float) -> None:
    x = torch.randn(2, 30, 4)
    x[1, 5, 2] = bad
    assert host_passes.quantize_sym_cols(x, F32_EPS) is None


@pytest.mark.parametrize("kernel", ["int_mm", "float32"])
@pytest.mark.parametrize("right", ["row-major (V)", "a transposed view (Kᵀ)"])
def test_a_matmuls_right_operand_by_columns_gives_the_aten_kernels_values_and_counts(
    kernel: str, right: str
) -> None:
    """``dut_matmul`` with the right operand quantized where it lies: the bits and the device
    figures of the aten kernels' transposed copy."""
    from asic_backend.ops.linear import dut_matmul
    from asic_backend.sim import host_gemm
    from asic_backend.sim.device import get_device

    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 3, 5, 40, generator=g)
    b = torch.randn(2, 3, 40, 7, generator=g)
    if right != "row-major (V)":
        b = torch.randn(2, 3, 7, 40, generator=g).transpose(-2, -1)
    device = get_device()
    by_columns = []
    quantize_sym_cols = host_passes.quantize_sym_cols

    def spied(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        result = quantize_sym_cols(x, eps)
        by_columns.append(result is not None)
        return result

    runs = []
    with host_gemm.forced(kernel), pytest.MonkeyPatch.context() as patch:
        patch.setattr(host_passes, "quantize_sym_cols", spied)
        for mode in ("native", "aten"):
            device.reset()
            with host_passes.forced(mode):
                y = dut_matmul(a, b, "default", alpha=0.5)
            snap = device.snapshot()
            runs.append((y, (snap.dut_ops, snap.macs, snap.cycles, snap.bytes_moved)))
    # Only a row-major right operand is quantized where it lies, and only with native passes.
    assert by_columns == ([True, False] if right == "row-major (V)" else [])
    (native, native_figures), (aten, aten_figures) = runs
    assert torch.equal(native.view(torch.int32), aten.view(torch.int32))
    assert native_figures == aten_figures


# -- rescale -----------------------------------------------------------------------------------


def _assert_rescales_alike(
    acc: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    consume: bool,
    threads: int,
) -> None:
    """``scale_acc`` native and aten: the same bits, in the accumulator's memory if consumed."""
    results = []
    with torch_threads(threads):
        for mode in ("native", "aten"):
            work = acc.clone()
            with host_passes.forced(mode):
                y = numerics.scale_acc(work, a, b, bias=bias, consume=consume)
            assert (y.data_ptr() == work.data_ptr()) == consume
            results.append(y)
    assert torch.equal(results[0].view(torch.int32), results[1].view(torch.int32))


@settings(max_examples=100, deadline=None)
@given(
    m=st.integers(1, 6),
    n=st.integers(1, 40),
    per_row=st.booleans(),
    per_column=st.booleans(),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_rescale_is_the_golden_model(
    m: int, n: int, per_row: bool, per_column: bool, with_bias: bool, seed: int
) -> None:
    """Any int32 accumulator, by scales per row or for all, per column or for all."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randint(-(2**31), 2**31 - 1, (m, n), dtype=torch.int32, generator=g)
    a = torch.rand(m if per_row else 1, 1, generator=g) * 1e-3
    b = torch.rand(n if per_column else 1, generator=g) * 1e-2
    bias = torch.randn(n, generator=g) if with_bias else None
    with host_passes.forced("native"):
        y = numerics.scale_acc(acc, a, b, bias=bias)
    b_row = b.tolist() * (1 if per_column else n)
    bias_row = None if bias is None else bias.tolist()
    want = [
        golden.scale_row(row, a[i if per_row else 0, 0].item(), b_row, bias_row)
        for i, row in enumerate(acc.tolist())
    ]
    assert y.tolist() == want


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("b_shape", ["[N]", "[1, N]", "[1]"])
@pytest.mark.parametrize("form", ["int32", "int32 consumed", "float32"])
def test_rescale_equals_the_aten_kernels_in_the_same_memory(
    form: str, b_shape: str, bias: bool, threads: int
) -> None:
    """A consumed int32 accumulator, and a float32 one, are scaled in their own memory."""
    g = torch.Generator().manual_seed(5)
    m, n = 300, 260  # past PARALLEL_MIN_NUMEL
    acc = torch.randint(-(2**24), 2**24, (m, n), dtype=torch.int32, generator=g)
    if form == "float32":
        acc = acc.to(torch.float32)
    a = torch.rand(m, 1, generator=g)
    b = torch.rand({"[N]": (n,), "[1, N]": (1, n), "[1]": (1,)}[b_shape], generator=g)
    c = torch.randn(n, generator=g) if bias else None
    _assert_rescales_alike(acc, a, b, c, consume=form != "int32", threads=threads)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 4),
    m=st.integers(1, 5),
    n=st.integers(1, 30),
    dtype=st.sampled_from([torch.int32, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_batch_of_matrices_rescale_is_the_golden_model(
    batch: int, m: int, n: int, dtype: torch.dtype, seed: int
) -> None:
    """Attention's scores: each matrix by its own rows' and its own columns' scales."""
    g = torch.Generator().manual_seed(seed)
    bound = 2**31 if dtype == torch.int32 else 2**24  # a float32 accumulator holds exact ints
    acc = torch.randint(-bound, bound - 1, (batch, m, n), dtype=torch.int32, generator=g)
    a = torch.rand(batch, m, 1, generator=g) * 1e-3
    b = torch.rand(batch, 1, n, generator=g) * 1e-2
    with host_passes.forced("native"):
        y = numerics.scale_acc(acc.to(dtype), a, b)
    want = [
        [
            golden.scale_row(row, a[i, r, 0].item(), b[i, 0].tolist(), None)
            for r, row in enumerate(rows)
        ]
        for i, rows in enumerate(acc.tolist())
    ]
    assert y.tolist() == want


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(6, 300, 260), (4, 1024, 600)], ids=["2 MB", "10 MB"])
@pytest.mark.parametrize("form", ["int32", "int32 consumed", "float32"])
def test_a_batch_of_matrices_rescale_equals_the_aten_kernels_in_the_same_memory(
    form: str, shape: tuple[int, int, int], threads: int
) -> None:
    """Below and past the size where the aten kernels go by chunks of rows; the same memory."""
    g = torch.Generator().manual_seed(7)
    batch, m, n = shape
    acc = torch.randint(-(2**24), 2**24, shape, dtype=torch.int32, generator=g)
    if form == "float32":
        acc = acc.to(torch.float32)
    a = torch.rand(batch, m, 1, generator=g)
    b = torch.rand(batch, 1, n, generator=g)
    _assert_rescales_alike(acc, a, b, None, consume=form != "int32", threads=threads)


@pytest.mark.parametrize(
    "args",
    [
        (
            torch.zeros(3, 4, dtype=torch.int32),
            torch.ones(3, 1, dtype=torch.bfloat16),
            torch.ones(4),
        ),
        (
            torch.zeros(3, 4, dtype=torch.int32),
            torch.ones(3, 1),
            torch.ones(4, dtype=torch.float16),
        ),
        (torch.zeros(3, 4, dtype=torch.int32).t(), torch.ones(4, 1), torch.ones(3)),
        (torch.zeros(3, 4, dtype=torch.int64), torch.ones(3, 1), torch.ones(4)),
        (torch.zeros(3, 4, dtype=torch.int32), torch.ones(2, 1), torch.ones(4)),
        (torch.zeros(3, 4, dtype=torch.int32), torch.ones(3, 1), torch.ones(3, 4)),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.ones(1), torch.ones(2, 1, 4)),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.ones(2, 3, 1), torch.ones(1, 1, 4)),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.ones(2, 3, 1), torch.ones(1)),
        (torch.zeros(2, 3, 4, dtype=torch.int32).mT, torch.ones(2, 4, 1), torch.ones(2, 1, 3)),
        (torch.zeros(2, 2, 3, 4, dtype=torch.int32), torch.ones(2, 2, 3, 1), torch.ones(4)),
    ],
    ids=[
        "bfloat16 row scales",
        "float16 column scales",
        "transposed",
        "int64",
        "2 row scales",
        "[M, N] scales",
        "batch: one row scale for all",
        "batch: one column scale a column for every matrix",
        "batch: one column scale for all",
        "batch: transposed",
        "4-D",
    ],
)
def test_what_the_fused_rescale_does_not_take(args: tuple[torch.Tensor, ...]) -> None:
    assert host_passes.scale_rows(*args, None, in_place=False) is None


def test_a_batch_of_matrices_with_a_bias_takes_the_aten_kernels() -> None:
    """No caller gives one (attention's scores have none): not a loop to keep untested."""
    acc = torch.zeros(2, 3, 4, dtype=torch.int32)
    args = (acc, torch.ones(2, 3, 1), torch.ones(2, 1, 4), torch.ones(4))
    assert host_passes.scale_rows(*args, in_place=False) is None


def test_parameters_take_the_fused_passes() -> None:
    """A model's weight (quantized once) and bias are parameters."""
    w = torch.nn.Parameter(torch.randn(4, 30), requires_grad=False)
    bias = torch.nn.Parameter(torch.randn(4), requires_grad=False)
    assert host_passes.quantize_sym(w, F32_EPS) is not None
    acc = torch.zeros(3, 4, dtype=torch.int32)
    assert (
        host_passes.scale_rows(acc, torch.ones(3, 1), torch.ones(4), bias, in_place=False)
        is not None
    )


def test_a_bias_of_another_dtype_takes_the_aten_kernels() -> None:
    acc = torch.zeros(3, 4, dtype=torch.int32)
    bias = torch.ones(4, dtype=torch.bfloat16)
    assert (
        host_passes.scale_rows(acc, torch.ones(3, 1), torch.ones(4), bias, in_place=False) is None
    )


# -- a linear's two passes around its GEMM ------------------------------------------------------


def _prepared(w_q: torch.Tensor, w_scale: torch.Tensor, calls: list[str]):  # type: ignore[no-untyped-def]
    """What ``host_passes.linear`` asks its caller for: the weight's scales and a GEMM by
    ``w_q``, recording each step it is asked for."""

    def gemm(q: torch.Tensor) -> torch.Tensor:
        calls.append("gemm")
        return numerics.linear_i32(q, w_q)

    def prepare():  # type: ignore[no-untyped-def]
        calls.append("prepare")
        return w_scale, gemm

    return prepare


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("rows", "n"), [(1, 24), (7, 24), (300, 24), (5, 1)])
def test_a_linears_passes_are_the_two_passes_apart(
    rows: int, n: int, bias: bool, threads: int
) -> None:
    """The quantization and the rescale of ``quantize_sym`` and ``scale_rows``, bit for bit, and
    the aten kernels' (300 rows of 256: past PARALLEL_MIN_NUMEL, shared among threads; one
    output, a value or reward head's: one scale for all)."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 256, generator=g) * 3
    w_q = torch.randint(-127, 128, (n, 256), dtype=torch.int8, generator=g)
    w_scale = torch.rand(n, generator=g) * 1e-2
    b = torch.randn(n, generator=g) if bias else None
    calls: list[str] = []
    with torch_threads(threads):
        y = host_passes.linear(x, b, F32_EPS, _prepared(w_q, w_scale, calls))
        quantized = host_passes.quantize_sym(x, F32_EPS)
        assert y is not None
        assert quantized is not None
        q, x_scale = quantized
        apart = host_passes.scale_rows(
            numerics.linear_i32(q, w_q), x_scale, w_scale, b, in_place=False
        )
        with host_passes.forced("aten"):
            q_aten, s_aten = quantize_sym_rows(x)
            aten = numerics.dequantize_acc(numerics.linear_i32(q_aten, w_q), s_aten, w_scale, b)
    assert calls == ["prepare", "gemm"]
    assert y.dtype == torch.float32
    assert y.shape == (rows, n)
    assert torch.equal(y, apart)
    assert torch.equal(y, aten)


@pytest.mark.parametrize(
    "what",
    [
        "bfloat16",
        "3-D",
        "one value a row",
        "column-major",
        "no rows",
        "a row of inf",
        "a row of nan",
        "aten passes",
        "the caller declines",
        "a bfloat16 bias",
        "a bias of two rows",
        "scales of another length",
        "one scale, as a 0-D tensor",
    ],
)
def test_what_a_linears_passes_do_not_take_never_runs_the_gemm(what: str) -> None:
    """None before the GEMM: the caller's general path runs it, once."""
    x, w_scale, b = torch.randn(4, 30), torch.rand(6), torch.randn(6)
    if what == "bfloat16":
        x = x.bfloat16()
    elif what == "3-D":
        x = x.reshape(2, 2, 30)
    elif what == "one value a row":
        x = x[:, :1]
    elif what == "column-major":
        x = torch.randn(30, 4).t()
    elif what == "no rows":
        x = x[:0]
    elif what == "a row of inf":
        x[1, 3] = float("inf")
    elif what == "a row of nan":
        x[3, 0] = float("nan")
    elif what == "a bfloat16 bias":
        b = b.bfloat16()
    elif what == "a bias of two rows":
        b = torch.randn(2, 6)
    elif what == "scales of another length":
        w_scale = torch.rand(5)
    elif what == "one scale, as a 0-D tensor":
        w_scale, b = torch.tensor(0.5), None
    calls: list[str] = []
    prepare = _prepared(torch.ones(6, x.shape[-1], dtype=torch.int8), w_scale, calls)
    if what == "the caller declines":
        prepare = lambda: calls.append("prepare")  # type: ignore[assignment,func-returns-value] # noqa: E731
    with host_passes.forced("aten" if what == "aten passes" else "native"):
        assert host_passes.linear(x, b, F32_EPS, prepare) is None
    # Refused on x's layout alone, before the caller's weight is looked up; inf and NaN are
    # found by the quantization's own pass, after it.
    x_alone = {"bfloat16", "3-D", "one value a row", "column-major", "no rows", "aten passes"}
    assert calls == ([] if what in x_alone else ["prepare"])


def _native_prepared(kernel: str, w_q: torch.Tensor, w_scale: torch.Tensor, calls: list[str]):  # type: ignore[no-untyped-def]
    """``_prepared`` with the GEMM as a :class:`host_passes.NativeGemm` of ``kernel``: run
    inside ``host_passes.linear``'s own native call, recorded through its ``record``."""
    module = NATIVE_MODULES[kernel]
    packed = module.pack(w_q)
    threads = module.gemm_threads(1 << 20)

    def prepare():  # type: ignore[no-untyped-def]
        calls.append("prepare")
        record = lambda: calls.append("record")  # noqa: E731
        return w_scale, host_passes.NativeGemm(
            kernel, packed.data, packed.n, packed.k, threads, record
        )

    return prepare


NATIVE_MODULES: dict[str, Any] = {"int16": int16_gemm, "amx": amx_gemm}
#: The native kernels of a fused linear, each where this process has it.
NATIVE_KERNELS = pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(
            "int16",
            marks=pytest.mark.skipif(
                not int16_gemm.available(), reason=int16_gemm.unavailable_reason()
            ),
        ),
        pytest.param("amx", marks=needs_amx),
    ],
)


@NATIVE_KERNELS
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [
        (1, 256, 24),
        (7, 256, 24),
        (300, 256, 24),
        (5, 256, 1),
        (9, 33, 17),
        (48, 130, 70),
        (33, 4100, 70),
    ],
)
def test_a_linear_by_a_natively_packed_weight_is_one_call_with_the_steps_apart_bits(
    rows: int, k: int, n: int, bias: bool, threads: int, kernel: str
) -> None:
    """Quantized straight into the kernel's activations, multiplied and rescaled in one native
    call: the bits of the passes around a GEMM apart, and the aten kernels' (odd K: ``int16``'s
    last pair half padding; 9 rows of 17 columns: more than its micro-tile and panel; 48 rows
    by 70 columns of K 130: ``amx``'s blocks of 32 and 16 rows, a last panel of 6 columns and K
    padded past two tiles; K 4100: ``amx``'s K in chunks), the GEMM recorded once."""
    g = torch.Generator().manual_seed(rows * k)
    x = torch.randn(rows, k, generator=g) * 3
    w_q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w_q[0, :2] = -128  # the extremes: -128 · -128 products
    x[0, 0] = -x.abs().max()  # a row whose -128 meets them
    w_scale = torch.rand(n, generator=g) * 1e-2
    b = torch.randn(n, generator=g) if bias else None
    calls: list[str] = []
    apart_calls: list[str] = []
    with torch_threads(threads):
        y = host_passes.linear(x, b, F32_EPS, _native_prepared(kernel, w_q, w_scale, calls))
        apart = host_passes.linear(x, b, F32_EPS, _prepared(w_q, w_scale, apart_calls))
        with host_passes.forced("aten"):
            q_aten, s_aten = quantize_sym_rows(x)
            aten = numerics.dequantize_acc(numerics.linear_i32(q_aten, w_q), s_aten, w_scale, b)
    assert calls == ["prepare", "record"]
    assert y is not None
    assert apart is not None
    assert y.shape == (rows, n)
    assert torch.equal(y, apart)
    assert torch.equal(y, aten)


@NATIVE_KERNELS
@pytest.mark.parametrize("what", ["a row of inf", "a row of nan", "a packing of another K"])
def test_what_a_native_linear_does_not_take_never_records_its_gemm(what: str, kernel: str) -> None:
    x, w_q = torch.randn(4, 30), torch.ones(6, 30, dtype=torch.int8)
    if what == "a row of inf":
        x[1, 3] = float("inf")
    elif what == "a row of nan":
        x[3, 0] = float("nan")
    else:
        w_q = torch.ones(6, 32, dtype=torch.int8)
    calls: list[str] = []
    prepare = _native_prepared(kernel, w_q, torch.rand(6), calls)
    assert host_passes.linear(x, None, F32_EPS, prepare) is None
    assert calls == ["prepare"]


def _tiled_prepared(  # type: ignore[no-untyped-def]
    w_q: torch.Tensor, w_scale: torch.Tensor, calls: list[object], rows: int, columns: int
):
    """``_prepared`` with the GEMM as a :class:`host_passes.TiledGemm` of tiles of at most
    ``rows`` × ``columns``, recording each tile it is asked for (its rows and first column)."""

    def tile(q: torch.Tensor, j0: int, j1: int) -> torch.Tensor:
        calls.append((q.shape[0], j0, j1))
        return numerics.linear_i32(q, w_q[j0:j1])

    def prepare():  # type: ignore[no-untyped-def]
        calls.append("prepare")
        record = lambda: calls.append("record")  # noqa: E731
        return w_scale, host_passes.TiledGemm(tile, w_q.shape[0], rows, columns, record)

    return prepare


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    ("rows", "n", "tiles"),
    [
        # 700 rows in two blocks of 350 (not 512 and 188); 1100 columns as 512, 512 and 76.
        (700, 1100, [(350, 0, 512), (350, 0, 512), (350, 512, 1024), (350, 512, 1024),
                     (350, 1024, 1100), (350, 1024, 1100)]),
        (300, 512, [(300, 0, 512)]),  # one tile: the whole product
        (1025, 40, [(342, 0, 40), (342, 0, 40), (341, 0, 40)]),
    ],
)  # fmt: skip
def test_a_linear_in_tiles_gives_the_bits_of_its_gemm_in_one_call(
    rows: int, n: int, tiles: list[tuple[int, int, int]], bias: bool, threads: int
) -> None:
    """Each tile rescaled by its own rows' and columns' scales and bias into its place in the
    output: the bits of the passes around the whole GEMM and the aten kernels', in blocks of
    equal rows, the GEMM recorded once."""
    g = torch.Generator().manual_seed(rows + n)
    x = torch.randn(rows, 24, generator=g) * torch.rand(rows, 1, generator=g) * 5
    w_q = torch.randint(-128, 128, (n, 24), dtype=torch.int8, generator=g)
    w_scale = torch.rand(n, generator=g) * 1e-2
    b = torch.randn(n, generator=g) if bias else None
    calls: list[object] = []
    with torch_threads(threads):
        y = host_passes.linear(x, b, F32_EPS, _tiled_prepared(w_q, w_scale, calls, 512, 512))
        whole = host_passes.linear(x, b, F32_EPS, _prepared(w_q, w_scale, []))
        with host_passes.forced("aten"):
            q_aten, s_aten = quantize_sym_rows(x)
            aten = numerics.dequantize_acc(numerics.linear_i32(q_aten, w_q), s_aten, w_scale, b)
    assert calls == ["prepare", *tiles, "record"]
    assert y is not None
    assert whole is not None
    assert y.shape == (rows, n)
    assert torch.equal(y, whole)
    assert torch.equal(y, aten)


@pytest.mark.parametrize(
    ("n", "extra", "message"),
    [
        (6, 1, r"a linear's GEMM tile gave torch.int32 \[4, 5\]"),
        (7, 0, r"a linear's tiled GEMM has 7 columns where the weight has 6 scales"),
    ],
)
def test_a_linears_gemm_tiles_of_another_shape_are_an_error(
    n: int, extra: int, message: str
) -> None:
    def tile(q: torch.Tensor, j0: int, j1: int) -> torch.Tensor:
        return torch.zeros(q.shape[0], j1 - j0 + extra, dtype=torch.int32)

    gemm = host_passes.TiledGemm(tile, n, 512, 4, lambda: None)
    with pytest.raises(TypeError, match=rf"^asic: {message}$"):
        host_passes.linear(torch.randn(4, 30), None, F32_EPS, lambda: (torch.rand(6), gemm))


def test_a_linears_gemm_of_another_shape_is_an_error() -> None:
    """After the GEMM ran (and was counted) there is no going back to the general path."""
    with pytest.raises(TypeError, match=r"^asic: a linear's GEMM gave torch.int32 \[4, 5\]$"):
        host_passes.linear(
            torch.randn(4, 30),
            None,
            F32_EPS,
            lambda: (torch.rand(6), lambda q: torch.zeros(4, 5, dtype=torch.int32)),
        )


# -- choosing and building ---------------------------------------------------------------------


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A process's first choice again, with a cache of its own; the real one afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(host_passes.ENV_VAR, raising=False)
    host_passes.reset()
    yield tmp_path / "asic_backend"
    monkeypatch.undo()
    host_passes.reset()


def test_the_first_use_builds_once_and_later_processes_load_the_build(fresh_choice: Path) -> None:
    assert host_passes.mode() == "native"
    (built,) = fresh_choice.glob("host_passes-*.so")
    stamp = built.stat().st_mtime_ns
    assert host_passes.describe().startswith("native (auto: built with ")
    assert "-ffp-contract=off" in host_passes.describe()
    host_passes.reset()  # as a new process would
    assert host_passes.mode() == "native"
    assert list(fresh_choice.glob("*")) == [built]
    assert built.stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    ("env", "describe"),
    [
        ({"ASIC_HOST_PASSES": "aten"}, "aten ($ASIC_HOST_PASSES=aten)"),
        ({"ASIC_HOST_PASSES": " Native "}, "native ($ASIC_HOST_PASSES=native)"),
        (
            {"CC": "/nonexistent/cc", "PATH": ""},
            "aten (auto: no C compiler found ($CC, cc, gcc, clang))",
        ),
    ],
    ids=["aten", "native", "no compiler"],
)
def test_the_choice_and_how_it_reads(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], describe: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert host_passes.describe() == describe
    assert host_passes.mode() == describe.split()[0]


def test_a_compiler_that_fails_reads_as_the_reason(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", f"{sys.executable} -c 'import sys; sys.exit(\"cc: no such thing\")'")
    assert host_passes.mode() == "aten"
    assert host_passes.describe().startswith("aten (auto: the build failed: ")
    assert host_passes.describe().endswith(": cc: no such thing)")
    assert not list(fresh_choice.glob("*.so"))
    monkeypatch.setenv(host_passes.ENV_VAR, "native")
    host_passes.reset()
    with pytest.raises(
        RuntimeError, match=r"^asic: the native host passes are not available: the build failed: "
    ):
        host_passes.mode()


def test_a_build_that_fails_its_self_check_gives_way_to_the_next_flags(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that rounds otherwise than torch is never used: the next set of flags is built
    and checked (here the first set's build fails, so the plain one is used)."""
    real = host_passes._check_rows
    marked = "-DASIC_SELF_CHECK_FAILS"  # a flag every compiler takes, to tell the builds apart

    def check(native: Any) -> str | None:
        return "int8 [0], scale 2.0" if marked in native.built_with else real(native)

    monkeypatch.setattr(host_passes, "_OPTIONAL_FLAGS", ((marked,), ()))
    monkeypatch.setattr(host_passes, "_check_rows", check)
    assert host_passes.mode() == "native"
    assert host_passes.describe().startswith("native (auto: built with ")
    assert host_passes.describe().endswith(" -fPIC -shared)")
    assert len(list(fresh_choice.glob("host_passes-*.so"))) == 2


def test_where_no_build_passes_its_self_check_the_aten_passes_run_and_say_why(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_passes, "_OPTIONAL_FLAGS", ((),))
    monkeypatch.setattr(host_passes, "_check_rows", lambda native: "int8 [0], scale 2.0")
    assert host_passes.mode() == "aten"
    assert host_passes.describe().startswith("aten (auto: the build failed: ")
    assert host_passes.describe().endswith(": its self-check failed (int8 [0], scale 2.0))")
    assert not int16_gemm.available()
    assert host_passes.quantize_sym(torch.randn(2, 8), F32_EPS) is None
    monkeypatch.setenv(host_passes.ENV_VAR, "native")
    host_passes.reset()
    with pytest.raises(RuntimeError, match="its self-check failed"):
        host_passes.mode()


def test_the_choice_is_read_once_and_the_header_names_that_reading(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(host_passes.ENV_VAR, "aten")
    assert host_passes.mode() == "aten"
    monkeypatch.setenv(host_passes.ENV_VAR, "native")  # too late: read at the first pass
    assert host_passes.mode() == "aten"
    assert host_passes.describe() == "aten ($ASIC_HOST_PASSES=aten)"
    host_passes.reset()
    assert host_passes.mode() == "native"
    assert host_passes.describe() == "native ($ASIC_HOST_PASSES=native)"


def test_a_build_is_kept_per_source_compiler_flags_and_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache shared among machines must not hand one CPU's -march=native code to another."""
    sources, compiler, flags = {"a.c": b"int x;"}, ["/usr/bin/cc"], ("-O3", "-march=native")
    monkeypatch.setattr(host_passes, "cpu_flags", lambda: ("avx2", "fma"))
    key = host_passes._key(sources, compiler, flags)
    assert host_passes._key(dict(sources), list(compiler), tuple(flags)) == key
    others = [
        host_passes._key({"a.c": b"int y;"}, compiler, flags),
        host_passes._key(sources, ["/usr/bin/clang"], flags),
        host_passes._key(sources, compiler, ("-O3",)),
    ]
    monkeypatch.setattr(host_passes, "cpu_flags", lambda: ("avx2", "fma", "avx512f"))
    others.append(host_passes._key(sources, compiler, flags))
    assert len({key, *others}) == 5


def test_a_bad_choice_is_one_line_naming_the_good_ones(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(host_passes.ENV_VAR, "fast")
    with pytest.raises(
        ValueError, match=r"^\$ASIC_HOST_PASSES='fast' is not one of native, aten, auto$"
    ):
        host_passes.mode()
    with (
        pytest.raises(ValueError, match="unknown host passes 'fast'; known: native, aten"),
        host_passes.forced("fast"),
    ):
        pass


def test_forcing_overrides_the_environment(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(host_passes.ENV_VAR, "aten")
    with host_passes.forced("native"):
        assert host_passes.describe() == "native (forced)"
        assert host_passes.quantize_sym(torch.randn(2, 8), F32_EPS) is not None
    assert host_passes.quantize_sym(torch.randn(2, 8), F32_EPS) is None
    assert os.environ[host_passes.ENV_VAR] == "aten"


# -- a convolution's rescale -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 5),
    size=st.sampled_from([(7,), (3, 4), (2, 2, 3)]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_convolutions_rescale_is_the_golden_model(
    batch: int, channels: int, size: tuple[int, ...], with_bias: bool, seed: int
) -> None:
    """``acc·scale[n, c] + bias[c]``, rounded after each step, for 1-D to 3-D convolutions."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randint(
        -(2**31), 2**31 - 1, (batch, channels, *size), dtype=torch.int32, generator=g
    )
    scale = torch.rand(batch, channels, *[1] * len(size), generator=g) * 1e-5
    bias = torch.randn(channels, generator=g) if with_bias else None
    with host_passes.forced("native"):
        y = host_passes.scale_planes(acc, scale, bias, out=None)
    assert y is not None
    plane = acc[0, 0].numel()
    want = [
        golden.scale_row(
            acc[n, c].reshape(-1).tolist(),
            scale[n, c].item(),
            [1.0] * plane,  # a product by 1.0 is exact: the two-step formula
            None if bias is None else [bias[c].item()] * plane,
        )
        for n in range(batch)
        for c in range(channels)
    ]
    assert y.reshape(batch * channels, plane).tolist() == want


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("form", ["int32", "float32 in place", "into out"])
def test_a_convolutions_rescale_equals_the_aten_kernels(
    form: str, bias: bool, threads: int
) -> None:
    """Where ``ops.conv`` puts the result: new (int32), ``acc``'s memory (float32), ``out``."""
    from asic_backend.ops.conv import _rescale

    g = torch.Generator().manual_seed(9)
    acc = torch.randint(-(2**24), 2**24, (4, 6, 60, 50), dtype=torch.int32, generator=g)
    if form != "int32":
        acc = acc.to(torch.float32)
    scale = torch.rand(4, 6, 1, 1, generator=g) * 1e-3
    c = torch.randn(6, generator=g).to(torch.bfloat16) if bias else None  # converted first
    results = []
    with torch_threads(threads):
        for mode in ("native", "aten"):
            work = acc.clone()
            out = torch.empty(acc.shape) if form == "into out" else None
            with host_passes.forced(mode):
                y = _rescale(work, scale, c, out=out)
            assert y.dtype == torch.float32
            if form == "int32":
                assert y.data_ptr() != work.data_ptr()
            else:
                assert y.data_ptr() == (work if out is None else out).data_ptr()
            results.append(y)
    assert torch.equal(results[0].view(torch.int32), results[1].view(torch.int32))


@pytest.mark.parametrize(
    ("acc", "scale", "bias"),
    [
        (
            torch.zeros(2, 3, 4, dtype=torch.int32),
            torch.ones(2, 3, 1),
            torch.ones(3, dtype=torch.bfloat16),
        ),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.ones(2, 3, 4), None),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.ones(3, 2, 1).transpose(0, 1), None),
        (torch.zeros(2, 4, 3, dtype=torch.int32).transpose(1, 2), torch.ones(2, 3, 1), None),
        (torch.zeros(2, 12, dtype=torch.int32), torch.ones(2, 1), None),
    ],
    ids=["bfloat16 bias", "a scale a value", "strided scales", "strided accumulator", "2-D"],
)
def test_what_the_fused_convolution_rescale_does_not_take(
    acc: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> None:
    assert host_passes.scale_planes(acc, scale, bias, out=None) is None


def test_no_writable_cache_reads_as_the_reason(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nowhere to build: the aten kernels run, and say why (not an error in every pass)."""
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-cache")
    monkeypatch.setattr(tempfile, "tempdir", "/proc")
    assert host_passes.mode() == "aten"
    assert host_passes.describe() == (
        "aten (auto: RuntimeError: no writable cache directory of this user's for the native "
        "host passes)"
    )
    assert host_passes.quantize_sym(torch.randn(2, 8), F32_EPS) is None


def test_the_temporary_fallback_is_private_and_trusted_only_if_so(
    fresh_choice: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-cache")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = tmp_path / f"asic_backend-{os.getuid()}"
    assert host_passes.mode() == "native"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert list(private.glob("host_passes-*.so"))
    private.chmod(0o777)  # as another user could have made it
    host_passes.reset()
    assert host_passes.mode() == "aten"
    assert "no writable cache directory" in host_passes.describe()


def test_a_first_use_while_tracing_leaves_the_build_to_a_real_call(fresh_choice: Path) -> None:
    """A process whose first DUT op is traced (fake tensors under a compile) must not decide
    then: the self-check would run on fake tensors and fail for good."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        quantize_sym_rows(torch.empty(4, 30))
        assert host_passes.mode() == "native"  # a first build under the mode: real tensors
    assert host_passes.quantize_sym(torch.randn(2, 8), F32_EPS) is not None
