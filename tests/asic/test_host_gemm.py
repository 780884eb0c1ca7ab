"""Every exact host kernel gives the golden model's bits: the DUT's numbers do not depend on
which one this host picks (``$ASIC_HOST_GEMM``)."""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asic_backend.sim import amx_gemm, conv, host, host_gemm, host_passes, int16_gemm, numerics
from asic_backend.sim.conv import ConvGeometry, conv_i32
from tests import gc_freeze
from tests.asic import golden
from tests.asic.test_numerics import OVERFLOW, GemmCase, gemm_case, run_linear_i32
from tests.races import run_interleaved

KERNELS = pytest.mark.parametrize("name", host_gemm.available_kernels())
#: Each kernel, with ``int_mm`` under each weight layout (``int_mm@rows``...): the bits depend
#: on neither.
VARIANTS = [
    *(name for name in host_gemm.available_kernels() if name != "int_mm"),
    *(f"int_mm@{layout}" for layout in host_gemm.INT_MM_LAYOUTS),
]


@contextlib.contextmanager
def forced(variant: str) -> Iterator[None]:
    """Kernel ``variant`` forced (:data:`VARIANTS`), with its layout where it names one."""
    name, _, layout = variant.partition("@")
    with host_gemm.forced(name), pytest.MonkeyPatch.context() as patch:
        if layout:
            patch.setenv(host_gemm.LAYOUT_ENV_VAR, layout)
        yield


@pytest.mark.parametrize("name", VARIANTS)
@settings(max_examples=40, deadline=None)
@given(case=gemm_case(), overflow=OVERFLOW)
def test_linear_i32_equals_golden_with_each_kernel(
    name: str, case: GemmCase, overflow: numerics.AccOverflow
) -> None:
    with forced(name):
        assert run_linear_i32(case, overflow).tolist() == case.golden(overflow)


@pytest.mark.parametrize("name", VARIANTS)
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
    with forced(name):
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
    for name in host_gemm.available_kernels():
        monkeypatch.setenv(host_gemm.ENV_VAR, name)
        assert host_gemm.kernel() == name
    monkeypatch.setenv(host_gemm.ENV_VAR, "auto")
    without = "int16" if int16_gemm.available() else "float32"
    with_unit = host_gemm.has_int8_unit() and host_gemm.int_mm_is_exact()
    auto = "amx" if amx_gemm.available() else "int_mm" if with_unit else without
    assert host_gemm.kernel() == auto
    monkeypatch.setenv(host_gemm.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=r"\$ASIC_HOST_GEMM='fast' is not one of int_mm, "):
        host_gemm.kernel()
    with (
        pytest.raises(ValueError, match="unknown host GEMM kernel 'fast'"),
        host_gemm.forced("fast"),
    ):
        pass


@pytest.mark.parametrize(
    ("flags", "torch_reads", "unit"),
    [
        (("avx2", "avx512f", "avx512bw"), {"avx512_vnni": True}, False),  # Linux's flags decide
        (("avx2", "avx_vnni"), {}, True),
        (("avx512f", "avx512_vnni"), {}, True),
        (("amx_tile", "amx_int8"), {}, True),
        # Not Linux: torch's reading of the CPU; AVX-512 without VNNI is no int8 unit.
        ((), {"avx512_f": True, "avx512_vnni": False, "cpu_name": "Xeon"}, False),
        ((), {"avx2": True, "avx_vnni": True}, True),
        ((), {}, False),
    ],
)
def test_an_int8_unit_is_a_vnni_or_amx_flag_of_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str, ...],
    torch_reads: dict[str, object],
    unit: bool,
) -> None:
    monkeypatch.setattr(host_gemm, "cpu_flags", lambda: flags)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: torch_reads, raising=False)
    assert host_gemm.has_int8_unit.__wrapped__() is unit


@pytest.mark.parametrize("vnni", [True, False])
def test_a_torch_without_get_capabilities_is_asked_for_vnni_and_amx(
    monkeypatch: pytest.MonkeyPatch, vnni: bool
) -> None:
    monkeypatch.setattr(host_gemm, "cpu_flags", lambda: ())
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: vnni, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert host_gemm.has_int8_unit.__wrapped__() is vnni


def test_a_reading_of_the_cpu_that_fails_counts_as_no_int8_unit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails() -> dict[str, object]:
        raise RuntimeError("cpuinfo could not read this CPU")

    monkeypatch.setattr(host_gemm, "cpu_flags", lambda: ())
    monkeypatch.setattr(torch.cpu, "get_capabilities", fails, raising=False)
    assert host_gemm.has_int8_unit.__wrapped__() is False


