"""Convolutions and attention on the simulated ASIC, and the mistake that sends them to the host.

With ``--asic-backend`` every multiply-accumulate of ``TinyCNN`` runs on the DUT: the report
shows ``dut%`` 100%. Called with autograd live (no ``torch.no_grad()``), the same model runs on
the host, op by op; the marked test fails and lists each op with its host MACs and the fix. It
is marked ``xfail(strict=True, raises=pytest.fail.Exception)`` to show that failure while the
suite stays green.
"""

from __future__ import annotations

import pytest
import torch

from examples.models import TinyCNN

pytestmark = pytest.mark.no_graph_break


@pytest.fixture(autouse=True)
def _needs_the_dut(request):  # type: ignore[no-untyped-def]
    if not request.config.getoption("asic_backend"):
        pytest.skip("shows the simulated device: run with --asic-backend")
    # nn.MultiheadAttention's fused C++ fast path would run the attention where the DUT cannot
    # see it (a counted host fallback, whose reason says this).
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(True)


def test_cnn_runs_on_the_dut(nobreak_compile, asic):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = TinyCNN().eval(), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        reference = model(x)
        out = nobreak_compile(model)(x)
    counters = asic.snapshot()
    assert counters.host_macs == 0  # every MAC on the DUT
    assert counters.macs > 0
    torch.testing.assert_close(out, reference, rtol=0.05, atol=0.05)


@pytest.mark.xfail(
    reason="autograd is live: the model runs on the host", strict=True, raises=pytest.fail.Exception
)
def test_forgotten_no_grad_is_caught(nobreak_compile):  # type: ignore[no-untyped-def]
    model = TinyCNN().eval()
    nobreak_compile(model)(torch.randn(2, 3, 16, 16))  # no torch.no_grad()
