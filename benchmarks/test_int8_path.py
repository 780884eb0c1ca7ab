"""The int8 path at LLM layer shapes: the DUT against fp32 on the host and raw ``torch._int_mm``.

One benchmark group per layer shape (``--benchmark-group-by=group``, the default), each with:

* ``test_fp32``: ``torch.nn.functional.linear`` in fp32 on the host (an eager MLP for ``mlp``);
* ``test_int_mm``: ``torch._int_mm`` on int8 operands, the host's native int8 GEMM without any
  quantization around it (the floor the DUT path is measured against);
* ``test_dut[<preset>]``: the DUT path for the presets ``default``, ``gemmini`` and ``tpu_v1``:
  the ``asic::dyn_linear`` op the backend lowers a float linear to (quantize per token, int8
  GEMM on the simulator, rescale), or for ``mlp`` the block compiled with ``backend="asic"``. Its
  simulated figures (cycles, utilization, bound, roofline time) are in ``extra_info``;
* ``test_dut_inductor``: the layer (or block) compiled with ``make_backend(host="inductor")`` on
  the ``default`` preset, the host work around each DUT GEMM fused into Inductor kernels.

A model width of 2048 (Llama-7B's is 4096) keeps it to minutes on 2 CPU cores. Decode runs
M = 1 and 8 tokens, prefill M = 128 and 512; ``qkv`` is d -> 3d, ``o`` d -> d, ``up`` d -> 4d,
``down`` 4d -> d, and ``mlp`` is up, GELU, down.

    pytest benchmarks/test_int8_path.py --benchmark-only --asic-roofline docs/roofline.svg
    pytest benchmarks/test_int8_path.py --benchmark-disable      # plain tests, as CI runs them

A plain run compiles ``test_dut_inductor`` on :data:`PLAIN_INDUCTOR`'s layers only (the others
are marked ``timed_only``: benchmarks/conftest.py).

A table of the DUT/fp32 and DUT/GEMM ratios per shape and host GEMM kernel, and of each DUT over
the fastest kernel alone of its shape (``DUT/best GEMM``, the per-layer target), closes a timed run
(``conftest.py``), from ``test_interleaved``, which runs the candidates of a shape round robin:
fp32, and for each of the ``int_mm`` and ``float32`` kernels (forced, so a host with an int8
dot-product unit shows what one without sees, and the reverse) the kernel alone and the DUT
(with the native host passes, and with the aten kernels' as a machine without a C compiler
runs them: ``asic_backend.sim.host_passes``), and, where TorchAO is installed, the layer as
TorchAO's dynamic int8 under Inductor (the production int8 path, for the DUT/TorchAO column),
and where the DUT runs an ``int_mm`` GEMM in tiles, the DUT with its GEMMs in one call (the
DUT/whole column: ``asic_backend.sim.host_gemm.untiled``). ``test_int_mm_layouts`` times
``torch._int_mm`` by each weight layout the ``int_mm`` kernel may keep, which it measures once
per process (``asic_backend.sim.host_gemm.int_mm_layout``).
Every test first checks its numbers (DUT close to fp32, ``_int_mm`` exact, the simulated figures
equal to the cycle model's), so a fast wrong path fails; nothing asserts on time.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import asic_backend.ops.linear  # noqa: F401  (registers torch.ops.asic.dyn_linear)
from asic_backend import make_backend
from asic_backend.ops.library import DIRECT_CALLS
from asic_backend.ops.linear import quantize_sym_rows
from asic_backend.sim import host_gemm, host_passes, int16_gemm, kernel_choice
from asic_backend.sim.config import AsicConfig
from asic_backend.sim.cycles import ACC_BYTES, gemm_cost
from asic_backend.sim.device import get_device
from benchmarks.conftest import (
    AO_CACHE_WARNING,
    DUT_PRESET,
    TIMED_ONLY,
    best_interleaved,
    forced_kernel,
    host_line,
    record,
    record_interleaved,
    smoke_rows,
    timed_kernels,
    torchao_peer,
)

pytest.importorskip("pytest_benchmark")

D = 2048  # model width
PRESETS = ("default", "gemmini", "tpu_v1")
#: Dynamic int8 (per-token activations, per-channel weights) against fp32: max |error| / max |y|.
TOLERANCE = 5e-2


@dataclasses.dataclass(frozen=True)
class Layer:
    phase: str  # decode | prefill
    kind: str  # qkv | o | up | down | mlp
    m: int
    k: int
    n: int  # for mlp: the hidden width (up is k -> n, down n -> k)

    @property
    def group(self) -> str:
        return f"{self.phase} {self.kind} {self.m}×{self.k}×{self.n}"

    @property
    def gemms(self) -> list[tuple[int, int, int]]:
        if self.kind == "mlp":
            return [(self.m, self.k, self.n), (self.m, self.n, self.k)]
        return [(self.m, self.k, self.n)]

    @property
    def rounds(self) -> int:
        # Enough rounds for one undisturbed round on a shared 2-core host: a decode call is a
        # fraction of a millisecond, so 200 of them take about as long as 10 prefill calls.
        return 200 if self.m <= 8 else 10


TIMED = getattr(pytest.mark, TIMED_ONLY)
PROJECTIONS = {"qkv": (D, 3 * D), "o": (D, D), "up": (D, 4 * D), "down": (4 * D, D)}
LAYERS = [
    *(
        Layer(phase, kind, m, k, n)
        for phase, ms in (("decode", (1, 8)), ("prefill", (128, 512)))
        for m in ms
        for kind, (k, n) in PROJECTIONS.items()
    ),
    Layer("decode", "mlp", 8, D, 4 * D),
    Layer("prefill", "mlp", 512, D, 4 * D),
]
LAYER_PARAMS = [
    pytest.param(
        layer,
        id=f"{layer.phase}-{layer.kind}-M{layer.m}",
        marks=pytest.mark.benchmark(group=layer.group),
    )
    for layer in LAYERS
]


# Operands are made once per process and shared by a group's rows, so every row sees the same
# data and a plain (benchmark-disabled) run does not spend its time in the random generator.


@functools.cache
def weight(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(k * 7 + n)
    return torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g) * 0.1


@functools.cache
def activation(m: int, k: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m * 3 + k))


@functools.cache
def int8(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)


def dut_operands(layer: Layer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The int8 operands of the layer's DUT GEMMs as the DUT quantizes them (per token, per
    output channel): the "kernel alone" rows time the DUT's own GEMMs, whose float32 slicing
    depends on the weights' magnitudes (:func:`asic_backend.sim.host_gemm.slice_length`)."""
    return [
        (quantize_sym_rows(activation(m, k))[0], quantize_sym_rows(weight(k, n)[0])[0])
        for m, k, n in layer.gemms
    ]


