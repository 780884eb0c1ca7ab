"""The compiled graph's call (asic_backend/runtime.py): straight where AOTAutograd's runtime
wrappers would do nothing, through them everywhere else, with the same results either way."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

import asic_backend.backend
from asic_backend import make_backend, runtime
from asic_backend.backend import AsicHostWarning
from asic_backend.sim.device import Device

from .models import MLP


@dataclass
class Compiled:
    """One graph's compile as the backend saw it: how often AOTAutograd's function ran, and
    whether the backend handed Dynamo a straight call."""

    straight: bool = False
    aot_calls: int = 0


@dataclass
class Calls:
    graphs: list[Compiled] = field(default_factory=list)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Every graph the backend compiles in the test, with a count of the calls that went
    through AOTAutograd's runtime wrappers."""
    seen = Calls()

    def spy(aot_fn: Callable[..., Any], captured: runtime.CapturedForward, arity: int) -> Any:
        graph = Compiled()
        seen.graphs.append(graph)

        def counted(*args: Any) -> Any:
            graph.aot_calls += 1
            return aot_fn(*args)

        result = runtime.straight_call(counted, captured, arity)
        graph.straight = result is not counted
        return result

    monkeypatch.setattr(asic_backend.backend, "straight_call", spy)
    return seen


def _twice(fn: Callable[[], Any], device: Device) -> tuple[Any, int]:
    """``fn``'s second result (the first call goes through the wrappers) and the DUT ops it
    ran."""
    fn()
    before = device.snapshot().dut_ops
    out = fn()
    return out, device.snapshot().dut_ops - before


def test_an_inference_graph_is_called_straight_with_the_same_bits_and_counts(
    calls: Calls, device: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = MLP().eval(), torch.randn(8, 64)
    straight = torch.compile(copy.deepcopy(model), backend="asic", fullgraph=True)
    with torch.no_grad():
        out, ops = _twice(lambda: straight(x), device)
        out3 = straight(x)
    assert [(g.straight, g.aot_calls) for g in calls.graphs] == [(True, 1)]
    assert ops == 2

    torch._dynamo.reset()
    monkeypatch.setattr(asic_backend.backend, "straight_call", lambda aot_fn, *_: aot_fn)
    wrapped = torch.compile(copy.deepcopy(model), backend="asic", fullgraph=True)
    with torch.no_grad():
        ref, ref_ops = _twice(lambda: wrapped(x), device)
    assert torch.equal(out, ref)
    assert torch.equal(out3, ref)
    assert ops == ref_ops


def test_grad_mode_on_without_inputs_that_require_grad(calls: Calls, device: Device) -> None:
    model = MLP().eval().requires_grad_(False)
    compiled = torch.compile(model, backend="asic", fullgraph=True)
    out, ops = _twice(lambda: compiled(torch.randn(4, 64)), device)
    assert [g.straight for g in calls.graphs] == [True]
    assert ops == 2
    assert torch.is_grad_enabled()  # given back after the call
    assert not out.requires_grad
    assert out.grad_fn is None


def test_dynamic_shapes_pass_their_sizes_straight(calls: Calls, device: Device) -> None:
    model = MLP().eval()
    compiled = torch.compile(model, backend="asic", dynamic=True, fullgraph=True)
    with torch.no_grad():
        for rows in (3, 5, 9):
            x = torch.randn(rows, 64)
            assert compiled(x).shape == (rows, 32)
    assert [g.straight for g in calls.graphs] == [True]
    assert sum(g.aot_calls for g in calls.graphs) == 1


class _ViewOfInput(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.t(), x @ x.t()


class _MutatesBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.fc(x)


class _AliasedOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y, y.view(-1)


def test_an_output_that_is_a_view_of_an_input_keeps_the_wrappers(calls: Calls) -> None:
    x = torch.randn(4, 16)
    compiled = torch.compile(_ViewOfInput(), backend="asic", fullgraph=True)
    with torch.no_grad():
        compiled(x)
        view, _ = compiled(x)
    assert [(g.straight, g.aot_calls) for g in calls.graphs] == [(False, 2)]
    assert view._base is x


def test_a_mutated_buffer_keeps_the_wrappers(calls: Calls) -> None:
    model = _MutatesBuffer().eval()
    compiled = torch.compile(model, backend="asic", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(4, 16))
    assert [g.straight for g in calls.graphs] == [False]
    assert float(model.calls) == 3


def test_outputs_aliasing_each_other_alias_as_in_eager(calls: Calls) -> None:
    # AOTAutograd's inference metadata calls both fresh: the graph's own view op makes them
    # alias, straight or wrapped.
    compiled = torch.compile(_AliasedOutputs().eval(), backend="asic", fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(4, 16))
        y, flat = compiled(torch.randn(4, 16))
    assert [g.straight for g in calls.graphs] == [True]
    assert flat._base is y


def test_autocast_keeps_the_wrappers_that_turn_it_off(calls: Calls) -> None:
    model, x = MLP().eval(), torch.randn(4, 64)
    compiled = torch.compile(model, backend="asic", fullgraph=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(x)
        out = compiled(x)
    assert [g.straight for g in calls.graphs] == [False]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert out.dtype == model(x).dtype


def test_a_live_autograd_graph_keeps_the_wrappers(calls: Calls) -> None:
    model = MLP()  # parameters require grad, grad mode on: the graph runs on the host
    compiled = torch.compile(model, backend="asic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AsicHostWarning)
        compiled(torch.randn(4, 64)).sum().backward()
    assert [g.straight for g in calls.graphs] == [False]
    assert model.fc1.weight.grad is not None


def test_a_tensor_subclass_input_keeps_the_wrappers(calls: Calls) -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    compiled = torch.compile(double, backend=make_backend(), fullgraph=True)
    x = TwoTensor(torch.ones(3), torch.full((3,), 2.0))
    with torch.no_grad():
        compiled(x)
        out = compiled(x)
    assert [g.straight for g in calls.graphs] == [False]
    assert isinstance(out, TwoTensor)
    assert torch.equal(out.b, torch.full((3,), 4.0))
