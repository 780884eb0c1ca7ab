"""Convolutions on the DUT: float ones as dynamic int8, PT2E ones as integers, the rest counted.

Every test here also runs under the suite-wide MAC accounting check (tests/accounting.py): each
compiled call's DUT + host MACs equal FlopCounterMode's count of the same graph.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from asic_backend import make_backend
from asic_backend.sim import conv as sim_conv
from asic_backend.sim import numerics
from asic_backend.sim.conv import ConvGeometry
from asic_backend.sim.cycles import conv_cost
from asic_backend.sim.device import Device

from .models import assert_close_to_fp32

CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "conv1d-audio-stride2": (lambda: nn.Conv1d(8, 16, 3, stride=2, padding=1), (2, 8, 40)),
    "conv2d-3x3": (lambda: nn.Conv2d(8, 16, 3, padding=1), (2, 8, 12, 12)),
    "conv2d-strided-7x7-stem": (lambda: nn.Conv2d(3, 16, 7, stride=2, padding=3), (2, 3, 20, 20)),
    "conv2d-dilated": (lambda: nn.Conv2d(8, 8, 3, padding=2, dilation=2), (1, 8, 10, 10)),
    "conv2d-same-even-kernel": (lambda: nn.Conv2d(4, 8, 4, padding="same"), (2, 4, 9, 9)),
    "conv2d-valid": (lambda: nn.Conv2d(4, 8, (3, 1), padding="valid"), (2, 4, 9, 9)),
    "conv2d-reflect": (
        lambda: nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect"),
        (2, 4, 9, 9),
    ),
    "conv2d-1x1": (lambda: nn.Conv2d(16, 32, 1), (2, 16, 7, 7)),
    "conv2d-grouped": (lambda: nn.Conv2d(8, 16, 3, padding=1, groups=4), (2, 8, 9, 9)),
    "conv2d-depthwise": (lambda: nn.Conv2d(16, 16, 3, padding=1, groups=16), (2, 16, 9, 9)),
    "conv2d-depthwise-x2": (lambda: nn.Conv2d(8, 16, 5, padding=2, groups=8), (2, 8, 9, 9)),
    "conv2d-unbatched": (lambda: nn.Conv2d(4, 8, 3), (4, 9, 9)),
    "conv3d": (lambda: nn.Conv3d(4, 8, 3, padding=1, stride=(1, 2, 2)), (1, 4, 5, 8, 8)),
    "conv_transpose1d": (
        lambda: nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1),
        (2, 8, 10),
    ),
    "conv_transpose2d-output-padding": (
        lambda: nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
        (2, 8, 5, 5),
    ),
    "conv_transpose3d-dilated": (
        lambda: nn.ConvTranspose3d(4, 4, 2, dilation=2),
        (1, 4, 3, 4, 4),
    ),
}


def _geometry(conv: nn.Module, x: torch.Tensor) -> ConvGeometry:
    spatial = conv.weight.dim() - 2
    batched = x if x.dim() == spatial + 2 else x.unsqueeze(0)
    padding = conv.padding
    if padding == "same":
        padding = [((k - 1) // 2, k - 1 - (k - 1) // 2) for k in conv.kernel_size]
    elif padding == "valid" or conv.padding_mode != "zeros":
        padding = 0
    if conv.padding_mode != "zeros":  # the input is padded explicitly first
        batched = torch.nn.functional.pad(batched, conv._reversed_padding_repeated_twice)
    transposed = isinstance(conv, nn.modules.conv._ConvTransposeNd)
    return ConvGeometry.of(
        batched.shape,
        conv.weight.shape,
        stride=conv.stride,
        padding=padding,
        dilation=conv.dilation,
        groups=conv.groups,
        transposed=transposed,
        output_padding=conv.output_padding if transposed else 0,
    )


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_float_convolutions_run_on_the_dut(device: Device, case: str) -> None:
    build, shape = CASES[case]
    conv, x = build().eval(), torch.randn(*shape)
    with torch.no_grad():
        ref = conv(x)
        out = torch.compile(conv, backend="asic", fullgraph=True)(x)
    assert out.shape == ref.shape
    assert_close_to_fp32(out, ref)
    geo = _geometry(conv, x)
    snap = device.snapshot()
    # One GEMM per group, each costing SCALE-Sim's im2col GEMM; nothing on the host.
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (geo.groups, 0, 0)
    assert snap.macs == geo.macs
    assert snap.cycles == geo.groups * conv_cost(device.config, geo, out_bytes=4).cycles


def test_a_batch_element_does_not_depend_on_the_rest_of_the_batch(device: Device) -> None:
    # Activations are quantized per sample: a sample's result is the same alone or batched.
    conv = nn.Conv2d(4, 8, 3, padding=1).eval()
    x = torch.randn(3, 4, 8, 8)
    x[2] *= 100  # a sample with a much larger range would coarsen a per-tensor scale
    compiled = torch.compile(conv, backend="asic", dynamic=False)
    with torch.no_grad():
        batched = compiled(x)
        alone = compiled(x[:1])
    assert torch.equal(batched[:1], alone)


def test_conv_weights_are_quantized_once_and_follow_in_place_writes(device: Device) -> None:
    from asic_backend.ops import conv as conv_ops

    conv = nn.Conv2d(4, 8, 3).eval()
    compiled = torch.compile(conv, backend="asic")
    calls: list[int] = []
    original = conv_ops._quantize_conv_weight

    def counting(*args: Any) -> Any:
        calls.append(1)
        return original(*args)

    x = torch.randn(1, 4, 6, 6)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(conv_ops, "_quantize_conv_weight", counting)
        first = compiled(x)
        assert torch.equal(compiled(x), first)
        assert len(calls) == 1
        conv.weight.mul_(2)  # an in-place write bumps the version: re-quantized
        second = compiled(x)
        assert_close_to_fp32(second, conv(x))
    assert len(calls) == 2


def test_bfloat16_convolution_runs_on_the_dut(device: Device) -> None:
    conv = nn.Conv2d(8, 8, 3, padding=1).to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 8, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        out = torch.compile(conv, backend="asic", fullgraph=True)(x)
        ref = conv(x)
    assert out.dtype == torch.bfloat16
    assert_close_to_fp32(out, ref)
    assert device.snapshot().dut_ops == 1


def test_a_float64_convolution_is_a_counted_host_fallback_at_its_line(device: Device) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3).double()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)  # the site

    net, x = Net().eval(), torch.randn(2, 3, 6, 6, dtype=torch.float64)
    compiled = torch.compile(net, backend="asic", fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(compiled(x), net(x))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.macs) == (0, 2, 0)
    assert snap.host_macs == 2 * (2 * 4 * 4 * 4 * 3 * 3 * 3)
    (stats,) = device.host_fallback_stats
    lines, first = inspect.getsourcelines(Net)
    line = first + next(i for i, text in enumerate(lines) if text.rstrip().endswith("# the site"))
    assert (stats.site.op, stats.site.file, stats.site.line) == ("conv2d", __file__, line)
    assert stats.site.reason.startswith("torch.float64 operands: the DUT path quantizes")
    assert (stats.calls, stats.shape) == (2, "x[2, 3, 6, 6] w[4, 3, 3, 3]")


def test_quantize_none_leaves_convolutions_on_the_host_counted(device: Device) -> None:
    conv, x = nn.Conv1d(4, 4, 3).eval(), torch.randn(2, 4, 10)
    with torch.no_grad():
        out = torch.compile(conv, backend=make_backend(quantize="none"))(x)
        torch.testing.assert_close(out, conv(x))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (0, 1, 2 * 8 * 4 * 4 * 3)
    (site,) = device.host_fallback_sites
    assert site.reason == "quantize='none': float convolutions stay on the host"


@pytest.mark.parametrize("host", ["aten", "inductor"])
def test_dynamic_batch_convolution_does_not_recompile(device: Device, host: str) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    counter = CompileCounterWithBackend(make_backend(host=host))
    compiled = torch.compile(net, backend=counter, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 3, 8, 8)
            assert_close_to_fp32(compiled(x), net(x))
    assert counter.frame_count == 1
    assert device.snapshot().dut_ops == 2 * 3


class _CNN(nn.Module):
    """conv -> relu -> grouped strided conv -> linear: PT2E quantizes all three."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.c2(torch.relu(self.c1(x))).flatten(1))


@pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated:UserWarning")
@pytest.mark.parametrize("quantizer", ["x86_static", "xnnpack_static"])
def test_pt2e_convolutions_run_on_the_dut_within_one_lsb(device: Device, quantizer: str) -> None:
    pytest.importorskip("torchao")
    from .test_pt2e import _convert

    x = torch.randn(2, 3, 8, 8)
    converted = _convert(_CNN(), quantizer, x)
    with torch.no_grad():
        ref = converted(x)
        out = torch.compile(converted, backend="asic", fullgraph=True)(x)
    snap = device.snapshot()
    # c1, c2 (2 groups), fc; the convs' output quantize (and c1's relu) fused on the DUT.
    assert (snap.dut_ops, snap.host_fallbacks) == (1 + 2 + 1, 0)
    assert snap.macs == 2 * 8 * 8 * 8 * 27 + 2 * 16 * 8 * 36 + 2 * 128 * 10
    # Requantized int8 activations: each differs from PT2E's float reference by at most 1 LSB,
    # which the next layer carries on; a few output LSBs at most.
    output_scale = float(ref.abs().max()) / 127
    assert float((out - ref).abs().max()) <= 4 * output_scale


@pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated:UserWarning")
def test_pt2e_transposed_convolutions(device: Device) -> None:
    pytest.importorskip("torchao")
    from .test_pt2e import _convert

    # XNNPACK quantizes conv_transpose + relu. Per tensor: on the DUT, requantized there.
    net = nn.Sequential(nn.ConvTranspose2d(4, 6, 2, stride=2), nn.ReLU())
    x = torch.randn(1, 4, 4, 4)
    macs = 16 * 4 * 6 * 2 * 2
    per_tensor = _convert(net, "xnnpack_static_per_tensor", x)
    with torch.no_grad():
        ref = per_tensor(x)
        out = torch.compile(per_tensor, backend="asic", fullgraph=True)(x)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.macs) == (1, 0, macs)
    output_scale = float(ref.abs().max()) / 255  # relu: the int8 range holds [0, max]
    assert float((out - ref).abs().max()) <= 2 * output_scale
    # Per channel, XNNPACK scales axis 0: the input channels a transposed conv sums over.
    device.reset()
    per_channel = _convert(net, "xnnpack_static", x)
    with torch.no_grad():
        torch.compile(per_channel, backend="asic", fullgraph=True)(x)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (0, 1, macs)
    (site,) = device.host_fallback_sites
    assert site.reason.startswith("per-channel weights along axis 0, which the layer sums over")