def linear(k: int, n: int) -> nn.Linear:
    """An ``nn.Linear`` holding the shared ``weight(k, n)`` (no init, no grad)."""
    w, b = weight(k, n)
    module = nn.Linear(k, n, device="meta")
    module.weight = nn.Parameter(w, requires_grad=False)
    module.bias = nn.Parameter(b, requires_grad=False)
    return module


def mlp(layer: Layer) -> nn.Module:
    return nn.Sequential(linear(layer.k, layer.n), nn.GELU(), linear(layer.n, layer.k)).eval()


def fp32_fn(layer: Layer) -> Callable[[], torch.Tensor]:
    x = activation(layer.m, layer.k)
    if layer.kind == "mlp":
        block = mlp(layer)
        return lambda: block(x)
    w, b = weight(layer.k, layer.n)
    return lambda: F.linear(x, w, b)


def assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    error = float((out - ref).abs().max() / ref.abs().max())
    assert error < TOLERANCE, f"DUT output is {error:.3g} off fp32 (max |error| / max |y|)"


@pytest.mark.parametrize("layer", LAYER_PARAMS)
def test_fp32(benchmark: Any, layer: Layer, request: pytest.FixtureRequest) -> None:
    out = benchmark.pedantic(fp32_fn(layer), rounds=layer.rounds, warmup_rounds=1)
    assert out.shape == (layer.m, layer.k if layer.kind == "mlp" else layer.n)
    record(request.config, layer.group, "fp32", benchmark)


