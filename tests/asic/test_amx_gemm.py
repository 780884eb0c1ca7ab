"""The ``amx`` host kernel against the golden model: every tile edge (rows of 16 and 32, panels
of 32 columns, K past and short of a tile's 64), every layout it takes, one and two threads; and
what a process without it picks."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asic_backend.sim import amx_gemm, host, host_gemm, host_passes, numerics
from tests.amx import needs_amx
from tests.asic import golden
from tests.asic.test_host_passes import torch_threads

INT8 = st.integers(-128, 127)


@st.composite
def operands(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    # Past a block of 32 rows and a panel of 32 columns, K short of and past a tile's 64.
    m, k, n = draw(st.integers(0, 40)), draw(st.integers(0, 140)), draw(st.integers(0, 70))
    extreme = draw(st.booleans())  # -128 · -128 everywhere: the largest sums
    values = st.just(-128) if extreme else INT8
    a = draw(st.lists(st.lists(values, min_size=k, max_size=k), min_size=m, max_size=m))
    w = draw(st.lists(st.lists(values, min_size=k, max_size=k), min_size=n, max_size=n))
    return (
        torch.tensor(a, dtype=torch.int8).reshape(m, k),
        torch.tensor(w, dtype=torch.int8).reshape(n, k),
    )


@needs_amx
@settings(max_examples=60, deadline=None)
@given(ab=operands(), w_layout=st.sampled_from(["rows", "columns", "strided"]))
def test_products_equal_the_golden_model(
    ab: tuple[torch.Tensor, torch.Tensor], w_layout: str
) -> None:
    a, w = ab
    if w_layout == "columns":  # a [K, N] matmul operand, as its transposed view
        w = w.t().contiguous().t()
    elif w_layout == "strided":  # every other row of a larger tensor
        w = torch.stack([w, torch.ones_like(w)], dim=1).reshape(2 * w.shape[0], w.shape[1])[::2]
    got = amx_gemm.mm(a, amx_gemm.pack(w))
    assert got.dtype == torch.int32
    assert got.shape == (a.shape[0], w.shape[0])
    assert got.tolist() == golden.gemm_i32(a.tolist(), w.tolist())


@needs_amx
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        # 70 panels of 32 columns by K = 1030 (17 tiles of K): 15 panels a group of 512 KiB, so
        # 5 groups; 3 blocks of rows, the last of 6.
        (70, 1030, 2230),
        # One group, 7 blocks of rows: the threads share the blocks.
        (200, 128, 40),
        # K in two chunks (32 tiles of 64, then 2): the sums wait in each thread's buffer; 10
        # panels, 8 a group, so 2 groups, the last panel of 12 columns; a block of 32 rows and
        # one of 16.
        (40, 2100, 300),
        # K in two chunks, one group: the threads share 19 blocks of rows in spans.
        (600, 2100, 40),
    ],
    ids=["groups", "rows", "chunks", "spans"],
)
def test_a_gemm_shared_among_threads_is_exact_and_writes_into_out_rows(
    threads: int, m: int, k: int, n: int
) -> None:
    """Past the size where the work is shared, into a caller's accumulator whose rows lie apart
    (a slice of a wider one): every value the exact product, and nothing beside it written."""
    gen = torch.Generator().manual_seed(threads)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    assert m * n * k >= amx_gemm.PARALLEL_MIN_MACS
    wide = torch.full((m, n + 7), 7, dtype=torch.int32)
    with torch_threads(threads):
        result = amx_gemm.mm(a, amx_gemm.pack(w), out=wide[:, 3 : n + 3])
    assert result.data_ptr() == wide[:, 3:].data_ptr()
    assert torch.equal(result.long(), a.long() @ w.long().t())
    assert (wide[:, :3] == 7).all()
    assert (wide[:, n + 3 :] == 7).all()


@needs_amx
def test_the_longest_reduction_stays_exact() -> None:
    """K = INT_MM_MAX_K of -128 · -128: 2^31 − 2^14, the int32 path's largest sum."""
    k = numerics.INT_MM_MAX_K
    a = torch.full((2, k), -128, dtype=torch.int8)
    w = torch.full((17, k), -128, dtype=torch.int8)
    w[1] = 127
    got = amx_gemm.mm(a, amx_gemm.pack(w))
    assert torch.equal(got.long(), a.long() @ w.long().t())


