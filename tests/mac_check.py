"""The MAC accounting check (tests/accounting.py) in the pytest runs the tests start themselves.

``tests/conftest.py`` loads this plugin into every inner run (``-p tests.mac_check`` in
``PYTEST_ADDOPTS``, the repository on ``PYTHONPATH``): the example suite, the README's runs, the
fixes' examples, the model checks. Each graph they compile with the asic backend is checked on
every call, as in the outer run, and a difference fails the inner test. In-process ``pytester``
runs are checked by the outer block already, so it opens none of its own there.

It imports nothing heavy itself: the check starts when ``asic_backend.backend`` is imported
(before any graph can be compiled with it), so a run that never compiles for the DUT imports no
torch, as without it.

With ``NOBREAK_MAC_CHECK_LOG`` set, a run appends one line to that file at its end,
``graphs=<compiled> calls=<checked>``, so a test can see that the check really ran.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

LOG = "NOBREAK_MAC_CHECK_LOG"
BACKEND = "asic_backend.backend"
_BLOCK = pytest.StashKey[contextlib.ExitStack]()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once ``name`` has been imported (its module executed)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders find it
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            # A loader of its own: the one found may serve every module (pytest's rewriter).
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then()


def pytest_configure(config: pytest.Config) -> None:
    stack = contextlib.ExitStack()
    config.stash[_BLOCK] = stack

    def open_block() -> None:
        from tests.accounting import active, checking_every_graph

        if active():  # an in-process run: the outer block checks its graphs
            return
        checked = stack.enter_context(checking_every_graph())
        if LOG in os.environ:
            path = Path(os.environ[LOG])
            stack.callback(lambda: _log(path, checked.graphs, checked.calls))

    def start() -> None:
        # The block opens at the first compile, when the backend and torch are whole: opening
        # it while the backend's package is still being imported would import half of it.
        backend: Any = sys.modules[BACKEND]
        original = backend.AsicBackend.__call__

        def first_compile(self: Any, gm: Any, example_inputs: Any) -> Any:
            backend.AsicBackend.__call__ = original
            open_block()
            return backend.AsicBackend.__call__(self, gm, example_inputs)

        backend.AsicBackend.__call__ = first_compile
        stack.callback(setattr, backend.AsicBackend, "__call__", original)

    if BACKEND in sys.modules:
        start()
    else:
        finder = _AfterImport(BACKEND, start)
        sys.meta_path.insert(0, finder)
        stack.callback(_forget, finder)
    if LOG in os.environ:
        # A run that compiles nothing for the DUT still says the check was loaded.
        stack.callback(_log_unless_logged, Path(os.environ[LOG]))


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_BLOCK, None)
    if stack is not None:
        stack.close()


def _forget(finder: _AfterImport) -> None:
    if finder in sys.meta_path:  # the backend was never imported
        sys.meta_path.remove(finder)


_logged: list[bool] = []


def _log_unless_logged(path: Path) -> None:
    if not _logged:
        _log(path, 0, 0)


def _log(path: Path, graphs: int, calls: int) -> None:
    _logged.append(True)
    with path.open("a", encoding="utf-8") as log:
        log.write(f"graphs={graphs} calls={calls}\n")