@pytest.mark.parametrize("layer", LAYER_PARAMS)
def test_int_mm(benchmark: Any, layer: Layer, request: pytest.FixtureRequest) -> None:
    # The DUT's operand layout: activations [M, K], weights [N, K] multiplied as a view [K, N].
    rows = functools.partial(smoke_rows, disabled=benchmark.disabled)
    operands = [(int8(rows(m), k), int8(n, k)) for m, k, n in layer.gemms]

    def gemms() -> list[torch.Tensor]:
        return [torch._int_mm(a, w.t()) for a, w in operands]

    outs = benchmark.pedantic(gemms, rounds=layer.rounds, warmup_rounds=1)
    for out, (a, w) in zip(outs, operands, strict=True):  # exact: |sum| < 2^31 for K <= 131071
        assert torch.equal(out[:4].double(), a[:4].double() @ w.double().t())
    record(request.config, layer.group, "int_mm", benchmark)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("layer", LAYER_PARAMS)
def test_dut(
    asic_benchmark: Any, benchmark: Any, layer: Layer, preset: str, request: pytest.FixtureRequest
) -> None:
    config = AsicConfig.preset(preset)
    x = activation(layer.m, layer.k)
    if layer.kind == "mlp":
        block = mlp(layer)
        target: Callable[[torch.Tensor], torch.Tensor] = torch.compile(
            block, backend=make_backend(config=config), fullgraph=True
        )
        ref = block(x[:4])
    else:
        w, b = weight(layer.k, layer.n)
        key = get_device(config).key
        target = functools.partial(_dyn_linear, w=w, b=b, key=key)
        ref = F.linear(x[:4], w, b)  # rows are quantized independently: 4 rows check them all
    _run_dut(asic_benchmark, benchmark, layer, config, target, x, ref, request, "dut")


#: The layers whose Inductor-hosted DUT a plain run compiles and checks: one row, a few rows, a
#: long K, many rows, and both MLPs (the rest only differ in their shapes).
PLAIN_INDUCTOR = (
    "decode-qkv-M1",
    "decode-down-M8",
    "prefill-qkv-M128",
    "decode-mlp-M8",
    "prefill-mlp-M512",
)


@pytest.mark.parametrize(
    "layer",
    [
        p if p.id in PLAIN_INDUCTOR else pytest.param(*p.values, id=p.id, marks=[*p.marks, TIMED])
        for p in LAYER_PARAMS
    ],
)
def test_dut_inductor(
    asic_benchmark: Any, benchmark: Any, layer: Layer, request: pytest.FixtureRequest
) -> None:
    """The layer compiled with ``make_backend(host="inductor")``: the quantization and the
    rescale fused into one host kernel each, around the DUT GEMM."""
    config = AsicConfig.preset(DUT_PRESET)
    x = activation(layer.m, layer.k)
    block = mlp(layer) if layer.kind == "mlp" else linear(layer.k, layer.n).eval()
    backend = make_backend(config=config, host="inductor")
    target = torch.compile(block, backend=backend, fullgraph=True)
    with torch.no_grad():
        ref = block(x[:4])
        _run_dut(asic_benchmark, benchmark, layer, config, target, x, ref, request, "dut_inductor")


def _run_dut(
    asic_benchmark: Any,
    benchmark: Any,
    layer: Layer,
    config: AsicConfig,
    target: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    ref: torch.Tensor,
    request: pytest.FixtureRequest,
    variant: str,
) -> None:
    asic_benchmark.label = f"{layer.phase} {layer.kind}"
    out = asic_benchmark(target, x, rounds=layer.rounds)
    assert_close(out[:4], ref)

    # The simulated figures of one call are exactly the cycle model's, for this device.
    info = asic_benchmark.extra_info
    costs = [gemm_cost(config, m, k, n, ACC_BYTES) for m, k, n in layer.gemms]
    assert info["asic_device"] == config.name
    assert info["asic_dut_ops"] == len(costs)
    assert info["asic_host_fallbacks"] == 0
    assert info["asic_macs"] == sum(c.macs for c in costs)
    assert info["asic_cycles"] == sum(c.cycles for c in costs)
    assert info["asic_bytes_moved"] == sum(c.bytes_moved for c in costs)
    assert info["asic_roofline_time_s"] == pytest.approx(sum(c.roofline_time_s for c in costs))
    record(
        request.config,
        layer.group,
        variant,
        benchmark,
        preset=config.name,
        sim_time_s=info["asic_roofline_time_s"],
    )