@pytest.mark.usefixtures("aten_passes")
def test_a_depthwise_conv_quantizes_into_one_reused_float32_buffer(device: Device) -> None:
    """The host convolves a depthwise conv in float32, so the quantized activations go to it as
    float32 in one buffer reused from call to call (no int8 tensor and conversion back, no fresh
    pages), and the result is bit for bit the int8 route's."""
    from unittest import mock

    from asic_backend.ops import conv as conv_ops

    x, w, b = torch.randn(2, 8, 9, 9), torch.randn(8, 1, 3, 3), torch.randn(8)
    args = (b, [1, 1], [1, 1, 1, 1], [1, 1], 8, False, [0, 0], True, device.key)
    run = mock.patch.object(conv_ops, "run_conv_i32", wraps=conv_ops.run_conv_i32)
    with run as spy:
        first = conv_ops.dyn_conv(x, w, *args)
        second = conv_ops.dyn_conv(x * 3, w, *args)
    operands = [call.args[0] for call in spy.call_args_list]
    assert [a.dtype for a in operands] == [torch.float32, torch.float32]
    assert operands[0].data_ptr() == operands[1].data_ptr()
    with mock.patch.object(conv_ops, "takes_float32", return_value=False), run as spy:
        assert torch.equal(conv_ops.dyn_conv(x, w, *args), first)
        assert torch.equal(conv_ops.dyn_conv(x * 3, w, *args), second)
    assert [call.args[0].dtype for call in spy.call_args_list] == [torch.int8, torch.int8]


