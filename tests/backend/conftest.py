"""Fixtures of the backend tests: a fresh Dynamo and a zeroed device per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch._dynamo.utils import counters

from asic_backend.sim import host_passes
from asic_backend.sim.device import Device, get_device


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def device() -> Device:
    """The device ``backend="asic"`` uses ($ASIC_BACKEND_CONFIG or the default preset), zeroed."""
    dev = get_device()
    dev.reset()
    return dev


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def fresh_host_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which once-per-process messages the backend has already given."""
    from asic_backend import notices

    monkeypatch.setattr(notices, "_said", set())


@pytest.fixture
def aten_passes() -> Iterator[None]:
    """The host passes in aten kernels (asic_backend.sim.host_passes): for a test of their
    mechanics (chunks of rows or samples, reused buffers), which the native passes, a row or a
    plane at a time whatever the size, do not have."""
    with host_passes.forced("aten"):
        yield
