"""The ``int16`` host kernel against the golden model: every tile edge (rows, panel columns, an
odd K), every layout it takes, one and two threads; and what a process without it picks."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asic_backend.sim import host, host_gemm, host_passes, int16_gemm, numerics
from tests.asic import golden
from tests.asic.test_host_passes import torch_threads

pytestmark = pytest.mark.skipif(
    not int16_gemm.available(), reason=f"no int16 kernel: {int16_gemm.unavailable_reason()}"
)

INT8 = st.integers(-128, 127)


@st.composite
def operands(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    # Past a micro-tile (6 rows) and a panel (16 columns) on each side, K odd and even.
    m, k, n = draw(st.integers(0, 14)), draw(st.integers(0, 40)), draw(st.integers(0, 37))
    extreme = draw(st.booleans())  # -128 · -128 everywhere: the largest pair sums
    values = st.just(-128) if extreme else INT8
    a = draw(st.lists(st.lists(values, min_size=k, max_size=k), min_size=m, max_size=m))
    w = draw(st.lists(st.lists(values, min_size=k, max_size=k), min_size=n, max_size=n))
    return (
        torch.tensor(a, dtype=torch.int8).reshape(m, k),
        torch.tensor(w, dtype=torch.int8).reshape(n, k),
    )


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
    got = int16_gemm.mm(a, int16_gemm.pack(w))
    assert got.dtype == torch.int32
    assert got.tolist() == golden.gemm_i32(a.tolist(), w.tolist())
    assert got.shape == (a.shape[0], w.shape[0])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        # 31 panels of 16 columns by K = 1030: 3 groups of 15 (256 KiB each); 70 · 1030 widened
        # values pass the 2^16 from which the widening is shared too.
        (70, 1029, 485),
        # 3 panels, one group: the threads share its 34 blocks of rows.
        (200, 128, 40),
    ],
    ids=["groups", "rows"],
)
def test_a_gemm_shared_among_threads_is_exact_and_writes_into_out_rows(
    threads: int, m: int, k: int, n: int
) -> None:
    """Past the size where the work is shared, into a caller's accumulator whose rows lie apart
    (a slice of a wider one): every value the exact product, and nothing beside it written."""
    gen = torch.Generator().manual_seed(threads)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    assert m * n * k >= int16_gemm.PARALLEL_MIN_MACS
    wide = torch.full((m, n + 7), 7, dtype=torch.int32)
    with torch_threads(threads):
        result = int16_gemm.mm(a, int16_gemm.pack(w), out=wide[:, 3 : n + 3])
    assert result.data_ptr() == wide[:, 3:].data_ptr()
    assert torch.equal(result.long(), a.long() @ w.long().t())
    assert (wide[:, :3] == 7).all()
    assert (wide[:, n + 3 :] == 7).all()


def test_bad_operands_are_refused_in_one_line() -> None:
    w = int16_gemm.pack(torch.zeros((4, 8), dtype=torch.int8))
    a = torch.zeros((2, 8), dtype=torch.int8)
    with pytest.raises(ValueError, match=r"into torch.int32 \[2, 2\], not int32 \[2, 4\]$"):
        int16_gemm.mm(a, w, out=torch.zeros((2, 2), dtype=torch.int32))
    with pytest.raises(ValueError, match=r"activations as a 2-D int8 CPU tensor, got torch.uint8"):
        int16_gemm.mm(a.to(torch.uint8), w)
    with pytest.raises(ValueError, match=r"a weight as a 2-D int8 CPU tensor, got torch.float32"):
        int16_gemm.pack(torch.zeros((4, 8)))
    # Rows over one another (stride 0): the kernel does not write them; torch's copy refuses.
    out = torch.zeros((1, 4), dtype=torch.int32).expand(2, 4)
    with pytest.raises(RuntimeError, match="refers to a single memory location"):
        int16_gemm.mm(a, w, out=out)


def test_the_longest_reduction_stays_exact() -> None:
    """K = INT_MM_MAX_K of -128 · -128: 2^31 − 2^14, the int32 path's largest sum."""
    k = numerics.INT_MM_MAX_K
    a = torch.full((2, k), -128, dtype=torch.int8)
    w = torch.full((17, k), -128, dtype=torch.int8)
    w[1] = 127
    got = int16_gemm.mm(a, int16_gemm.pack(w))
    assert torch.equal(got.long(), a.long() @ w.long().t())


def test_a_weight_of_another_length_is_refused() -> None:
    packed = int16_gemm.pack(torch.zeros((4, 8), dtype=torch.int8))
    with pytest.raises(ValueError, match=r"int16 GEMM of \[2, 9\] by a packed \[4, 8\]"):
        int16_gemm.mm(torch.zeros((2, 9), dtype=torch.int8), packed)


def test_operands_without_data_take_float32() -> None:
    """A meta operand has nothing to pack: the kernel hands such a GEMM to ``float32``."""
    a = torch.empty((3, 5, 8), dtype=torch.int8, device="meta")
    with host_gemm.forced("int16"):
        assert host_gemm.kernel_for(8, a) == "float32"
        assert host_gemm.bmm_i32(a, a).shape == (3, 5, 5)


