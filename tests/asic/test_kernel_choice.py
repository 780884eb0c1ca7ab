"""``auto``'s choice between ``int_mm`` and ``int16`` at a few rows by a kept weight, timed per
shape (:func:`asic_backend.sim.host_gemm.static_choice`): which kernel runs, never the bits."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from asic_backend.ops import linear
from asic_backend.sim import host_gemm, int16_gemm
from asic_backend.sim.tensor_cache import stamp

pytestmark = pytest.mark.skipif(
    not int16_gemm.available() or not host_gemm.int_mm_is_exact(),
    reason="needs both the int16 kernel and an exact torch._int_mm",
)

K, N = 64, 48
#: A trial's calls: each kernel's untimed first call, then its timed ones, in turn.
TRIAL = 2 * (1 + host_gemm._CHOICE_ROUNDS)


class Clock:
    """A fake ``time.perf_counter`` that a trial call advances by its kernel's cost: the
    kernel :func:`host_gemm.static_choice` last handed out, its n-th call costing the n-th of
    its ``costs`` (the last one from there on)."""

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


@pytest.fixture
def choosing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """``auto`` as on a CPU with an int8 unit (``int_mm``), no choices made yet; yields the
    kernels the choice handed out, call by call."""
    monkeypatch.delenv(host_gemm.ENV_VAR, raising=False)
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: True)
    host_gemm.int_mm_layout()  # the layout probe reads the real clock, before any fake one
    handed: list[str] = []
    real = host_gemm.static_choice

    def spied(*args: object) -> tuple[str, host_gemm.Timing | None]:
        name, timing = real(*args)  # type: ignore[arg-type]
        handed.append(name)
        return name, timing

    monkeypatch.setattr(host_gemm, "static_choice", spied)
    host_gemm.forget_choices()
    yield handed
    host_gemm.forget_choices()


def use_clock(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    real = host_gemm.static_choice

    def tracked(*args: object) -> tuple[str, host_gemm.Timing | None]:
        name, timing = real(*args)  # type: ignore[arg-type]
        clock.kernel = name
        return name, timing

    monkeypatch.setattr(host_gemm, "static_choice", tracked)
    monkeypatch.setattr(host_gemm.time, "perf_counter", clock)


def int8(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)


def key(rows: int) -> tuple[int, int, int, int]:
    return (rows, K, N, torch.get_num_threads())


@pytest.mark.parametrize(
    ("costs", "chosen"),
    [
        ({"int_mm": [1.0], "int16": [0.5]}, "int16"),
        ({"int_mm": [1.0], "int16": [0.95]}, "int_mm"),  # within the margin: no second copy
        # Its first call (its operand just made, in the caches) does not count: half the
        # timed ones are fast, and the first would tip the median.
        ({"int_mm": [1.0], "int16": [0.01, *[0.5, 1.5] * host_gemm._CHOICE_ROUNDS]}, "int_mm"),
        # The median of the calls' ratios counts, not the best calls nor the mean: one int_mm
        # call is fast.
        ({"int_mm": [1.0, 0.3, 1.0], "int16": [0.8]}, "int16"),
    ],
)
@pytest.mark.parametrize("rows", [1, host_gemm.CHOICE_ROWS])
def test_a_shapes_first_weight_times_each_kernel_in_turn_then_the_faster_runs(
    monkeypatch: pytest.MonkeyPatch,
    choosing: list[str],
    costs: dict[str, list[float]],
    chosen: str,
    rows: int,
) -> None:
    use_clock(monkeypatch, Clock(costs))
    a, w = int8(rows, K), int8(N, K, seed=1)
    with host_gemm.forced("int_mm"):
        expected = host_gemm.mm_i32(a, w, w_static=True)
    choosing.clear()
    for _ in range(TRIAL + 3):
        assert torch.equal(host_gemm.mm_i32(a, w, w_static=True), expected)
    assert choosing == ["int_mm", "int16"] * (TRIAL // 2) + [chosen] * 3
    assert host_gemm.static_choices() == {key(rows): chosen}


def test_other_weights_of_the_shape_take_int_mm_while_the_trial_runs(
    monkeypatch: pytest.MonkeyPatch, choosing: list[str]
) -> None:
    use_clock(monkeypatch, Clock({"int_mm": [1.0], "int16": [0.5]}))
    a, trial_w, other = int8(1, K), int8(N, K, seed=1), int8(N, K, seed=2)
    for _ in range(TRIAL // 2):
        for w in (trial_w, other):
            host_gemm.mm_i32(a, w, w_static=True)
    assert choosing[1::2] == ["int_mm"] * (TRIAL // 2)  # the other weight's calls
    assert host_gemm.static_choices() == {}  # the trial weight has had half its calls
    host_gemm.mm_i32(a, other, w_static=True)
    assert choosing[-1] == "int_mm"


@pytest.mark.parametrize(("int16_cost", "kept"), [(0.5, True), (2.0, False)])
def test_a_trial_that_keeps_int_mm_drops_its_int16_packing(
    monkeypatch: pytest.MonkeyPatch, choosing: list[str], int16_cost: float, kept: bool
) -> None:
    use_clock(monkeypatch, Clock({"int_mm": [1.0], "int16": [int16_cost]}))
    a, w = int8(2, K), int8(N, K, seed=1)
    for _ in range(TRIAL):
        host_gemm.mm_i32(a, w, w_static=True)
    assert (id(w) in host_gemm._weight_copies["int16"]._entries) == kept


@pytest.mark.parametrize("how", ["forced", "environment", "rows"])
def test_no_trial_where_the_kernel_is_asked_for_or_the_rows_are_many(
    monkeypatch: pytest.MonkeyPatch, choosing: list[str], how: str
) -> None:
    rows = host_gemm.CHOICE_ROWS + 1 if how == "rows" else 1
    a, w = int8(rows, K), int8(N, K, seed=1)
    if how == "environment":
        monkeypatch.setenv(host_gemm.ENV_VAR, "int_mm")
    with host_gemm.forced("int_mm") if how == "forced" else contextlib.nullcontext():
        for _ in range(TRIAL):
            host_gemm.mm_i32(a, w, w_static=True)
    assert set(choosing) == {"int_mm"}
    assert host_gemm.static_choices() == {}
    assert id(w) not in host_gemm._weight_copies["int16"]._entries


@pytest.mark.parametrize("chosen", ["int16", "int_mm"])
def test_a_dut_linear_gives_the_same_bits_through_its_trial_and_keeps_the_choice(
    monkeypatch: pytest.MonkeyPatch, choosing: list[str], chosen: str
) -> None:
    """A float linear's native path times the whole linear (its quantization, the GEMM, the
    rescale: one native call with ``int16``); the trial's operands are not kept on the
    weight, the chosen kernel's then are, on every weight of the shape."""
    costs = {"int_mm": [1.0], "int16": [0.5 if chosen == "int16" else 2.0]}
    use_clock(monkeypatch, Clock(costs))
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
    assert host_gemm.static_choices() == {key(1): chosen}
    trial_weight, other = (linear._kept_weight(w, False, stamp(w)) for w, _ in weights)
    assert ("int16", "int16") not in trial_weight.operands  # nor int_mm's, under the trial
    torch.ops.asic.dyn_linear(x, *weights[0], False, True, "default")
    torch.ops.asic.dyn_linear(x, *weights[1], False, True, "default")
    assert choosing[-2:] == [chosen, chosen]
    assert {name for name, _ in trial_weight.operands} == {chosen}
    assert {name for name, _ in other.operands} == {"int_mm", chosen}


