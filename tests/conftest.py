"""Shared test setup. ``pytester`` is enabled in pyproject.toml (``-p pytester``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest import pytester as _pytester

from tests import gc_freeze, threads, zygote
from tests.skip_reasons import AMX_SKIP

# pytester restores ``sys.modules`` after each in-process inner run, deleting the modules that
# run imported. torch imports many submodules lazily (Dynamo, Inductor, sympy); deleting them
# and importing them again re-registers C-level state and crashes the interpreter
# ("SystemError: bad call flags", then a segfault). Keep those packages across inner runs.
_KEEP = (
    "torch",
    "functorch",
    "sympy",
    "mpmath",
    "numpy",
    "torchao",
    "transformers",
    "diffusers",
    "asic_backend",
    "pytest_nobreak",
    "triton",
)
_original_init = _pytester.SysModulesSnapshot.__init__


def _init(
    self: _pytester.SysModulesSnapshot, preserve: Callable[[str], bool] | None = None
) -> None:
    def keep(name: str) -> bool:
        return name.split(".", 1)[0] in _KEEP or bool(preserve and preserve(name))

    _original_init(self, preserve=keep)


_pytester.SysModulesSnapshot.__init__ = _init  # type: ignore[method-assign]


#: The pages' hidden example projects (tests/test_readme.py copies them out), not our tests.
collect_ignore = ["readme_projects"]

ROOT = Path(__file__).resolve().parents[1]

#: The suite's plugins in every inner pytest run, found on the repository's path: the MAC
#: accounting check (tests/mac_check.py) and the garbage collector's freezing (tests/gc_freeze.py).
INNER_PLUGINS = "-p tests.mac_check -p tests.gc_freeze"
#: Plugins of this environment that no inner pytest run needs: hypothesis's takes 1.5 s to import
#: in every pytest process on a 2-core AVX2 host (anyio's 0.5 s), and the suite starts some 80.
#: The README's runs keep the user's whole set (tests/test_readme.py builds their environment).
INNER_ADDOPTS = f"-p no:hypothesispytest -p no:anyio {INNER_PLUGINS}"


def inner_pythonpath() -> str:
    """``PYTHONPATH`` for an inner run: the repository first, so ``tests.mac_check`` imports."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(autouse=True)
def _fresh_kernel_choices() -> Iterator[None]:
    """Each test's ``auto`` kernel trials start afresh (asic_backend.sim.kernel_choice): a
    choice an earlier test's loop made would change which kernel a later one runs, the bits
    being the same, where it spies on the kernels."""
    yield
    module = sys.modules.get("asic_backend.sim.kernel_choice")
    if module is not None:
        module.forget()


@pytest.fixture(scope="session", autouse=True)
def _lean_subprocess_runs() -> Iterator[None]:
    """Inner runs started with ``subprocess`` (module fixtures included) skip those plugins and
    check the MAC accounting."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", inner_pythonpath())
        patch.setenv("PYTEST_ADDOPTS", INNER_ADDOPTS)
        yield


@pytest.fixture(autouse=True)
def _lean_pytester_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for ``pytester`` runs, whose setup clears ``PYTEST_ADDOPTS``: set it after.
    Their subprocess runs are forks of a process that has imported torch (tests/zygote.py),
    except in a test marked ``fresh_interpreter``."""
    if "pytester" not in request.fixturenames:
        return
    tester: pytest.Pytester = request.getfixturevalue("pytester")
    monkeypatch.setenv("PYTEST_ADDOPTS", INNER_ADDOPTS)
    if request.node.get_closest_marker("fresh_interpreter") is None:
        monkeypatch.setattr(tester, "popen", _forked_popen(tester.popen))


def _forked_popen(popen: Callable[..., Any]) -> Callable[..., Any]:
    """``Pytester.popen`` by :func:`tests.zygote.popen` for what ``Pytester.run`` asks of it:
    stdin closed, output to files."""

    def forked(
        cmdargs: Any,
        stdout: Any = subprocess.PIPE,
        stderr: Any = subprocess.PIPE,
        stdin: Any = pytest.Pytester.CLOSE_STDIN,
        **kw: Any,
    ) -> Any:
        if stdin is not pytest.Pytester.CLOSE_STDIN or kw or isinstance(stdout, int):
            return popen(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
        # Pytester.popen's environment: the working directory first on PYTHONPATH.
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        return zygote.popen(cmdargs, env=env, stdout=stdout, stderr=stderr)

    return forked


@pytest.fixture(autouse=True)
def _dynamo_config_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """An in-process ``pytester`` run executes its tests' modules in this process, and a
    module-level ``torch._dynamo.config`` setting there stays for every later test: in a serial
    run, ``capture_scalar_outputs`` left on by tests/plugin/test_runtime_figures.py turned a
    later inner run's graph break into a different compile error. Put back what changed."""
    if "pytester" not in request.fixturenames:
        yield
        return
    import torch._dynamo

    before = torch._dynamo.config.get_config_copy()
    yield
    after = torch._dynamo.config.get_config_copy()  # getattr would warn on deprecated names
    for name, value in before.items():
        if after[name] != value:
            setattr(torch._dynamo.config, name, value)


@pytest.fixture(autouse=True)
def _no_ci_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs must not see the outer CI's environment: ``CI`` turns strict baselines
    on, and the GitHub variables would append tables to the real job summary."""
    for name in ("CI", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _every_mac_accounted() -> Iterator[None]:
    """DESIGN: every MAC runs on the DUT or is a counted host fallback. Checked on every call of
    every graph any test compiles with the asic backend (tests/accounting.py)."""
    from tests.accounting import checking_every_graph

    with checking_every_graph():
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    gc_freeze.start(config)
    threads.share(config)


# --------------------------------------------------------------------------- skips in CI

#: Skips a CI run accepts: (reason prefix, why it is no gap). Any other skip in CI is a test
#: that silently stopped proving its claim (an import that broke, a browser that went missing)
#: and fails the run.
ALLOWED_CI_SKIPS: tuple[tuple[str, str], ...] = (
    (
        AMX_SKIP,
        "the amx kernel runs only on a CPU with AMX (Intel Sapphire Rapids on); a runner without"
        " one has nothing to run it on, and the tests of what such a process picks instead"
        " (tests/asic/test_amx_gemm.py) run everywhere",
    ),
)
_skipped: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)  # a module's importorskip skips all of its tests at collection


def _note_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        _skipped.append((report.nodeid, reason))


def unexpected_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips no entry of :data:`ALLOWED_CI_SKIPS` accepts."""
    return [
        (nodeid, reason)
        for nodeid, reason in dict.fromkeys(skipped)  # each xdist worker reports a module's
        if not any(reason.startswith(prefix) for prefix, _ in ALLOWED_CI_SKIPS)
    ]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not os.environ.get("CI") or hasattr(session.config, "workerinput"):
        return
    unexpected = unexpected_skips(_skipped)
    if not unexpected:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"CI: {len(unexpected)} test(s) skipped (tests/conftest.py ALLOWED_CI_SKIPS):"]
    lines += [f"  {nodeid}: {reason}" for nodeid, reason in unexpected]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
