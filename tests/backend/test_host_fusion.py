"""The work around the DUT GEMM: bit-exact whichever host runs it, fused under Inductor, and
the device's per-call bookkeeping exact under threads."""

from __future__ import annotations

import itertools
import re
import threading

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

from asic_backend import make_backend
from asic_backend.ops import linear as quant_ops
from asic_backend.sim import host_passes
from asic_backend.sim.cycles import ACC_BYTES, gemm_cost
from asic_backend.sim.device import Device

ops = torch.ops.asic


def _inductor(model: nn.Module, *args: torch.Tensor, dynamic: bool | None = None) -> list[str]:
    """The Python wrapper code Inductor wrote for ``model`` on the ``asic`` backend."""
    compiled = torch.compile(
        model, backend=make_backend(host="inductor"), fullgraph=True, dynamic=dynamic
    )
    with torch.no_grad():
        _, codes = run_and_get_code(compiled, *args)
    return codes


def _kernels(code: str) -> list[str]:
    """The fused host kernels the wrapper's ``call`` runs, in order."""
    return re.findall(r"\b(cpp_fused_\w+)\(", code.split("def call")[-1])


def _assert_two_dut_ops_in_three_kernels(
    model: nn.Module, x: torch.Tensor, *, whole: str, opaque: str
) -> None:
    """``model`` (layer, ReLU, layer) under Inductor: no ``asic::<whole>`` left, two opaque
    ``asic::<opaque>`` ops, and the host work around them in three fused kernels: quantize;
    rescale + ReLU + quantize; rescale."""
    code = "\n".join(_inductor(model, x))
    assert f"asic.{whole}" not in code
    assert code.count(f"torch.ops.asic.{opaque}.default(") == 2
    kernels = _kernels(code)
    assert len(kernels) == 3, kernels
    assert all(step in kernels[1] for step in ("relu", "amax", "round")), kernels


