"""Host MAC accounting: whatever leaves a matmul-class op on the host, it is counted, per call,
with its MACs, the user's line and a reason to act on."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

from asic_backend import host_fallbacks_reported, make_backend
from asic_backend.lower import accounting
from asic_backend.lower.accounting import AUTOGRAD_REASON, BACKWARD_REASON
from asic_backend.notices import AsicHostWarning
from asic_backend.sim.device import Device
from tests.accounting import AccountingError, reference_macs

from .models import MLP, assert_close_to_fp32

#: MLP(64, 128, 32) on a [4, 64] input.
MLP_MACS = 4 * (64 * 128 + 128 * 32)


@pytest.mark.usefixtures("fresh_host_warnings")
def test_autograd_live_counts_every_op_on_the_host(device: Device) -> None:
    model, x = MLP(), torch.randn(4, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AsicHostWarning)
        out = torch.compile(model, backend="asic")(x)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.macs, snap.host_macs) == (0, 2, 0, MLP_MACS)
    assert {s.reason for s in device.host_fallback_sites} == {AUTOGRAD_REASON}
    assert "torch.no_grad() or torch.inference_mode()" in AUTOGRAD_REASON
    # The backward pass's GEMMs (two per linear but the first layer's input gradient) run on
    # the host too, counted as such.
    out.sum().backward()
    snap = device.snapshot()
    backward = [s for s in device.host_fallback_stats if s.site.reason == BACKWARD_REASON]
    assert sum(s.macs for s in backward) == snap.host_macs - MLP_MACS > 0


class _ConvAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv(x).flatten(2).transpose(1, 2)
        return self.attention(tokens, tokens, tokens, need_weights=False)[0]


@pytest.mark.usefixtures("fresh_host_warnings")
def test_autograd_live_convolutions_and_attention_run_on_the_host_counted(
    device: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host attention kernel lays its output out after its (transposed) inputs: the counting
    # marker in front of it must keep their strides, or the graph's views after it break.
    monkeypatch.setattr(torch.backends.mha, "get_fastpath_enabled", lambda: False)
    model, x = _ConvAttention().eval(), torch.randn(2, 3, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AsicHostWarning)
        out = torch.compile(model, backend="asic")(x)
    torch.testing.assert_close(out, model(x))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.macs) == (0, 0)
    assert {s.site.op for s in device.host_fallback_stats} == {
        "conv2d",
        "multi_head_attention_forward",
    }


@pytest.mark.usefixtures("fresh_host_warnings")
def test_the_autograd_warning_is_left_to_a_reporter_that_lists_host_fallbacks(
    device: Device,
) -> None:
    x = torch.randn(4, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with host_fallbacks_reported():
            torch.compile(MLP(), backend="asic")(x)
        assert not [w for w in caught if issubclass(w.category, AsicHostWarning)]
        torch._dynamo.reset()
        torch.compile(MLP(), backend="asic")(x)  # unreported code: said once, now
    said = [w for w in caught if issubclass(w.category, AsicHostWarning)]
    assert len(said) == 1
    assert "each of its matmul-class ops counts as a host fallback" in str(said[0].message)


def test_an_op_no_pass_lowers_is_counted_with_a_generic_reason(device: Device) -> None:
    def fn(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x.clone().addmm_(a, b)  # in place: Dynamo records addmm_, no pass takes it

    x, a, b = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend="asic")(x, a, b), fn(x, a, b))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (0, 1, 3 * 4 * 5)
    (site,) = device.host_fallback_sites
    assert site.reason.startswith("no DUT lowering reached aten.addmm (in-place and out=")


def test_host_fallbacks_are_counted_with_the_inductor_host_too(device: Device) -> None:
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).double().eval()
    x = torch.randn(5, 8, dtype=torch.float64)
    with torch.no_grad():
        out = torch.compile(net, backend=make_backend(host="inductor"))(x)
        torch.testing.assert_close(out, net(x))
    snap = device.snapshot()
    assert (snap.host_fallbacks, snap.host_macs) == (2, 5 * (8 * 8 + 8 * 4))


@pytest.fixture
def no_mha_fastpath_off() -> None:
    assert torch.backends.mha.get_fastpath_enabled()


@pytest.mark.usefixtures("no_mha_fastpath_off")
def test_fused_transformer_fast_path_counts_its_macs_on_the_host(device: Device) -> None:
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(layer, backend="asic")(x), layer(x))
    tokens = 2 * 6
    # in-projection (3 x 32), attention (QKᵀ and PV over 6 positions), out-projection, FFN
    expected = tokens * 32 * 96 + 2 * tokens * 6 * 32 + tokens * 32 * 32 + 2 * tokens * 32 * 64
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (0, 1, expected)
    (site,) = device.host_fallback_sites
    assert "torch.backends.mha.set_fastpath_enabled(False)" in site.reason


def test_the_accounting_check_catches_an_uncounted_host_op(
    device: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The suite-wide check is only worth its cost if it fails: without the accounting pass, a
    # float64 linear's MACs go unseen, and the call raises.
    monkeypatch.setattr(accounting, "_mark", lambda *args: None)
    net, x = nn.Linear(8, 4).double(), torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(AccountingError, match=r"host 0 MACs \(total 0\), but"):
        torch.compile(net, backend="asic")(x)


@pytest.mark.usefixtures("fresh_host_warnings")
def test_the_backward_pass_counts_its_convolutions_and_attention(device: Device) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from asic_backend import flop_counter_extras

    model, x = _ConvAttention(), torch.randn(2, 3, 4, 4)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AsicHostWarning)
            torch.compile(model, backend="asic")(x).sum().backward()
        with FlopCounterMode(display=False, custom_mapping=flop_counter_extras()) as counter:
            model(x).sum().backward()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    snap = device.snapshot()
    assert snap.host_macs == counter.get_total_flops() // 2
    backward = {s.site.op for s in device.host_fallback_stats if s.site.reason == BACKWARD_REASON}
    assert backward == {"conv2d", "multi_head_attention_forward"}


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (torch.mv, ((3, 4), (4,))),
        (torch.dot, ((5,), (5,))),
        (torch.linalg.matmul, ((2, 3, 4), (4, 5))),
        (lambda a, b: torch.tensordot(a, b, dims=2), ((3, 4, 5), (4, 5, 6))),
        (torch.inner, ((3, 4), (5, 4))),
        (lambda a, b: torch.linalg.multi_dot([a, b, b.t()]), ((3, 4), (4, 4))),
    ],
    ids=["mv", "dot", "linalg.matmul", "tensordot", "inner", "multi_dot"],
)
def test_every_spelling_of_a_matmul_runs_on_the_dut(
    device: Device, fn: Callable[..., torch.Tensor], shapes: tuple[tuple[int, ...], ...]
) -> None:
    # Drawn here, under the seeding fixture, not at collection: a 5-term dot product of
    # unseeded draws can cancel to ~0, where int8's error relative to the result is unbounded.
    args = tuple(torch.randn(shape) for shape in shapes)
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(*args)
    assert_close_to_fp32(out, fn(*args))
    snap = device.snapshot()
    assert (snap.host_fallbacks, snap.host_macs) == (0, 0)
    assert snap.dut_ops >= 1


def test_matmuls_inside_higher_order_ops_run_on_the_dut(device: Device) -> None:
    linear = nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def block(x: torch.Tensor) -> torch.Tensor:
        return linear(x)

    def branches(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: linear(t), lambda t: linear(t) * 2, (x,))

    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.compile(lambda x: block(block(x)), backend="asic")(x)
        assert device.snapshot().macs == reference_macs(lambda x: block(block(x)), x)
        device.reset()
        torch.compile(branches, backend="asic")(x)
    snap = device.snapshot()
    # The branch that ran: one GEMM (FlopCounterMode would count the larger branch).
    assert (snap.dut_ops, snap.macs, snap.host_macs) == (1, 3 * 8 * 8, 0)


def test_inductor_keeps_small_matmuls_where_the_accounting_sees_them(device: Device) -> None:
    # Inductor decomposes a one-row addmm and every mv into multiplies and sums, where no
    # matmul is left to count: the asic backend keeps those ops whole.
    host = make_backend(host="inductor", quantize="none")
    net, x = nn.Linear(4, 5), torch.randn(1, 4)
    with torch.no_grad():
        torch.compile(net, backend=host)(x)
        torch.compile(torch.mv, backend=host)(torch.randn(3, 4), torch.randn(4))
    assert device.snapshot().host_macs == 4 * 5 + 3 * 4


def test_dut_results_take_the_dtype_autocast_traced(device: Device) -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.conv = nn.Linear(8, 8), nn.Conv1d(5, 5, 3)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                sdpa = torch.nn.functional.scaled_dot_product_attention(x, x, x)
                return self.fc(x), self.conv(x), sdpa, torch.bmm(x, y)

    model, x, y = Mixed(), torch.randn(2, 5, 8), torch.randn(2, 8, 3)
    with torch.no_grad():
        eager = model(x, y)
        compiled = torch.compile(model, backend="asic")(x, y)
    assert [t.dtype for t in compiled] == [t.dtype for t in eager] == [torch.bfloat16] * 4
    assert device.snapshot().dut_ops > 0


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (torch.nn.functional.scaled_dot_product_attention, [(2, 4, 0, 8), (2, 4, 5, 8)] * 1),
        (torch.nn.functional.scaled_dot_product_attention, [(2, 4, 5, 8), (2, 4, 0, 8)]),
        (torch.bmm, [(2, 0, 3), (2, 3, 4)]),
    ],
    ids=["sdpa-no-queries", "sdpa-no-keys", "bmm-no-rows"],
)
def test_empty_matmuls_and_attention(
    device: Device, fn: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]]
) -> None:
    args = [torch.randn(*s) for s in shapes]
    if fn is torch.nn.functional.scaled_dot_product_attention:
        args = [args[0], args[1], args[1]]
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", dynamic=False)(*args)
    torch.testing.assert_close(out, fn(*args))
