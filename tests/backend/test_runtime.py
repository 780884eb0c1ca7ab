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
    """One graph's calls as the backend saw them: all of them, and those that went through
    AOTAutograd's runtime wrappers."""

    calls: int = 0
    aot_calls: int = 0

    @property
    def straight(self) -> bool:
        """Called straight from its second call on (only the first went through the
        wrappers)."""
        return self.calls > 1 and self.aot_calls == 1


@dataclass
class Calls:
    graphs: list[Compiled] = field(default_factory=list)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Every graph the backend compiles in the test, with its calls and those that went
    through AOTAutograd's runtime wrappers."""
    seen = Calls()

    def spy(aot_fn: Callable[..., Any], captured: runtime.CapturedForward, inputs: Any) -> Any:
        graph = Compiled()
        seen.graphs.append(graph)

        def counted(*args: Any) -> Any:
            graph.aot_calls += 1
            return aot_fn(*args)

        result = runtime.straight_call(counted, captured, inputs)

        def call(*args: Any) -> Any:
            graph.calls += 1
            return result(*args)

        return call

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


def test_dynamic_outputs_keep_the_wrappers_that_mark_them_for_the_next_graph(
    calls: Calls,
) -> None:
    """The wrappers mark an output's dynamic dims, so a compiled function it feeds compiles
    once for all sizes (a straight call left it compiling twice)."""
    graphs: list[int] = []
    model = MLP().eval()
    first = torch.compile(model, backend="asic", dynamic=True, fullgraph=True)
    second = torch.compile(
        lambda y: y.sin(), backend=lambda gm, ex: (graphs.append(1), gm.forward)[1]
    )
    with torch.no_grad():
        for rows in (3, 5, 9):
            assert first(torch.randn(rows, 64)).shape == (rows, 32)
        for rows in (11, 13):
            second(first(torch.randn(rows, 64)))
    assert [g.straight for g in calls.graphs] == [False]
    assert len(graphs) == 1


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
        for _ in range(2):
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


class _Scaled(torch.Tensor):
    """A tensor subclass of one inner tensor, whose value is ``data · scale``: unwrapped, its
    graph has as many arguments as the plain one."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: float) -> _Scaled:
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)  # type: ignore[attr-defined,no-any-return]

    def __init__(self, data: torch.Tensor, scale: float) -> None:
        self.data_, self.scale = data, scale

    def __tensor_flatten__(self) -> tuple[list[str], tuple[float]]:
        return ["data_"], (self.scale,)

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: Any, *_: Any) -> _Scaled:
        return _Scaled(inner["data_"], meta[0])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def value(t: Any) -> Any:
            return t.data_ * t.scale if isinstance(t, _Scaled) else t

        tree_map = torch.utils._pytree.tree_map
        return func(*tree_map(value, args), **tree_map(value, kwargs or {}))


def test_a_subclass_of_one_inner_tensor_keeps_the_wrappers(calls: Calls) -> None:
    """Its inner graph takes as many arguments as the subclass's, and AOTAutograd's metadata is
    the inner one's: the first call tells, and keeps the wrappers that unwrap it."""

    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    compiled = torch.compile(add, backend="asic", fullgraph=True)
    with torch.no_grad():
        results = [compiled(_Scaled(torch.full((2,), 3.0), 3.0), torch.ones(2)) for _ in range(3)]
    assert [g.straight for g in calls.graphs] == [False]
    assert [r.tolist() for r in results] == [[10.0, 10.0]] * 3


def test_a_subclass_made_in_the_graph_keeps_the_wrappers(calls: Calls) -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    def make(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return TwoTensor(x * 2, y * 3)

    compiled = torch.compile(make, backend="asic", fullgraph=True)
    with torch.no_grad():
        outs = [compiled(torch.ones(2), torch.ones(2)) for _ in range(3)]
    assert [g.straight for g in calls.graphs] == [False]
    assert all(isinstance(out, TwoTensor) for out in outs)
    assert torch.equal(outs[-1].b, torch.full((2,), 3.0))