@pytest.fixture
def without_int16(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process whose native library has no int16 kernel (no AVX2), and no int8 unit."""
    native = host_passes.built()
    assert native is not None
    monkeypatch.setattr(host_passes, "built", lambda: native._replace(int16_available=False))
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: False)
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    yield
    monkeypatch.undo()


def test_without_it_auto_takes_float32_and_says_why(
    without_int16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host_gemm.kernel() == "float32"
    assert host_gemm.describe() == (
        "float32 (auto: no int8 dot-product unit on this CPU; int16: the native library was "
        "built without AVX2 (this CPU or its compiler has none))"
    )
    with pytest.raises(RuntimeError, match="int16 host GEMM was forced, but the int16 kernel"):
        host_gemm.forced("int16").__enter__()
    monkeypatch.setenv(host_gemm.ENV_VAR, "int16")
    with pytest.raises(
        RuntimeError, match=r"^asic: \$ASIC_HOST_GEMM=int16, but the int16 kernel is not "
    ):
        host_gemm.kernel()


def test_with_it_auto_takes_it_where_there_is_no_int8_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: False)
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    assert host_gemm.kernel() == "int16"
    assert host_gemm.describe() == "int16 (auto: no int8 dot-product unit on this CPU)"


@pytest.mark.parametrize(("n", "k"), [(16, 16), (48, 131), (37, 64), (5, 3)])
def test_every_layout_packs_to_the_same_bytes(n: int, k: int) -> None:
    """Rows of unit stride (a linear's weight, attention's K) and columns of unit stride (a
    ``[K, N]``'s transposed view, attention's V) each take a vector path; any other layout is
    packed element by element. All three must give the same packing."""
    gen = torch.Generator().manual_seed(n * k)
    base = torch.randint(-128, 128, (2 * n, 3 * k), dtype=torch.int8, generator=gen)
    strided = base[::2, ::3]  # neither stride 1: element by element
    rows, columns = strided.contiguous(), strided.t().contiguous().t()
    assert rows.stride(1) == 1
    assert columns.stride(0) == 1
    packed = [int16_gemm.pack(w).data for w in (strided, rows, columns)]
    assert torch.equal(packed[0], packed[1])
    assert torch.equal(packed[0], packed[2])


@pytest.mark.parametrize(
    ("c", "size", "kernel", "stride", "dilation", "padding"),
    [
        # Output rows of 32 points: every panel one run of input bytes.
        (4, (6, 34), (3, 3), (1, 1), (1, 1), [(0, 0), (0, 0)]),
        # Rows of 20: panels wrap to the next row once (two runs); the last one is partial.
        (3, (9, 18), (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
        # Rows of 5: a panel over four rows, value by value; an odd K (3 · 1 · 3), dilation 2.
        (3, (7, 9), (1, 3), (1, 1), (1, 2), [(2, 0), (0, 1)]),
        # A 1-D conv, as one of height 1 (Whisper's): a single output row of 40 points.
        (5, (1, 40), (1, 3), (1, 1), (1, 1), [(0, 0), (1, 1)]),
        # Stride 2 (ResNet's downsampling): rows of 20 points, bytes 2 apart, wrapping once.
        (3, (9, 40), (3, 3), (2, 2), (1, 1), [(1, 1), (1, 1)]),
        # Stride 2 by rows only, 3 by columns (value by value), and a 7x7 kernel.
        (2, (12, 50), (7, 7), (2, 3), (1, 1), [(3, 3), (3, 3)]),
        # Dilation 2 by rows, 3 by columns, rows of 20.
        (3, (11, 26), (3, 3), (1, 1), (2, 3), [(0, 0), (0, 0)]),
        # Rows of exactly 8 (two runs a panel, none partial) and of exactly 16 (one run).
        (2, (6, 10), (3, 3), (1, 1), (1, 1), [(0, 0), (0, 0)]),
        (2, (6, 18), (3, 3), (1, 1), (1, 1), [(0, 0), (0, 0)]),
    ],
    ids=[
        "one-run",
        "two-runs",
        "many-runs",
        "1d",
        "stride-2",
        "stride-3",
        "dilated",
        "ow-8",
        "ow-16",
    ],
)
def test_a_conv_input_packs_as_its_im2col_matrix(
    c: int,
    size: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
    padding: list[tuple[int, int]],
) -> None:
    """``pack_conv`` of a padded input gives the bytes ``pack`` gives for the im2col matrix
    (``F.unfold``'s, K in the weight's order), padding value included, for every sample."""
    gen = torch.Generator().manual_seed(c)
    x = torch.randint(-128, 128, (2, c, *size), dtype=torch.int8, generator=gen)
    padded = int16_gemm.conv_input(x, padding, value=-7)
    cols = torch.nn.functional.unfold(padded.float(), kernel, dilation=dilation, stride=stride)
    for n in range(2):
        matrix = cols[n].t().to(torch.int8)  # [points, C·KH·KW]
        got = int16_gemm.pack_conv(padded[n], kernel, stride, dilation)
        assert (got.n, got.k) == tuple(matrix.shape)
        assert torch.equal(got.data, int16_gemm.pack(matrix).data)


def test_a_conv_packing_shared_between_two_threads_is_the_same() -> None:
    """Past the size where the packing is shared (panels split between the threads)."""
    x = torch.randint(-128, 128, (1, 32, 38, 38), dtype=torch.int8)
    padded = int16_gemm.conv_input(x, [(1, 1), (1, 1)], value=3)
    assert int16_gemm.PARALLEL_MIN_MACS <= 38 * 38 * 32 * 9  # values packed: shared
    packed = []
    for threads in (1, 2):
        with torch_threads(threads):
            packed.append(int16_gemm.pack_conv(padded[0], (3, 3), (1, 1), (1, 1)).data.clone())
    assert torch.equal(packed[0], packed[1])
    cols = torch.nn.functional.unfold(padded.float(), (3, 3))[0].t().to(torch.int8)
    assert torch.equal(packed[0], int16_gemm.pack(cols).data)


def test_a_conv_packing_needs_its_margins_and_a_fitting_kernel() -> None:
    x = torch.zeros((1, 2, 4, 4), dtype=torch.int8)
    with pytest.raises(ValueError, match="reads 32 bytes on either side of its input"):
        int16_gemm.pack_conv(x[0], (3, 3), (1, 1), (1, 1))
    padded = int16_gemm.conv_input(x, [(0, 0), (0, 0)], value=0)
    with pytest.raises(
        ValueError, match="a 5x3 kernel of dilation 1x1 and stride 1x1 does not fit"
    ):
        int16_gemm.pack_conv(padded[0], (5, 3), (1, 1), (1, 1))
    with pytest.raises(ValueError, match=r"takes a contiguous 3-D int8 input, got torch\.float32"):
        int16_gemm.pack_conv(padded[0].float(), (3, 3), (1, 1), (1, 1))
    with pytest.raises(ValueError, match=r"input, got non-contiguous torch\.int8 "):
        int16_gemm.pack_conv(padded[0].transpose(1, 2), (3, 3), (1, 1), (1, 1))
    # No channels: an empty sum, whatever the margins.
    empty = int16_gemm.conv_input(torch.zeros((2, 0, 4, 4), dtype=torch.int8), [(1, 1)] * 2, 0)
    packed = int16_gemm.pack_conv(empty[1], (3, 3), (1, 1), (1, 1))
    assert (packed.n, packed.k) == (16, 0)
    assert int16_gemm.mm(torch.zeros((3, 0), dtype=torch.int8), packed).eq(0).all()


def test_a_packing_for_one_call_reuses_a_buffer_below_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``reuse``: the thread's buffer for a call's operand (a dynamic right operand, an im2col
    matrix), whose packing is as good as a new one's; past the cap, no buffer is kept."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randint(-128, 128, (20, 30), dtype=torch.int8, generator=gen)
    a = torch.randint(-128, 128, (7, 30), dtype=torch.int8, generator=gen)
    kept: dict[str, object] = {}

    def run() -> None:
        first = int16_gemm.pack(w, reuse=True)
        assert torch.equal(first.data, int16_gemm.pack(w).data)
        again = int16_gemm.pack(w.flip(0), reuse=True)
        kept["same buffer"] = again.data.data_ptr() == first.data.data_ptr()
        kept["product"] = int16_gemm.mm(a, again).tolist()
        monkeypatch.setattr(host, "SCRATCH_OPERAND_MAX_BYTES", first.data.numel() - 1)
        past = int16_gemm.pack(w, reuse=True)
        kept["past the cap"] = past.data.data_ptr() != first.data.data_ptr()
        kept["slots"] = sorted(slot for _, slot in host._scratch.bufs)

    thread = threading.Thread(target=run)  # a fresh thread: buffers of its own
    thread.start()
    thread.join()
    assert kept["same buffer"]
    assert kept["product"] == golden.gemm_i32(a.tolist(), w.flip(0).tolist())
    assert kept["past the cap"]
    assert kept["slots"] == [2, 3]  # the widened activations', and the one packing's


def test_the_choice_follows_the_build_without_a_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library rebuilt without the kernel (``host_passes.reset()`` and another compiler) takes
    ``auto`` to ``float32`` at the next GEMM, and a direct call says why."""
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: False)
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    assert host_gemm.kernel() == "int16"
    native = host_passes.built()
    assert native is not None
    monkeypatch.setattr(host_passes, "built", lambda: native._replace(int16_available=False))
    assert host_gemm.kernel() == "float32"
    with pytest.raises(RuntimeError, match=r"^asic: the int16 kernel is not available: the nat"):
        int16_gemm.pack(torch.zeros((2, 2), dtype=torch.int8))
