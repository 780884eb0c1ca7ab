"""The suite-wide MAC accounting check (tests/accounting.py) fails where it should.

Every test of the suite runs under it; these show that it compares what it claims to: graphs
with higher-order ops (the branch taken, each loop iteration), graphs that call ``asic::`` ops
themselves (counted by their own formulas, the device's figures left as the call made them),
a benchmark's first call (compared at the end), and that a graph it cannot run is a failure.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

from asic_backend.lower import accounting
from asic_backend.notices import AsicHostWarning
from asic_backend.sim.device import Device
from tests import accounting as check
from tests.accounting import AccountingError, checking_every_graph

#: A float64 linear runs on the host; with the accounting pass off its MACs go uncounted.
LINEAR = nn.Linear(8, 8).double()


def _branches(x: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda t: LINEAR(t), lambda t: LINEAR(t) * 2, (x,))


def _loop(x: torch.Tensor) -> torch.Tensor:
    def body(i: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i + 1, LINEAR(t).tanh()

    return torch._higher_order_ops.while_loop(lambda i, t: i < 3, body, (torch.tensor(0), x))[1]


def _checkpointed(x: torch.Tensor) -> torch.Tensor:
    return torch.utils.checkpoint.checkpoint(lambda t: LINEAR(t).relu(), x, use_reentrant=False)


HOP_CASES = {"cond": (_branches, 1), "while_loop": (_loop, 3), "checkpoint": (_checkpointed, 1)}


def _compiled_call(fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", AsicHostWarning)
        return torch.compile(fn, backend="asic")(torch.randn(3, 8, dtype=torch.float64))


@pytest.mark.parametrize("name", list(HOP_CASES))
def test_a_higher_order_op_graph_is_checked_op_by_op(device: Device, name: str) -> None:
    fn, linears = HOP_CASES[name]
    with checking_every_graph() as checked:
        _compiled_call(fn)
    # The branch taken or each iteration, on the host (float64): counted as ran.
    assert device.snapshot().host_macs == linears * 3 * 8 * 8
    assert (checked.graphs, checked.calls) == (1, 1)


@pytest.mark.parametrize("name", list(HOP_CASES))
def test_uncounted_macs_inside_a_higher_order_op_fail_the_call(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Such graphs used to be skipped: their uncounted host MACs passed.
    monkeypatch.setattr(accounting, "_mark", lambda *args: None)
    fn, linears = HOP_CASES[name]
    with pytest.raises(AccountingError, match=rf"total 0\), but the graph does {linears * 192} "):
        _compiled_call(fn)


def test_a_graph_with_a_higher_order_op_it_cannot_run_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(check.HIGHER_ORDER_OPS, "cond")
    with pytest.raises(AccountingError, match=r"cannot check a graph with cond: say in"):
        _compiled_call(_branches)


def _int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.asic.int_mm(a, b, "default")


def test_a_graph_of_asic_ops_is_checked_on_the_devices_figures_it_made(device: Device) -> None:
    a = torch.randint(-128, 128, (16, 32), dtype=torch.int8)
    b = torch.randint(-128, 128, (32, 24), dtype=torch.int8)
    with checking_every_graph() as checked:
        torch.compile(_int_mm, backend="asic")(a, b)
    assert checked.calls == 1
    snap = device.snapshot()
    # One GEMM: the reference run's own call of the op left the counters as they were.
    assert (snap.dut_ops, snap.macs) == (1, 16 * 32 * 24)


def test_an_asic_op_counted_wrong_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    int_mm = torch.ops.asic.int_mm
    monkeypatch.setitem(check.REFERENCE_FORMULAS, int_mm, lambda *args, **kwargs: 0)
    a = torch.ones(4, 8, dtype=torch.int8)
    with pytest.raises(AccountingError, match=r"the DUT counted 128 .* does 0 MACs"):
        torch.compile(_int_mm, backend="asic")(a, a.t().contiguous())


def test_a_benchmarks_first_call_is_compared_when_the_block_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(accounting, "_mark", lambda *args: None)
    net, x = nn.Linear(8, 4).double(), torch.randn(2, 8, dtype=torch.float64)
    block = checking_every_graph(first_call_only=True)
    with torch.no_grad():
        checked = block.__enter__()
        compiled = torch.compile(net, backend="asic")
        for _ in range(3):
            compiled(x)  # a timed round: no reference run, no error yet
        assert checked.calls == 0
        with pytest.raises(
            AccountingError, match=r"host 0 MACs \(total 0\), but the graph does 64 "
        ):
            block.__exit__(None, None, None)
    assert checked.calls == 1  # the first call only
