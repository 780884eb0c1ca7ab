"""The backend itself: registration, options, inference-only, no break, no recompile, the seed."""

from __future__ import annotations

import warnings

import pytest
import torch
from functorch.compile import make_boxed_func
from torch import fx, nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import asic_backend
from asic_backend import AsicConfig, make_backend
from asic_backend.backend import AsicHostWarning
from asic_backend.sim.device import Device, get_device

from .models import MLP, assert_close_to_fp32


def test_registered_as_a_dynamo_backend() -> None:
    assert "asic" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("asic") is asic_backend.asic_backend


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantize": "int4"}, "quantize='int4' is not one of 'dynamic', 'none'"),
        ({"matmul": "yes"}, "matmul='yes' is not one of 'dynamic', 'none'"),
        ({"host": "cuda"}, "host='cuda' is not one of 'aten', 'inductor'"),
        ({"config": "tpu_v9"}, "ASIC config 'tpu_v9' is neither a preset"),
    ],
)
def test_bad_options_are_one_clear_line(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        make_backend(**kwargs)
    assert "\n" not in str(info.value)


def test_options_through_torch_compile() -> None:
    gemmini = get_device("gemmini")
    gemmini.reset()
    model, x = MLP(), torch.randn(4, 64)
    with torch.no_grad():
        torch.compile(model, backend="asic", options={"config": "gemmini"})(x)
    assert gemmini.snapshot().dut_ops == 2
    assert gemmini.snapshot().peak_macs_per_cycle == AsicConfig.preset("gemmini").rows ** 2

    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(model, backend="asic", options={"quantise": "none"})(x)
    assert "unknown option(s) 'quantise'" in str(info.value)


def test_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASIC_BACKEND_CONFIG", "tpu_v1")
    tpu = get_device("tpu_v1")
    tpu.reset()
    with torch.no_grad():
        torch.compile(MLP(), backend="asic")(torch.randn(4, 64))
    assert tpu.snapshot().dut_ops == 2


def test_package_exports_the_backend_names() -> None:
    from asic_backend import backend
    from asic_backend.lower import unconverted

    assert asic_backend.AsicBackend is backend.AsicBackend
    assert asic_backend.AsicHostWarning is backend.AsicHostWarning
    assert asic_backend.NotConvertedError is unconverted.NotConvertedError
    assert {"AsicBackend", "AsicHostWarning", "NotConvertedError"} <= set(asic_backend.__all__)


def test_backend_repr_and_device() -> None:
    be = make_backend(config="gemmini", quantize="none")
    assert repr(be) == "AsicBackend(config=gemmini, quantize='none', matmul='none', host='aten')"
    assert be.device is get_device("gemmini")


@pytest.mark.usefixtures("fresh_host_warnings")
def test_autograd_live_runs_on_the_host_and_says_so_once(device: Device) -> None:
    model, x = MLP(), torch.randn(4, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two compiles of two frames: still one message
            torch._dynamo.reset()
            out = torch.compile(model, backend="asic")(x)
            torch.compile(MLP(), backend="asic")(x)
    messages = [w for w in caught if issubclass(w.category, AsicHostWarning)]
    assert len(messages) == 1
    assert "torch.no_grad()" in str(messages[0].message)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()  # the host graph keeps its backward
    assert model.fc1.weight.grad is not None
    assert device.snapshot().dut_ops == 0


def test_no_grad_after_training_runs_on_the_dut(device: Device) -> None:
    model = MLP()
    compiled = torch.compile(model, backend="asic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AsicHostWarning)
        compiled(torch.randn(4, 64)).sum().backward()
    with torch.inference_mode():
        compiled(torch.randn(4, 64))
    assert device.snapshot().dut_ops == 2


@pytest.mark.parametrize("host", ["aten", "inductor"])
def test_dynamic_batch_does_not_recompile(device: Device, host: str) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = MLP()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mlp(x) + (x @ x.transpose(0, 1)).mean()

    model = Net()
    counter = CompileCounterWithBackend(make_backend(host=host))
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for batch in (3, 5, 17):
            x = torch.randn(batch, 64)
            assert_close_to_fp32(compiled(x), model(x))
    assert counter.frame_count == 1
    assert counters["stats"]["unique_graphs"] == 1
    assert device.snapshot().dut_ops == 3 * 3


# -- the seed scenario ------------------------------------------------------------------------


class _SeedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


_real_dut_calls = 0


def dut_matmul_sync(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The user's simulator call: reads a scalar from the activations."""
    global _real_dut_calls
    a_scale = float(a.abs().max().item()) / 127
    a_q = torch.clamp(torch.round(a / a_scale), -127, 127)
    _real_dut_calls += 1
    return torch.nn.functional.linear(a_q * a_scale, w, b)


def naive_backend(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
    """The user's backend: swap every linear for the Python call, then aot_autograd."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._nn.linear:
            node.target = dut_matmul_sync
    gm.recompile()
    return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)


def test_seed_naive_backend_runs_the_whole_frame_eagerly() -> None:
    global _real_dut_calls
    _real_dut_calls = 0
    model, x = _SeedNet(), torch.randn(4, 32)
    compiled = torch.compile(model, backend=naive_backend)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))  # "green", yet ...
    assert _real_dut_calls == 0  # ... the DUT never ran:
    assert counters["frames"]["total"] == 1
    assert counters["frames"]["ok"] == 0  # the frame fell back to eager
    (reason,) = counters["unimplemented"]
    assert "gb0219" in reason
    assert "_local_scalar_dense" in reason


def test_seed_network_runs_on_the_dut_with_asic(device: Device) -> None:
    model, x = _SeedNet(), torch.randn(4, 32)
    with torch.no_grad(), torch._dynamo.error_on_graph_break(True):
        compiled = torch.compile(model, backend="asic")
        for _ in range(3):
            assert_close_to_fp32(compiled(x), model(x))
    assert dict(counters["frames"]) == {"total": 1, "ok": 1}
    assert "unimplemented" not in counters
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2 * 3, 0)


# -- the aten graph calls the DUT kernels directly ---------------------------------------------


def _forward_graph(model: nn.Module, x: torch.Tensor) -> fx.GraphModule:
    """The forward aten graph the asic backend hands its host compiler (boxed_nop) for model."""
    from torch._dynamo.backends import debugging

    seen: list[fx.GraphModule] = []
    nop = debugging.boxed_nop

    def spy(gm: fx.GraphModule, example_inputs: object) -> object:
        seen.append(gm)
        return nop(gm, example_inputs)

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(debugging, "boxed_nop", spy)
        torch.compile(model, backend="asic")(x)
    (gm,) = seen
    return gm


def test_an_inference_graph_calls_the_dut_kernels_directly() -> None:
    from asic_backend.ops.library import DIRECT_CALLS

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    gm = _forward_graph(model, torch.randn(2, 8))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    direct = DIRECT_CALLS[torch.ops.asic.dyn_linear.default]
    assert targets.count(direct) == 2
    assert torch.ops.asic.dyn_linear.default not in targets


def test_who_watches_ops_still_sees_the_dut_op() -> None:
    """The profiler around a compiled call, and a dispatch mode around a direct call, see
    ``asic::dyn_linear`` (the direct call steps aside for them), with the same numbers."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from asic_backend.ops.library import DIRECT_CALLS

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    torch._dynamo.reset()
    model = nn.Linear(8, 4).eval()
    compiled = torch.compile(model, backend="asic")
    x = torch.randn(2, 8)
    key = get_device(None).key
    direct = DIRECT_CALLS[torch.ops.asic.dyn_linear.default]
    with torch.no_grad():
        plain = compiled(x)
        with torch.profiler.profile(acc_events=True) as prof:  # torch 2.12 warns without it
            profiled = compiled(x)
        with Ops() as ops:
            watched = direct(x, model.weight, model.bias, False, True, key)
    assert "asic::dyn_linear" in {event.name for event in prof.events()}
    assert ops.names == ["asic.dyn_linear.default"]
    assert torch.equal(plain, profiled)
    assert torch.equal(plain, watched)
