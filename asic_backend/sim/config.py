"""The description of a simulated int8 matmul ASIC: array, memories, bandwidth and numerics.

An :class:`AsicConfig` is a frozen, validated value. Get one from a preset
(``AsicConfig.preset("tpu_v1")``), a TOML file (``AsicConfig.from_toml(path)``), the
``ASIC_BACKEND_CONFIG`` environment variable (``AsicConfig.from_env()``), or derive one with
``.replace(rows=64)``. Its :attr:`~AsicConfig.key` names it in reports and in the device registry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomllib is 3.11+; its backport has the same API
    import tomli as tomllib

Dataflow = Literal["ws", "os", "is"]
AccOverflow = Literal["wrap", "saturate"]
RequantRounding = Literal["tflite", "float64_rne"]

DATAFLOWS: tuple[str, ...] = get_args(Dataflow)
ACC_OVERFLOWS: tuple[str, ...] = get_args(AccOverflow)
REQUANT_ROUNDINGS: tuple[str, ...] = get_args(RequantRounding)

#: Weight tiles a PE can hold: 1, or 2 when the next tile loads while the current one computes.
WEIGHT_BUFFERS: tuple[int, ...] = (1, 2)

#: Operations per multiply-accumulate (a multiply and an add), for TOP/s and ops per byte.
OPS_PER_MAC = 2

#: What one host sync costs the device by default, in its cycles: the device drains its queue,
#: the value crosses the bus to the host (a PCIe read completion, about 1 µs) and the host
#: decides and issues the next work (about 1 µs more): 2 µs, at the default 1 GHz clock.
DEFAULT_SYNC_CYCLES = 2000

#: The environment variable :meth:`AsicConfig.from_env` reads: a preset name or a TOML path.
ENV_VAR = "ASIC_BACKEND_CONFIG"

_KIB = 1024
_MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class AsicConfig:
    """A simulated R x C systolic int8 matmul array, its SRAMs, its DRAM link and its numerics.

    ``dataflow`` is SCALE-Sim's: weight-stationary (``ws``), output-stationary (``os``) or
    input-stationary (``is``). ``weight_buffers`` is 1, or 2 for a ``ws`` array whose PEs hold a
    second weight tile, loaded while the first one computes (TPU v1's double buffering); see
    :func:`asic_backend.sim.cycles.systolic_cycles`.

    ``sync_cycles`` is what one host sync (a graph reading a device value back, see
    :mod:`asic_backend.lower.host_syncs`) stalls the device for, in its cycles (0: free).

    The defaults are the ``default`` preset. ``acc_overflow`` says what the int32 accumulator does
    when the exact result does not fit; ``requant_rounding`` picks the int32 -> int8 rounding
    (``"tflite"``: gemmlowp fixed point; ``"float64_rne"``: the same multiplier applied in float64,
    rounded half to even).

    >>> cfg = AsicConfig.preset("tpu_v1")
    >>> cfg.rows, cfg.key
    (256, 'tpu_v1')
    >>> cfg.replace(rows=64).key          # no longer the preset: its name and a hash of the fields
    'tpu_v1-221eef5089'
    """

    name: str = "default"
    rows: int = 128
    cols: int = 128
    dataflow: Dataflow = "ws"
    weight_buffers: int = 1
    clock_hz: float = 1e9
    inp_sram_bytes: int = 4 * _MIB
    wgt_sram_bytes: int = 4 * _MIB
    acc_sram_bytes: int = 1 * _MIB
    dram_bw_bytes_per_s: float = 100e9
    acc_overflow: AccOverflow = "wrap"
    requant_rounding: RequantRounding = "tflite"
    sync_cycles: int = DEFAULT_SYNC_CYCLES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"AsicConfig.name must be a non-empty string, got {self.name!r}")
        for field in ("rows", "cols", "inp_sram_bytes", "wgt_sram_bytes", "acc_sram_bytes"):
            value = getattr(self, field)
            # bool is an int subclass; `rows = true` in a TOML file is a mistake, not 1.
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"AsicConfig.{field} must be a positive integer, got {value!r}")
        if (
            isinstance(self.sync_cycles, bool)
            or not isinstance(self.sync_cycles, int)
            or self.sync_cycles < 0
        ):
            raise ValueError(
                "AsicConfig.sync_cycles (device cycles one host sync stalls for) must be a "
                f"non-negative integer, got {self.sync_cycles!r}"
            )
        for field in ("clock_hz", "dram_bw_bytes_per_s"):
            value = getattr(self, field)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    f"AsicConfig.{field} must be a positive finite number, got {value!r}"
                )
        # One spelling per value, so equal configs hash to the same key (TOML gives 700000000).
        object.__setattr__(self, "clock_hz", float(self.clock_hz))
        object.__setattr__(self, "dram_bw_bytes_per_s", float(self.dram_bw_bytes_per_s))
        _check_choice("dataflow", self.dataflow, DATAFLOWS)
        if type(self.weight_buffers) is not int or self.weight_buffers not in WEIGHT_BUFFERS:
            raise ValueError(
                "AsicConfig.weight_buffers must be 1 (single-buffered) or 2 (double-buffered), "
                f"got {self.weight_buffers!r}"
            )
        if self.weight_buffers == 2 and self.dataflow != "ws":
            raise ValueError(
                f"AsicConfig.weight_buffers=2 double-buffers the stationary weights of the 'ws' "
                f"dataflow; the {self.dataflow!r} dataflow holds no weight tile in its PEs "
                "(use weight_buffers=1, or dataflow='ws')"
            )
        _check_choice("acc_overflow", self.acc_overflow, ACC_OVERFLOWS)
        _check_choice("requant_rounding", self.requant_rounding, REQUANT_ROUNDINGS)

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str) -> AsicConfig:
        """The preset called ``name`` (see :data:`PRESETS`)."""
        try:
            return PRESETS[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown ASIC preset {name!r}; known presets: {', '.join(sorted(PRESETS))}"
            ) from None

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], *, origin: str | None = None) -> AsicConfig:
        """A config from a table of fields; an optional ``preset`` key names the base preset.

        ``origin`` (e.g. the file it came from) prefixes any error message.
        """
        fields = dict(table)
        try:
            base = cls.preset(fields.pop("preset", "default"))
            _check_fields(fields, extra_allowed=("preset",))
            return base.replace(**fields)
        except ValueError as exc:
            if origin is None:
                raise
            raise ValueError(f"{origin}: {exc}") from None

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> AsicConfig:
        """A config from a TOML file of top-level fields (plus an optional ``preset = "..."``)."""
        p = Path(path)
        try:
            with p.open("rb") as fh:
                table = tomllib.load(fh)
        except FileNotFoundError:
            raise ValueError(f"ASIC config file {str(p)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"ASIC config file {str(p)!r} is not valid TOML: {exc}") from None
        return cls.from_mapping(table, origin=f"ASIC config file {str(p)!r}")

    @classmethod
    def load(cls, spec: str) -> AsicConfig:
        """A preset name, or the path of a TOML file."""
        if spec in PRESETS:
            return PRESETS[spec]
        if spec.endswith(".toml") or os.sep in spec or Path(spec).is_file():
            return cls.from_toml(spec)
        raise ValueError(
            f"ASIC config {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
            "nor a path to a .toml file"
        )

    @classmethod
    def from_env(cls) -> AsicConfig:
        """The config named by ``$ASIC_BACKEND_CONFIG`` (a preset or TOML path); unset: default."""
        spec = os.environ.get(ENV_VAR, "").strip()
        if not spec:
            return PRESETS["default"]
        try:
            return cls.load(spec)
        except ValueError as exc:
            raise ValueError(f"${ENV_VAR}: {exc}") from None

    def replace(self, **changes: Any) -> AsicConfig:
        """A copy with ``changes`` applied (validated like any other config)."""
        _check_fields(changes)
        return dataclasses.replace(self, **changes)

    # -- derived figures ----------------------------------------------------------------------

    @property
    def peak_macs_per_cycle(self) -> int:
        """MACs the whole array does per cycle: rows x cols."""
        return self.rows * self.cols

    @property
    def peak_ops_per_s(self) -> float:
        """Peak throughput, counting a MAC as two ops: 2·R·C·f."""
        return OPS_PER_MAC * self.peak_macs_per_cycle * self.clock_hz

    @property
    def ridge_ops_per_byte(self) -> float:
        """Arithmetic intensity (ops/byte) above which a GEMM is compute-bound: peak / bandwidth."""
        return self.peak_ops_per_s / self.dram_bw_bytes_per_s

    def describe(self) -> str:
        """One line for headers and legends: ``default (128x128 ws @ 1 GHz)``; a double-buffered
        array says so: ``tpu_v1 (256x256 ws, 2 weight buffers @ 0.7 GHz)``."""
        buffers = f", {self.weight_buffers} weight buffers" if self.weight_buffers > 1 else ""
        return (
            f"{self.name} ({self.rows}x{self.cols} {self.dataflow}{buffers} "
            f"@ {self.clock_hz / 1e9:g} GHz)"
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields, by name (what a TOML file would hold)."""
        return dataclasses.asdict(self)

    @property
    def key(self) -> str:
        """A short stable id: the name alone for an unmodified preset, else name + field hash."""
        if PRESETS.get(self.name) == self:
            return self.name
        fields = self.as_dict()
        # Added later: at their defaults, keys made before them stay the same.
        if fields["weight_buffers"] == 1:
            del fields["weight_buffers"]
        if fields["sync_cycles"] == DEFAULT_SYNC_CYCLES:
            del fields["sync_cycles"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return f"{self.name}-{hashlib.sha256(canonical.encode()).hexdigest()[:10]}"


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AsicConfig))


