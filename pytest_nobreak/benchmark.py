"""``asic_benchmark``: pytest-benchmark's ``benchmark``, driven for the int8 path.

>>> def test_decode_qkv(asic_benchmark):
...     be = asic_backend.make_backend(config="tpu_v1")
...     layer = torch.compile(torch.nn.Linear(2048, 6144), backend=be)
...     y = asic_benchmark(layer, torch.randn(1, 2048), rounds=20)
...     assert asic_benchmark.extra_info["asic_dut_ops"] == 1

It times the target with ``benchmark.pedantic`` and puts the simulated figures of ONE call of it
in ``benchmark.extra_info`` (``asic_cycles``, ``asic_macs`` (on the DUT), ``asic_host_macs``,
``asic_utilization``, ``asic_mapping_efficiency`` and ``asic_compute_utilization`` (SCALE-Sim's,
averaged over the call's folds), ``asic_bytes_moved``, ``asic_bound``, ``asic_roofline_time_s``,
``asic_dut_ops``, ``asic_host_fallbacks``, ``asic_device``, ...). Those figures are exact: they
are the device counters read just before and just after a single call, never an average. When
the target ran exactly once (``--benchmark-disable``, xdist, or ``rounds=1, warmup_rounds=0``)
that call is the one measured; otherwise one more, untimed call runs after the timed rounds and
is measured, so compilation and warm-up never count.

The test's compile-report figures (the ``cycles`` the baseline gates on) count that one call
too: the warm-up and timed rounds are left out of them, so a timed run and a
``--benchmark-disable`` run of the same test record the same figures. (The device itself, the
``asic`` fixture, still counts every call that ran.)

Only ``benchmark.pedantic`` and ``benchmark.extra_info`` are used, so it works under
pytest-codspeed's ``benchmark`` as well. pytest-benchmark is optional: without it, tests using
``asic_benchmark`` error with the command that installs it; nothing else changes.

The same module holds the plugin object behind ``--asic-roofline PATH``: every benchmarked test
(one using ``benchmark``, directly or through ``asic_benchmark``) ships the GEMMs its DUT ran to
the controller on its call report, and the controller draws them
(:mod:`pytest_nobreak.report.roofline`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from asic_backend.sim.config import OPS_PER_MAC
from pytest_nobreak.config import NobreakConfig
from pytest_nobreak.gate.atomic import write_atomic
from pytest_nobreak.keys import MONITOR_KEY
from pytest_nobreak.report.roofline import Point, Roof, render_svg
from pytest_nobreak.report.versions import sim_version, torch_version

if TYPE_CHECKING:
    from asic_backend.sim.config import AsicConfig
    from asic_backend.sim.cycles import GemmCost
    from asic_backend.sim.device import CounterSnapshot, Device
    from pytest_nobreak.report.roofline import Roof

__all__ = [
    "INSTALL_HINT",
    "AsicBenchmark",
    "AsicCallFigures",
    "BenchmarkPlugin",
    "asic_benchmark",
]

INSTALL_HINT = "pip install 'pytest-nobreak[benchmark]'"
MISSING_BENCHMARK = (
    "asic_benchmark needs pytest-benchmark's `benchmark` fixture, which is not available: "
    f"install it with {INSTALL_HINT}, or drop -p no:benchmark"
)
#: Attribute of the call report carrying the test's roofline points (JSON, so xdist ships it).
ROOFLINE_ATTR = "nobreak_roofline"
#: Default timed rounds of ``asic_benchmark`` (after one warm-up round, by default).
DEFAULT_ROUNDS = 5

_POINTS_KEY = pytest.StashKey[dict[str, Any]]()


class BenchmarkLike(Protocol):
    """The part of pytest-benchmark's fixture that pytest-codspeed's also has."""

    extra_info: dict[str, Any]

    def pedantic(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] = ...,
        kwargs: dict[str, Any] | None = ...,
        *,
        rounds: int = ...,
        warmup_rounds: int = ...,
        iterations: int = ...,
    ) -> Any: ...


# --------------------------------------------------------------------------- device counters


@dataclasses.dataclass(frozen=True)
class _State:
    """Every simulated device's counters and GEMM history at one moment."""

    devices: dict[str, Device]
    snapshots: dict[str, CounterSnapshot]
    # Per device: GEMMs issued since its reset, and the costs of the last ones (equal shapes
    # share one cost object, so new GEMMs are told by the count, not by identity).
    histories: dict[str, tuple[int, tuple[GemmCost, ...]]]

    @classmethod
    def capture(cls, *, import_backend: bool) -> _State:
        # The generic roofline collection must not import torch into a test that never used it.
        if not import_backend and "asic_backend.sim.device" not in sys.modules:
            return cls({}, {}, {})
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from asic_backend.sim.device import all_devices

        devices = {d.key: d for d in all_devices()}
        return cls(
            devices,
            {key: d.snapshot() for key, d in devices.items()},
            {key: d.history() for key, d in devices.items()},
        )

    def new_gemms(self, before: _State) -> list[tuple[str, GemmCost]]:
        """The GEMMs recorded since ``before``, in order (while the history holds them)."""
        out = []
        for key, (issued, costs) in self.histories.items():
            new = issued - before.histories.get(key, (0, ()))[0]
            if new > 0:
                out += [(key, c) for c in costs[-new:]]
        return out