def test_a_host_whose_int_mm_is_not_exact_never_runs_it_and_says_which_kernel_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``auto`` takes another kernel there, and ``int_mm`` forced hands each GEMM to
    ``float32``: the header names the kernel that computes, the products stay exact."""
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: True)
    monkeypatch.setattr(host_gemm, "int_mm_is_exact", lambda: False)
    monkeypatch.setattr(amx_gemm, "available", lambda: False)  # a unit of VNNI alone
    int_mm_calls: list[None] = []
    real_int_mm = torch._int_mm
    monkeypatch.setattr(
        torch, "_int_mm", lambda *a, **k: int_mm_calls.append(None) or real_int_mm(*a, **k)
    )
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(-128, 128, (9, 300), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (70, 300), dtype=torch.int8, generator=gen)
    expected = a.long() @ w.long().t()
    without = "int16" if int16_gemm.available() else "float32"
    monkeypatch.setenv(host_gemm.ENV_VAR, "auto")
    assert host_gemm.kernel() == without
    assert host_gemm.describe().startswith(
        f"{without} (auto: an int8 dot-product unit on this CPU, whose torch._int_mm is not exact"
    )
    assert torch.equal(numerics.linear_i32(a, w).long(), expected)
    monkeypatch.setenv(host_gemm.ENV_VAR, "int_mm")
    assert host_gemm.kernel_for(300) == "float32"
    assert host_gemm.describe() == (
        "int_mm ($ASIC_HOST_GEMM=int_mm); torch._int_mm is not exact on this host: float32"
        " computes every GEMM"
    )
    assert torch.equal(numerics.linear_i32(a, w).long(), expected)
    assert torch.equal(numerics.bmm_i32(a[None], w[None]).long()[0], expected)
    assert int_mm_calls == []


@KERNELS
def test_batched_products_above_the_float32_slice(name: str) -> None:
    k = 2 * host_gemm.FLOAT32_SLICE + 5
    a = torch.full((2, 3, k), -128, dtype=torch.int8)
    w = torch.full((2, 4, k), -128, dtype=torch.int8)
    w[1, :, ::3] = 127
    with host_gemm.forced(name):
        out = numerics.bmm_i32(a, w)
    assert torch.equal(out.long(), a.long() @ w.long().transpose(1, 2))


@KERNELS
def test_a_weight_written_in_place_is_not_served_from_the_kernels_cache(name: str) -> None:
    """Each kernel keeps a copy of a weight (float, or int8 ``[K, N]`` for ``int_mm``): an
    in-place write must remake it."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (4, 64), dtype=torch.int8, generator=gen)
    w = torch.randint(-100, 100, (8, 64), dtype=torch.int8, generator=gen)
    with host_gemm.forced(name):
        first = numerics.linear_i32(a, w, a_zp=3)
        assert torch.equal(numerics.linear_i32(a, w, a_zp=3), first)  # served from the cache
        w.add_(7)
        second = numerics.linear_i32(a, w, a_zp=3)
    expected = (a.long() - 3) @ w.long().t()
    assert torch.equal(second.long(), expected)
    assert not torch.equal(second, first)


def test_the_float_copy_is_made_once_per_weight() -> None:
    w = torch.randint(-128, 128, (8, 64), dtype=torch.int8)
    with host_gemm.forced("float32"):
        copy = host_gemm.float_weight(w, torch.float32)
        assert host_gemm.float_weight(w, torch.float32) is copy
        assert host_gemm.float_weight(w, torch.float64) is not copy
        assert host_gemm.float_weight(w, torch.float32) is copy  # one copy per dtype
        w[0, 0] = 5
        assert host_gemm.float_weight(w, torch.float32) is not copy


@pytest.mark.parametrize("layout", host_gemm.INT_MM_LAYOUTS)
def test_int_mm_reads_a_weight_in_the_layout_but_one_row_by_its_rows(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """``columns``: the weight's row-major ``[K, N]`` copy is made once and read from two rows
    on; ``rows``: ``w`` itself is read; a single row always reads ``w`` (oneDNN's GEMV)."""
    assert host_gemm.int_mm_is_exact()  # its own check runs before the spy, once a process
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, layout)
    seen: list[torch.Tensor] = []
    real = torch._int_mm

    def spy(a: torch.Tensor, b: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        seen.append(b)
        return real(a, b, **kwargs)

    monkeypatch.setattr(torch, "_int_mm", spy)
    gen = torch.Generator().manual_seed(2)
    w = torch.randint(-128, 128, (24, 64), dtype=torch.int8, generator=gen)
    rows = torch.randint(-128, 128, (8, 64), dtype=torch.int8, generator=gen)
    with host_gemm.forced("int_mm"):
        for a in (rows, rows, rows[:1]):
            product = host_gemm.mm_i32(a, w, w_static=True)
            assert torch.equal(product.long(), a.long() @ w.long().t())
    first, again, row = seen
    if layout == "columns":
        assert (first.shape, first.is_contiguous()) == ((64, 24), True)
        assert again is first  # kept
    else:
        assert (first.data_ptr(), first.stride()) == (w.data_ptr(), (1, 64))
        assert (again.data_ptr(), again.stride()) == (w.data_ptr(), (1, 64))
    assert (row.data_ptr(), row.stride()) == (w.data_ptr(), (1, 64))  # w itself, transposed


@KERNELS
@gc_freeze.paused()  # it checks that a dropped tensor is collected
def test_a_fresh_view_of_a_weight_each_call_finds_its_kept_copy(name: str) -> None:
    """An exported TorchAO layer hands the kernel a new view of its weight on every call: the
    kernel's copy of it (``[K, N]`` int8, or float) is kept under the weight, remade once the
    weight is written, and dropped with it."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randint(-128, 128, (24, 64), dtype=torch.int8, generator=gen)  # [N, K]
    a = torch.randint(-128, 128, (8, 64), dtype=torch.int8, generator=gen)
    cache = {"int_mm": "columns", "float32": "slices", "float64": "float64"}.get(name, name)
    made: list[int] = []
    real = host_gemm._weight_copies[cache].get

    def counting(key: torch.Tensor, version: object, make: object) -> object:
        return real(key, version, lambda: (made.append(1), make())[1])  # type: ignore[operator]

    with host_gemm.forced(name), pytest.MonkeyPatch.context() as patch:
        patch.setenv(host_gemm.LAYOUT_ENV_VAR, "columns")  # int_mm's copy (rows reads w itself)
        patch.setattr(host_gemm._weight_copies[cache], "get", counting)
        for _ in range(3):
            product = host_gemm.mm_i32(a, weight[:], w_static=True)
            assert torch.equal(product.long(), a.long() @ weight.long().t())
        weight.add_(1)
        product = host_gemm.mm_i32(a, weight[:], w_static=True)
    assert torch.equal(product.long(), a.long() @ weight.long().t())
    assert len(made) == 2  # once, and once more after the write
    kept = weakref.ref(weight)
    del weight
    gc.collect()
    assert kept() is None


@gc_freeze.paused()  # it checks that a dropped tensor is collected
def test_int_mm_keeps_no_copy_of_a_weight_already_row_major_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In the ``columns`` layout, ``w_q`` a view of a ``[K, N]`` tensor is read as it is. A
    kept view of it would hold its key alive in the weak-keyed cache."""
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, "columns")
    gen = torch.Generator().manual_seed(4)
    columns = torch.randint(-128, 128, (64, 24), dtype=torch.int8, generator=gen)
    a = torch.randint(-128, 128, (8, 64), dtype=torch.int8, generator=gen)
    with host_gemm.forced("int_mm"):
        product = host_gemm.mm_i32(a, columns.t(), w_static=True)
    assert torch.equal(product.long(), a.long() @ columns.long())
    kept = weakref.ref(columns)
    del columns
    gc.collect()
    assert kept() is None