def test_host_inductors_weight_gemm_takes_the_choice_too(
    monkeypatch: pytest.MonkeyPatch, choosing: list[str]
) -> None:
    """``asic::dyn_weight_mm``, the GEMM ``host="inductor"`` calls between Inductor's own
    quantization and rescale, times the GEMM alone."""
    use_clock(monkeypatch, Clock({"int_mm": [1.0], "int16": [0.5]}))
    x_q, w = int8(1, K), torch.randn(N, K)
    with host_gemm.forced("int_mm"):
        expected, _ = torch.ops.asic.dyn_weight_mm(x_q, w.clone(), False, True, "default")
    for _ in range(TRIAL + 1):
        acc, _ = torch.ops.asic.dyn_weight_mm(x_q, w, False, True, "default")
        assert torch.equal(acc, expected)
    assert host_gemm.static_choices() == {key(1): "int16"}
    assert choosing[-1] == "int16"


def test_the_header_says_where_int16_may_take_int_mms_place(
    monkeypatch: pytest.MonkeyPatch, choosing: list[str]
) -> None:
    note = f"; int16 at 1 to {host_gemm.CHOICE_ROWS} rows where timed faster, by weight shape"
    assert host_gemm.describe().endswith(note)
    with host_gemm.forced("int_mm"):
        assert note not in host_gemm.describe()
    monkeypatch.setenv(host_gemm.ENV_VAR, "int_mm")
    assert note not in host_gemm.describe()
