"""Simulated devices and their counters, kept in a side registry.

Counters live here, not in op outputs, so nothing the compiler may drop or merge carries them: a
GEMM is counted exactly when its numerics run. Every device is thread-safe and resettable, and one
exists per distinct :attr:`AsicConfig.key`.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal, get_args

import torch

from asic_backend.sim import host_gemm, numerics
from asic_backend.sim.config import AsicConfig
from asic_backend.sim.conv import ConvGeometry, conv_i32
from asic_backend.sim.cycles import ACC_BYTES, GemmCost, conv_cost, gemm_cost

#: What a DUT GEMM computes, for the per-family share of MACs in reports: a linear or plain
#: matrix product, a batched one (attention's QK and PV, ``bmm``), or a convolution.
GemmFamily = Literal["matmul", "bmm", "conv"]
GEMM_FAMILIES: tuple[str, ...] = get_args(GemmFamily)

#: How many per-GEMM costs a device remembers since its last reset (oldest dropped first).
COST_HISTORY = 4096
#: How many distinct GEMM shapes a device keeps the cost of (then it starts over).
COST_MEMO = 65536


@dataclasses.dataclass(frozen=True)
class HostFallback:
    """A matmul-class op the DUT did not run, and why (one line), with the user's site if known
    and the frame the op was traced in (``origin_*``: a library's, or the user's own), which
    says whose code it is."""

    op: str
    reason: str
    file: str | None = None
    line: int | None = None
    source: str | None = None
    origin_file: str | None = None
    origin_line: int | None = None
    origin_function: str | None = None


@dataclasses.dataclass(frozen=True)
class HostFallbackStats:
    """One host-fallback site since the last reset: its calls, MACs, and first call's shapes."""

    site: HostFallback
    calls: int
    macs: int
    shape: str | None = None


@dataclasses.dataclass(frozen=True)
class CounterSnapshot:
    """A device's counters at one moment. ``macs`` ran on the DUT, ``host_macs`` on the host
    (host fallbacks); ``peak_macs_per_cycle`` is rows·cols (for utilization)."""

    dut_ops: int = 0
    host_fallbacks: int = 0
    macs: int = 0
    cycles: int = 0
    bytes_moved: int = 0
    peak_macs_per_cycle: int = 0
    host_macs: int = 0
    #: Host syncs the device stalled for (each added ``AsicConfig.sync_cycles`` to ``cycles``).
    syncs: int = 0

    @property
    def dut_share(self) -> float | None:
        """The share of all MACs that ran on the DUT (None when there were none)."""
        total = self.macs + self.host_macs
        return self.macs / total if total else None

    @property
    def utilization(self) -> float:
        """MACs done / MACs the array could have done in those cycles (0.0 when idle)."""
        capacity = self.peak_macs_per_cycle * self.cycles
        return self.macs / capacity if capacity else 0.0

    def __add__(self, other: object) -> CounterSnapshot:
        if not isinstance(other, CounterSnapshot):
            return NotImplemented
        cycles = self.cycles + other.cycles
        if self.peak_macs_per_cycle == other.peak_macs_per_cycle or cycles == 0:
            peak = max(self.peak_macs_per_cycle, other.peak_macs_per_cycle)
        else:
            # Devices of different sizes: the cycle-weighted mean keeps the summed utilization
            # right (up to rounding to an int).
            capacity = (
                self.peak_macs_per_cycle * self.cycles + other.peak_macs_per_cycle * other.cycles
            )
            peak = round(capacity / cycles)
        return CounterSnapshot(
            dut_ops=self.dut_ops + other.dut_ops,
            host_fallbacks=self.host_fallbacks + other.host_fallbacks,
            macs=self.macs + other.macs,
            cycles=cycles,
            bytes_moved=self.bytes_moved + other.bytes_moved,
            peak_macs_per_cycle=peak,
            host_macs=self.host_macs + other.host_macs,
            syncs=self.syncs + other.syncs,
        )

    def as_dict(self) -> dict[str, Any]:
        """The integer counters by name, plus ``utilization`` (a float)."""
        return {
            "dut_ops": self.dut_ops,
            "host_fallbacks": self.host_fallbacks,
            "macs": self.macs,
            "host_macs": self.host_macs,
            "cycles": self.cycles,
            "bytes_moved": self.bytes_moved,
            "syncs": self.syncs,
            "utilization": self.utilization,
        }