@pytest.mark.parametrize(
    ("rows_s", "columns_s", "chosen"),
    [(1.0, 0.7, "columns"), (1.0, 0.8, "rows"), (0.4, 1.0, "rows")],
)
def test_auto_takes_the_layout_measured_faster_by_a_quarter(
    monkeypatch: pytest.MonkeyPatch, rows_s: float, columns_s: float, chosen: str
) -> None:
    """``auto`` times both layouts' GEMMs in turn, keeps each one's best, and takes
    ``columns`` only where it is faster by a quarter (``rows`` keeps no copy); here on a fake
    clock that a GEMM advances by its layout's time. The first ``rows`` GEMM, cold, takes 9
    times as long: its mean over the rounds would pick ``columns`` in the last case."""
    now = [0.0]
    calls: list[str] = []

    def fake_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        layout = "columns" if b.is_contiguous() else "rows"
        calls.append(layout)
        cold = layout == "rows" and calls.count(layout) == 1
        now[0] += (rows_s if layout == "rows" else columns_s) * (9 if cold else 1)
        return torch.empty(0)

    monkeypatch.setattr(torch, "_int_mm", fake_int_mm)
    monkeypatch.setattr(host_gemm.time, "perf_counter", lambda: now[0])
    monkeypatch.delenv(host_gemm.LAYOUT_ENV_VAR, raising=False)
    assert host_gemm._measured_layout.__wrapped__() == chosen
    assert calls == ["rows", "columns"] * host_gemm._PROBE_ROUNDS


def test_the_layout_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, " Columns ")
    assert (host_gemm.int_mm_layout(), host_gemm.static_form("int_mm", 2)) == ("columns",) * 2
    assert host_gemm.static_form("int_mm", 1) == "rows"  # a single row: the GEMV's layout
    assert host_gemm.static_form("int16", 2) == "int16"
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, "auto")
    monkeypatch.setattr(host_gemm, "_measured_layout", lambda: "columns")
    assert host_gemm.int_mm_layout() == "columns"
    monkeypatch.setattr(host_gemm, "_measured_layout", lambda: "rows")
    assert host_gemm.static_form("int_mm", 2) == "rows"
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, "kn")
    with pytest.raises(
        ValueError, match=r"^\$ASIC_INT_MM_LAYOUT='kn' is not one of rows, columns, auto$"
    ):
        host_gemm.int_mm_layout()


def test_the_probe_times_real_tensors_under_a_fake_tensor_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its answer is kept for the process: a first use while tracing must still time real
    GEMMs on the CPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: list[type] = []
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: seen.append(type(a)) or real(a, b))
    with FakeTensorMode():
        assert host_gemm._measured_layout.__wrapped__() in host_gemm.INT_MM_LAYOUTS
    assert set(seen) == {torch.Tensor}


@pytest.mark.parametrize("layout", host_gemm.INT_MM_LAYOUTS)
def test_an_inference_tensors_kn_weight_is_read_as_it_lies(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """A ``[K, N]`` weight made under ``torch.inference_mode`` has no version to keep a copy
    under: from two rows on ``_int_mm`` reads it as it lies, in either layout, not a copy a
    call."""
    assert host_gemm.int_mm_is_exact()  # its own check runs before the spy, once a process
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, layout)
    seen: list[torch.Tensor] = []
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b, **kw: seen.append(b) or real(a, b, **kw))
    with torch.inference_mode():
        gen = torch.Generator().manual_seed(6)
        columns = torch.randint(-128, 128, (64, 24), dtype=torch.int8, generator=gen)
        a = torch.randint(-128, 128, (8, 64), dtype=torch.int8, generator=gen)
        with host_gemm.forced("int_mm"):
            for _ in range(2):
                product = host_gemm.mm_i32(a, columns.t(), w_static=True)
                assert torch.equal(product.long(), a.long() @ columns.long())
    assert [b.data_ptr() for b in seen] == [columns.data_ptr()] * 2