@pytest.mark.parametrize("layer", LAYER_PARAMS)
@pytest.mark.filterwarnings(AO_CACHE_WARNING)
def test_interleaved(benchmark: Any, layer: Layer, request: pytest.FixtureRequest) -> None:
    """fp32 and, per host GEMM kernel (``int_mm`` and ``float32``, forced), the kernel alone and
    the DUT (the op, and compiled with ``host="inductor"``) run round robin, so each ratio of
    the closing table compares runs on the same machine at the same moments
    (:func:`benchmarks.conftest.best_interleaved`), and a host of either kind shows what the
    other kind sees. Where the DUT runs an ``int_mm`` GEMM in tiles, the DUT with its GEMMs in
    one call runs too (``dut_whole``)."""
    # Every layer compiles nn.Linear.forward anew: without a reset the recompile limit would
    # send the later layers to eager fp32.
    torch._dynamo.reset()
    config = AsicConfig.preset(DUT_PRESET)
    x = activation(layer.m, layer.k)
    operands = dut_operands(layer)
    make_dut: Callable[[], Callable[[torch.Tensor], Any]]
    if layer.kind == "mlp":
        block = mlp(layer)
        # A copy a call: each DUT variant quantizes and reads weights of its own, as cold as
        # the others' (the one before it in a round has not just read them).
        make_dut = lambda: torch.compile(  # noqa: E731
            copy.deepcopy(block), backend=make_backend(config=config), fullgraph=True
        )
    else:
        w, b = weight(layer.k, layer.n)
        key = get_device(config).key
        make_dut = lambda: functools.partial(_dyn_linear, w=w.clone(), b=b, key=key)  # noqa: E731
        block = linear(layer.k, layer.n).eval()
    # A plain (benchmark-disabled) run leaves the Inductor variant to test_dut_inductor, which
    # compiles and checks the same layer: an Inductor compile is most of a plain run's time.
    variants: dict[str, Callable[[torch.Tensor], Any]] = {"dut": make_dut()}
    if not benchmark.disabled:
        variants["dut_aten"] = functools.partial(_aten_passes, make_dut())
        variants["dut_inductor"] = torch.compile(
            block, backend=make_backend(config=config, host="inductor")
        )
    fp32 = fp32_fn(layer)
    fns: dict[str, Callable[[], Any]] = {"fp32": fp32}
    if not benchmark.disabled and importlib.util.find_spec("torchao") is not None:
        # The production int8 path on the same layer: what the DUT's overhead over its GEMM
        # compares with (TorchAO's quantization and rescale are Inductor's kernels).
        peer = torchao_peer(block)
        with torch.no_grad():
            assert_close(peer(x), fp32())
        fns["torchao"] = functools.partial(peer, x)
    # Per kernel, its DUT variants: under int_mm, where the DUT runs a GEMM in tiles, also the
    # DUT with its GEMMs in one call each, as before them (the tiles' gain, in the same rounds).
    per_kernel = {name: dict(variants) for name in timed_kernels(benchmark.disabled)}
    tiled = any(host_gemm.int_mm_tiles(m, n) for m, _, n in layer.gemms)
    if tiled and "int_mm" in per_kernel and not benchmark.disabled:
        per_kernel["int_mm"]["dut_whole"] = functools.partial(_untiled, make_dut())
    for name, kernel_variants in per_kernel.items():
        # The kernel alone on int8 operands, as the DUT calls it (weights static, so a float
        # kernel keeps their float copy), then the DUT with that kernel.
        fns[f"gemm@{name}"] = forced_kernel(
            name, lambda: [host_gemm.mm_i32(a, w, w_static=True) for a, w in operands]
        )
        for variant, fn in kernel_variants.items():
            fns[f"{variant}@{name}"] = forced_kernel(name, functools.partial(fn, x))
    with torch.no_grad():
        ref = fp32()
        for name, kernel_variants in per_kernel.items():
            for fn in kernel_variants.values():
                assert_close(forced_kernel(name, functools.partial(fn, x))(), ref)
        rounds = 1 if benchmark.disabled else layer.rounds
        best: dict[str, float] = {}
        benchmark.pedantic(lambda: best.update(best_interleaved(fns, rounds)), rounds=1)
    if not benchmark.disabled:
        record_interleaved(request.config, layer.group, best)


