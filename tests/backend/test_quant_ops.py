"""The high-level ``asic::`` ops: schema/fake/AOT checks, exactness against their sources."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import asic_backend.lower.accounting
import asic_backend.ops.attention
import asic_backend.ops.conv  # noqa: F401  (the asic:: ops checked here)
from asic_backend import make_backend
from asic_backend.ops import linear as quant_ops
from asic_backend.sim import host_gemm, host_passes, numerics
from asic_backend.sim.device import Device, HostFallback, HostFallbackStats, get_device

ops = torch.ops.asic


def _opcheck_cases(key: str) -> list[tuple[Any, tuple[Any, ...]]]:
    i8 = torch.int8
    w_q = torch.randint(-127, 128, (32, 64), dtype=i8)
    return [
        (
            ops.dyn_linear.default,
            (torch.randn(3, 5, 64), torch.randn(32, 64), None, False, False, key),
        ),
        (
            ops.dyn_linear.default,
            (torch.randn(7, 64), torch.randn(64, 32), torch.randn(32), True, True, key),
        ),
        (ops.dyn_matmul.default, (torch.randn(2, 3, 4, 16), torch.randn(3, 16, 5), key)),
        (
            ops.dyn_qlinear.default,
            (
                torch.randn(4, 64),
                w_q,
                torch.rand(32, 1),
                torch.randn(32),
                None,
                False,
                True,
                -128,
                127,
                quant_ops.F32_EPS,
                True,
                key,
            ),
        ),
        (
            ops.qlinear.default,
            (
                torch.randint(0, 256, (6, 64), dtype=torch.uint8),
                torch.tensor(0.02, dtype=torch.float64),
                torch.tensor(130),
                w_q,
                torch.rand(32) * 0.01,
                torch.zeros(32, dtype=torch.int64),
                torch.randn(32),
                0.05,
                3,
                0,
                255,
                torch.uint8,
                key,
            ),
        ),
        (
            ops.host_fallback.default,
            (torch.randn(3, 4), [torch.randn(4, 5)], "mm", [], key, "mm", "why", "f.py", 3, "f(x)"),
        ),
        (
            ops.dyn_conv.default,
            (
                torch.randn(2, 4, 9, 9),
                torch.randn(6, 2, 3, 3),
                torch.randn(6),
                [2, 1],
                [1, 1, 0, 1],
                [1, 2],
                2,
                False,
                [0, 0],
                True,
                key,
            ),
        ),
        (
            ops.dyn_conv.default,
            (
                torch.randn(4, 7),
                torch.randn(4, 3, 3),
                None,
                [2],
                [1, 1],
                [1],
                1,
                True,
                [1],
                False,
                key,
            ),
        ),
        (
            ops.qconv.default,
            (
                torch.randint(0, 256, (2, 4, 6, 6), dtype=torch.uint8),
                torch.tensor(0.02, dtype=torch.float64),
                torch.tensor(130),
                torch.randint(-127, 128, (8, 4, 3, 3), dtype=i8),
                torch.rand(8) * 0.01,
                torch.zeros(8, dtype=torch.int64),
                torch.randn(8),
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                1,
                False,
                [0, 0],
                0.05,
                3,
                0,
                255,
                torch.uint8,
                key,
            ),
        ),
        (
            ops.dyn_sdpa.default,
            (
                torch.randn(2, 4, 5, 8),
                torch.randn(2, 2, 7, 8),
                torch.randn(2, 2, 7, 6),
                torch.rand(5, 7) > 0.2,
                False,
                0.3,
                True,
                key,
            ),
        ),
    ]


def test_ops_pass_opcheck(device: Device) -> None:
    for op, args in _opcheck_cases(device.key):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


# -- bit-exact replicas of TorchAO's activation quantization ------------------------------------

_rows = st.integers(1, 6)
# k >= 2: for k == 1 TorchAO reduces over the whole tensor (its block [1, 1] means "no reduction").
_cols = st.integers(2, 40)


@settings(max_examples=60, deadline=None)
@given(
    m=_rows,
    k=_cols,
    symmetric=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    scale=st.sampled_from([1e-6, 1.0, 300.0]),
    offset=st.sampled_from([0.0, 2.0, -5.0]),
    seed=st.integers(0, 2**16),
)
def test_activation_quantization_is_torchao_bit_exact(
    m: int, k: int, symmetric: bool, dtype: torch.dtype, scale: float, offset: float, seed: int
) -> None:
    pytest.importorskip("torchao")
    from torchao.quantization.quant_primitives import (
        MappingType,
        choose_qparams_affine,
        quantize_affine,
    )

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * scale + offset).to(dtype)
    x[0, 0] = 0.0  # an exact zero in every example (the zero point must map it exactly)
    mapping = MappingType.SYMMETRIC if symmetric else MappingType.ASYMMETRIC
    # Int8Tensor.from_hp's call, verbatim.
    ref_scale, ref_zp = choose_qparams_affine(
        input=x,
        mapping_type=mapping,
        block_size=[1, k],
        target_dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        scale_dtype=torch.float32,
        zero_point_dtype=torch.int8,
        keepdim=True,
        eps=quant_ops.F32_EPS,
    )
    ref_q = quantize_affine(x, [1, k], ref_scale, ref_zp, torch.int8, -128, 127)

    scale_t, zp = quant_ops.choose_qparams_rows(x, symmetric=symmetric)
    q = quant_ops.quantize_rows(x, scale_t, zp, -128, 127)
    assert torch.equal(scale_t, ref_scale.reshape(m, 1))
    assert torch.equal(zp, ref_zp.reshape(m, 1).to(torch.int32))
    assert torch.equal(q, ref_q)


def _by_chunks_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every host pass by chunks of 3 rows of 37 values (fewer at the end)."""
    monkeypatch.setattr(numerics, "CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(numerics, "CHUNK_BYTES", 3 * 37 * 4)
    monkeypatch.setattr(numerics, "CAST_FIRST_MIN_NUMEL", 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["new", "consume", "out", "one value a row"])
@pytest.mark.usefixtures("aten_passes")
def test_symmetric_quantization_by_chunks_of_rows_is_the_whole_ones(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, form: str
) -> None:
    """Bit for bit, each chunk's rows with their own scales, into the int8 result, the caller's
    ``out`` or (consumed) ``x``; a row of all zeros takes the eps scale in either form."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(11, 1 if form == "one value a row" else 37, generator=g) * 40).to(dtype)
    x[4] = 0.0

    def run() -> tuple[torch.Tensor, ...]:
        work = x.clone()
        out = torch.empty(work.shape) if form == "out" else None
        q, scale = quant_ops.quantize_sym_rows(work, consume=form == "consume", out=out)
        assert q is out or out is None
        return q, scale, work

    whole = run()
    _by_chunks_of_rows(monkeypatch)
    for got, want in zip(run(), whole, strict=True):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("scale_dtype", [torch.float32, None], ids=["f32-scale", "bf16-scale"])
@pytest.mark.usefixtures("aten_passes")
def test_torchao_quantization_by_chunks_of_rows_is_the_whole_ones(
    monkeypatch: pytest.MonkeyPatch,
    symmetric: bool,
    per_token: bool,
    scale_dtype: torch.dtype | None,
) -> None:
    """``quantize_rows`` as ``asic::dyn_qlinear`` calls it: per-row or per-tensor scales and
    zero points (sliced, or broadcast, per chunk), in bfloat16 where TorchAO keeps the scale in
    the input's dtype, and PT2E's uint8 range."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(11, 37, generator=g) * 3 + 1).to(torch.bfloat16)
    qmin, qmax = (-128, 127) if symmetric else (0, 255)
    scale, zp = quant_ops.choose_qparams_rows(
        x,
        symmetric=symmetric,
        qmin=qmin,
        qmax=qmax,
        scale_dtype=scale_dtype,
        per_tensor=not per_token,
    )
    whole = quant_ops.quantize_rows(x, scale, None if symmetric else zp, qmin, qmax)
    _by_chunks_of_rows(monkeypatch)
    chunked = quant_ops.quantize_rows(x, scale, None if symmetric else zp, qmin, qmax)
    assert chunked.dtype == torch.int8
    assert torch.equal(chunked, whole)


@pytest.mark.usefixtures("aten_passes")
def test_a_linear_by_chunks_of_rows_gives_the_same_bits_and_counts(
    monkeypatch: pytest.MonkeyPatch, device: Device
) -> None:
    g = torch.Generator().manual_seed(4)
    x, w, b = (torch.randn(*shape, generator=g) for shape in ((2, 11, 37), (13, 37), (13,)))
    whole = ops.dyn_linear(x, w, b, False, False, device.key)
    counts = device.snapshot()
    device.reset()
    _by_chunks_of_rows(monkeypatch)
    chunked = ops.dyn_linear(x, w, b, False, False, device.key)
    assert torch.equal(chunked, whole)
    assert device.snapshot() == counts
    assert counts.dut_ops == 1


# -- the float path: weight cache ---------------------------------------------------------------


def test_weight_cache_follows_in_place_writes(device: Device) -> None:
    w = torch.randn(16, 32)
    x = torch.randn(4, 32)
    first = ops.dyn_linear(x, w, None, False, True, device.key)
    assert torch.equal(first, ops.dyn_linear(x, w, None, False, True, device.key))
    # Same storage, new _version: the cached int8 copy is stale. (x2 scales exactly: same int8
    # weights, doubled scales, so the result must double exactly.)
    w.mul_(2.0)
    second = ops.dyn_linear(x, w, None, False, True, device.key)
    uncached = ops.dyn_linear(x, w, None, False, False, device.key)
    assert torch.equal(second, uncached)
    assert torch.equal(second, 2.0 * first)


@pytest.mark.parametrize("how", ["load_state_dict", "an optimizer step", "copy_ under no_grad"])
def test_a_compiled_models_weights_written_in_place_are_quantized_again(
    device: Device, how: str
) -> None:
    """What a user does to a model between calls bumps the weight's version: the next call
    quantizes it again, native path or not."""
    model = torch.nn.Linear(16, 8)
    compiled = torch.compile(model, backend="asic")
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
    if how == "load_state_dict":
        model.load_state_dict(torch.nn.Linear(16, 8).state_dict())
    elif how == "an optimizer step":
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model(x).sum().backward()
        opt.step()
    else:
        with torch.no_grad():
            model.weight.copy_(torch.randn(8, 16))
    with torch.no_grad():
        got = compiled(x)
        fresh = ops.dyn_linear(x, model.weight, model.bias, False, False, device.key)
    assert torch.equal(got, fresh)


def test_a_write_through_data_is_seen_after_clear_caches(device: Device) -> None:
    """``p.data`` is a tensor with a version counter of its own: a write through it does not
    bump the parameter's, so the kept quantized weight stays until the caches are cleared (as
    docs/device.md says)."""
    from asic_backend.sim.tensor_cache import clear_caches

    w, x = torch.nn.Parameter(torch.randn(8, 16)), torch.randn(4, 16)
    with torch.no_grad():
        before = ops.dyn_linear(x, w, None, False, True, device.key)
        w.data.mul_(2.0)
        assert torch.equal(ops.dyn_linear(x, w, None, False, True, device.key), before)
        clear_caches()
        assert torch.equal(ops.dyn_linear(x, w, None, False, True, device.key), 2.0 * before)


def test_inference_tensors_are_not_cached(device: Device) -> None:
    with torch.inference_mode():
        w = torch.randn(16, 32)
        x = torch.randn(4, 32)
        first = ops.dyn_linear(x, w, None, False, True, device.key)
        w.mul_(4.0)  # no version counter to see this: only recomputation is safe
        second = ops.dyn_linear(x, w, None, False, True, device.key)
    assert torch.equal(second, 4.0 * first)


# -- the float path: a kept weight's linear in three native steps -------------------------------

STATIC_KERNELS = [k for k in host_gemm.available_kernels() if k in host_gemm.STATIC_KERNELS]


@pytest.fixture
def native_linears(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each call of ``host_passes.linear`` (the native path's) gave the result."""
    taken: list[bool] = []
    real = host_passes.linear

    def watch(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(host_passes, "linear", watch)
    return taken


def _general_path(*args: Any) -> torch.Tensor:
    """``dyn_linear`` the general way: quantize, ``run_mm_i32``, rescale, each step checked."""
    return quant_ops._dyn_linear(*args, quant_ops._weight_mm)


@pytest.mark.parametrize("transposed", [False, True], ids=["nk", "kn"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(
    ("shape", "n"),
    [
        ((1, 40), 24),
        ((7, 40), 24),
        ((300, 256), 24),
        ((2, 3, 40), 24),
        ((5, 40), 1),
        ((3, 41), 20),  # odd K: the int16 kernel's last pair is half padding
        ((9, 33), 17),  # more rows than a micro-tile, a panel and one column
    ],
)
@pytest.mark.parametrize("kernel", STATIC_KERNELS)
def test_a_kept_weights_linear_takes_the_native_path_with_the_general_paths_bits_and_counts(
    device: Device,
    native_linears: list[bool],
    kernel: str,
    shape: tuple[int, ...],
    n: int,
    bias: bool,
    transposed: bool,
) -> None:
    """Decode (one row, seven) and prefill rows (300 of 256, two threads), a batch of rows, one
    output (a value head), a weight stored ``[K, N]`` (GPT-2's Conv1D): one native call each,
    the same bits and the same counts as the general path's and the aten kernels'."""
    g = torch.Generator().manual_seed(len(shape) * shape[0])
    k = shape[-1]
    x = torch.randn(shape, generator=g) * 2
    w = torch.randn(k, n, generator=g) if transposed else torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    args = (x, w, b, transposed, True, device.key)
    results = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with host_gemm.forced(kernel):
            for run in (lambda: ops.dyn_linear(*args), lambda: _general_path(*args)):
                device.reset()
                results.append((run(), device.snapshot()))
            with host_passes.forced("aten"):
                aten = ops.dyn_linear(*args)
    finally:
        torch.set_num_threads(before)
    (native, native_counts), (general, general_counts) = results
    # The op's call takes it; the general path never asks; under the aten passes it declines.
    assert native_linears == [True, False]
    assert native.shape == (*shape[:-1], n)
    assert native.dtype == torch.float32
    assert torch.equal(native, general)
    assert torch.equal(native, aten)
    assert native_counts == general_counts
    assert native_counts.dut_ops == 1


_TILE_ROWS, _TILE_COLUMNS = host_gemm.INT_MM_TILE_MIN_ROWS, host_gemm.INT_MM_TILE_MIN_COLUMNS


@pytest.mark.skipif(not host_gemm.int_mm_is_exact(), reason="torch._int_mm is not exact here")
@pytest.mark.parametrize("layout", host_gemm.INT_MM_LAYOUTS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(
    ("rows", "n", "transposed", "tiled"),
    [
        (_TILE_ROWS - 1, _TILE_COLUMNS + 28, False, False),
        (_TILE_ROWS, _TILE_COLUMNS + 28, False, True),
        (_TILE_ROWS + 44, _TILE_COLUMNS - 1, False, False),
        (_TILE_ROWS + 44, _TILE_COLUMNS, True, True),  # a weight stored [K, N]
        (2 * host_gemm.INT_MM_TILE + 1, _TILE_COLUMNS + 1, False, True),  # blocks of rows
    ],
)
def test_a_prefill_linear_by_int_mm_runs_in_tiles_with_the_general_paths_bits_and_counts(
    device: Device,
    monkeypatch: pytest.MonkeyPatch,
    rows: int,
    n: int,
    transposed: bool,
    tiled: bool,
    bias: bool,
    layout: str,
) -> None:
    """From INT_MM_TILE_MIN_ROWS rows and INT_MM_TILE_MIN_COLUMNS columns on, the GEMM and its
    rescale run tile by tile, in either weight layout (tiles of the ``[N, K]`` rows, or column
    slices of the ``[K, N]`` copy), in blocks of rows past INT_MM_TILE, the last tile a column
    wide: the general path's bits, and one GEMM counted, as before; ``untiled()``'s too."""
    monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, layout)
    tiles: list[int] = []
    spans: dict[tuple[int, int], list[int]] = {}  # each tile's rows, by its columns
    real = host_passes._linear_tiled

    def spy(native: Any, q: torch.Tensor, x_scale: torch.Tensor, gemm: Any, *rest: Any) -> Any:
        tiles.append(rows)

        def tile(block: torch.Tensor, j0: int, j1: int) -> torch.Tensor:
            spans.setdefault((j0, j1), []).append(block.shape[0])
            return gemm.tile(block, j0, j1)

        return real(native, q, x_scale, gemm._replace(tile=tile), *rest)

    monkeypatch.setattr(host_passes, "_linear_tiled", spy)
    g = torch.Generator().manual_seed(rows + n)
    x = torch.randn(rows, 24, generator=g) * torch.rand(rows, 1, generator=g) * 5
    w = torch.randn((24, n) if transposed else (n, 24), generator=g)
    b = torch.randn(n, generator=g) if bias else None
    args = (x, w, b, transposed, True)
    results = []
    with host_gemm.forced("int_mm"):
        for run in (ops.dyn_linear, _general_path):
            device.reset()
            results.append((run(*args, device.key), device.snapshot()))
        with host_gemm.untiled():
            whole = ops.dyn_linear(*args, device.key)
    (y, counts), (general, general_counts) = results
    assert tiles == ([rows] if tiled else [])  # host_gemm.untiled() took no tiles
    if tiled:  # at most INT_MM_TILE square, covering the output once
        columns = sorted(spans)
        assert [j0 for j0, _ in columns] == [0, *(j1 for _, j1 in columns[:-1])]
        assert columns[-1][1] == n
        assert all(j1 - j0 <= host_gemm.INT_MM_TILE for j0, j1 in columns)
        assert all(sum(blocks) == rows for blocks in spans.values())
        assert all(block <= host_gemm.INT_MM_TILE for blocks in spans.values() for block in blocks)
    assert torch.equal(y, general)
    assert torch.equal(whole, general)
    assert counts == general_counts
    assert counts.dut_ops == 1


@pytest.mark.skipif(not host_gemm.int_mm_is_exact(), reason="torch._int_mm is not exact here")
def test_a_compiled_models_wide_prefill_linear_runs_in_tiles_with_the_bits_of_one_call(
    device: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backend="asic"``: the wide linear of a model goes in tiles, the narrow one in one call;
    the outputs and the device's figures are those of the model run with no tiles."""
    tiles: list[int] = []
    real = host_passes._linear_tiled
    monkeypatch.setattr(host_passes, "_linear_tiled", lambda *a: tiles.append(1) or real(*a))
    wide = _TILE_COLUMNS + 28
    model = torch.nn.Sequential(
        torch.nn.Linear(24, wide), torch.nn.ReLU(), torch.nn.Linear(wide, 16)
    ).eval()
    compiled = torch.compile(model, backend=make_backend(), fullgraph=True)
    x = torch.randn(_TILE_ROWS + 44, 24)
    runs = []
    with torch.no_grad(), host_gemm.forced("int_mm"):
        for tiled in (True, False):
            device.reset()
            with contextlib.nullcontext() if tiled else host_gemm.untiled():
                runs.append((compiled(x), device.snapshot()))
    (y, counts), (whole, whole_counts) = runs
    assert tiles == [1]
    assert torch.equal(y, whole)
    assert counts == whole_counts
    assert counts.dut_ops == 2


@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("kernel", STATIC_KERNELS)
def test_the_inductor_hosts_gemm_by_a_kept_weight_gives_the_general_paths_bits(
    device: Device, kernel: str, rows: int
) -> None:
    """``asic::dyn_weight_mm`` (what ``host="inductor"`` calls between its fused passes) by a
    kept weight multiplies by its kept operand: the bits and counts of the weight not kept."""
    g = torch.Generator().manual_seed(rows)
    x_q = torch.randint(-128, 128, (rows, 40), dtype=torch.int8, generator=g)
    w = torch.randn(24, 40, generator=g)
    results = []
    with host_gemm.forced(kernel):
        for kept in (True, False):
            device.reset()
            acc, scale = ops.dyn_weight_mm(x_q, w, False, kept, device.key)
            results.append((acc, scale, device.snapshot()))
    (acc, scale, counts), (acc_general, scale_general, counts_general) = results
    assert acc.dtype == torch.int32
    assert torch.equal(acc, acc_general)
    assert torch.equal(scale, scale_general)
    assert counts == counts_general
    assert counts.dut_ops == 1


@pytest.mark.parametrize("kernel", STATIC_KERNELS)
def test_a_kept_weight_of_another_k_is_the_general_paths_one_line(
    device: Device, kernel: str
) -> None:
    w = torch.randn(24, 40)
    with host_gemm.forced(kernel):
        ops.dyn_linear(torch.randn(3, 40), w, None, False, True, device.key)  # kept
        with pytest.raises(RuntimeError, match=r"the input's last dim \(41\) != the weight's"):
            ops.dyn_linear(torch.randn(3, 41), w, None, False, True, device.key)
    assert device.snapshot().dut_ops == 1


@pytest.mark.parametrize("cache_weight", [True, False], ids=["kept", "not kept"])
def test_the_inductor_hosts_gemm_refuses_activations_that_are_not_int8(
    device: Device, cache_weight: bool
) -> None:
    """The same one line by a kept weight as by one that is not (uint8 would run)."""
    with pytest.raises(TypeError, match=r"^asic: activations must be a 2-D int8 tensor"):
        ops.dyn_weight_mm(
            torch.zeros(3, 40, dtype=torch.uint8), torch.randn(24, 40), False, cache_weight,
            device.key,
        )  # fmt: skip
    assert device.snapshot().dut_ops == 0


@pytest.mark.parametrize(
    "what",
    [
        "not kept",
        "an inference weight",
        "the float32 kernel",
        "K past INT_MM_MAX_K",
        "bfloat16 activations",
        "a bfloat16 bias",
        *(f"a row of inf ({kernel})" for kernel in STATIC_KERNELS),
        "no rows",
        "the aten passes",
    ],
)
def test_what_the_native_linear_does_not_take_runs_the_general_path(
    device: Device, native_linears: list[bool], what: str
) -> None:
    """Each takes the general path, as before the native one existed: the same values, and one
    GEMM counted (none without rows)."""
    g = torch.Generator().manual_seed(9)
    # Past INT_MM_MAX_K a sum may leave int32: the general path sums in int64.
    k = numerics.INT_MM_MAX_K + 1 if what == "K past INT_MM_MAX_K" else 40
    x, b = torch.randn(5, k, generator=g), torch.randn(24, generator=g)
    if what == "an inference weight":
        with torch.inference_mode():
            w = torch.randn(24, k, generator=g)
    else:
        w = torch.randn(24, k, generator=g)
    kernel = "float32" if what == "the float32 kernel" else STATIC_KERNELS[0]
    if what == "bfloat16 activations":
        x = x.bfloat16()
    elif what == "a bfloat16 bias":
        b = b.bfloat16()
    elif what.startswith("a row of inf"):
        kernel = what.split("(")[1].rstrip(")")  # int16: inside its one native call
        x[2, 7] = float("inf")
    elif what == "no rows":
        x = x[:0]
    args = (x, w, b, False, what != "not kept", device.key)
    with (
        host_gemm.forced(kernel),
        host_passes.forced("aten" if what == "the aten passes" else "native"),
    ):
        got = ops.dyn_linear(*args)
        counts = device.snapshot()
        device.reset()
        want = _general_path(*args)
    # Asked for every weight the op may keep; declined, by the passes or by the weight's side.
    assert native_linears == ([] if what == "not kept" else [False])
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert counts == device.snapshot()
    assert counts.dut_ops == (0 if what == "no rows" else 1)


def test_dyn_linear_counts_one_gemm_per_call(device: Device) -> None:
    ops.dyn_linear(torch.randn(2, 3, 32), torch.randn(16, 32), None, False, True, device.key)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.macs) == (1, 6 * 32 * 16)


def test_dyn_matmul_broadcasts_and_runs_one_gemm_per_batch(device: Device) -> None:
    a, b = torch.randn(2, 3, 4, 16), torch.randn(3, 16, 5)
    out = ops.dyn_matmul(a, b, device.key)
    ref = a @ b
    assert out.shape == ref.shape
    assert float((out - ref).abs().max() / ref.abs().max()) < 2e-2
    assert device.snapshot().dut_ops == 6


def _matmul_reference(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``asic::dyn_matmul``'s numbers from its definition: ``a [B, M, K]`` quantized per row,
    ``b [B, K, N]`` per column, their int8 products summed exactly (float64), then
    ``(float32(acc)·(s_a·alpha))·s_b`` in float32."""
    (batch, m, k), n = a.shape, b.shape[-1]
    aq, sa = quant_ops.quantize_sym_rows(a.reshape(-1, k))
    bq, sb = quant_ops.quantize_sym_rows(b.transpose(1, 2).reshape(-1, k))
    acc = aq.double().reshape(batch, m, k) @ bq.double().reshape(batch, n, k).transpose(1, 2)
    return (acc.float() * (sa * alpha).reshape(batch, m, 1)) * sb.reshape(batch, 1, n)


@pytest.mark.parametrize("kernel", host_gemm.available_kernels())
@pytest.mark.parametrize(
    "shape",
    [(2, 5, 16, 7), (4, 128, 32, 128)],  # below and above numerics.CAST_FIRST_MIN_NUMEL
    ids=["small", "cast-in-place"],
)
def test_dyn_matmul_and_sdpa_scores_are_their_formula(
    device: Device, kernel: str, shape: tuple[int, int, int, int]
) -> None:
    batch, m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(batch, m, k, generator=gen), torch.randn(batch, k, n, generator=gen)
    with host_gemm.forced(kernel):
        assert torch.equal(ops.dyn_matmul(a, b, device.key), _matmul_reference(a, b))
        scores = quant_ops.dut_matmul(a, b, device.key, alpha=0.125)
    assert torch.equal(scores, _matmul_reference(a, b, alpha=0.125))


@pytest.mark.parametrize("kernel", host_gemm.available_kernels())
@pytest.mark.parametrize("mask", ["none", "causal", "bool"])
def test_dyn_sdpa_is_its_formula(device: Device, kernel: str, mask: str) -> None:
    """Both GEMMs as dyn_matmul computes them, the softmax between in float32 (the scores and
    probabilities are the op's own temporaries, worked on in place above 64K entries)."""
    heads, length, dim = 4, 160, 32  # 4·160·160 scores: above numerics.CAST_FIRST_MIN_NUMEL
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, heads, length, dim, generator=gen) for _ in range(3))
    keep = torch.rand(length, length, generator=gen) > 0.3
    scores = _matmul_reference(q[0], k[0].transpose(1, 2), alpha=dim**-0.5)
    if mask == "causal":
        scores = scores.masked_fill(~torch.ones_like(keep).tril(), -torch.inf)
    elif mask == "bool":
        scores = scores.masked_fill(~keep, -torch.inf)
    expected = _matmul_reference(torch.softmax(scores, -1), v[0]).unsqueeze(0)
    attn_mask = keep if mask == "bool" else None
    with host_gemm.forced(kernel):
        out = ops.dyn_sdpa(q, k, v, attn_mask, mask == "causal", None, False, device.key)
    assert torch.equal(out, expected)


def test_empty_batch(device: Device) -> None:
    out = ops.dyn_linear(torch.randn(0, 32), torch.randn(16, 32), None, False, True, device.key)
    assert out.shape == (0, 16)
    assert device.snapshot().dut_ops == 0


@pytest.mark.parametrize("shape", [(2, 0), (3, 2, 0), (0,)])
@pytest.mark.parametrize("kept", [True, False])
def test_a_layer_of_no_input_features_gives_its_bias(
    device: Device, shape: tuple[int, ...], kept: bool
) -> None:
    """An empty sum is 0, so the layer gives its bias, as eager's ``F.linear`` does (the row
    scales of an empty row raised an IndexError, and ``reshape(-1, 0)`` a RuntimeError)."""
    b = torch.randn(16)
    out = ops.dyn_linear(torch.randn(shape), torch.randn(16, 0), b, False, kept, device.key)
    assert torch.equal(out, b.expand(*shape[:-1], 16))


# -- PT2E: int8 output within 1 LSB of the float reference --------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    uint8=st.booleans(),
    relu=st.booleans(),
    m=st.integers(1, 9),
)
def test_qlinear_requant_within_one_lsb(seed: int, uint8: bool, relu: bool, m: int) -> None:
    from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers the ops)

    qd = torch.ops.quantized_decomposed
    gen = torch.Generator().manual_seed(seed)
    k, n = 48, 24
    dtype, qmin, qmax = (torch.uint8, 0, 255) if uint8 else (torch.int8, -128, 127)
    x_scale, x_zp = 0.03, (131 if uint8 else -3)
    y_scale, y_zp = 0.05, (120 if uint8 else 5)
    x_q = torch.randint(qmin, qmax + 1, (m, k), generator=gen).to(dtype)
    w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    w_scale = torch.rand(n, generator=gen) * 0.02 + 1e-3
    w_zp = torch.zeros(n, dtype=torch.int64)
    bias = torch.randn(n, generator=gen)

    x_dq = qd.dequantize_per_tensor(x_q, x_scale, x_zp, qmin, qmax, dtype)
    w_dq = qd.dequantize_per_channel(w_q, w_scale, w_zp, 0, -127, 127, torch.int8)
    y = torch.nn.functional.linear(x_dq, w_dq, bias)
    ref = qd.quantize_per_tensor(torch.relu(y) if relu else y, y_scale, y_zp, qmin, qmax, dtype)

    key = get_device("default").key  # (hypothesis runs this without function-scoped fixtures)
    out = ops.qlinear(
        x_q,
        torch.tensor(x_scale, dtype=torch.float64),
        torch.tensor(x_zp),
        w_q,
        w_scale,
        w_zp,
        bias,
        y_scale,
        y_zp,
        max(qmin, y_zp) if relu else qmin,
        qmax,
        dtype,
        key,
    )
    assert out.dtype == dtype
    assert int((out.int() - ref.int()).abs().max()) <= 1


def test_qlinear_rejects_asymmetric_weights(device: Device) -> None:
    args = _opcheck_cases(device.key)[4][1]
    bad = list(args)
    bad[5] = torch.ones(32, dtype=torch.int64)  # a non-zero weight zero point
    with pytest.raises(ValueError, match="zero-point"):
        ops.qlinear(*bad)


def test_host_fallback_counts_every_call_with_its_macs_and_keeps_the_site(
    device: Device,
) -> None:
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    for rows in (3, 3, 6):  # the MACs follow each call's real shapes
        x = torch.randn(rows, 4)
        out = ops.host_fallback(x, [w], "mm", [], device.key, "mm", "float64", "m.py", 7, "fc(x)")
        assert torch.equal(out, x)
        assert out.data_ptr() != x.data_ptr()
    snap = device.snapshot()
    assert (snap.host_fallbacks, snap.host_macs, snap.macs) == (3, (3 + 3 + 6) * 4 * 5, 0)
    site = HostFallback("mm", "float64", "m.py", 7, "fc(x)")
    assert device.host_fallback_sites == (site,)
    assert device.host_fallback_stats == (HostFallbackStats(site, 3, 240, "[3, 4] x [4, 5]"),)


def test_host_fallback_rejects_an_unknown_formula(device: Device) -> None:
    with pytest.raises(ValueError, match="unknown MAC formula 'gemv'"):
        ops.host_fallback(torch.randn(2), [], "gemv", [], device.key, "x", "y", None, None, None)


def test_unknown_device_key_is_one_clear_line() -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        ops.dyn_linear(torch.randn(2, 4), torch.randn(3, 4), None, False, True, "no-such-device")


def test_dut_ops_refuse_inputs_that_require_grad(device: Device) -> None:
    # The DUT has no backward: a call autograd would record fails now, rather than leaving the
    # gradients silently None at backward().
    x, w = torch.randn(2, 8), torch.randn(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"asic::dyn_linear is inference-only .* torch.no_grad"):
        ops.dyn_linear(x, w, None, False, True, device.key)
    with torch.no_grad():
        assert ops.dyn_linear(x, w, None, False, True, device.key).shape == (2, 4)


def test_a_dut_op_called_directly_in_compiled_code_is_one_node(device: Device) -> None:
    x, w = torch.randn(3, 8), torch.randn(4, 8)

    def f(t: torch.Tensor) -> torch.Tensor:
        return quant_ops.dyn_linear(t, w, None, False, True, device.key) + 1

    out = torch.compile(f, backend="eager", fullgraph=True)(x)
    assert torch.equal(out, f(x))