@dataclasses.dataclass(frozen=True)
class AsicCallFigures:
    """The simulated figures of one call of a benchmarked target.

    ``counters`` are summed over the ``devices`` the call used; ``gemms`` is each DUT GEMM of the
    call with its device key, in order; ``complete`` is False when the call ran more GEMMs than a
    device's history keeps (then the roofline figures are left out). ``calls`` is how many times
    the target ran in all, timed rounds, warm-up and the measured call included.
    """

    counters: CounterSnapshot
    devices: tuple[AsicConfig, ...]
    gemms: tuple[tuple[str, GemmCost], ...]
    calls: int

    @property
    def complete(self) -> bool:
        return len(self.gemms) == self.counters.dut_ops

    @property
    def roofline_time_s(self) -> float:
        """The GEMMs run one after the other, each at its own roofline time."""
        return sum(cost.roofline_time_s for _, cost in self.gemms)

    @property
    def bound(self) -> str:
        """``compute`` or ``memory``: the bound of the GEMMs that take most of the time."""
        memory = sum(c.roofline_time_s for _, c in self.gemms if c.bound == "memory")
        return "memory" if memory > self.roofline_time_s / 2 else "compute"

    def extra_info(self) -> dict[str, Any]:
        """What ``asic_benchmark`` stores in ``benchmark.extra_info``."""
        c = self.counters
        info: dict[str, Any] = {
            "asic_device": "+".join(d.key for d in self.devices),
            "asic_preset": "+".join(d.name for d in self.devices),
            **{f"asic_{name}": value for name, value in c.as_dict().items()},
            "asic_arithmetic_intensity": (
                OPS_PER_MAC * c.macs / c.bytes_moved if c.bytes_moved else 0.0
            ),
            "asic_target_calls": self.calls,
        }
        if self.complete and self.gemms:
            time_s = self.roofline_time_s
            info["asic_bound"] = self.bound
            info["asic_roofline_time_s"] = time_s
            info["asic_attained_ops_per_s"] = OPS_PER_MAC * c.macs / time_s if time_s else 0.0
            info["asic_mapping_efficiency"] = self.fold_mean("mapping_efficiency")
            info["asic_compute_utilization"] = self.fold_mean("compute_utilization")
        return info

    def fold_mean(self, figure: str) -> float:
        """SCALE-Sim's per-fold ``figure`` (``mapping_efficiency``, ``compute_utilization``)
        averaged over every fold of the call's GEMMs, as SCALE-Sim averages a layer's folds."""
        folds = sum(cost.folds for _, cost in self.gemms)
        total = sum(getattr(cost, figure) * cost.folds for _, cost in self.gemms)
        return total / folds if folds else 0.0


def _per_call(before: _State, after: _State, calls: int) -> AsicCallFigures:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from asic_backend.sim.device import CounterSnapshot

    total = CounterSnapshot()
    used: list[AsicConfig] = []
    for key, snap in after.snapshots.items():
        prev = before.snapshots.get(key, CounterSnapshot())
        fields = ("dut_ops", "host_fallbacks", "macs", "host_macs", "cycles", "bytes_moved")
        delta = {f: getattr(snap, f) - getattr(prev, f) for f in fields}
        if any(v < 0 for v in delta.values()):
            pytest.fail(
                f"asic_benchmark: the counters of ASIC device {key!r} went down during the "
                "measured call: the target must not reset the device",
                pytrace=False,
            )
        if delta["dut_ops"] or delta["host_fallbacks"]:
            used.append(after.devices[key].config)
            total += CounterSnapshot(**delta, peak_macs_per_cycle=snap.peak_macs_per_cycle)
    return AsicCallFigures(total, tuple(used), tuple(after.new_gemms(before)), calls)


# --------------------------------------------------------------------------- the fixture