def _check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"AsicConfig.{field} must be one of {', '.join(allowed)}; got {value!r}")


def _check_fields(fields: Mapping[str, Any], extra_allowed: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(fields) - set(_FIELD_NAMES))
    if unknown:
        raise ValueError(
            f"unknown AsicConfig field(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join((*extra_allowed, *_FIELD_NAMES))}"
        )


#: The built-in devices, by name. ``default`` is the dataclass's defaults.
PRESETS: Mapping[str, AsicConfig] = MappingProxyType(
    {
        "default": AsicConfig(),
        # TPU v1 (Jouppi et al., ISCA 2017): 256x256 MACs at 700 MHz, DDR3 at 34 GB/s, a 24 MiB
        # unified buffer, 4 MiB of accumulators, a 4-tile (4 x 64 KiB) weight FIFO, and "one
        # 64 KiB tile of weights plus one for double-buffering (to hide the 256 cycles it takes
        # to shift a tile in)" in the matrix unit.
        "tpu_v1": AsicConfig(
            name="tpu_v1",
            rows=256,
            cols=256,
            dataflow="ws",
            weight_buffers=2,
            clock_hz=700e6,
            inp_sram_bytes=24 * _MIB,
            wgt_sram_bytes=256 * _KIB,
            acc_sram_bytes=4 * _MIB,
            dram_bw_bytes_per_s=34e9,
        ),
        # Gemmini's default: a 16x16 mesh, a 256 KiB scratchpad (split here between inputs and
        # weights), a 64 KiB accumulator, a 128-bit system bus.
        "gemmini": AsicConfig(
            name="gemmini",
            rows=16,
            cols=16,
            dataflow="ws",
            clock_hz=1e9,
            inp_sram_bytes=128 * _KIB,
            wgt_sram_bytes=128 * _KIB,
            acc_sram_bytes=64 * _KIB,
            dram_bw_bytes_per_s=16e9,
        ),
    }
)