def test_a_linear_reads_the_form_of_the_layout_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout changed between calls: each call gets the weight's operand in the layout in
    force, each kept apart (a copy ``[K, N]``, or the weight's own rows), never the other's."""
    import asic_backend.ops.linear  # noqa: F401  (registers asic::dyn_linear)

    assert host_gemm.int_mm_is_exact()  # its own check runs before the spy, once a process
    seen: list[torch.Tensor] = []
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b, **kw: seen.append(b) or real(a, b, **kw))
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(4, 64, generator=gen), torch.randn(24, 64, generator=gen)
    outs = []
    with host_gemm.forced("int_mm"):
        for layout in ("columns", "rows", "columns", "rows"):
            monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, layout)
            outs.append(torch.ops.asic.dyn_linear(x, w, None, False, True, "default"))
    assert [b.is_contiguous() for b in seen] == [True, False, True, False]
    assert seen[0].data_ptr() == seen[2].data_ptr()  # each kept
    assert seen[1].data_ptr() == seen[3].data_ptr() != seen[0].data_ptr()
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


@KERNELS
def test_a_dynamic_operand_by_columns_is_read_as_it_lies(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``w_q`` a transposed view of a row-major ``[K, N]`` (a 1x1 conv's input, a sample at a
    time): the exact product under every kernel, and ``_int_mm`` reads that ``[K, N]`` itself."""
    gen = torch.Generator().manual_seed(5)
    columns = torch.randint(-128, 128, (64, 40), dtype=torch.int8, generator=gen)
    a = torch.randint(-128, 128, (24, 64), dtype=torch.int8, generator=gen)
    read: list[int] = []
    int_mm = torch._int_mm

    def spy(x: torch.Tensor, y: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        read.append(y.data_ptr())
        return int_mm(x, y, **kwargs)

    host_gemm.int_mm_is_exact()  # its probe, once a process, calls _int_mm on operands of its own
    monkeypatch.setattr(torch, "_int_mm", spy)
    with host_gemm.forced(name):
        product = host_gemm.mm_i32(a, columns.t())
    assert torch.equal(product.long(), a.long() @ columns.long())
    # amx hands a product without a kept weight to int_mm (host_gemm.kernel_for).
    by_int_mm = name == "int_mm" or (name == "amx" and host_gemm.int_mm_is_exact())
    assert read == ([columns.data_ptr()] if by_int_mm else [])


def test_int_mm_hands_a_reduction_of_one_to_float32() -> None:
    # torch._int_mm returns uninitialized memory for K = 1 with N >= 2 (oneDNN, torch 2.13).
    a = torch.tensor([[-128], [127]], dtype=torch.int8)
    w = torch.tensor([[-128], [3], [-1]], dtype=torch.int8)
    with host_gemm.forced("int_mm"):
        assert torch.equal(host_gemm.mm_i32(a, w).long(), a.long() @ w.long().t())


def test_the_scratch_accumulator_is_reused_and_grows() -> None:
    small = host_gemm.scratch_i32(2, 3)
    again = host_gemm.scratch_i32(3, 2)
    assert again.data_ptr() == small.data_ptr()
    assert again.shape == (3, 2)
    large = host_gemm.scratch_i32(64, 64)
    assert large.shape == (64, 64)
    assert large.is_contiguous()
    with torch.inference_mode():
        inside = host_gemm.scratch_i32(128, 128)
    assert not inside.is_inference()  # writable outside inference_mode later
    inside.fill_(0)
    # One buffer per dtype: a float32 operand and an int32 accumulator live side by side.
    floats = host_gemm.scratch((4, 4, 4), torch.float32)
    assert (floats.dtype, floats.shape) == (torch.float32, (4, 4, 4))
    assert floats.data_ptr() != host_gemm.scratch_i32(8, 8).data_ptr()
    assert host_gemm.scratch((16, 4), torch.float32).data_ptr() == floats.data_ptr()
    # Two operands alive at once take two slots.
    other = host_gemm.scratch((4, 4, 4), torch.float32, slot=1)
    assert other.data_ptr() != floats.data_ptr()
    assert host_gemm.scratch((4, 4, 4), torch.float32, slot=1).data_ptr() == other.data_ptr()


@pytest.mark.parametrize("kernel", ["float32", "float64"])
def test_a_batched_gemms_float_operands_are_reused_never_its_result(kernel: str) -> None:
    """bmm_i32 converts its int8 operands in this thread's buffers, a transposed view into a
    transposed view (no transposing copy); a result stays the caller's after the next call."""
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-128, 128, (3, 5, 40), dtype=torch.int8, generator=g)
    w_kn = torch.randint(-128, 128, (3, 40, 7), dtype=torch.int8, generator=g)
    want = a.long() @ w_kn.long()
    with host_gemm.forced(kernel):
        first = host_gemm.bmm_i32(a, w_kn.transpose(1, 2), allow_float32=True)
        kept = first.clone()
        second = host_gemm.bmm_i32(w_kn.transpose(1, 2), a)
    assert torch.equal(first.long(), want)
    assert torch.equal(first, kept)  # the second call wrote elsewhere
    assert torch.equal(second.long(), want.transpose(1, 2))


@pytest.mark.parametrize("zp", [0, 5])
def test_a_deep_conv_in_float32_slices_of_input_channels(zp: int) -> None:
    """Off ``int_mm``, a conv whose sums exceed 2^24 runs as float32 convolutions over slices of
    its input channels (not float64), and stays exact at the extreme values."""
    x = torch.full((1, 160, 5, 5), -128, dtype=torch.int8)
    x[:, ::2] = 127
    f = torch.full((3, 160, 3, 3), -128, dtype=torch.int8)
    geo = ConvGeometry.of(x.shape, f.shape, stride=1, padding=1, dilation=1, groups=1)
    slices = conv._float32_slices(geo, 255 if zp else 128)
    assert len(slices) > 1
    assert slices[-1][1] == 160
    with host_gemm.forced("float32"):
        out = conv_i32(x, f, geo, a_zp=zp)
    padded = torch.nn.functional.pad(x.double() - zp, (1, 1, 1, 1))  # padding holds the zp
    expected = torch.nn.functional.conv2d(padded, f.double())
    assert torch.equal(out.double(), expected)


@pytest.mark.parametrize("k", [host_gemm.FLOAT32_SLICE + 1, 3 * host_gemm.FLOAT32_SLICE])
def test_a_static_weight_sliced_into_one_batched_gemm_in_blocks_of_rows(
    k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 with a weight: K's slices as one batched GEMM, taken a few rows at a time when
    the partial sums would be large (here: forced to blocks of 2 rows)."""
    monkeypatch.setattr(host_gemm, "_PARTIALS_MAX", 2 * 3 * 5)
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(-128, 128, (7, k), dtype=torch.int8, generator=gen)
    a[0] = -128
    w = torch.full((5, k), -128, dtype=torch.int8)
    w[1:] = torch.randint(-128, 128, (4, k), dtype=torch.int8, generator=gen)
    with host_gemm.forced("float32"):
        out = host_gemm.mm_i32(a, w, w_static=True)
        again = host_gemm.mm_i32(a, w, out=torch.empty(7, 5, dtype=torch.int32), w_static=True)
    expected = a.long() @ w.long().t()
    assert torch.equal(out.long(), expected)
    assert torch.equal(again.long(), expected)


CONV_CASES = [
    # (x, w, groups): a 3x3 conv whose sums exceed 2^24 (sliced off int_mm), a 1-D audio conv,
    # a depthwise conv, a small dense conv with a bias.
    ((2, 160, 6, 6), (8, 160, 3, 3), 1),
    ((2, 20, 50), (16, 20, 3), 1),
    ((2, 8, 7, 7), (8, 1, 3, 3), 8),
    ((1, 3, 9, 9), (4, 3, 3, 3), 1),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "groups"), CONV_CASES)
def test_dyn_conv_gives_the_same_bits_under_every_kernel(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], groups: int
) -> None:
    """The DUT's float conv op end to end (quantize, accumulate, rescale): the host kernel
    changes how the accumulator is computed, never a bit of the output."""
    import asic_backend.ops.conv  # noqa: F401  (registers asic::dyn_conv)

    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(x_shape, generator=gen), torch.randn(w_shape, generator=gen)
    b = torch.randn(w_shape[0], generator=gen)
    spatial = len(x_shape) - 2
    outs = []
    for name in VARIANTS:
        with forced(name):
            outs.append(
                torch.ops.asic.dyn_conv(
                    x,
                    w,
                    b,
                    [1] * spatial,
                    [1] * 2 * spatial,
                    [1] * spatial,
                    groups,
                    False,
                    [0] * spatial,
                    True,
                    "default",
                )
            )
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


STATIC_KERNELS = [k for k in host_gemm.available_kernels() if k in host_gemm.STATIC_KERNELS]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.split("@")[0] in STATIC_KERNELS])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("into", ["new", "out"])
def test_a_static_operand_gives_mm_i32s_bits(variant: str, rows: int, into: str) -> None:
    """What a kernel keeps of a weight, made once and multiplied by directly: the product
    ``mm_i32`` gives by the weight, with the extreme values."""
    name = variant.split("@")[0]
    gen = torch.Generator().manual_seed(rows)
    a = torch.randint(-128, 128, (rows, 70), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (9, 70), dtype=torch.int8, generator=gen)
    a[0], w[0] = -128, -128
    with forced(variant):
        operand = host_gemm.static_operand(name, w, rows)
    assert operand.kernel == name
    out = torch.empty(rows, 9, dtype=torch.int32) if into == "out" else None
    got = host_gemm.static_mm(a, operand, out=out)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), a.long() @ w.long().t())
    if out is not None:
        assert got.data_ptr() == out.data_ptr()
    with forced(variant):
        assert torch.equal(got, host_gemm.mm_i32(a, w, w_static=True))
        # Kept (or a view of the weight itself), not made again.
        again = host_gemm.static_operand(name, w, rows).data
    assert _storage(again) == _storage(operand.data)


def _storage(data: torch.Tensor | int16_gemm.Packed | amx_gemm.Packed) -> int:
    return (data if isinstance(data, torch.Tensor) else data.data).data_ptr()


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_a_float_kernel_keeps_no_static_operand(name: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^asic: the {name} kernel keeps no static operand; \('int_mm', "
    ):
        host_gemm.static_operand(name, torch.ones(2, 3, dtype=torch.int8), 1)


@pytest.mark.parametrize("k", [64, 3 * host_gemm.FLOAT32_SLICE + 7])
def test_dyn_linear_gives_the_same_bits_under_every_kernel(k: int) -> None:
    """One weight through every kernel and layout in turn: the same bits (which operand each
    reads: :func:`test_a_linear_reads_the_form_of_the_layout_in_force`)."""
    import asic_backend.ops.linear  # noqa: F401  (registers asic::dyn_linear)

    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(5, k, generator=gen), torch.randn(6, k, generator=gen)
    b = torch.randn(6, generator=gen)
    outs = []
    for name in VARIANTS:
        with forced(name):
            outs.append(torch.ops.asic.dyn_linear(x, w, b, False, True, "default"))
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


@pytest.mark.parametrize(
    ("value", "k", "length"),
    [
        (-128, 4096, host_gemm.FLOAT32_SLICE),  # the worst case: 1024 · 2^14 = 2^24
        (32, 4096, 4096),  # 128 · 32 · 4096 = 2^24 exactly: one GEMM
        (33, 4096, 2048),  # just over: two slices of 2048
        (1, 100_000, 100_000),
        (0, 3000, 3000),
    ],
)
def test_the_slice_length_follows_the_weights_magnitudes(value: int, k: int, length: int) -> None:
    w = torch.full((3, k), value, dtype=torch.int8)
    assert host_gemm.slice_length(w) == length
    a = torch.full((2, k), -128, dtype=torch.int8)  # the activations' worst case
    a[1, ::2] = 127
    with host_gemm.forced("float32"):
        out = host_gemm.mm_i32(a, w, w_static=True)
    assert torch.equal(out.long(), a.long() @ w.long().t())


@settings(max_examples=30, deadline=None)
@given(
    k=st.integers(1, 6000),
    big=st.integers(0, 128),
    seed=st.integers(0, 2**16),
)
def test_a_static_weight_of_any_magnitudes_is_exact_under_float32(
    k: int, big: int, seed: int
) -> None:
    """Weights mostly small with a run of large values: the slice length adapts, the result
    stays exact for worst-case activations."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-8, 9, (4, k), dtype=torch.int8, generator=gen)
    w[seed % 4, : k // 3] = -big if big < 128 else -128
    a = torch.randint(-128, 128, (3, k), dtype=torch.int8, generator=gen)
    a[0] = -128
    with host_gemm.forced("float32"):
        out = host_gemm.mm_i32(a, w, w_static=True)
    assert torch.equal(out.long(), a.long() @ w.long().t())


def test_a_one_slice_float32_product_may_stay_float32() -> None:
    """``allow_float32``: the float32 GEMM's own result (integers within 2^24), the values of
    the int32 one; several slices, or another kernel, still give int32."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (4, 300), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (6, 300), dtype=torch.int8, generator=gen)
    deep = torch.full((6, 3000), -128, dtype=torch.int8)  # worst case: three slices of K
    expected = a.long() @ w.long().t()
    with host_gemm.forced("float32"):
        out = host_gemm.mm_i32(a, w, w_static=True, allow_float32=True)
        sliced = host_gemm.mm_i32(
            torch.full((4, 3000), -128, dtype=torch.int8), deep, w_static=True, allow_float32=True
        )
    assert out.dtype == torch.float32
    assert torch.equal(out.long(), expected)
    assert sliced.dtype == torch.int32
    assert torch.equal(sliced, torch.full((4, 6), 3000 * 2**14, dtype=torch.int32))
    with host_gemm.forced("int_mm"):
        assert host_gemm.mm_i32(a, w, w_static=True, allow_float32=True).dtype == torch.int32


@pytest.mark.parametrize(("k", "length"), [(2048, 2048), (8192, 4096)])
def test_quantized_gaussian_weights_take_long_slices(k: int, length: int) -> None:
    """What the README and :func:`host_gemm.slice_length` say of a quantized layer: all of
    K = 2048 in one float32 GEMM, half of K = 8192."""
    from asic_backend.ops.linear import quantize_sym_rows

    w = torch.randn(512, k, generator=torch.Generator().manual_seed(k)) / k**0.5
    assert host_gemm.slice_length(quantize_sym_rows(w)[0]) == length


def _quantized_linear_weight(k: int, n: int) -> torch.Tensor:
    """An ``nn.Linear``'s initial weight quantized per channel: uniform values, so the bound
    on ``Σ|w|`` alone allows slices of 1024 only."""
    from asic_backend.ops.linear import quantize_sym_rows

    torch.manual_seed(k)
    return quantize_sym_rows(torch.nn.Linear(k, n).weight.detach())[0]


def test_rows_short_enough_take_one_gemm_over_all_of_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized ``nn.Linear(4096, ...)`` by quantized Gaussian tokens: its weight alone
    allows slices of 1024, but the rows' norms bound every partial sum within 2^24, so float32
    takes one GEMM (no batched GEMM of slices) and keeps its float32 result; activations that
    follow the weight's signs make sums beyond 2^24 and take the slices. Both are exact."""
    from asic_backend.ops.linear import quantize_sym_rows

    w = _quantized_linear_weight(4096, 64)
    assert host_gemm.slice_length(w) == host_gemm.FLOAT32_SLICE
    tokens = quantize_sym_rows(torch.randn(16, 4096, generator=torch.Generator().manual_seed(6)))
    # The worst activations for row 0: each value the sign of its weight, at full scale.
    aligned = torch.where(w[:1] < 0, -128, 127).to(torch.int8)
    batched: list[torch.Size] = []
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: batched.append(a.shape) or bmm(a, b))
    with host_gemm.forced("float32"):
        assert host_gemm.one_gemm_is_exact(tokens[0].float(), w.float())
        one = host_gemm.mm_i32(tokens[0], w, w_static=True, allow_float32=True)
        assert batched == []
        sliced = host_gemm.mm_i32(aligned, w, w_static=True, allow_float32=True)
        assert batched == [torch.Size([4, 1, 1024])]
    assert one.dtype == torch.float32
    assert torch.equal(one.double(), tokens[0].double() @ w.double().t())
    assert sliced.dtype == torch.int32
    exact = aligned.double() @ w.double().t()
    assert exact[0, 0] > host_gemm.F32_EXACT  # beyond what one float32 GEMM holds
    assert torch.equal(sliced.double(), exact)


@pytest.mark.parametrize("k", [3000, numerics.INT_MM_MAX_K])
def test_a_product_of_activations_takes_one_gemm_where_its_rows_allow(k: int) -> None:
    """Off a static weight (attention's ``P·V``, a batched product), float32 runs one GEMM over
    K where the rows' norms allow it (its float32 result kept), and slices of
    :data:`FLOAT32_SLICE` where they do not: exact either way."""
    gen = torch.Generator().manual_seed(7)
    small = torch.randint(-3, 4, (2, 3, k), dtype=torch.int8, generator=gen)
    worst = torch.full((2, 3, k), -128, dtype=torch.int8)
    with host_gemm.forced("float32"):
        one = host_gemm.bmm_i32(small, small, allow_float32=True)
        sliced = host_gemm.bmm_i32(worst, worst, allow_float32=True)
    assert one.dtype == torch.float32
    assert torch.equal(one.double(), small.double() @ small.double().mT)
    assert sliced.dtype == torch.int32
    assert torch.equal(sliced.long(), worst.long() @ worst.long().mT)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1000, 5000), scale=st.integers(1, 128), seed=st.integers(0, 2**16))