_DYN_LINEAR = DIRECT_CALLS[torch.ops.asic.dyn_linear.default]


def _untiled(dut: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    # The DUT with its int_mm GEMMs in one call each (asic_backend.sim.host_gemm.untiled).
    with host_gemm.untiled():
        return dut(x)


def _aten_passes(dut: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
    # The DUT with the aten kernels' quantization and rescale: what a machine without a C
    # compiler runs (asic_backend.sim.host_passes).
    with host_passes.forced("aten"):
        return dut(x)


def _dyn_linear(x: torch.Tensor, *, w: torch.Tensor, b: torch.Tensor, key: str) -> torch.Tensor:
    # What the backend's lowering puts in place of a float linear (weights quantized once,
    # cached), called as the compiled aten graph calls it (asic_backend.ops.library.DIRECT_CALLS).
    out: torch.Tensor = _DYN_LINEAR(x, w, b, False, True, key)
    return out


#: The linears of two rows or more (:func:`test_int_mm_layouts`).
_LAYOUT_LAYERS = [layer for layer in LAYERS if layer.kind != "mlp" and layer.m > 1]


@pytest.mark.benchmark(group="int_mm weight layouts")
def test_int_mm_layouts(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``torch._int_mm`` by each weight layout the ``int_mm`` kernel may keep
    (:func:`asic_backend.sim.host_gemm.int_mm_layout`: the weight's own ``[N, K]`` rows, or a
    row-major ``[K, N]`` copy), at every linear shape, round robin: which is faster is the
    CPU's oneDNN kernel's, so the table shows what ``auto`` measured and why. A single row
    always reads the rows (oneDNN's GEMV), so only shapes of two rows or more are timed. A
    plain run checks that both layouts give the same bits."""
    host_gemm.int_mm_is_exact()  # its own check (both layouts), once a process
    fns: dict[str, Callable[[], Any]] = {}
    for layer in _LAYOUT_LAYERS:
        ((m, k, n),) = layer.gemms
        rows = smoke_rows(m, benchmark.disabled)
        a, w = int8(rows, k), int8(n, k)
        products = []
        for layout in host_gemm.INT_MM_LAYOUTS:
            operand = host_gemm.static_operand("int_mm", w, rows, layout)
            products.append(host_gemm.static_mm(a, operand))
            fns[f"{layer.group}@{layout}"] = functools.partial(host_gemm.static_mm, a, operand)
        assert torch.equal(*products)
    best: dict[str, float] = {}
    rounds = 1 if benchmark.disabled else 20
    benchmark.pedantic(lambda: best.update(best_interleaved(fns, rounds)), rounds=1)
    if benchmark.disabled:  # one pass ran as a smoke test; single-shot ratios would mislead
        return
    lines = ["| layer (M×K×N) | rows ms | columns ms | columns/rows |", "|---|---|---|---|"]
    for layer in _LAYOUT_LAYERS:
        by_rows, by_columns = (best[f"{layer.group}@{name}"] for name in host_gemm.INT_MM_LAYOUTS)
        ratio = by_columns / by_rows
        benchmark.extra_info[f"{layer.group} columns/rows"] = round(ratio, 3)
        lines.append(
            f"| {layer.group} | {by_rows * 1e3:.3g} | {by_columns * 1e3:.3g} | {ratio:.2f} |"
        )
    with capsys.disabled():
        print(f"\n{host_line()}")
        print(f"int_mm weight layout from two rows on: {host_gemm.int_mm_layout()} (one row: rows)")
        print("\n".join(lines))


#: A decode step's linears: this many layers of the four projections, called in turn, so each
#: streams its weight from memory past the others', as a model's step does.
STEP_LAYERS = 4
#: The step's row counts: each that ``auto`` may time ``int16`` at, and 8 (``int_mm`` alone).
STEP_ROWS = (*range(1, host_gemm.CHOICE_ROWS + 1), 8)


@pytest.mark.benchmark(group="decode step kernels")
def test_decode_step(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A decode step of :data:`STEP_LAYERS` layers of DUT linears (``asic::dyn_linear``, as
    the compiled graph calls it) at each of :data:`STEP_ROWS`, under ``int_mm`` and ``int16``
    forced and under ``auto``, which at 1 to ``CHOICE_ROWS`` rows times the two kernels on
    each shape's first weight and keeps the faster
    (:func:`asic_backend.sim.host_gemm.static_choice`), round robin. Alone, a layer's weight
    can stay in the CPU's caches between calls; in a step it cannot, and the kernels' order
    may turn (the table in docs/benchmarks.md). A plain run checks, at a small width, that the
    three give the same bits through ``auto``'s trials."""
    if not int16_gemm.available():
        pytest.skip(f"int16: {int16_gemm.unavailable_reason()}")
    width = 128 if benchmark.disabled else D
    layers = [
        weight(k, n)
        for _ in range(STEP_LAYERS)
        for k, n in ((width, 3 * width), (width, width), (width, 4 * width), (4 * width, width))
    ]
    # Each layer's own tensors (weight() shares one per shape): as many weights to stream as
    # a model's layers have.
    layers = [(w.clone(), b) for w, b in layers]
    key = get_device(AsicConfig.preset(DUT_PRESET)).key
    kernel_choice.forget()  # this step's trials, in its streaming

    def step(x: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [_dyn_linear(x[w.shape[1]], w=w, b=b, key=key) for w, b in layers]

    fns: dict[str, Callable[[], Any]] = {}
    for rows in STEP_ROWS:
        x = {k: activation(rows, k) for k in (width, 4 * width)}
        with torch.no_grad():
            expected = forced_kernel("int_mm", functools.partial(step, x))()
            for run in range(2 * (1 + kernel_choice.ROUNDS) + 1):  # auto's trials, and one
                outs = step(x) if run else forced_kernel("int16", functools.partial(step, x))()
                assert all(torch.equal(y, e) for y, e in zip(outs, expected, strict=True))
        fns[f"{rows}@auto"] = functools.partial(step, x)
        for name in kernel_choice.KERNELS:
            fns[f"{rows}@{name}"] = forced_kernel(name, functools.partial(step, x))
    best: dict[str, float] = {}
    rounds = 1 if benchmark.disabled else 20
    with torch.no_grad():
        benchmark.pedantic(lambda: best.update(best_interleaved(fns, rounds)), rounds=1)
    if benchmark.disabled:  # one pass ran as a smoke test; single-shot ratios would mislead
        return
    chosen = kernel_choice.choices()
    lines = [
        "| rows | int_mm ms | int16 ms | int16/int_mm | auto ms | auto/int_mm | auto/faster "
        "| auto's int16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    kinds = {(k, n): kind for kind, (k, n) in PROJECTIONS.items()}
    for rows in STEP_ROWS:
        by = {name: best[f"{rows}@{name}"] for name in ("auto", *kernel_choice.KERNELS)}
        # The layers whose trial kept int16 (the rest kept int_mm); "no trial" above 4 rows.
        picks = [kinds[k, n] for (r, k, n, *_), v in chosen.items() if r == rows and v == "int16"]
        trials = any(choice[0] == rows for choice in chosen)
        benchmark.extra_info[f"{rows} rows auto/int_mm"] = round(by["auto"] / by["int_mm"], 3)
        lines.append(
            f"| {rows} | {by['int_mm'] * 1e3:.3g} | {by['int16'] * 1e3:.3g} | "
            f"{by['int16'] / by['int_mm']:.2f} | {by['auto'] * 1e3:.3g} | "
            f"{by['auto'] / by['int_mm']:.2f} | "
            f"{by['auto'] / min(by['int_mm'], by['int16']):.2f} | "
            f"{(', '.join(picks) or 'none') if trials else 'no trial'} |"
        )
    with capsys.disabled():
        print(f"\n{host_line()}")
        print(f"decode step: {STEP_LAYERS} layers of qkv, o, up, down at {D} wide")
        print("\n".join(lines))
