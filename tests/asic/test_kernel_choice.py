"""``auto``'s choice between ``int_mm`` and ``int16`` at a few rows by a kept weight, timed per
shape (:mod:`asic_backend.sim.kernel_choice`, :func:`asic_backend.sim.host_gemm.static_choice`):
which kernel runs, never the bits."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from asic_backend.ops import linear
from asic_backend.sim import amx_gemm, host_gemm, int16_gemm, kernel_choice
from asic_backend.sim.tensor_cache import stamp

pytestmark = pytest.mark.skipif(
    not int16_gemm.available() or not host_gemm.int_mm_is_exact(),
    reason="needs both the int16 kernel and an exact torch._int_mm",
)

K, N = 64, 48
#: A trial's calls: each kernel's untimed first call, then its timed ones, in turn.
TRIAL = 2 * (1 + kernel_choice.ROUNDS)


class Clock:
    """A fake clock for the trials that a call advances by its kernel's cost: the kernel
    :func:`host_gemm.static_choice` last handed out, its n-th call costing the n-th of its
    ``costs`` (the last one from there on)."""

    def __init__(self, costs: dict[str, list[float]]) -> None:
        self.costs = costs
        self.now, self.reads, self.kernel = 0.0, 0, ""
        self.calls: dict[str, int] = {}

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # a stop: the call ran
            n = self.calls[self.kernel] = self.calls.get(self.kernel, 0) + 1
            costs = self.costs[self.kernel]
            self.now += costs[min(n, len(costs)) - 1]
        return self.now


class Choosing:
    """What :func:`host_gemm.static_choice` handed out and which kernels' GEMMs ran, call by
    call, and the fake clock (:meth:`clock`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.handed: list[str] = []
        self.ran: list[str] = []
        self._patch = monkeypatch
        self._clock: Clock | None = None
        choose, int_mm, int16 = host_gemm.static_choice, torch._int_mm, int16_gemm.mm

        def spied(*args: Any, **kwargs: Any) -> tuple[str, kernel_choice.Timing | None]:
            name, timing = choose(*args, **kwargs)
            self.handed.append(name)
            if self._clock is not None:
                self._clock.kernel = name
            return name, timing

        def ran(name: str, real: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                self.ran.append(name)
                return real(*args, **kwargs)

            return run

        monkeypatch.setattr(host_gemm, "static_choice", spied)
        monkeypatch.setattr(torch, "_int_mm", ran("int_mm", int_mm))
        monkeypatch.setattr(int16_gemm, "mm", ran("int16", int16))

    def clock(self, costs: dict[str, list[float]]) -> None:
        self._clock = Clock(costs)
        self._patch.setattr(kernel_choice, "_clock", self._clock)

    def clear(self) -> None:
        self.handed.clear()
        self.ran.clear()


@pytest.fixture
def choosing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Choosing]:
    """``auto`` as on a CPU with an int8 unit (``int_mm``) and no AMX, no choices made yet."""
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: True)
    monkeypatch.setattr(amx_gemm, "available", lambda: False)
    host_gemm.int_mm_layout()  # the layout probe, before any spy
    kernel_choice.forget()
    yield Choosing(monkeypatch)
    kernel_choice.forget()


def int8(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)


def key(rows: int, path: str = "gemm", k: int = K, n: int = N) -> kernel_choice.Key:
    return (rows, k, n, torch.get_num_threads(), path)


def packed(w: torch.Tensor) -> bool:
    """Whether the int16 kernel keeps a packing of ``w``."""
    return id(w) in host_gemm._weight_copies["int16"]._entries