def _eager_dut(model: nn.Sequential, x: torch.Tensor, key: str) -> torch.Tensor:
    """``model`` (Linear / ReLU layers) with every linear as the eager ``asic::dyn_linear``."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            x = ops.dyn_linear(x, layer.weight, layer.bias, False, True, key)
        else:
            x = layer(x)
    return x


@pytest.mark.parametrize("shape", [(1, 64), (8, 64), (2, 5, 64)])
def test_inductor_fuses_quantize_and_rescale_bit_exact(
    device: Device, shape: tuple[int, ...]
) -> None:
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32)).eval()
    x = torch.randn(shape)
    compiled = torch.compile(model, backend=make_backend(host="inductor"), fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        device.reset()
        compiled(x)
        snap = device.snapshot()
        ref = _eager_dut(model, x, device.key)
    assert torch.equal(out, ref)
    rows = x.numel() // 64
    assert (snap.dut_ops, snap.macs) == (2, rows * (64 * 96 + 96 * 32))

    # The float linears became one opaque DUT GEMM each.
    _assert_two_dut_ops_in_three_kernels(model, x, whole="dyn_linear", opaque="dyn_weight_mm")


def test_inductor_fuses_a_convs_quantize_and_rescale_bit_exact(device: Device) -> None:
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 1)).eval()
    x = torch.randn(2, 4, 9, 9)
    compiled = torch.compile(model, backend=make_backend(host="inductor"), fullgraph=True)
    eager = torch.compile(model, backend=make_backend(host="aten"), fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        device.reset()
        compiled(x)
        snap = device.snapshot()
        assert torch.equal(out, eager(x))
    assert (snap.dut_ops, snap.macs) == (2, 2 * 81 * (8 * 4 * 9 + 6 * 8))

    # Each conv became one opaque DUT convolution.
    _assert_two_dut_ops_in_three_kernels(model, x, whole="dyn_conv", opaque="dyn_weight_conv")


@pytest.mark.parametrize(
    ("conv", "shape"),
    [
        (nn.Conv2d(8, 8, 3, padding=1, groups=8), (2, 8, 9, 9)),  # depthwise: float32 on the host
        (nn.Conv2d(4, 8, 3, stride=2, padding="valid"), (4, 9, 9)),  # unbatched
        (nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1), (2, 8, 10)),
        (nn.Conv2d(4, 8, 3), (0, 4, 9, 9)),  # empty: the whole op, nothing to fuse
    ],
    ids=["depthwise", "unbatched", "transposed", "empty"],
)
def test_inductor_convs_stay_exact(device: Device, conv: nn.Module, shape: tuple[int, ...]) -> None:
    conv = conv.eval()
    x = torch.randn(shape)
    with torch.no_grad():
        eager = torch.compile(conv, backend=make_backend(host="aten"), fullgraph=True)(x)
        out = torch.compile(conv, backend=make_backend(host="inductor"), fullgraph=True)(x)
    assert out.shape == eager.shape
    assert torch.equal(out, eager)


def test_inductor_dynamic_shapes_stay_exact(device: Device) -> None:
    model = nn.Sequential(nn.Linear(32, 48)).eval()
    compiled = torch.compile(model, backend=make_backend(host="inductor"), dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 17):
            x = torch.randn(rows, 32)
            assert torch.equal(compiled(x), _eager_dut(model, x, device.key))


def test_bfloat16_activations_keep_the_op_whole_and_exact(device: Device) -> None:
    # Eager rounds the bf16 scale between steps; a fused kernel would not (one ulp of the scale
    # moves int8 values), so these stay one op.
    model = nn.Sequential(nn.Linear(64, 32)).to(torch.bfloat16).eval()
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    compiled = torch.compile(model, backend=make_backend(host="inductor"), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), _eager_dut(model, x, device.key))
    code = "\n".join(_inductor(model, x))
    assert "torch.ops.asic.dyn_linear.default(" in code


@pytest.mark.parametrize("passes", host_passes.MODES)
def test_quantize_sym_rows_is_torchaos_formula(passes: str) -> None:
    # The short form (abs-max, no zero point) against the general TorchAO replica it stands for.
    g = torch.Generator().manual_seed(3)
    # Small, and large enough for the two-reduction form of max |x| (TWO_REDUCTIONS_MIN_NUMEL).
    shapes = [(7, 33), (7, quant_ops.TWO_REDUCTIONS_MIN_NUMEL // 7 + 1)]
    for dtype, shape in itertools.product((torch.float32, torch.bfloat16, torch.float16), shapes):
        x = torch.randn(shape, generator=g).to(dtype)
        x[2] = 0.0
        x[3] = x[3].abs()  # one-signed rows
        x[4] = -x[4].abs()
        with host_passes.forced(passes):
            q, scale = quant_ops.quantize_sym_rows(x)
        ref_scale, zp = quant_ops.choose_qparams_rows(x, symmetric=True)
        assert torch.equal(scale, ref_scale)
        assert torch.equal(q, quant_ops.quantize_rows(x, ref_scale, zp, -128, 127))


def test_a_shape_costs_once_and_counts_every_call(device: Device) -> None:
    x, w = torch.randn(3, 64), torch.randn(32, 64)
    for _ in range(3):
        ops.dyn_linear(x, w, None, False, True, device.key)
    issued, costs = device.history()
    assert issued == 3
    assert costs == (gemm_cost(device.config, 3, 64, 32, ACC_BYTES),) * 3
    assert costs[0] is costs[1]  # computed once, shared


def test_counters_stay_exact_under_threads(device: Device) -> None:
    x, w = torch.randn(2, 64), torch.randn(16, 64)
    ops.dyn_linear(x, w, None, False, True, device.key)  # the weight cached before the race
    device.reset()
    calls, threads = 200, 4
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        for _ in range(calls):
            ops.dyn_linear(x, w, None, False, True, device.key)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    cost = gemm_cost(device.config, 2, 64, 16, ACC_BYTES)
    snap = device.snapshot()
    assert snap.dut_ops == calls * threads
    assert (snap.macs, snap.cycles, snap.bytes_moved) == (
        cost.macs * calls * threads,
        cost.cycles * calls * threads,
        cost.bytes_moved * calls * threads,
    )
