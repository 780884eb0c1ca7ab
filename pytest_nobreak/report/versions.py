"""The versions a report records: torch's and the bundled simulator's, read without importing
either where that can be avoided."""

from __future__ import annotations

import importlib.metadata
import sys

from asic_backend import SIM_VERSION


def torch_version() -> str:
    """The installed torch release without its local build tag (``2.13.0``, not ``+cpu``).

    The xdist controller runs no test and has not imported torch; importing it only to read a
    version would cost seconds, so the distribution's metadata answers instead.
    """
    module = sys.modules.get("torch")
    if module is not None:
        raw = str(getattr(module, "__version__", "unknown"))
    else:
        try:
            raw = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path
            try:
                # Lazy: keeps torch out of the plugin's import until a test needs it.
                import torch
            except ImportError:
                return "unknown"
            raw = str(torch.__version__)
    return raw.split("+", 1)[0]


def sim_version() -> str | None:
    """The bundled ASIC simulator's model version, whether or not this run used the backend.

    It belongs to the installation, not to the run: if it depended on what the run imported,
    a run whose tests stopped reaching the device would see a "version change" and turn its
    regressions into warnings.
    """
    return SIM_VERSION
