"""Convolutions and attention on the DUT against fp32 on the host and raw ``torch._int_mm``.

One benchmark group per layer, each with:

* ``test_fp32``: the layer in fp32 eager on the host (``F.conv*d``, or SDPA's default CPU
  kernel);
* ``test_int_mm``: ``torch._int_mm`` on int8 operands of the GEMMs the DUT runs for it (the
  im2col matrix by the filters, one GEMM per group; QKᵀ and PV per head), without the
  quantization and the im2col around them: the floor the DUT path is measured against;
* ``test_dut[<preset>]``: the ``asic::`` op the backend lowers the layer to (``dyn_conv``:
  quantize per sample, im2col, int8 GEMMs on the simulator, rescale; ``dyn_sdpa``: both matmuls
  on the DUT, softmax on the host), on the ``default``, ``gemmini`` and ``tpu_v1`` presets, with
  the simulated figures in ``extra_info``.

The layers: a ResNet 3x3 conv at stage 1 and stage 3 shapes and a bottleneck's 1x1 conv, a
MobileNet depthwise 3x3, a Whisper-style 1-D audio conv (80 mel bins in, 384 channels out, 3000
frames), and SDPA at prefill and decode shapes.

    pytest benchmarks/test_conv_attention.py --benchmark-only    # timed, with the ratio table
    pytest benchmarks/test_conv_attention.py --benchmark-disable # plain tests, as CI runs them

``test_interleaved`` runs fp32 and, per host GEMM kernel (``int_mm`` and ``float32``, forced),
the layer's GEMMs alone and the DUT op round robin: the closing table's ratios, per kernel.

Every test first checks its numbers (DUT close to fp32, ``_int_mm`` exact, the simulated figures
equal to the cycle model's), so a fast wrong path fails; nothing asserts on time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import asic_backend.ops.attention
import asic_backend.ops.conv  # noqa: F401  (registers torch.ops.asic.dyn_conv / dyn_sdpa)
from asic_backend import make_backend
from asic_backend.sim import host_gemm
from asic_backend.sim.config import AsicConfig
from asic_backend.sim.conv import ConvGeometry
from asic_backend.sim.cycles import ACC_BYTES, conv_cost, gemm_cost
from asic_backend.sim.device import get_device
from benchmarks.conftest import (
    DUT_PRESET,
    best_interleaved,
    forced_kernel,
    record,
    record_interleaved,
    smoke_rows,
    timed_kernels,
)

pytest.importorskip("pytest_benchmark")

PRESETS = ("default", "gemmini", "tpu_v1")
#: Dynamic int8 against fp32: max |error| / max |y| (one layer: ~1%). Attention's output is an
#: average of 512 values near 0, so its max error over its max is larger (5.6% at this shape)
#: while the cosine similarity stays 0.9997: both are checked.
TOLERANCE = {"conv": 5e-2, "attention": 0.1}
MIN_COSINE = 0.999


@dataclasses.dataclass(frozen=True)
class Conv:
    name: str
    x: tuple[int, ...]  # [N, C_in, *size]
    w: tuple[int, ...]  # [C_out, C_in/groups, *kernel]
    stride: int
    padding: int
    groups: int = 1

    @property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry.of(
            self.x, self.w, stride=self.stride, padding=self.padding, dilation=1, groups=self.groups
        )

    @property
    def group(self) -> str:
        m, k, n = self.geometry.gemm
        per = f" x{self.groups}" if self.groups > 1 else ""
        return f"{self.name} {m}×{k}×{n}{per}"

    def fp32(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        conv = {3: F.conv1d, 4: F.conv2d}[len(self.x)]
        return conv(x, w, b, self.stride, self.padding, 1, self.groups)

    def module(self, w: torch.Tensor, b: torch.Tensor) -> nn.Module:
        """The layer as the ``nn.Conv1d``/``nn.Conv2d`` a model holds, with these parameters."""
        conv_cls = {3: nn.Conv1d, 4: nn.Conv2d}[len(self.x)]
        conv = conv_cls(self.x[1], self.w[0], self.w[2:], self.stride, self.padding, 1, self.groups)
        with torch.no_grad():
            conv.weight.copy_(w)
            conv.bias.copy_(b)
        return conv.eval()

    def dut(self, key: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]:
        spatial = len(self.x) - 2

        def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = torch.ops.asic.dyn_conv(
                x,
                w,
                b,
                [self.stride] * spatial,
                [self.padding] * 2 * spatial,
                [1] * spatial,
                self.groups,
                False,
                [0] * spatial,
                True,
                key,
            )
            return out

        return run


@dataclasses.dataclass(frozen=True)
class Attention:
    name: str
    batch: int
    heads: int
    length: int
    dim: int
    #: Keys and values, where they differ from the queries (a decode step: 1 query, a cache).
    source: int = 0

    @property
    def kv_length(self) -> int:
        return self.source or self.length

    @property
    def group(self) -> str:
        kv = f" kv {self.source}" if self.source else ""
        return f"{self.name} {self.batch}×{self.heads}×{self.length}×{self.dim}{kv}"

    @property
    def gemms(self) -> list[tuple[int, int, int]]:
        """QKᵀ then PV, per (batch, head)."""
        length, source, dim = self.length, self.kv_length, self.dim
        return [(length, dim, source), (length, source, dim)] * (self.batch * self.heads)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.batch, self.heads, self.length, self.dim

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return self.batch, self.heads, self.kv_length, self.dim


CONVS = [
    Conv("resnet conv3x3 stage1", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    Conv("resnet conv3x3 stage3", (8, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    # A ResNet-50 bottleneck's first conv: 64 multiply-adds an input value, so memory decides.
    Conv("resnet conv1x1 bottleneck", (8, 256, 56, 56), (64, 256, 1, 1), 1, 0),
    Conv("mobilenet depthwise3x3", (8, 128, 56, 56), (128, 1, 3, 3), 1, 1, groups=128),
    Conv("whisper conv1d k3", (4, 80, 3000), (384, 80, 3), 1, 1),
]
ATTENTIONS = [
    Attention("sdpa prefill", 1, 16, 512, 64),
    # 64 MB of scores, where chunks of heads pay most (asic_backend.ops.attention).
    Attention("sdpa long prefill", 1, 16, 1024, 64),
    # One token against a 2048-token cache: K and V quantized per call, V by columns.
    Attention("sdpa decode", 1, 32, 1, 128, source=2048),
]
ROUNDS = 10


def _param(layer: Conv | Attention) -> Any:
    return pytest.param(
        layer, id=layer.name.replace(" ", "-"), marks=pytest.mark.benchmark(group=layer.group)
    )


LAYERS = [*(_param(c) for c in CONVS), *(_param(a) for a in ATTENTIONS)]


@functools.cache
def conv_operands(layer: Conv) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(math.prod(layer.x))
    fan_in = math.prod(layer.w[1:])
    w = torch.randn(layer.w, generator=g) / fan_in**0.5
    return torch.randn(layer.x, generator=g), w, torch.randn(layer.w[0], generator=g) * 0.1


@functools.cache
def qkv(layer: Attention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(layer.length)
    q = torch.randn(layer.shape, generator=g)
    k, v = (torch.randn(layer.kv_shape, generator=g) for _ in range(2))
    return q, k, v


@functools.cache
def int8(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)


def assert_close(out: torch.Tensor, ref: torch.Tensor, kind: str) -> None:
    error = float((out - ref).abs().max() / ref.abs().max())
    cosine = float(F.cosine_similarity(out.flatten(), ref.flatten(), dim=0))
    assert error < TOLERANCE[kind], f"DUT output is {error:.3g} off fp32 (max |error| / max |y|)"
    assert cosine > MIN_COSINE, f"DUT output's cosine similarity with fp32 is {cosine:.6f}"


def _fp32(layer: Conv | Attention) -> Callable[[], torch.Tensor]:
    if isinstance(layer, Conv):
        x, w, b = conv_operands(layer)
        return lambda: layer.fp32(x, w, b)
    q, k, v = qkv(layer)
    return lambda: F.scaled_dot_product_attention(q, k, v)


def _gemms(layer: Conv | Attention) -> list[tuple[int, int, int]]:
    if isinstance(layer, Conv):
        return [layer.geometry.gemm] * layer.groups
    return layer.gemms


@pytest.mark.parametrize("layer", LAYERS)
def test_fp32(benchmark: Any, layer: Conv | Attention, request: pytest.FixtureRequest) -> None:
    out = benchmark.pedantic(_fp32(layer), rounds=ROUNDS, warmup_rounds=1)
    assert out.isfinite().all()
    record(request.config, layer.group, "fp32", benchmark)


@pytest.mark.parametrize("layer", LAYERS)
def test_int_mm(benchmark: Any, layer: Conv | Attention, request: pytest.FixtureRequest) -> None:
    # The DUT's operand layout: activations [M, K], weights [N, K] multiplied as a view [K, N].
    shapes = sorted(set(_gemms(layer)))
    rows = functools.partial(smoke_rows, disabled=benchmark.disabled)
    operands = {(m, k, n): (int8(rows(m), k), int8(n, k)) for m, k, n in shapes}
    order = [operands[gemm] for gemm in _gemms(layer)]

    def gemms() -> list[torch.Tensor]:
        return [torch._int_mm(a, w.t()) for a, w in order]

    outs = benchmark.pedantic(gemms, rounds=ROUNDS, warmup_rounds=1)
    for out, (a, w) in zip(outs[:2], order[:2], strict=True):  # exact: |sum| < 2^31
        assert torch.equal(out[:4].double(), a[:4].double() @ w.double().t())
    record(request.config, layer.group, "int_mm", benchmark)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("layer", LAYERS)
def test_dut(
    asic_benchmark: Any,
    benchmark: Any,
    layer: Conv | Attention,
    preset: str,
    request: pytest.FixtureRequest,
) -> None:
    config = AsicConfig.preset(preset)
    key = get_device(config).key
    asic_benchmark.label = layer.name
    if isinstance(layer, Conv):
        x, w, b = conv_operands(layer)
        out = asic_benchmark(layer.dut(key), x, w, b, rounds=ROUNDS)
        assert_close(out, layer.fp32(x, w, b), "conv")
        cost = conv_cost(config, layer.geometry, out_bytes=ACC_BYTES)
        costs = [cost] * layer.groups
    else:
        q, k, v = qkv(layer)
        out = asic_benchmark(
            torch.ops.asic.dyn_sdpa, q, k, v, None, False, None, False, key, rounds=ROUNDS
        )
        assert_close(out, F.scaled_dot_product_attention(q, k, v), "attention")
        costs = [gemm_cost(config, m, k_, n, ACC_BYTES) for m, k_, n in layer.gemms]

    # The simulated figures of one call are exactly the cycle model's, for this device.
    info = asic_benchmark.extra_info
    assert info["asic_device"] == preset
    assert (info["asic_dut_ops"], info["asic_host_fallbacks"]) == (len(costs), 0)
    assert info["asic_macs"] == sum(c.macs for c in costs)
    assert info["asic_cycles"] == sum(c.cycles for c in costs)
    assert info["asic_bytes_moved"] == sum(c.bytes_moved for c in costs)
    assert info["asic_roofline_time_s"] == pytest.approx(sum(c.roofline_time_s for c in costs))
    record(
        request.config,
        layer.group,
        "dut",
        benchmark,
        preset=preset,
        sim_time_s=info["asic_roofline_time_s"],
    )


def _exact_gemms(layer: Conv | Attention) -> Callable[[], list[torch.Tensor]]:
    """The layer's GEMMs on int8 operands through :mod:`asic_backend.sim.host_gemm` with whichever
    kernel is in force: a conv's per group (the filters static), attention's per head batched."""
    if isinstance(layer, Conv):
        shapes = sorted(set(_gemms(layer)))
        operands = {(m, k, n): (int8(m, k), int8(n, k)) for m, k, n in shapes}
        order = [operands[gemm] for gemm in _gemms(layer)]
        return lambda: [host_gemm.mm_i32(a, w, w_static=True) for a, w in order]
    heads, length, source = layer.batch * layer.heads, layer.length, layer.kv_length
    dim = layer.dim
    q, k = int8(heads, length, dim), int8(heads, source, dim + 1)[..., :dim].contiguous()
    p, v_t = int8(heads, length, source), int8(heads, dim, source)
    return lambda: [host_gemm.bmm_i32(q, k), host_gemm.bmm_i32(p, v_t)]


@pytest.mark.parametrize("layer", LAYERS)
def test_interleaved(
    benchmark: Any, layer: Conv | Attention, request: pytest.FixtureRequest
) -> None:
    """fp32 and, per host GEMM kernel (forced), the layer's GEMMs alone and the DUT op, round
    robin (:func:`benchmarks.conftest.best_interleaved`): the ratios of the closing table."""
    config = AsicConfig.preset(DUT_PRESET)
    key = get_device(config).key
    fp32 = _fp32(layer)
    variants: dict[str, Callable[[], torch.Tensor]] = {}
    if isinstance(layer, Conv):
        x, w, b = conv_operands(layer)
        op = layer.dut(key)
        variants["dut"] = lambda: op(x, w, b)
        if not benchmark.disabled:  # a plain run: tests/backend/test_host_fusion.py checks it
            torch._dynamo.reset()  # each layer compiles Conv.forward anew
            compiled = torch.compile(
                layer.module(w, b), backend=make_backend(config=config, host="inductor")
            )
            variants["dut_inductor"] = lambda: compiled(x)
        kind = "conv"
    else:
        q, k, v = qkv(layer)
        variants["dut"] = lambda: torch.ops.asic.dyn_sdpa(q, k, v, None, False, None, False, key)
        kind = "attention"
    fns: dict[str, Callable[[], Any]] = {"fp32": fp32}
    with torch.no_grad():
        for name in timed_kernels(benchmark.disabled):
            fns[f"gemm@{name}"] = forced_kernel(name, _exact_gemms(layer))
            for variant, fn in variants.items():
                fns[f"{variant}@{name}"] = forced_kernel(name, fn)
                assert_close(fns[f"{variant}@{name}"](), fp32(), kind)
        rounds = 1 if benchmark.disabled else ROUNDS
        best: dict[str, float] = {}
        benchmark.pedantic(lambda: best.update(best_interleaved(fns, rounds)), rounds=1)
    if not benchmark.disabled:
        record_interleaved(request.config, layer.group, best)