# (x, w, stride, padding [lo, hi per dim], dilation, groups, transposed, output_padding): convs
# the host computes in float32 whatever the kernel, with a batch of 7 samples of 1.5 to 3 KB.
CHUNKED = {
    "depthwise-2d": ((7, 8, 9, 9), (8, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 8, False, [0, 0]),
    "grouped-1d-strided": ((7, 12, 40), (6, 4, 3), [2], [1, 1], [1], 3, False, [0]),
    "depthwise-x2-3d": ((7, 4, 3, 6, 6), (8, 1, 1, 3, 3), [1, 1, 1], [0, 0, 1, 1, 0, 1],
                        [1, 1, 1], 4, False, [0, 0, 0]),
    "transposed-grouped": ((7, 8, 5, 5), (8, 3, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 2, True,
                           [1, 1]),
}  # fmt: skip


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CHUNKED))
@pytest.mark.usefixtures("aten_passes")
def test_a_batch_in_chunks_of_samples_gives_the_same_bits_and_counts(
    device: Device, monkeypatch: pytest.MonkeyPatch, case: str, dtype: torch.dtype, bias: bool
) -> None:
    """Where the host convolves in float32, a batch larger than a few chunks is quantized,
    convolved and rescaled a chunk of samples at a time: the same values as all at once, and
    one convolution on the device."""
    from unittest import mock

    from asic_backend.ops import conv as conv_ops

    x_shape, w_shape, *geometry = CHUNKED[case]
    x, w = torch.randn(x_shape, dtype=dtype), torch.randn(w_shape)
    b = torch.randn(w_shape[1] * geometry[3] if geometry[4] else w_shape[0]) if bias else None
    args = (x, w, b, *geometry, True, device.key)
    whole = conv_ops.dyn_conv(*args)
    counted = device.snapshot()
    device.reset()
    monkeypatch.setattr(numerics, "CHUNK_BYTES", 2 * 4 * math.prod(x_shape[1:]))  # 2 samples
    run = mock.patch.object(
        conv_ops, "run_conv_i32_by_chunks", wraps=conv_ops.run_conv_i32_by_chunks
    )
    with run as spy:
        chunked = conv_ops.dyn_conv(*args)
    assert spy.call_count == 1
    assert chunked.dtype == dtype
    assert chunked.is_contiguous()
    assert torch.equal(chunked, whole)
    assert device.snapshot() == counted


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "by-chunks"])
@pytest.mark.parametrize("case", [*CHUNKED, "dense"])
def test_the_native_host_passes_give_the_aten_kernels_bits_and_counts(
    device: Device, monkeypatch: pytest.MonkeyPatch, case: str, chunked: bool
) -> None:
    """``dyn_conv``'s quantization and rescale, fused or in aten kernels, whole or a chunk of
    samples at a time (asic_backend.sim.host_passes)."""
    from asic_backend.ops import conv as conv_ops
    from asic_backend.sim import host_passes

    dense = ((3, 8, 9, 9), (16, 8, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, False, [0, 0])
    x_shape, w_shape, *geometry = dense if case == "dense" else CHUNKED[case]
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    b = torch.randn(w_shape[1] * geometry[3] if geometry[4] else w_shape[0])
    if chunked:
        monkeypatch.setattr(numerics, "CHUNK_BYTES", 2 * 4 * math.prod(x_shape[1:]))
    results = []
    for mode in host_passes.MODES:
        device.reset()
        with host_passes.forced(mode):
            results.append(
                (conv_ops.dyn_conv(x, w, b, *geometry, True, device.key), device.snapshot())
            )
    (native, native_counts), (aten, aten_counts) = results
    assert torch.equal(native, aten)
    assert native_counts == aten_counts
    assert native_counts.dut_ops >= 1  # one a group


# (x, kernel, stride, padding [top, bottom, left, right], dilation): depthwise 2-D convolutions,
# fused into one native loop a plane (asic_backend.sim.host_passes.depthwise_conv).
DEPTHWISE = {
    "3x3": ((2, 6, 9, 11), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1]),
    "3x3-strided": ((3, 4, 10, 9), (3, 3), [2, 2], [1, 1, 1, 1], [1, 1]),
    "5x5-dilated": ((1, 5, 13, 12), (5, 5), [1, 1], [4, 4, 4, 4], [2, 2]),
    "1x7-asymmetric": ((2, 3, 6, 17), (1, 7), [1, 3], [0, 2, 3, 1], [1, 1]),
    "unpadded-strided": ((2, 4, 8, 8), (2, 2), [2, 1], [0, 0, 0, 0], [1, 3]),
    "padding-past-the-input": ((1, 2, 3, 3), (3, 3), [1, 1], [5, 4, 6, 3], [1, 1]),
    "wide-two-threads": ((4, 16, 40, 40), (3, 3), [1, 1], [1, 1, 1, 1], [1, 1]),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", list(DEPTHWISE))
def test_a_fused_depthwise_conv_gives_the_aten_kernels_bits_and_counts(
    device: Device, case: str, bias: bool
) -> None:
    """Quantized, convolved and rescaled a plane at a time, against the three steps apart."""
    from unittest import mock

    from asic_backend.ops import conv as conv_ops
    from asic_backend.sim import host_passes

    x_shape, kernel, stride, padding, dilation = DEPTHWISE[case]
    g = torch.Generator().manual_seed(len(case))
    channels = x_shape[1]
    x = torch.randn(x_shape, generator=g) * 3
    w = torch.randn(channels, 1, *kernel, generator=g)
    b = torch.randn(channels, generator=g) if bias else None
    args = (x, w, b, stride, padding, dilation, channels, False, [0, 0], True, device.key)
    results = []
    real = host_passes.depthwise_conv
    fused: list[tuple[str, bool]] = []

    def watch(*a: Any, **k: Any) -> Any:
        fused.append((host_passes.mode(), (out := real(*a, **k)) is not None))
        return out

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for mode in host_passes.MODES:
            device.reset()
            with host_passes.forced(mode), mock.patch.object(host_passes, "depthwise_conv", watch):
                y = conv_ops.dyn_conv(*args)
            results.append((y, device.snapshot()))
    finally:
        torch.set_num_threads(before)
    assert fused == [("native", True), ("aten", False)]
    (native, native_counts), (aten, aten_counts) = results
    assert native.shape == aten.shape
    assert torch.equal(native, aten)
    assert native_counts == aten_counts


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_depthwise_sample_holding_inf_or_nan_takes_the_aten_kernels(
    device: Device, bad: float
) -> None:
    from asic_backend.ops import conv as conv_ops
    from asic_backend.sim import host_passes

    x, w = torch.randn(2, 4, 6, 6), torch.randn(4, 1, 3, 3)
    x[1, 2, 3, 3] = bad
    args = (x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 4, False, [0, 0], True, device.key)
    with host_passes.forced("native"):
        native = conv_ops.dyn_conv(*args)
    with host_passes.forced("aten"):
        aten = conv_ops.dyn_conv(*args)
    torch.testing.assert_close(native, aten, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "what",
    ["bfloat16", "channels-last", "two filters a channel", "kernel of 1,089 taps", "transposed"],
)
def test_what_the_fused_depthwise_conv_does_not_take(device: Device, what: str) -> None:
    """Each goes the separate steps' way (same values: the aten kernels' route is tested)."""
    from unittest import mock

    from asic_backend.ops import conv as conv_ops
    from asic_backend.sim import host_passes

    x, w = torch.randn(2, 4, 6, 6), torch.randn(4, 1, 3, 3)
    groups, transposed = 4, False
    if what == "bfloat16":
        x = x.to(torch.bfloat16)
    elif what == "channels-last":
        x = x.to(memory_format=torch.channels_last)
    elif what == "two filters a channel":
        w = torch.randn(8, 1, 3, 3)
    elif what == "kernel of 1,089 taps":
        x, w = torch.randn(1, 2, 40, 40), torch.randn(2, 1, 33, 33)
        groups = 2
    else:
        w, transposed = torch.randn(4, 1, 3, 3), True
    args = (x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], groups, transposed, [0, 0], True, device.key)
    real = host_passes.depthwise_conv
    returned: list[object] = []

    def watch(*a: Any, **k: Any) -> Any:
        returned.append(result := real(*a, **k))
        return result

    with mock.patch.object(host_passes, "depthwise_conv", watch):
        conv_ops.dyn_conv(*args)
    assert returned in ([], [None])


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "groups", "kernel", "chunks"),
    [
        pytest.param((8, 4, 6, 6), (4, 1, 3, 3), 4, "float32", 4, id="depthwise"),
        pytest.param((8, 16, 6, 6), (16, 16, 1, 1), 1, "float32", 4, id="pointwise-16-on-float32"),
        pytest.param((8, 16, 6, 6), (16, 16, 1, 1), 1, "int_mm", 1, id="pointwise-on-int_mm"),
        pytest.param((8, 32, 6, 6), (32, 32, 3, 3), 1, "float32", 1, id="dense-3x3-288-macs"),
        pytest.param((5, 4, 6, 6), (4, 1, 3, 3), 4, "float32", 1, id="two-chunks-and-a-half"),
    ],
)
def test_chunks_are_taken_for_many_samples_of_few_macs_per_value_on_the_float32_path(
    device: Device,
    monkeypatch: pytest.MonkeyPatch,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    groups: int,
    kernel: str,
    chunks: int,
) -> None:
    """Chunks where they win: the host convolves in float32 (never ``torch._int_mm``, which
    takes int8 values), at most ``sim.conv.CHUNK_MAX_MACS_PER_VALUE`` per input value (a dense
    3x3 of 32 channels has 288: oneDNN's calls on fewer rows would cost more), in three chunks
    or more."""
    from asic_backend.ops import conv as conv_ops
    from asic_backend.sim import host_gemm

    monkeypatch.setattr(numerics, "CHUNK_BYTES", 2 * 4 * math.prod(x_shape[1:]))  # 2 samples
    pad = w_shape[-1] // 2
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    args = ([1, 1], [pad] * 4, [1, 1], groups, False, [0, 0], True, device.key)
    with host_gemm.forced(kernel):
        conv_ops.dyn_conv(x, w, None, *args)
        assert device.snapshot().dut_ops == groups
        xb, _ = conv_ops._batched(x, w)
        geo = conv_ops._geometry(xb, w, *args[:6])
        per_chunk = sim_conv.samples_per_chunk(geo)
    assert -(-x_shape[0] // per_chunk) == chunks