class Device:
    """One simulated ASIC: its config and its counters since the last :meth:`reset`.

    >>> dev = get_device("gemmini")
    >>> dev.reset()
    >>> acc = run_mm_i32(a_q, w_q, device=dev)      # a_q int8 [8, 64], w_q int8 [32, 64]
    >>> dev.snapshot().dut_ops, dev.snapshot().cycles
    (1, 432)
    """

    def __init__(self, config: AsicConfig) -> None:
        self.config = config
        self.key = config.key
        self._lock = threading.Lock()
        self._dut_ops = 0
        self._host_fallbacks = 0
        self._macs = 0
        self._cycles = 0
        self._bytes = 0
        self._host_macs = 0
        self._syncs = 0
        self._sites: dict[HostFallback, HostFallbackStats] = {}  # first-seen order
        self._costs: collections.deque[GemmCost] = collections.deque(maxlen=COST_HISTORY)
        # (family, id(cost)) -> [family, cost, count]: costs come from the memo, one object per
        # shape, so identity finds them without hashing a cost's dozen fields on every call
        # (the entry holds the cost, so its id stays its own).
        self._shapes: dict[tuple[str, int], list[Any]] = {}
        # A cost depends only on the shape and the config: computed once per shape, so a call
        # adds precomputed numbers to the counters (GemmCost is frozen, safe to share).
        self._memo: dict[object, GemmCost] = {}

    def __repr__(self) -> str:
        return f"Device({self.key!r}, {self.snapshot()})"

    def snapshot(self) -> CounterSnapshot:
        """The counters now (a consistent copy)."""
        with self._lock:
            return CounterSnapshot(
                dut_ops=self._dut_ops,
                host_fallbacks=self._host_fallbacks,
                macs=self._macs,
                cycles=self._cycles,
                bytes_moved=self._bytes,
                peak_macs_per_cycle=self.config.peak_macs_per_cycle,
                host_macs=self._host_macs,
                syncs=self._syncs,
            )

    def reset(self) -> None:
        """Zero the counters and forget the host-fallback sites and the per-GEMM costs."""
        with self._lock:
            self._dut_ops = self._host_fallbacks = self._macs = self._cycles = self._bytes = 0
            self._host_macs = self._syncs = 0
            self._sites.clear()
            self._costs.clear()
            self._shapes.clear()

    def gemm_cost(
        self, m: int, k: int, n: int, out_bytes: int, input_bytes: int | None = None
    ) -> GemmCost:
        """:func:`asic_backend.sim.cycles.gemm_cost` on this device, computed once per shape."""
        key = (m, k, n, out_bytes, input_bytes)
        cost = self._memo.get(key)
        if cost is None:
            cost = self._remember(key, gemm_cost(self.config, m, k, n, out_bytes, input_bytes))
        return cost

    def conv_cost(self, geo: ConvGeometry, out_bytes: int) -> GemmCost:
        """:func:`asic_backend.sim.cycles.conv_cost` on this device, computed once per geometry."""
        key = (geo, out_bytes)
        cost = self._memo.get(key)
        if cost is None:
            cost = self._remember(key, conv_cost(self.config, geo, out_bytes))
        return cost

    def _remember(self, key: object, cost: GemmCost) -> GemmCost:
        # Racing threads may both compute a cost: the same value, so either is right.
        if len(self._memo) >= COST_MEMO:
            self._memo.clear()
        self._memo[key] = cost
        return cost

    def record_gemm(self, cost: GemmCost, count: int = 1, family: GemmFamily = "matmul") -> None:
        """Count ``count`` GEMMs of this cost run on the DUT (a grouped conv issues one a group).
        ``family`` only labels them for reports; the counters do not depend on it."""
        with self._lock:
            self._dut_ops += count
            self._macs += cost.macs * count
            self._cycles += cost.cycles * count
            self._bytes += cost.bytes_moved * count
            self._costs.extend([cost] * min(count, COST_HISTORY))
            entry = self._shapes.get((family, id(cost)))
            if entry is None:
                self._shapes[(family, id(cost))] = [family, cost, count]
            else:
                entry[2] += count

    def record_sync(self, count: int = 1) -> None:
        """Count ``count`` host syncs: each stalls the device ``config.sync_cycles`` cycles."""
        with self._lock:
            self._syncs += count
            self._cycles += self.config.sync_cycles * count

    def record_host_fallback(
        self, site: HostFallback, macs: int = 0, shape: str | None = None
    ) -> None:
        """Count one call of a matmul-class op that ran on the host, with its MACs."""
        with self._lock:
            self._host_fallbacks += 1
            self._host_macs += macs
            known = self._sites.get(site)
            self._sites[site] = HostFallbackStats(
                site=site,
                calls=1 if known is None else known.calls + 1,
                macs=macs if known is None else known.macs + macs,
                shape=shape if known is None else known.shape,
            )

    @property
    def host_fallback_sites(self) -> tuple[HostFallback, ...]:
        """The distinct host-fallback sites since the last reset, in first-seen order."""
        with self._lock:
            return tuple(self._sites)

    @property
    def host_fallback_stats(self) -> tuple[HostFallbackStats, ...]:
        """Calls and MACs of each host-fallback site since the last reset, in first-seen order."""
        with self._lock:
            return tuple(self._sites.values())

    @property
    def last_costs(self) -> tuple[GemmCost, ...]:
        """The cost of each GEMM since the last reset, oldest first (the last 4096 at most)."""
        with self._lock:
            return tuple(self._costs)

    @property
    def gemm_shapes(self) -> dict[tuple[str, GemmCost], int]:
        """How many GEMMs of each (family, cost) ran since the last reset, in first-seen order
        (every one of them, unlike :attr:`last_costs`)."""
        with self._lock:
            entries = [tuple(entry) for entry in self._shapes.values()]
        out: dict[tuple[str, GemmCost], int] = {}
        for family, cost, count in entries:  # equal costs from a memo that started over: one
            out[(family, cost)] = out.get((family, cost), 0) + count
        return out

    def history(self) -> tuple[int, tuple[GemmCost, ...]]:
        """``(dut_ops, last_costs)`` read together: the GEMMs issued since the last reset, and
        the costs of the last 4096 of them (one entry per GEMM; equal shapes share one object)."""
        with self._lock:
            return self._dut_ops, tuple(self._costs)