@pytest.mark.parametrize(
    ("costs", "chosen"),
    [
        ({"int_mm": [1.0], "int16": [0.5]}, "int16"),
        ({"int_mm": [1.0], "int16": [0.95]}, "int_mm"),  # within the margin: no second copy
        # Its first call (its operand just made, in the caches) does not count: half the
        # timed ones are fast, and the first would tip the median.
        ({"int_mm": [1.0], "int16": [0.01, *[0.5, 1.5] * kernel_choice.ROUNDS]}, "int_mm"),
        # The median of the calls' ratios counts, not the best calls nor the mean: one int_mm
        # call is fast.
        ({"int_mm": [1.0, 0.3, 1.0], "int16": [0.8]}, "int16"),
    ],
)
@pytest.mark.parametrize("rows", [1, host_gemm.CHOICE_ROWS])
def test_a_shapes_first_weight_times_each_kernel_in_turn_then_the_faster_runs(
    choosing: Choosing, costs: dict[str, list[float]], chosen: str, rows: int
) -> None:
    choosing.clock(costs)
    a, w = int8(rows, K), int8(N, K, seed=1)
    with host_gemm.forced("int_mm"):
        expected = host_gemm.mm_i32(a, w, w_static=True)
    choosing.clear()
    for _ in range(TRIAL + 3):
        assert torch.equal(host_gemm.mm_i32(a, w, w_static=True), expected)
    assert choosing.handed == ["int_mm", "int16"] * (TRIAL // 2) + [chosen] * 3
    assert choosing.ran == choosing.handed
    assert kernel_choice.choices() == {key(rows): chosen}


def test_other_weights_of_the_shape_take_int_mm_while_the_trial_runs(choosing: Choosing) -> None:
    choosing.clock({"int_mm": [1.0], "int16": [0.5]})
    a, trial_w, other = int8(1, K), int8(N, K, seed=1), int8(N, K, seed=2)
    for _ in range(TRIAL // 2):
        for w in (trial_w, other):
            host_gemm.mm_i32(a, w, w_static=True)
    assert choosing.ran[1::2] == ["int_mm"] * (TRIAL // 2)  # the other weight's calls
    assert kernel_choice.choices() == {}  # the trial weight has had half its calls
    assert not packed(other)


def test_a_first_weight_no_longer_called_hands_the_trial_to_the_next(
    choosing: Choosing,
) -> None:
    """A warm-up's weight, called once and kept: its shape is still decided, by the weights
    that run, and the packing the trial made of it is released."""
    choosing.clock({"int_mm": [1.0], "int16": [0.5]})
    a, idle, busy = int8(1, K), int8(N, K, seed=1), int8(N, K, seed=2)
    host_gemm.mm_i32(a, idle, w_static=True)
    host_gemm.mm_i32(a, idle, w_static=True)  # its int16 call: a packing made
    assert packed(idle)
    for _ in range(kernel_choice.IDLE_CALLS + TRIAL):
        host_gemm.mm_i32(a, busy, w_static=True)
    assert kernel_choice.choices() == {key(1): "int16"}
    assert (packed(idle), packed(busy)) == (False, True)


@pytest.mark.parametrize(("int16_cost", "kept"), [(0.5, True), (2.0, False)])
def test_a_trial_that_keeps_int_mm_releases_its_int16_packing(
    choosing: Choosing, int16_cost: float, kept: bool
) -> None:
    choosing.clock({"int_mm": [1.0], "int16": [int16_cost]})
    a, w = int8(2, K), int8(N, K, seed=1)
    for _ in range(TRIAL):
        host_gemm.mm_i32(a, w, w_static=True)
    assert packed(w) == kept


def test_a_packing_another_row_count_chose_is_not_released(choosing: Choosing) -> None:
    choosing.clock({"int_mm": [1.0], "int16": [0.5] * (TRIAL // 2) + [2.0]})
    w = int8(N, K, seed=1)
    for rows in (1, 2):  # int16 kept at one row, then int_mm at two
        for _ in range(TRIAL):
            host_gemm.mm_i32(int8(rows, K), w, w_static=True)
    assert kernel_choice.choices() == {key(1): "int16", key(2): "int_mm"}
    assert packed(w)


@pytest.mark.parametrize("how", ["forced", "environment", "rows", "inference"])
def test_no_trial_where_the_kernel_is_asked_for_the_rows_are_many_or_nothing_is_kept(
    monkeypatch: pytest.MonkeyPatch, choosing: Choosing, how: str
) -> None:
    """An inference tensor has no version to keep an int16 packing under: it would be packed
    again on every call, which the trial (its operand made before the clock starts) would
    not see."""
    rows = host_gemm.CHOICE_ROWS + 1 if how == "rows" else 1
    a = int8(rows, K)
    with torch.inference_mode(how == "inference"):
        w = int8(N, K, seed=1)
    if how == "environment":
        monkeypatch.setenv(host_gemm.ENV_VAR, "int_mm")
    with host_gemm.forced("int_mm") if how == "forced" else contextlib.nullcontext():
        for _ in range(TRIAL):
            host_gemm.mm_i32(a, w, w_static=True)
    assert set(choosing.ran) == {"int_mm"}
    assert kernel_choice.choices() == {}


def test_a_fresh_view_of_a_kn_weight_each_call_is_one_weight(choosing: Choosing) -> None:
    """``asic::int_mm`` passes ``b.t()``, a new view each call, of a program's ``[K, N]``."""
    choosing.clock({"int_mm": [1.0], "int16": [0.5]})
    a, b = int8(1, K), int8(K, N, seed=1)
    for _ in range(TRIAL + 1):
        assert torch.equal(torch.ops.asic.int_mm(a, b, "default"), torch._int_mm(a, b))
    assert kernel_choice.choices() == {key(1): "int16"}


def test_each_thread_count_has_its_own_trial(choosing: Choosing) -> None:
    choosing.clock({"int_mm": [1.0], "int16": [0.5]})
    a, w = int8(1, K), int8(N, K, seed=1)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for _ in range(TRIAL):
                host_gemm.mm_i32(a, w, w_static=True)
    finally:
        torch.set_num_threads(threads)
    assert {k[3] for k in kernel_choice.choices()} == {1, 2}


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("how", ["meta", "fake", "mode"])
def test_operands_without_data_never_take_a_chosen_int16(choosing: Choosing, how: str) -> None:
    """The native kernel reads data: a meta or fake operand has none, and a dispatch mode (a
    tracer) would not see it run."""
    kernel_choice._choices[key(1)] = "int16"
    if how == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode:
            a, w = mode.from_tensor(int8(1, K)), mode.from_tensor(int8(N, K, seed=1))
            assert host_gemm.mm_i32(a, w, w_static=True).shape == (1, N)
    elif how == "meta":
        a, w = int8(1, K).to("meta"), int8(N, K, seed=1).to("meta")
        assert host_gemm.mm_i32(a, w, w_static=True).device.type == "meta"
    else:
        a, w = int8(1, K), int8(N, K, seed=1)
        with _Ops() as ops:
            host_gemm.mm_i32(a, w, w_static=True)
        assert "aten._int_mm.default" in ops.seen
    assert choosing.handed == ["int_mm"]


def test_two_calls_in_flight_are_filed_under_their_own_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Threads: a trial's calls may stop out of order."""
    kernel_choice.forget()
    readings = iter([0.0, 10.0, 13.0, 14.0])  # start, start, stop (3 s), stop (14 s)
    monkeypatch.setattr(kernel_choice, "_clock", lambda: next(readings))
    k: kernel_choice.Key = (1, K, N, 1, "gemm")
    w = int8(N, K)
    (name_a, first), (name_b, second) = (
        kernel_choice.trial_call(k, w, "int_mm", lambda _: None) for _ in "ab"
    )
    assert (name_a, name_b) == ("int_mm", "int16")
    assert first is not None
    assert second is not None
    first.start()
    second.start()
    second.stop()
    first.stop()
    assert kernel_choice._trials[k].times == {"int_mm": [14.0], "int16": [3.0]}
    kernel_choice.forget()


@pytest.mark.parametrize("chosen", ["int16", "int_mm"])
def test_a_dut_linear_gives_the_same_bits_through_its_trial_and_keeps_the_choice(
    choosing: Choosing, chosen: str
) -> None:
    """A float linear's native path times the whole linear (its quantization, the GEMM, the
    rescale: one native call with ``int16``); the trial's operands are not kept on the
    weight, the chosen kernel's then are, on every weight of the shape."""
    choosing.clock({"int_mm": [1.0], "int16": [0.5 if chosen == "int16" else 2.0]})
    x = torch.randn(1, K)
    layers = [torch.nn.Linear(K, N) for _ in range(2)]
    weights = [(lin.weight.detach(), lin.bias.detach()) for lin in layers]
    with host_gemm.forced("int_mm"):  # on copies: nothing kept on the weights yet
        expected = [
            torch.ops.asic.dyn_linear(x, w.clone(), b, False, True, "default") for w, b in weights
        ]
    for _ in range(TRIAL):
        out = [torch.ops.asic.dyn_linear(x, w, b, False, True, "default") for w, b in weights]
        assert all(torch.equal(y, e) for y, e in zip(out, expected, strict=True))
    assert kernel_choice.choices() == {key(1, "linear"): chosen}
    trial_weight, other = (linear._kept_weight(w, False, stamp(w)) for w, _ in weights)
    assert not trial_weight.operands  # neither kernel's, under the trial
    choosing.clear()
    torch.ops.asic.dyn_linear(x, *weights[0], False, True, "default")
    torch.ops.asic.dyn_linear(x, *weights[1], False, True, "default")
    assert choosing.handed == [chosen, chosen]
    assert choosing.ran == ([] if chosen == "int16" else ["int_mm", "int_mm"])  # int16: native
    assert {name for name, _ in trial_weight.operands} == {chosen}
    assert {name for name, _ in other.operands} == {"int_mm", chosen}


def test_a_declined_native_call_is_timed_as_a_gemm_apart(choosing: Choosing) -> None:
    """A row of inf: the native linear declines after its trial handed out a kernel, and the
    general path's GEMM is a call of the ``gemm`` path's trial, not a sample of the whole
    linear's."""
    choosing.clock({"int_mm": [1.0], "int16": [0.5]})
    lin = torch.nn.Linear(K, N)
    w, b = lin.weight.detach(), lin.bias.detach()
    torch.ops.asic.dyn_linear(torch.randn(1, K), w, b, False, True, "default")
    bad = torch.full((1, K), float("inf"))
    torch.ops.asic.dyn_linear(bad, w, b, False, True, "default")
    trials = kernel_choice._trials
    assert [len(v) for v in trials[key(1, "linear")].times.values()] == [1, 0]
    assert [len(v) for v in trials[key(1, "gemm")].times.values()] == [1, 0]


def test_host_inductors_weight_gemm_takes_the_choice_too(choosing: Choosing) -> None:
    """``asic::dyn_weight_mm``, the GEMM ``host="inductor"`` calls between Inductor's own
    quantization and rescale, times the GEMM alone."""
    choosing.clock({"int_mm": [1.0], "int16": [0.5]})
    x_q, w = int8(1, K), torch.randn(N, K)
    with host_gemm.forced("int_mm"):
        expected, _ = torch.ops.asic.dyn_weight_mm(x_q, w.clone(), False, True, "default")
    for _ in range(TRIAL + 1):
        acc, _ = torch.ops.asic.dyn_weight_mm(x_q, w, False, True, "default")
        assert torch.equal(acc, expected)
    assert kernel_choice.choices() == {key(1): "int16"}
    assert choosing.ran[-1] == "int16"


def test_the_header_says_where_int16_may_take_int_mms_place(
    monkeypatch: pytest.MonkeyPatch, choosing: Choosing
) -> None:
    note = f"; int16 at 1 to {host_gemm.CHOICE_ROWS} rows where timed faster, by weight shape"
    assert host_gemm.describe().endswith(note)
    with host_gemm.forced("int_mm"):
        assert note not in host_gemm.describe()
    monkeypatch.setenv(host_gemm.ENV_VAR, "int_mm")
    assert note not in host_gemm.describe()
