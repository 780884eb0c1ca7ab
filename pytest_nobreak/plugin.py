"""pytest-nobreak's pytest plugin (entry point ``nobreak``; disable with ``-p no:nobreak``).

Hooks here only register options, the marker and the session object; the work is in
``session.py`` (per-test watching), ``monitor.py`` (the pytest-free core) and
``reporting.py`` (files and summaries). This module must not import torch: entry points load it
into every pytest run in the environment.
"""

from __future__ import annotations

import pytest

from pytest_nobreak.benchmark import BenchmarkPlugin, asic_benchmark
from pytest_nobreak.config import ASIC_BACKEND, NobreakConfig, add_options, check_ini_keys
from pytest_nobreak.fixtures import (
    CONFIG_KEY,
    asic,
    nobreak_compile,
    nobreak_export,
    nobreak_report,
)
from pytest_nobreak.markers import MARKER_DOC
from pytest_nobreak.models.items import add_model_options, configure_models
from pytest_nobreak.report.html_columns import HtmlColumns
from pytest_nobreak.session import NobreakSession

__all__ = ["asic", "asic_benchmark", "nobreak_compile", "nobreak_export", "nobreak_report"]

SESSION_PLUGIN_NAME = "nobreak-session"
BENCHMARK_PLUGIN_NAME = "nobreak-benchmark"
HTML_PLUGIN_NAME = "nobreak-pytest-html"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
    add_model_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DOC)
    check_ini_keys(config)
    settings = NobreakConfig.from_pytest_config(config)
    if settings.backend_explicit and not settings.asic:
        _check_backend_name(settings.backend)
    if settings.asic:
        _check_asic_device(settings)
        _check_host_kernels()
    config.stash[CONFIG_KEY] = settings
    config.pluginmanager.register(NobreakSession(config, settings), SESSION_PLUGIN_NAME)
    config.pluginmanager.register(BenchmarkPlugin(config, settings), BENCHMARK_PLUGIN_NAME)
    configure_models(config, settings)  # --nobreak-model: the generated checks
    if config.pluginmanager.hasplugin("html"):  # pytest-html: figures as columns, breaks as extras
        config.pluginmanager.register(HtmlColumns(config), HTML_PLUGIN_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    settings = config.stash.get(CONFIG_KEY, None)
    if settings is not None and settings.asic:
        from asic_backend.sim import host_passes  # torch: loaded already, under the backend

        host_passes.reset()  # a later run in this process (pytester) reads its own environment


def pytest_report_header(config: pytest.Config) -> str | list[str] | None:
    settings = config.stash.get(CONFIG_KEY, None)
    if settings is None:
        return None
    scope = "every test" if settings.watch_all else "marked tests"
    if settings.fail_unmarked:
        scope += " (breaks in unmarked tests fail the run)"
    if settings.fixture_backend == ASIC_BACKEND:
        # torch: the ASIC backend imports it anyway
        from asic_backend.sim import host_gemm, host_passes

        device = settings.asic_config().describe()
        return [
            f"nobreak: backend=asic, device={device}, watching {scope}",
            f"nobreak: host GEMM kernel {host_gemm.describe()}",
            f"nobreak: host passes {host_passes.describe()}",
        ]
    return f"nobreak: backend={settings.fixture_backend}, watching {scope}"


def _check_backend_name(name: str) -> None:
    # Only when the user named a backend: the check imports torch, which a plain run avoids.
    import torch._dynamo

    known = set(torch._dynamo.list_backends(exclude_tags=()))
    if name not in known:
        raise pytest.UsageError(
            f"--nobreak-backend {name}: unknown torch.compile backend; known: "
            f"{', '.join(sorted(known))}"
        )


def _check_host_kernels() -> None:
    """A bad ``$ASIC_HOST_GEMM``, ``$ASIC_INT_MM_LAYOUT`` or ``$ASIC_HOST_PASSES`` (or native
    passes that do not build when asked for) stops the run at once (exit 4, one line), not in a
    compile."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from asic_backend.sim import host_gemm, host_passes

    host_passes.reset()  # this run's environment, not an earlier run's in this process
    try:
        host_gemm.kernel()
        host_gemm.layout_setting()
        host_passes.mode()
    except ValueError as exc:
        raise pytest.UsageError(f"asic: {exc}") from None
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None


def _check_asic_device(settings: NobreakConfig) -> None:
    try:
        settings.asic_config()
    except (ValueError, OSError) as exc:
        raise pytest.UsageError(f"--asic-device: {exc}") from None