_registry: dict[str, Device] = {}
_registry_lock = threading.Lock()


def get_device(config: AsicConfig | str | None = None) -> Device:
    """The device for ``config``: one per distinct config key, created on first use.

    ``None`` means :meth:`AsicConfig.from_env`; a string is the key of a device already created, a
    preset name or a TOML path.

    >>> get_device("tpu_v1") is get_device(AsicConfig.preset("tpu_v1"))
    True
    """
    if isinstance(config, str):
        with _registry_lock:
            known = _registry.get(config)
        if known is not None:
            return known
        try:
            config = AsicConfig.load(config)
        except ValueError as exc:
            keys = ", ".join(d.key for d in all_devices()) or "none yet"
            raise ValueError(f"{exc} (device keys created so far: {keys})") from None
    elif config is None:
        config = AsicConfig.from_env()
    elif not isinstance(config, AsicConfig):
        raise TypeError(
            "asic: a device is named by an AsicConfig, a preset name, a TOML path or a device "
            f"key, got {config!r}"
        )
    with _registry_lock:
        device = _registry.get(config.key)
        if device is None:
            device = _registry[config.key] = Device(config)
        elif device.config != config:
            raise ValueError(
                f"asic: two different configs share the key {config.key!r}; rename one of them"
            )
        return device


def all_devices() -> list[Device]:
    """Every device created so far, in creation order."""
    with _registry_lock:
        return list(_registry.values())


def reset_all() -> None:
    """Reset the counters of every device."""
    for device in all_devices():
        device.reset()


def total_snapshot() -> CounterSnapshot:
    """The counters of all devices, summed."""
    return sum((d.snapshot() for d in all_devices()), CounterSnapshot())


def all_gemm_shapes() -> dict[tuple[str, str, GemmCost], int]:
    """How many GEMMs of each (device key, family, cost) ran on any device since its reset."""
    return {
        (device.key, family, cost): count
        for device in all_devices()
        for (family, cost), count in device.gemm_shapes.items()
    }


def all_host_fallbacks() -> list[HostFallback]:
    """The distinct host-fallback sites of all devices, deduplicated, in first-seen order."""
    return [stats.site for stats in all_host_fallback_stats()]


