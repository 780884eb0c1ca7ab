"""A bit-exact int8 matmul ASIC simulator, exposed as ``torch.compile(backend="asic")``.

>>> import torch, asic_backend
>>> model = torch.nn.Linear(64, 32)
>>> compiled = torch.compile(model, backend="asic")   # every MAC on the DUT, or counted on the host
>>> custom = asic_backend.make_backend(config=asic_backend.AsicConfig.preset("gemmini"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
#: Version of the simulator's numeric and cycle model. Bump it whenever a figure it reports can
#: change for the same input, so baselines recorded with another model are flagged.
SIM_VERSION = "3"

if TYPE_CHECKING:
    from asic_backend.backend import AsicBackend, asic_backend, make_backend
    from asic_backend.lower.exported import lower_exported
    from asic_backend.lower.unconverted import NotConvertedError
    from asic_backend.notices import AsicHostWarning, host_fallbacks_reported
    from asic_backend.sim.config import PRESETS, AsicConfig
    from asic_backend.sim.cycles import GemmCost, gemm_cost
    from asic_backend.sim.device import (
        CounterSnapshot,
        Device,
        HostFallback,
        HostFallbackStats,
        get_device,
    )
    from asic_backend.sim.macs import flop_counter_extras

__all__ = [
    "PRESETS",
    "SIM_VERSION",
    "AsicBackend",
    "AsicConfig",
    "AsicHostWarning",
    "CounterSnapshot",
    "Device",
    "GemmCost",
    "HostFallback",
    "HostFallbackStats",
    "NotConvertedError",
    "asic_backend",
    "flop_counter_extras",
    "gemm_cost",
    "get_device",
    "host_fallbacks_reported",
    "lower_exported",
    "make_backend",
]

_LAZY = {
    "PRESETS": "asic_backend.sim.config",
    "AsicConfig": "asic_backend.sim.config",
    "GemmCost": "asic_backend.sim.cycles",
    "gemm_cost": "asic_backend.sim.cycles",
    "CounterSnapshot": "asic_backend.sim.device",
    "Device": "asic_backend.sim.device",
    "HostFallback": "asic_backend.sim.device",
    "HostFallbackStats": "asic_backend.sim.device",
    "flop_counter_extras": "asic_backend.sim.macs",
    "host_fallbacks_reported": "asic_backend.notices",
    "get_device": "asic_backend.sim.device",
    "AsicBackend": "asic_backend.backend",
    "AsicHostWarning": "asic_backend.notices",
    "asic_backend": "asic_backend.backend",
    "make_backend": "asic_backend.backend",
    "NotConvertedError": "asic_backend.lower.unconverted",
    "lower_exported": "asic_backend.lower.exported",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `import asic_backend` stays cheap and the backend module (which registers the
    # custom ops) loads only when it is used.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asic_backend' has no attribute {name!r}")

    return getattr(importlib.import_module(module), name)
