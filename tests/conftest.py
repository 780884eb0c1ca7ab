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