def all_host_fallback_stats() -> list[HostFallbackStats]:
    """Calls and MACs of every host-fallback site of all devices, summed per site."""
    merged: dict[HostFallback, HostFallbackStats] = {}
    for device in all_devices():
        for stats in device.host_fallback_stats:
            known = merged.get(stats.site)
            merged[stats.site] = (
                stats
                if known is None
                else dataclasses.replace(
                    known, calls=known.calls + stats.calls, macs=known.macs + stats.macs
                )
            )
    return list(merged.values())


# -- execution entry points: run the numerics and count the GEMM on the device ------------------


def _check_device(device: object) -> None:
    if not isinstance(device, Device):
        raise TypeError(f"asic: device must be a Device (see get_device()), got {device!r}")


def run_mm_i32(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    *,
    a_zp: int | torch.Tensor = 0,
    bias_i32: torch.Tensor | None = None,
    device: Device,
    out: torch.Tensor | None = None,
    allow_float32: bool = False,
) -> torch.Tensor:
    """The int32-out GEMM ``a_q·w_qᵀ − a_zp·rowsum(w_q) + bias_i32`` on ``device``: [M,N] int32.

    ``a_zp`` is an int, or an int32 tensor: ``[]``/``[1]``/``[1,1]`` per tensor, ``[M,1]`` per row.
    ``out`` and ``allow_float32``: as :func:`asic_backend.sim.numerics.linear_i32` takes them.
    """
    _check_device(device)
    acc = numerics.linear_i32(
        a_q,
        w_q,
        a_zp,
        bias_i32,
        device.config.acc_overflow,
        out=out,
        allow_float32=allow_float32,
    )
    m, k = a_q.shape
    device.record_gemm(device.gemm_cost(m, k, w_q.shape[0], ACC_BYTES))
    return acc


