"""Shared test setup. ``pytester`` is enabled in pyproject.toml (``-p pytester``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from _pytest import pytester as _pytester

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


#: Plugins of this environment that no inner pytest run needs: hypothesis's takes 1.5 s to import
#: in every pytest process on a 2-core AVX2 host (anyio's 0.5 s), and the suite starts some 80.
#: The README's runs keep the user's whole set (tests/test_readme.py builds their environment).
INNER_ADDOPTS = "-p no:hypothesispytest -p no:anyio"


@pytest.fixture(scope="session", autouse=True)
def _lean_subprocess_runs() -> Iterator[None]:
    """Inner runs started with ``subprocess`` (module fixtures included) skip those plugins."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_ADDOPTS", INNER_ADDOPTS)
        yield


@pytest.fixture(autouse=True)
def _lean_pytester_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for ``pytester`` runs, whose setup clears ``PYTEST_ADDOPTS``: set it after."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")
        monkeypatch.setenv("PYTEST_ADDOPTS", INNER_ADDOPTS)


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
