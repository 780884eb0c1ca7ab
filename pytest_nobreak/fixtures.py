"""The plugin's fixtures. Each imports torch lazily, on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_nobreak.config import ASIC_BACKEND, NobreakConfig
from pytest_nobreak.keys import MONITOR_KEY
from pytest_nobreak.watch.compile_report import CompileReport
from pytest_nobreak.watch.export_report import ExportReport
from pytest_nobreak.watch.exporting import export_check

if TYPE_CHECKING:
    from asic_backend.sim.device import Device

CONFIG_KEY = pytest.StashKey[NobreakConfig]()


def _settings(request: pytest.FixtureRequest) -> NobreakConfig:
    return request.config.stash[CONFIG_KEY]


def session_backend(settings: NobreakConfig) -> Any:
    """The backend object ``nobreak_compile`` hands to ``torch.compile``."""
    if settings.fixture_backend == ASIC_BACKEND:
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from asic_backend import make_backend

        return make_backend(config=settings.asic_device)
    return settings.fixture_backend


@pytest.fixture
def nobreak_report(request: pytest.FixtureRequest) -> CompileReport:
    """The live compile report of this test: graphs, breaks, eager frames, recompiles, ASIC
    counters. Requesting it watches the test even when it is not marked."""

    report: CompileReport = request.node.stash[MONITOR_KEY].report
    return report


@pytest.fixture
def nobreak_compile(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``nobreak_compile(model_or_fn, **torch_compile_kwargs)``: ``torch.compile`` with the
    session's backend (``--nobreak-backend``, ``inductor`` by default, the ASIC simulator under
    ``--asic-backend``).

    >>> def test_mlp(nobreak_compile):
    ...     out = nobreak_compile(MLP())(torch.randn(4, 8))
    """
    settings = _settings(request)

    def compile(model_or_fn: Any, **kwargs: Any) -> Any:
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        import torch

        kwargs.setdefault("backend", session_backend(settings))
        return torch.compile(model_or_fn, **kwargs)

    return compile


@pytest.fixture
def nobreak_export(request: pytest.FixtureRequest) -> Callable[..., ExportReport]:
    """``nobreak_export(model, args, kwargs=None, *, dynamic_shapes=None, strict=None,
    asic=None)``: export ``model`` with ``torch.export`` (non-strict and strict;
    ``strict=True``/``False`` one mode) and record every problem of the exported programs in
    this test's report (see :func:`pytest_nobreak.export_check`). ``asic``: also run the
    program on the simulated DUT (``asic_backend.lower_exported`` on the session's device),
    on the example inputs and one more size of each dynamic dimension, checked against eager;
    ``None``: when the session runs ``--asic-backend``. Its host fallbacks and DUT figures are
    the test's, as under ``--asic-backend``. A marked test fails on every problem;
    ``allow=[...]`` matches them as it does breaks. Returns the
    :class:`~pytest_nobreak.watch.export_report.ExportReport` (``.program`` is the exported program,
    ``.lowered`` the DUT one).

    >>> @pytest.mark.no_graph_break
    ... def test_exports(nobreak_export):
    ...     nobreak_export(MLP(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
    """
    settings = _settings(request)

    def export(
        model: Any,
        args: tuple[Any, ...],
        kwargs: Any = None,
        *,
        dynamic_shapes: Any = None,
        strict: bool | None = None,
        asic: bool | None = None,
    ) -> ExportReport:

        result = export_check(
            model,
            args,
            kwargs,
            dynamic_shapes=dynamic_shapes,
            strict=strict,
            asic=settings.asic if asic is None else asic,
            device=settings.asic_config() if settings.asic or asic else None,
            root=str(request.config.rootpath),
            first_party=settings.first_party,
        )
        monitor = request.node.stash.get(MONITOR_KEY, None)
        if monitor is not None:
            monitor.report.add_export(result)
        return result

    return export


@pytest.fixture
def asic(request: pytest.FixtureRequest) -> Device:
    """This test's simulated ASIC: ``.config`` and ``.snapshot()`` counters (DUT ops, host
    fallbacks, MACs, cycles, bytes, utilization), reset at the start of the test."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from asic_backend.sim.device import get_device

    return get_device(_settings(request).asic_device)
