"""Host MAC accounting: whatever leaves a matmul-class op on the host, it is counted, per call,
with its MACs, the user's line and a reason to act on."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from asic_backend import accounting, host_fallbacks_reported, make_backend
from asic_backend.accounting import AUTOGRAD_REASON, BACKWARD_REASON
from asic_backend.device import Device
from asic_backend.notices import AsicHostWarning
from tests.accounting import AccountingError

from .models import MLP

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
    assert site.reason.startswith("aten.addmm reached the host compiler with no DUT lowering")


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