def test_one_gemm_or_slices_the_float32_kernel_is_exact(k: int, scale: int, seed: int) -> None:
    """Activations from small to full scale by a uniform quantized weight: near the norms'
    bound on either side, one GEMM or the slices, the bits of the int64 product."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (8, k), dtype=torch.int8, generator=gen)
    a = torch.randint(-scale, scale, (5, k), dtype=torch.int8, generator=gen)
    a[0] = torch.where(w[seed % 8] < 0, -scale, scale - 1)
    with host_gemm.forced("float32"):
        out = host_gemm.mm_i32(a, w, w_static=True)
        product = host_gemm.bmm_i32(a.unsqueeze(0), w.unsqueeze(0))
    assert torch.equal(out.long(), a.long() @ w.long().t())
    assert torch.equal(product[0].long(), a.long() @ w.long().t())


def test_the_norm_bound_is_what_its_docstring_says() -> None:
    """:func:`host_gemm.one_gemm_is_exact`'s examples and figure: the worst case allows 1,000
    values but not 1,025, and 256 quantized Gaussian tokens by a quantized
    ``nn.Linear(4096, ...)`` come to about three quarters of the bound."""
    from asic_backend.ops.linear import quantize_sym_rows

    worst = [torch.full((1, k), -128.0) for k in (1000, 1025)]
    assert host_gemm.one_gemm_is_exact(worst[0], worst[0])
    assert not host_gemm.one_gemm_is_exact(worst[1], worst[1])
    torch.manual_seed(0)
    w = quantize_sym_rows(torch.nn.Linear(4096, 4096).weight.detach())[0].float()
    tokens = quantize_sym_rows(torch.randn(256, 4096))[0].float()
    share = host_gemm._max_row_norm(tokens) * host_gemm._max_row_norm(w) / host_gemm.F32_EXACT
    assert 0.7 < share < 0.8
    assert host_gemm.one_gemm_is_exact(tokens, w)


def test_a_batched_gemm_of_a_row_major_right_operand_takes_it_as_it_lies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_int_mm`` gets each ``[K, N]`` matrix itself (a packed ``[N, K]`` copy took 7x the
    GEMMs of a decode step's PV)."""
    a = torch.randint(-128, 128, (3, 1, 40), dtype=torch.int8)
    w_kn = torch.randint(-128, 128, (3, 40, 7), dtype=torch.int8)
    seen: list[int] = []
    int_mm = torch._int_mm

    def spied(a: torch.Tensor, b: torch.Tensor, **kwargs: object) -> torch.Tensor:
        seen.append(b.data_ptr())
        return int_mm(a, b, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "_int_mm", spied)
    with host_gemm.forced("int_mm"):
        acc = host_gemm.bmm_i32(a, w_kn.transpose(1, 2))
    assert seen == [w_kn[i].data_ptr() for i in range(3)]
    assert torch.equal(acc.long(), a.long() @ w_kn.long())