class AsicBenchmark:
    """The ``asic_benchmark`` fixture's value (see the module docstring).

    ``label`` names the benchmarked layer on the ``--asic-roofline`` chart (default: the test
    function's name); ``figures`` holds the last call's :class:`AsicCallFigures`.
    """

    def __init__(self, benchmark: BenchmarkLike, item: pytest.Item) -> None:
        self.benchmark = benchmark
        self.label: str | None = None
        self.figures: AsicCallFigures | None = None
        self._item = item

    @property
    def extra_info(self) -> dict[str, Any]:
        """pytest-benchmark's ``extra_info`` of this test (saved in its JSON)."""
        return self.benchmark.extra_info

    def __call__(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        rounds: int = DEFAULT_ROUNDS,
        warmup_rounds: int = 1,
        iterations: int = 1,
        **kwargs: Any,
    ) -> Any:
        """Time ``fn(*args, **kwargs)`` with ``benchmark.pedantic(rounds=, warmup_rounds=,
        iterations=)``, record the simulated figures of one call, return ``fn``'s result.

        ``fn`` runs under ``torch.no_grad()``: the DUT is inference-only, and with autograd live
        the asic backend would leave the graph on the host. A target that ran no GEMM on the
        DUT fails the test: it would be a benchmark of the host under the DUT's name.
        """
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        import torch

        calls = 0

        def target(*a: Any, **kw: Any) -> Any:
            nonlocal calls
            calls += 1
            with torch.no_grad():
                return fn(*a, **kw)

        before = _State.capture(import_backend=True)
        result = self.benchmark.pedantic(
            target,
            args=args,
            kwargs=kwargs,
            rounds=rounds,
            warmup_rounds=warmup_rounds,
            iterations=iterations,
        )
        if calls != 1:
            # Timed rounds ran: measure one more call on its own, after warm-up and compile,
            # and keep the repetitions out of the test's figures.
            start, before = before, _State.capture(import_backend=True)
            target(*args, **kwargs)
            self._discount(_per_call(start, before, calls).counters)
        figures = _per_call(before, _State.capture(import_backend=True), calls)
        self.figures = figures
        if not figures.counters.dut_ops:
            pytest.fail(
                f"asic_benchmark: {_name(fn)} ran no GEMM on the simulated ASIC "
                f"({figures.counters.host_fallbacks} host fallback(s)); compile it with "
                "backend='asic' (or nobreak_compile under --asic-backend), or call an asic:: op",
                pytrace=False,
            )
        self.benchmark.extra_info.update(figures.extra_info())
        name = self.label or _test_name(self._item)
        self._item.stash[_POINTS_KEY] = _roofline_payload(figures.gemms, name)
        return result

    def _discount(self, repeated: CounterSnapshot) -> None:
        """Leave the counters of the repeated (timed and warm-up) calls out of this test's
        compile report: its ASIC figures are ``after - before``, so they go into ``before``."""

        monitor = self._item.stash.get(MONITOR_KEY, None)
        if monitor is None:  # not watched (cannot happen with the plugin's session on)
            return
        monitor.report.discount_asic(repeated)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _test_name(item: pytest.Item) -> str:
    """The test function's name, without the parameter ids."""
    name: str = getattr(item, "originalname", item.name)
    return name


@pytest.fixture
def asic_benchmark(request: pytest.FixtureRequest, benchmark: BenchmarkLike) -> AsicBenchmark:
    """``asic_benchmark(fn, *args, rounds=5, warmup_rounds=1, iterations=1, **kwargs)``: time
    ``fn`` on the simulated ASIC with pytest-benchmark; the simulated figures of one call go in
    ``extra_info``. Returns ``fn``'s result.

    >>> def test_mlp(asic_benchmark, nobreak_compile):     # run with --asic-backend
    ...     y = asic_benchmark(nobreak_compile(MLP()), torch.randn(8, 512), rounds=10)
    ...     assert asic_benchmark.extra_info["asic_host_fallbacks"] == 0
    """
    # `benchmark` is a parameter, not a lazy getfixturevalue(): pytest-benchmark decides
    # --benchmark-skip/--benchmark-only from the static fixture closure of each test.
    return AsicBenchmark(benchmark, request.node)


# --------------------------------------------------------------------------- roofline points


