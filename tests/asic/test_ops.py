"""The asic:: custom ops under opcheck and torch.compile, and the device registry behind them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch

import asic_backend.ops.primitives  # noqa: F401  (registers torch.ops.asic.*)
from asic_backend.sim import device as devices
from asic_backend.sim.config import ENV_VAR, AsicConfig
from asic_backend.sim.cycles import gemm_cost
from asic_backend.sim.device import (
    COST_HISTORY,
    CounterSnapshot,
    Device,
    HostFallback,
    get_device,
    run_linear_requant,
    run_mm_i32,
)
from asic_backend.sim.numerics import quantize_multiplier
from tests.asic import golden
from tests.races import run_interleaved

DEV = get_device("default")


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    devices.reset_all()
    yield
    devices.reset_all()


def rand_i8(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


M, K, N = 6, 32, 10
A = rand_i8(M, K, seed=1)
W = rand_i8(N, K, seed=2)
BIAS = torch.arange(-5 * N, 5 * N, 10, dtype=torch.int32) * 1000
ROW_ZP = i32([-128, 0, 5, 127, -3, 9]).reshape(M, 1)
MULT, SHIFT = quantize_multiplier(torch.linspace(1e-4, 3e-3, N, dtype=torch.float64))


def mm_args(a: torch.Tensor = A, zp: torch.Tensor | None = None) -> tuple[object, ...]:
    return (a, W, BIAS, ROW_ZP[: a.shape[0]] if zp is None else zp, DEV.key)


def requant_args(a: torch.Tensor = A, per_channel: bool = True) -> tuple[object, ...]:
    mult, shift = (MULT, SHIFT) if per_channel else (MULT[:1], SHIFT[:1])
    return (a, W, BIAS, -7, mult, shift, 3, -128, 127, DEV.key)


# -- opcheck and eager results ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        mm_args(),
        mm_args(zp=torch.tensor(-4, dtype=torch.int32)),
        (A, W, None, torch.zeros(1, dtype=torch.int32), DEV.key),
        mm_args(a=A[:0]),
    ],
    ids=["per_row_zp", "per_tensor_zp", "no_bias", "m0"],
)
def test_opcheck_mm_i32(args: tuple[object, ...]) -> None:
    torch.library.opcheck(torch.ops.asic.mm_i32.default, args)


@pytest.mark.parametrize("per_channel", [True, False])
def test_opcheck_linear_requant(per_channel: bool) -> None:
    torch.library.opcheck(
        torch.ops.asic.linear_requant.default, requant_args(per_channel=per_channel)
    )


def test_ops_equal_the_golden_model() -> None:
    out = torch.ops.asic.mm_i32(*mm_args())
    zps = ROW_ZP.flatten().tolist()
    assert out.tolist() == golden.linear_i32(A.tolist(), W.tolist(), zps, BIAS.tolist())
    q = torch.ops.asic.linear_requant(*requant_args())
    expected = golden.linear_requant(
        A.tolist(), W.tolist(), -7, BIAS.tolist(), MULT.tolist(), SHIFT.tolist(), 3, -128, 127
    )
    assert q.dtype == torch.int8
    assert q.tolist() == expected


def test_ops_count_on_their_device() -> None:
    gemmini = get_device("gemmini")
    torch.ops.asic.mm_i32(A, W, None, torch.zeros((), dtype=torch.int32), gemmini.key)
    torch.ops.asic.linear_requant(*requant_args()[:-1], gemmini.key)
    snap = gemmini.snapshot()
    assert snap.dut_ops == 2
    assert snap.macs == 2 * M * K * N
    assert snap.cycles == 2 * gemm_cost(gemmini.config, M, K, N, 4).cycles
    assert snap.bytes_moved == sum(
        gemm_cost(gemmini.config, M, K, N, b).bytes_moved for b in (4, 1)
    )
    assert snap.peak_macs_per_cycle == 16 * 16
    assert DEV.snapshot() == CounterSnapshot(peak_macs_per_cycle=128 * 128)
    assert [c.macs for c in gemmini.last_costs] == [M * K * N] * 2


def test_a_static_operands_gemm_counts_as_run_mm_i32() -> None:
    from asic_backend.sim import host_gemm

    gemmini = get_device("gemmini")
    kept = host_gemm.static_operand("int_mm", W, M)
    acc = devices.run_static_mm(A, kept, device=gemmini)
    static = gemmini.snapshot()
    gemmini.reset()
    assert torch.equal(acc, run_mm_i32(A, W, device=gemmini))
    assert static == gemmini.snapshot()
    assert static.dut_ops == 1
    with pytest.raises(TypeError, match="device must be a Device"):
        devices.run_static_mm(A, kept, device="gemmini")  # type: ignore[arg-type]


def test_m0_and_non_contiguous_inputs() -> None:
    empty = torch.ops.asic.mm_i32(*mm_args(a=A[:0]))
    assert empty.shape == (0, N)
    assert empty.dtype == torch.int32
    assert DEV.snapshot().dut_ops == 1
    assert DEV.snapshot().cycles == 0
    a_nc = A.t().contiguous().t()
    w_nc = W.t().contiguous().t()
    assert not a_nc.is_contiguous()
    assert not w_nc.is_contiguous()
    out = torch.ops.asic.mm_i32(a_nc, w_nc, BIAS, ROW_ZP, DEV.key)
    assert out.is_contiguous()
    assert torch.equal(out, torch.ops.asic.mm_i32(*mm_args()))
    q = torch.ops.asic.linear_requant(a_nc, w_nc, *requant_args()[2:])
    assert q.is_contiguous()
    assert torch.equal(q, torch.ops.asic.linear_requant(*requant_args()))


# -- bad input --------------------------------------------------------------------------------

BAD_MM = [
    ((A.float(), W, None, ROW_ZP, DEV.key), TypeError, r"activations must be a 2-D int8 tensor"),
    ((A, W[:, :5], None, ROW_ZP, DEV.key), ValueError, r"inner dimensions differ"),
    ((A, W, BIAS.long(), ROW_ZP, DEV.key), TypeError, r"bias must be an int32 tensor"),
    ((A, W, BIAS[:3], ROW_ZP, DEV.key), ValueError, r"bias must have shape \[N\]=\(10,\)"),
    (
        (A, W, None, ROW_ZP[:2], DEV.key),
        ValueError,
        r"shape \[\], \[1\], \[1, 1\] or \[M, 1\]=\(6, 1\)",
    ),
    ((A, W, None, ROW_ZP.to(torch.int8), DEV.key), TypeError, r"zero-point must be an int32"),
    ((A, W, None, ROW_ZP, "tpu_v9"), ValueError, r"ASIC config 'tpu_v9' is neither a preset"),
]
BAD_REQUANT = [
    ((A, W, None, -7, MULT[:3], SHIFT, 3, -128, 127, DEV.key), ValueError, r"multiplier must have"),
    ((A, W, None, -7, MULT, SHIFT.float(), 3, -128, 127, DEV.key), TypeError, r"shift must be an"),
    (
        (A, W, None, 200, MULT, SHIFT, 3, -128, 127, DEV.key),
        ValueError,
        r"zero-point 200 is outside",
    ),
    ((A, W, None, -7, MULT, SHIFT, 3, 10, 0, DEV.key), ValueError, r"qmin=10, qmax=0"),
]


@pytest.mark.parametrize(("args", "exc", "message"), BAD_MM)
def test_mm_i32_bad_input(args: tuple[object, ...], exc: type, message: str) -> None:
    with pytest.raises(exc, match=message) as info:
        torch.ops.asic.mm_i32(*args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("args", "exc", "message"), BAD_REQUANT)
def test_linear_requant_bad_input(args: tuple[object, ...], exc: type, message: str) -> None:
    with pytest.raises(exc, match=message) as info:
        torch.ops.asic.linear_requant(*args)
    assert "\n" not in str(info.value)


def test_data_dependent_checks_run_in_the_real_kernel() -> None:
    with pytest.raises(ValueError, match=r"zero-point -129 is outside int8"):
        torch.ops.asic.mm_i32(A, W, None, ROW_ZP - 1, DEV.key)
    with pytest.raises(ValueError, match=r"shifts must lie in \[-31, 30\]"):
        torch.ops.asic.linear_requant(A, W, None, 0, MULT, SHIFT + 100, 0, -128, 127, DEV.key)
    assert DEV.snapshot().dut_ops == 0  # nothing counted for a GEMM that did not run


def test_fake_kernel_rejects_bad_input_at_trace_time() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda a, w, zp: torch.ops.asic.mm_i32(a, w, None, zp, DEV.key),
        backend="aot_eager",
        fullgraph=True,
    )
    # Dynamo wraps the fake kernel's error; our line is in its message.
    with pytest.raises(Exception, match=r"TypeError\('asic: weights must be a 2-D int8 tensor"):
        compiled(A, W.float(), ROW_ZP)
    assert DEV.snapshot().dut_ops == 0


# -- torch.compile ----------------------------------------------------------------------------


def two_layers(key: str) -> Callable[..., torch.Tensor]:
    def f(a: torch.Tensor, zp: torch.Tensor) -> torch.Tensor:
        q = torch.ops.asic.linear_requant(a, W, BIAS, -7, MULT, SHIFT, 3, -128, 127, key)
        acc: torch.Tensor = torch.ops.asic.mm_i32(q, W[:, :N].contiguous(), None, zp, key)
        return acc.float() * 0.5

    return f


def test_fullgraph_aot_eager_counts_runs_not_traces() -> None:
    torch._dynamo.reset()
    f = two_layers(DEV.key)
    zp = ROW_ZP
    expected = f(A, zp)
    devices.reset_all()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(A, zp)
    assert torch.equal(out, expected)
    # Tracing ran only the fake kernels; the one compiled call ran two GEMMs.
    assert DEV.snapshot().dut_ops == 2


def test_fullgraph_inductor_dynamic_batch_without_recompiles() -> None:
    torch._dynamo.reset()
    f = two_layers(DEV.key)
    compiled = torch.compile(f, backend="inductor", fullgraph=True, dynamic=True)
    batches = (3, 5, 17)
    inputs = [(rand_i8(b, K, seed=b), rand_i8(b, 1, seed=b + 1).to(torch.int32)) for b in batches]
    expected = [f(a, zp) for a, zp in inputs]
    devices.reset_all()
    assert torch.equal(compiled(*inputs[0]), expected[0])
    with torch.compiler.set_stance("fail_on_recompile"):
        for (a, zp), want in zip(inputs[1:], expected[1:], strict=True):
            assert torch.equal(compiled(a, zp), want)
    assert DEV.snapshot().dut_ops == 2 * len(batches)
    assert DEV.snapshot().macs == sum(b * K * N + b * N * N for b in batches)


# -- the device registry and its counters -----------------------------------------------------


def test_get_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_device("default") is DEV
    assert get_device(AsicConfig()) is DEV
    small = get_device(AsicConfig(rows=8, cols=8))
    assert get_device(small.key) is small  # a modified config is found by its key
    assert small.key != DEV.key
    monkeypatch.setenv(ENV_VAR, "gemmini")
    assert get_device() is get_device("gemmini")
    monkeypatch.delenv(ENV_VAR)
    assert get_device() is DEV
    assert small in devices.all_devices()
    with pytest.raises(ValueError, match=r"neither a preset .* \(device keys created so far: "):
        get_device("nope")
    with pytest.raises(TypeError, match=r"a device is named by an AsicConfig"):
        get_device(3)  # type: ignore[arg-type]


def test_run_functions_need_a_device() -> None:
    with pytest.raises(TypeError, match=r"device must be a Device \(see get_device\(\)\)"):
        run_mm_i32(A, W, device="default")  # type: ignore[arg-type]


def test_entry_points_never_alias_inputs() -> None:
    out = run_mm_i32(A, W, device=DEV)
    assert out.data_ptr() not in (A.data_ptr(), W.data_ptr())
    args = {"a_zp": 0, "bias_i32": None, "multiplier": MULT, "shift": SHIFT}
    q = run_linear_requant(A, W, **args, out_zp=0, qmin=-128, qmax=127, device=DEV)  # type: ignore[arg-type]
    assert q.data_ptr() != A.data_ptr()


def test_reset_and_host_fallbacks() -> None:
    dev = get_device(AsicConfig(name="fallbacks"))
    site = HostFallback("linear", "weight zero-point is not 0", "model.py", 12, "y = self.fc(x)")
    for _ in range(3):
        dev.record_host_fallback(site)
    dev.record_host_fallback(HostFallback("matmul", "float64 input"))
    run_mm_i32(A, W, device=dev)
    snap = dev.snapshot()
    assert (snap.host_fallbacks, snap.dut_ops) == (4, 1)
    assert dev.host_fallback_sites == (site, HostFallback("matmul", "float64 input"))
    assert devices.all_host_fallbacks() == list(dev.host_fallback_sites)  # others were reset
    assert devices.total_snapshot().host_fallbacks == 4
    dev.reset()
    assert dev.snapshot() == CounterSnapshot(peak_macs_per_cycle=128 * 128)
    assert not dev.host_fallback_sites
    assert not dev.last_costs


def test_cost_history_is_bounded() -> None:
    dev = Device(AsicConfig(name="history"))
    costs = [gemm_cost(dev.config, m, 1, 1, 4) for m in range(COST_HISTORY + 10)]
    for cost in costs:
        dev.record_gemm(cost)
    assert dev.last_costs == tuple(costs[10:])
    assert dev.snapshot().dut_ops == COST_HISTORY + 10


def test_counter_snapshot_arithmetic() -> None:
    a = CounterSnapshot(dut_ops=1, macs=100, cycles=10, bytes_moved=7, peak_macs_per_cycle=20)
    b = CounterSnapshot(
        dut_ops=2,
        host_fallbacks=1,
        macs=60,
        cycles=30,
        peak_macs_per_cycle=4,
        host_macs=40,
        syncs=2,
    )
    total = a + b
    assert (total.dut_ops, total.host_fallbacks, total.macs, total.cycles) == (3, 1, 160, 40)
    assert (total.host_macs, total.syncs) == (40, 2)
    assert total.dut_share == pytest.approx(160 / 200)
    assert CounterSnapshot().dut_share is None
    # Utilization of the sum: all MACs over all the capacity, 160 / (20·10 + 4·30).
    assert total.utilization == pytest.approx(160 / 320)
    assert a + CounterSnapshot() == a
    assert CounterSnapshot().utilization == 0.0
    assert a.as_dict() == {
        "dut_ops": 1,
        "host_fallbacks": 0,
        "macs": 100,
        "host_macs": 0,
        "cycles": 10,
        "bytes_moved": 7,
        "syncs": 0,
        "utilization": 0.5,
    }
    assert sum([a, b], CounterSnapshot()) == total


def test_a_host_sync_stalls_the_device_for_its_configured_cycles() -> None:
    dev = get_device(AsicConfig(name="syncing", rows=8, cols=8, sync_cycles=300))
    dev.reset()
    dev.record_sync()
    dev.record_sync(count=2)
    snap = dev.snapshot()
    assert (snap.syncs, snap.cycles, snap.dut_ops, snap.macs) == (3, 900, 0, 0)
    dev.reset()
    assert (dev.snapshot().syncs, dev.snapshot().cycles) == (0, 0)
    free = get_device(AsicConfig(name="free-syncs", sync_cycles=0))
    free.record_sync()
    assert (free.snapshot().syncs, free.snapshot().cycles) == (1, 0)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2000"])
def test_sync_cycles_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError, match=r"AsicConfig.sync_cycles .* must be a non-negative"):
        AsicConfig(sync_cycles=bad)  # type: ignore[arg-type]


def test_sync_cycles_at_its_default_keeps_older_keys() -> None:
    base = AsicConfig(name="lab", rows=64)
    assert base.key == AsicConfig(name="lab", rows=64, sync_cycles=2000).key
    assert base.key != AsicConfig(name="lab", rows=64, sync_cycles=10).key


def test_counters_are_thread_safe() -> None:
    dev = get_device(AsicConfig(name="threads", rows=8, cols=8))
    workers, calls = 8, 40
    a, w = rand_i8(4, 16), rand_i8(8, 16)
    cost = gemm_cost(dev.config, 4, 16, 8, 4)
    seen: list[Device] = []
    start = threading.Barrier(workers)

    def work() -> None:
        start.wait()
        seen.append(get_device(AsicConfig(name="threads-new", rows=3)))
        for _ in range(calls):
            run_mm_i32(a, w, device=dev)
            dev.record_host_fallback(HostFallback("linear", "same site"))

    run_interleaved([work] * workers)
    snap = dev.snapshot()
    assert snap.dut_ops == workers * calls
    assert snap.host_fallbacks == workers * calls
    assert (snap.macs, snap.cycles) == (workers * calls * cost.macs, workers * calls * cost.cycles)
    assert len(dev.host_fallback_sites) == 1
    assert len({id(d) for d in seen}) == 1