@pytest.mark.parametrize("kernel", ["float32", "float64"])
def test_a_batched_gemm_of_fake_or_meta_operands_keeps_its_shape(kernel: str) -> None:
    """No data to copy into the reused buffers: the operands are converted as they are."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    meta = [torch.empty(s, dtype=torch.int8, device="meta") for s in ((2, 3, 40), (2, 5, 40))]
    with host_gemm.forced(kernel):
        assert host_gemm.bmm_i32(*meta).shape == (2, 3, 5)
        with FakeTensorMode():
            a, w = torch.empty(2, 3, 40, dtype=torch.int8), torch.empty(2, 5, 40, dtype=torch.int8)
            assert host_gemm.bmm_i32(a, w).shape == (2, 3, 5)


def test_an_operand_past_the_cap_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread keeps no buffer for an operand larger than SCRATCH_OPERAND_MAX_BYTES."""
    import threading

    monkeypatch.setattr(host, "SCRATCH_OPERAND_MAX_BYTES", 4 * 3 * 5 * 40 - 1)
    a = torch.randint(-128, 128, (3, 5, 40), dtype=torch.int8)
    w = torch.randint(-128, 128, (3, 2, 40), dtype=torch.int8)
    kept: list[object] = []

    def run() -> None:
        with host_gemm.forced("float32"):
            acc = host_gemm.bmm_i32(a, w)
        assert torch.equal(acc.long(), a.long() @ w.long().transpose(1, 2))
        kept.extend(sorted(str(key) for key in host._scratch.bufs))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert kept == ["(torch.float32, 1)"]  # w (480 bytes) only; a (2,400) past the cap


