"""The plugin's own count of what ran on the simulated DUT while a monitor watches.

The devices of ``asic_backend`` count since their last reset, and a test may reset them
itself (``device.reset()``, ``asic_backend.sim.device.reset_all()``), so figures read as a
difference of the devices' counters could be zeroed or go negative. Instead, each count the
devices record is also handed to the counters started here (a wrap of ``Device.record_gemm``,
``Device.record_host_fallback`` and ``Device.record_sync``, installed once per process), which
nothing but the monitor that owns them touches.

The simulator is optional and imports torch: nothing here imports it. Until
``asic_backend.sim.device`` has been imported nothing can have run on a device, and every device
that exists when it is first seen during a block was made in that block, so its counters up to
then are the block's.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asic_backend.sim.cycles import GemmCost
    from asic_backend.sim.device import CounterSnapshot, HostFallback, HostFallbackStats

_MODULE = "asic_backend.sim.device"
_listeners: list[AsicCounts] = []
_install_lock = threading.Lock()
_installed = False


class AsicCounts:
    """What ran on any simulated device between :meth:`start` and :meth:`stop`.

    ``total`` is ``None`` until the simulator is imported (then zero until something runs);
    ``sites`` holds each host-fallback site's calls and MACs, in first-seen order, and
    ``gemms`` how many DUT GEMMs of each (device key, family, cost) ran, in first-seen order.
    """

    def __init__(self) -> None:
        self.total: CounterSnapshot | None = None
        self.sites: dict[HostFallback, HostFallbackStats] = {}
        # (device, family, id(cost)) -> [device, family, cost, count]: identity, as the device
        # keys its own (no hashing of a cost's fields on every GEMM of a watched test).
        self._gemms: dict[tuple[str, str, int], list[Any]] = {}
        self._lock = threading.Lock()
        self._running = False

    def start(self, *, reset_devices: bool) -> None:
        """Start counting. ``reset_devices``: also zero the devices' own counters (a test's
        ``asic`` fixture then shows this test's counts only)."""
        self._running = True
        module = sys.modules.get(_MODULE)
        if module is None:
            return
        if reset_devices:
            module.reset_all()
        self._join(module, seed=False)

    def poll(self) -> None:
        """Join the tap if the simulator was imported since :meth:`start` (cheap otherwise)."""
        if self._running and self.total is None:
            module = sys.modules.get(_MODULE)
            if module is not None:
                self._join(module, seed=True)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing that runs in the block."""
        self.poll()
        joined = self in _listeners
        if joined:
            _listeners.remove(self)
        try:
            yield
        finally:
            if joined and self._running:
                _listeners.append(self)

    def stop(self) -> None:
        self.poll()
        self._running = False
        if self in _listeners:
            _listeners.remove(self)

    def _join(self, module: Any, *, seed: bool) -> None:
        _install(module)
        with self._lock:
            self.total = module.total_snapshot() if seed else module.CounterSnapshot()
            if seed:
                self.sites = {stats.site: stats for stats in module.all_host_fallback_stats()}
                for (key, family, cost), count in module.all_gemm_shapes().items():
                    self._gemms[(key, family, id(cost))] = [key, family, cost, count]
        _listeners.append(self)

    @property
    def gemms(self) -> dict[tuple[str, str, GemmCost], int]:
        """How many DUT GEMMs of each (device key, family, cost) ran, in first-seen order."""
        with self._lock:
            entries = [tuple(entry) for entry in self._gemms.values()]
        out: dict[tuple[str, str, GemmCost], int] = {}
        for key, family, cost, count in entries:
            out[(key, family, cost)] = out.get((key, family, cost), 0) + count
        return out

    def _add(
        self,
        counted: CounterSnapshot,
        fallback: tuple[Any, int, str | None] | None,
        gemm: tuple[str, str, GemmCost, int] | None = None,
    ) -> None:
        with self._lock:
            self.total = counted if self.total is None else self.total + counted
            if gemm is not None:
                key, family, cost, count = gemm
                entry = self._gemms.get((key, family, id(cost)))
                if entry is None:
                    self._gemms[(key, family, id(cost))] = [key, family, cost, count]
                else:
                    entry[3] += count
            if fallback is None:
                return
            site, macs, shape = fallback
            known = self.sites.get(site)
            if known is None:
                # Lazy: keeps torch out of the plugin's import until a test needs it.
                from asic_backend.sim.device import HostFallbackStats

                self.sites[site] = HostFallbackStats(site=site, calls=1, macs=macs, shape=shape)
            else:
                self.sites[site] = dataclasses.replace(
                    known, calls=known.calls + 1, macs=known.macs + macs
                )


def minus(after: CounterSnapshot, before: CounterSnapshot) -> CounterSnapshot:
    return dataclasses.replace(
        after,
        dut_ops=after.dut_ops - before.dut_ops,
        host_fallbacks=after.host_fallbacks - before.host_fallbacks,
        macs=after.macs - before.macs,
        host_macs=after.host_macs - before.host_macs,
        cycles=after.cycles - before.cycles,
        bytes_moved=after.bytes_moved - before.bytes_moved,
        syncs=after.syncs - before.syncs,
    )


def _install(module: Any) -> None:
    """Wrap the methods through which a device counts, once per process.

    What a call added is read from the device itself (its counters after the call minus
    before), so these counts cannot drift from the device's own arithmetic.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        device = module.Device
        record_gemm = device.record_gemm
        record_host_fallback = device.record_host_fallback

        @functools.wraps(record_gemm)
        def gemm(self: Any, cost: Any, count: int = 1, family: str = "matmul") -> None:
            __tracebackhide__ = True  # a tap: not in the user's tracebacks
            if not _listeners:
                record_gemm(self, cost, count, family)
                return
            before = self.snapshot()
            record_gemm(self, cost, count, family)
            _dispatch(minus(self.snapshot(), before), None, (self.key, family, cost, count))

        @functools.wraps(record_host_fallback)
        def host_fallback(self: Any, site: Any, macs: int = 0, shape: str | None = None) -> None:
            __tracebackhide__ = True  # a tap: not in the user's tracebacks
            if not _listeners:
                record_host_fallback(self, site, macs, shape)
                return
            before = self.snapshot()
            record_host_fallback(self, site, macs, shape)
            _dispatch(minus(self.snapshot(), before), (site, macs, shape))

        record_sync = device.record_sync

        @functools.wraps(record_sync)
        def sync(self: Any, count: int = 1) -> None:
            __tracebackhide__ = True  # a tap: not in the user's tracebacks
            if not _listeners:
                record_sync(self, count)
                return
            before = self.snapshot()
            record_sync(self, count)
            _dispatch(minus(self.snapshot(), before), None)

        device.record_gemm = gemm
        device.record_host_fallback = host_fallback
        device.record_sync = sync
        _installed = True


def _dispatch(
    counted: CounterSnapshot,
    fallback: tuple[Any, int, str | None] | None,
    gemm: tuple[str, str, GemmCost, int] | None = None,
) -> None:
    for listener in list(_listeners):
        listener._add(counted, fallback, gemm)