def _roofline_payload(gemms: Sequence[tuple[str, GemmCost]], name: str) -> dict[str, Any]:
    """The test's roofline points and the roofs of their devices, as plain JSON."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from asic_backend.sim.device import get_device

    points, roofs = [], {}
    for key, cost in gemms:
        roofs[key] = roof_fields(get_device(key).config)
        points.append(
            {
                "device": key,
                "layer": f"{name} {cost.m}×{cost.k}×{cost.n}",
                "arithmetic_intensity": cost.arithmetic_intensity,
                "attained_ops_per_s": cost.attained_ops_per_s,
                "bound": cost.bound,
                "utilization": cost.utilization,
                "mapping_efficiency": cost.mapping_efficiency,
                "compute_utilization": cost.compute_utilization,
            }
        )
    return {"roofs": roofs, "points": _unique(points)}


def _unique(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p in points:
        seen.setdefault(tuple(sorted(p.items())), p)
    return list(seen.values())


class BenchmarkPlugin:
    """Hooks for ``asic_benchmark`` and ``--asic-roofline`` (registered by ``plugin.py``)."""

    def __init__(self, config: pytest.Config, settings: NobreakConfig) -> None:
        self.config = config
        self.settings = settings
        #: Roofline payloads of the tests that ran, by nodeid (a rerun replaces its entry).
        self.payloads: dict[str, dict[str, Any]] = {}
        self.lines: list[tuple[str, bool]] = []  # (text, is_error)

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, Any]
    ) -> None:
        """Put the simulator and torch versions in pytest-benchmark's machine info, so
        ``--benchmark-compare`` warns when either changed between two runs."""

        machine_info["asic_sim"] = {"version": sim_version(), "torch": torch_version()}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """Record the DUT GEMMs of a benchmarked test that does not use ``asic_benchmark``."""
        if self.settings.roofline_path is None or "benchmark" not in _fixturenames(item):
            return (yield)
        before = _State.capture(import_backend=False)
        result = yield
        if _POINTS_KEY not in item.stash:
            gemms = _State.capture(import_backend=False).new_gemms(before)
            if gemms:
                item.stash[_POINTS_KEY] = _roofline_payload(gemms, _test_name(item))
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "call" and self.settings.roofline_path is not None:
            payload = item.stash.get(_POINTS_KEY, None)
            if payload is not None:
                setattr(report, ROOFLINE_ATTR, payload)
        elif report.when == "setup" and report.failed and _missing_benchmark(item, call):
            # pytest would say "fixture 'benchmark' not found" and list 80 fixtures.
            report.longrepr = MISSING_BENCHMARK
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect roofline points on the controller (or in a serial run)."""
        payload = getattr(report, ROOFLINE_ATTR, None)
        if payload is not None and report.when == "call":
            self.payloads[report.nodeid] = payload

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.settings.roofline_path
        if path is None or hasattr(self.config, "workerinput"):
            return

        try:
            svg, n_points, n_roofs = self._render()
            write_atomic(path, svg)
        except (OSError, UnicodeError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.lines.append((f"nobreak: cannot write roofline {path}: {reason}", True))
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        what = f"{n_points} point(s) on {n_roofs} device(s)"
        self.lines.append((f"nobreak: roofline of {what} written to {path}", False))

    def _render(self) -> tuple[str, int, int]:

        roofs: dict[str, Roof] = {}
        points: dict[tuple[Any, ...], Point] = {}
        # By nodeid, so the colours and numbers do not depend on xdist's scheduling.
        for _, payload in sorted(self.payloads.items()):
            for key, roof in payload["roofs"].items():
                roofs.setdefault(key, Roof(key, **roof))
            for p in payload["points"]:
                point = Point(**p)
                points.setdefault(dataclasses.astuple(point), point)
        if not roofs:  # nothing benchmarked on the DUT: still draw the session's device
            roofs = _session_roof(self.settings)
        return render_svg(list(roofs.values()), list(points.values())), len(points), len(roofs)

    @pytest.hookimpl(trylast=True)  # after pytest-benchmark's table, next to the file it drew
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for text, error in self.lines:
            terminalreporter.write_line(text, **({"red": True, "bold": True} if error else {}))


def _session_roof(settings: NobreakConfig) -> dict[str, Roof]:

    config = settings.asic_config()
    return {config.key: Roof(config.key, **roof_fields(config))}


def roof_fields(config: AsicConfig) -> dict[str, Any]:
    """A device's roofs, from its config (the one source of the peak and ridge formulas)."""
    described = config.describe()
    return {
        "peak_ops_per_s": config.peak_ops_per_s,
        "bandwidth_bytes_per_s": config.dram_bw_bytes_per_s,
        "description": described if config.key == config.name else f"{config.key}: {described}",
    }


def _fixturenames(item: pytest.Item) -> list[str]:
    # Only function items have fixtures (a doctest item has none).
    names: list[str] = getattr(item, "fixturenames", [])
    return names


def _missing_benchmark(item: pytest.Item, call: pytest.CallInfo[None]) -> bool:
    """Whether setup failed because no plugin provides ``benchmark`` to ``asic_benchmark``."""
    if "asic_benchmark" not in _fixturenames(item) or call.excinfo is None:
        return False
    # pytest's FixtureLookupError (private) names the missing fixture in `argname`.
    return getattr(call.excinfo.value, "argname", None) == "benchmark"