def run_static_mm(
    a_q: torch.Tensor,
    w: host_gemm.StaticOperand,
    *,
    device: Device,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`run_mm_i32` of int8 activations ``a_q [M, K]`` by a weight's kept operand
    (:func:`asic_backend.sim.host_gemm.static_operand`), without a zero-point or bias (a
    dynamic linear's GEMM): int32 ``[M, N]``, into ``out`` where given, counted on ``device``
    as :func:`run_mm_i32` counts it. The caller guarantees ``K <= INT_MM_MAX_K``."""
    _check_device(device)
    acc = host_gemm.static_mm(a_q, w, out=out)
    m, k = a_q.shape
    _record_mm(device, m, k, acc.shape[1])
    return acc


def record_mm(m: int, k: int, n: int, *, device: Device) -> None:
    """Record an int32-out GEMM ``[M, K] · [K, N]`` on ``device``, for a caller that computed
    it itself, inside a fused native call (:func:`asic_backend.sim.host_passes.linear` by an
    ``int16``-packed weight): what :func:`run_static_mm` records."""
    _check_device(device)
    _record_mm(device, m, k, n)


def _record_mm(device: Device, m: int, k: int, n: int) -> None:
    device.record_gemm(device.gemm_cost(m, k, n, ACC_BYTES))


def run_bmm_i32(
    a_q: torch.Tensor, w_q: torch.Tensor, *, device: Device, allow_float32: bool = False
) -> torch.Tensor:
    """A batch of int32-out GEMMs on ``device`` (:func:`asic_backend.sim.numerics.bmm_i32`): int8
    ``[B, M, K]`` by ``[B, N, K]`` gives int32 ``[B, M, N]`` (or float32 with the same values,
    when ``allow_float32``); counted as B GEMMs."""
    _check_device(device)
    acc = numerics.bmm_i32(a_q, w_q, device.config.acc_overflow, allow_float32=allow_float32)
    batch, m, k = a_q.shape
    if batch:
        device.record_gemm(
            device.gemm_cost(m, k, w_q.shape[1], ACC_BYTES), count=batch, family="bmm"
        )
    return acc


def run_linear_requant(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    *,
    a_zp: int,
    bias_i32: torch.Tensor | None,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    out_zp: int,
    qmin: int,
    qmax: int,
    device: Device,
) -> torch.Tensor:
    """The int8-out linear on ``device``: accumulate, requantize, add out_zp, clamp: int8 [M,N]."""
    _check_device(device)
    out = numerics.linear_requant(
        a_q,
        w_q,
        a_zp=a_zp,
        bias_i32=bias_i32,
        multiplier=multiplier,
        shift=shift,
        out_zp=out_zp,
        qmin=qmin,
        qmax=qmax,
        acc_overflow=device.config.acc_overflow,
        rounding=device.config.requant_rounding,
    )
    m, k = a_q.shape
    device.record_gemm(device.gemm_cost(m, k, w_q.shape[0], out_bytes=1))
    return out


def run_conv_i32(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    geo: ConvGeometry,
    *,
    a_zp: int | torch.Tensor = 0,
    bias_i32: torch.Tensor | None = None,
    device: Device,
    out_bytes: int = ACC_BYTES,
    allow_float32: bool = False,
) -> torch.Tensor:
    """The int32 accumulator of the convolution ``geo`` on ``device``, one GEMM per group
    (:func:`asic_backend.sim.conv.conv_i32`, ``allow_float32`` and float32 ``x_q`` included):
    int32 ``geo.out_shape``.
    ``out_bytes`` is what each output leaves the array as (1 when the DUT requantizes it)."""
    _check_device(device)
    acc = conv_i32(
        x_q,
        w_q,
        geo,
        a_zp=a_zp,
        bias_i32=bias_i32,
        acc_overflow=device.config.acc_overflow,
        allow_float32=allow_float32,
    )
    record_conv(geo, device=device, out_bytes=out_bytes)
    return acc


def record_conv(geo: ConvGeometry, *, device: Device, out_bytes: int = ACC_BYTES) -> None:
    """Record the convolution ``geo`` on ``device`` (one GEMM per group), for a caller that
    computed its exact accumulator itself, with its quantization and rescale fused around it
    (:func:`asic_backend.sim.host_passes.depthwise_conv`): what :func:`run_conv_i32` records."""
    _check_device(device)
    device.record_gemm(device.conv_cost(geo, out_bytes), count=geo.groups, family="conv")


def run_conv_i32_by_chunks(
    chunks: Iterable[torch.Tensor],
    w_q: torch.Tensor,
    geo: ConvGeometry,
    *,
    device: Device,
    allow_float32: bool = False,
) -> Iterator[torch.Tensor]:
    """:func:`run_conv_i32` fed its batch as consecutive chunks of samples (each ``x_q`` of
    ``[n, C_in, *size]``, made when asked for): yields each chunk's accumulator in turn, the same
    values as one call gives. A caller that quantizes a chunk and rescales its result before
    asking for the next keeps one chunk's data in the CPU's caches through all three. The device
    records one convolution of ``geo`` once the chunks have covered its batch."""
    _check_device(device)
    done = 0
    for x_q in chunks:
        part = dataclasses.replace(geo, batch=int(x_q.shape[0]))
        if done + part.batch > geo.batch:
            raise ValueError(f"asic: conv chunks go past the batch's {geo.batch} samples")
        yield conv_i32(
            x_q,
            w_q,
            part,
            acc_overflow=device.config.acc_overflow,
            allow_float32=allow_float32,
        )
        done += part.batch
    if done != geo.batch:
        raise ValueError(f"asic: conv chunks cover {done} of the batch's {geo.batch} samples")
    device.record_gemm(device.conv_cost(geo, ACC_BYTES), count=geo.groups, family="conv")


def run_conv_requant(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    geo: ConvGeometry,
    *,
    a_zp: int,
    bias_i32: torch.Tensor | None,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    out_zp: int,
    qmin: int,
    qmax: int,
    device: Device,
) -> torch.Tensor:
    """The int8-out convolution on ``device``: accumulate, requantize per output channel, add
    ``out_zp``, clamp: int8 ``geo.out_shape``."""
    _check_device(device)
    numerics.check_requant_params(multiplier, shift, geo.out_channels)
    numerics.check_int8_qparams(a_zp, out_zp, qmin, qmax)
    acc = conv_i32(
        x_q, w_q, geo, a_zp=a_zp, bias_i32=bias_i32, acc_overflow=device.config.acc_overflow
    )
    rows = acc.movedim(1, -1).reshape(-1, geo.out_channels)  # one row per output point
    out = numerics.requantize(
        rows, multiplier, shift, out_zp, qmin, qmax, device.config.requant_rounding
    )
    out = out.reshape(geo.batch, *geo.out_size, geo.out_channels).movedim(-1, 1).contiguous()
    device.record_gemm(device.conv_cost(geo, out_bytes=1), count=geo.groups, family="conv")
    return out