def test_the_smaller_operands_sums_decide_first_without_reading_the_larger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every partial sum is at most ``128 · Σ|a|`` too: where the small operand's rows allow it
    (a decode step's probabilities by a long V), the norms of the large one are not taken; at
    the bound's edge the answer is the same as the norms'."""
    norms: list[tuple[int, ...]] = []
    max_row_norm = host_gemm._max_row_norm

    def spied(x: torch.Tensor) -> float:
        norms.append(tuple(x.shape))
        return max_row_norm(x)

    monkeypatch.setattr(host_gemm, "_max_row_norm", spied)
    probs = torch.zeros(1, 2048)
    probs[0, :100] = 127.0  # Σ = 12,700: 128 · Σ is within 2^24
    v = torch.full((64, 2048), -128.0)
    assert host_gemm.one_gemm_is_exact(probs, v)
    assert norms == []
    exact = (probs.double() @ v.double().t()).abs().max().item()
    assert exact < host_gemm.F32_EXACT  # what the bound promised
    # 1,000 values of -128 by themselves: Σ · 128 = 16,384,000, within 2^24; 1,025: not, and
    # the norms (the same figure here) say no too.
    worst = [torch.full((1, k), -128.0) for k in (1000, 1025)]
    assert host_gemm.one_gemm_is_exact(worst[0], worst[0])
    assert norms == []
    assert not host_gemm.one_gemm_is_exact(worst[1], worst[1])
    assert norms == [(1, 1025), (1, 1025)]


def test_untiled_holds_in_every_thread_while_its_block_runs() -> None:
    """``host_gemm.untiled()``, entered in one thread, keeps another's wide linear in one call
    while the block runs, and only then (its docstring: process-wide, like ``forced``)."""
    operand = host_gemm.StaticOperand(
        "int_mm", torch.zeros(16, host_gemm.INT_MM_TILE_MIN_COLUMNS, dtype=torch.int8)
    )
    rows = host_gemm.INT_MM_TILE_MIN_ROWS
    inside, done = threading.Event(), threading.Event()

    def hold() -> None:
        with host_gemm.untiled():
            inside.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert inside.wait(30)
        assert host_gemm.native_linear_gemm(operand, rows, lambda: None) is None
    finally:
        done.set()
        thread.join()
    tiled = host_gemm.native_linear_gemm(operand, rows, lambda: None)
    assert isinstance(tiled, host_passes.TiledGemm)


@pytest.mark.parametrize("first_ends", [True, False], ids=["first-ends-first", "later-ends-first"])
@pytest.mark.parametrize("module", [host_gemm, host_passes], ids=lambda m: m.__name__)
def test_forced_blocks_of_two_threads_may_end_in_either_order(
    module: object, first_ends: bool
) -> None:
    """Each block ends its own entry: the block still running holds, whichever ended first,
    and the process's choice comes back when both ended."""
    first, second = ("float32", "float64") if module is host_gemm else ("aten", "native")
    chosen = host_gemm.kernel if module is host_gemm else host_passes.mode
    before = chosen()
    entered, looked, ended, seen = threading.Event(), threading.Event(), threading.Event(), []

    def later_block() -> None:
        with module.forced(second):  # type: ignore[attr-defined]
            entered.set()
            assert looked.wait(30)
            if first_ends:
                assert ended.wait(30)  # the first block has ended
                seen.append(chosen())
        ended.set()

    thread = threading.Thread(target=later_block)
    with module.forced(first):  # type: ignore[attr-defined]
        thread.start()
        assert entered.wait(30)
        seen.append(chosen())
        looked.set()
        if not first_ends:
            assert ended.wait(30)  # the later block has ended
            seen.append(chosen())
    if first_ends:
        ended.set()
    thread.join()
    assert seen == ([second, second] if first_ends else [second, first])
    assert chosen() == before


def test_overrides_stay_whole_under_threads_that_switch_at_every_step() -> None:
    """Blocks entered and ended by four threads at once, the interpreter switching threads as
    often as it can: no block's end fails, and none leaves its entry behind."""
    overrides = host.Overrides()
    errors: list[BaseException] = []

    def blocks(name: str) -> None:
        try:
            for _ in range(5000):
                with overrides.held(name):
                    assert overrides.current() is not None
        except BaseException as exc:
            errors.append(exc)

    run_interleaved(functools.partial(blocks, str(i)) for i in range(4))
    assert errors == []
    assert overrides.current() is None
    assert not overrides