@needs_amx
def test_bad_operands_are_refused_in_one_line() -> None:
    w = amx_gemm.pack(torch.zeros((4, 8), dtype=torch.int8))
    a = torch.zeros((2, 8), dtype=torch.int8)
    with pytest.raises(ValueError, match=r"into torch.int32 \[2, 2\], not int32 \[2, 4\]$"):
        amx_gemm.mm(a, w, out=torch.zeros((2, 2), dtype=torch.int32))
    with pytest.raises(ValueError, match=r"activations as a 2-D int8 CPU tensor, got torch.uint8"):
        amx_gemm.mm(a.to(torch.uint8), w)
    with pytest.raises(ValueError, match=r"a weight as a 2-D int8 CPU tensor, got torch.float32"):
        amx_gemm.pack(torch.zeros((4, 8)))
    with pytest.raises(ValueError, match=r"amx GEMM of \[2, 9\] by a packed \[4, 8\]"):
        amx_gemm.mm(torch.zeros((2, 9), dtype=torch.int8), w)


@needs_amx
@pytest.mark.parametrize(("n", "k"), [(32, 64), (48, 131), (37, 64), (5, 3)])
def test_every_layout_packs_to_the_same_bytes(n: int, k: int) -> None:
    """Rows of unit stride (a linear's weight) take the path of 4 values at a time; any other
    layout is packed value by value: the same packing, its padding zeros."""
    gen = torch.Generator().manual_seed(n * k)
    base = torch.randint(-128, 128, (2 * n, 3 * k), dtype=torch.int8, generator=gen)
    strided = base[::2, ::3]
    rows, columns = strided.contiguous(), strided.t().contiguous().t()
    packed = [amx_gemm.pack(w).data for w in (strided, rows, columns)]
    assert torch.equal(packed[0], packed[1])
    assert torch.equal(packed[0], packed[2])
    # Every value once, the rest (columns to 32, K to 64) zeros.
    assert packed[0].numel() == -(-n // 32) * 32 * -(-k // 64) * 64
    assert sorted(packed[0][packed[0] != 0].tolist()) == sorted(rows[rows != 0].tolist())


@needs_amx
def test_an_empty_reduction_gives_zeros() -> None:
    packed = amx_gemm.pack(torch.zeros((16, 0), dtype=torch.int8))
    out = torch.full((3, 16), 7, dtype=torch.int32)
    assert amx_gemm.mm(torch.zeros((3, 0), dtype=torch.int8), packed, out=out).eq(0).all()


@needs_amx
def test_a_packing_for_one_call_reuses_a_buffer() -> None:
    """``reuse``: the thread's buffer for a call's operand (a matmul's right operand, an im2col
    matrix), whose packing is as good as a new one's; the activations take a buffer of their
    own."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randint(-128, 128, (20, 30), dtype=torch.int8, generator=gen)
    a = torch.randint(-128, 128, (7, 30), dtype=torch.int8, generator=gen)
    kept: dict[str, object] = {}

    def run() -> None:
        first = amx_gemm.pack(w, reuse=True)
        assert torch.equal(first.data, amx_gemm.pack(w).data)
        again = amx_gemm.pack(w.flip(0), reuse=True)
        kept["same buffer"] = again.data.data_ptr() == first.data.data_ptr()
        kept["product"] = amx_gemm.mm(a, again).tolist()
        kept["slots"] = sorted(slot for _, slot in host._scratch.bufs)

    thread = threading.Thread(target=run)  # a fresh thread: buffers of its own
    thread.start()
    thread.join()
    assert kept["same buffer"]
    assert kept["product"] == golden.gemm_i32(a.tolist(), w.flip(0).tolist())
    assert kept["slots"] == [host.AMX_A_SLOT, host.AMX_PACK_SLOT]


@needs_amx
def test_on_a_cpu_with_amx_auto_takes_it_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    assert host_gemm.kernel() == "amx"
    assert host_gemm.describe().startswith("amx (auto: AMX's int8 tiles on this CPU)")


@needs_amx
@pytest.mark.skipif(not host_gemm.int_mm_is_exact(), reason="torch._int_mm is not exact here")
def test_products_without_a_kept_weight_take_int_mm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A right operand new on every call (attention's, a convolution's) would be packed on every
    call: ``int_mm`` computes those, the kept weights' products stay on ``amx``, and the header
    says so."""
    calls: list[str] = []
    real_int_mm, real_mm = torch._int_mm, amx_gemm.mm
    monkeypatch.setattr(
        torch, "_int_mm", lambda *a, **k: calls.append("int_mm") or real_int_mm(*a, **k)
    )
    monkeypatch.setattr(amx_gemm, "mm", lambda *a, **k: calls.append("amx") or real_mm(*a, **k))
    gen = torch.Generator().manual_seed(4)
    a = torch.randint(-128, 128, (9, 70), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (33, 70), dtype=torch.int8, generator=gen)
    expected = a.long() @ w.long().t()
    with host_gemm.forced("amx"):
        assert host_gemm.kernel_for(70) == "int_mm"
        assert host_gemm.kernel_for(70, kept=True) == "amx"
        assert host_gemm.kernel_for(1) == "amx"  # K = 1: no int_mm (INT_MM_MIN_K)
        assert torch.equal(host_gemm.mm_i32(a, w).long(), expected)
        assert torch.equal(host_gemm.bmm_i32(a[None], w[None]).long()[0], expected)
        assert calls == ["int_mm", "int_mm"]
        assert torch.equal(host_gemm.mm_i32(a, w, w_static=True).long(), expected)
        assert calls[2:] == ["amx"]
        assert "; int_mm for products without a kept weight" in host_gemm.describe()


def test_without_it_auto_takes_another_and_a_direct_call_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A library built without AMX (or a process the OS denies the tiles): ``auto`` takes the
    kernel it took before, forcing ``amx`` is an error naming the reason."""
    native = host_passes.built()
    if native is None:
        pytest.skip(f"no native library: {host_passes.build_detail()}")
    monkeypatch.setattr(host_passes, "built", lambda: native._replace(amx_built=False))
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    assert not amx_gemm.available()
    assert "amx" not in host_gemm.available_kernels()
    assert host_gemm.kernel() != "amx"
    reason = "the native library was built without AMX (this CPU or its compiler has none)"
    assert amx_gemm.unavailable_reason() == reason
    with pytest.raises(RuntimeError, match="amx host GEMM was forced, but the amx kernel is not"):
        host_gemm.forced("amx").__enter__()
    monkeypatch.setenv(host_gemm.ENV_VAR, "amx")
    with pytest.raises(RuntimeError, match=r"^asic: \$ASIC_HOST_GEMM=amx, but the amx kernel is "):
        host_gemm.kernel()
    with pytest.raises(RuntimeError, match=r"^asic: the amx kernel is not available: the native"):
        amx_gemm.pack(torch.zeros((2, 2), dtype=torch.int8))


@needs_amx
def test_a_kernel_whose_self_check_fails_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amx_gemm, "_exact", lambda native: False)
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    assert not amx_gemm.available()
    assert amx_gemm.unavailable_reason() == "its self-check product was not exact"
    assert host_gemm.kernel() != "amx"


@needs_amx
def test_a_process_linux_denies_the_tiles_never_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amx_gemm, "_granted", lambda native: False)
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    assert not amx_gemm.available()
    assert amx_gemm.unavailable_reason().startswith("Linux does not grant this process AMX's")
    assert host_gemm.kernel() != "amx"


@needs_amx
@pytest.mark.parametrize(("rows", "n"), [(5, 0), (0, 7)])
def test_a_linear_without_outputs_or_rows_writes_nothing(rows: int, n: int) -> None:
    """An ``nn.Linear(k, 0)`` (or no rows) reaches the fused linear's GEMM with nothing to do."""
    k = 64
    packed = amx_gemm.pack(torch.zeros((n, k), dtype=torch.int8))
    gemm = host_passes.NativeGemm("amx", packed.data, n, k, 1, lambda: None)
    x = torch.randn(rows, k)
    y = host_passes.linear(x, None, 1e-7, lambda: (torch.ones(n), gemm))
    if rows:  # the native passes take no rows: the caller's general path does
        assert y is not None
        assert y.shape == (rows, 0)
    assert amx_gemm.mm(torch.zeros((rows, k), dtype=torch.int8), packed).shape == (rows, n)
