"""The browser tests' fixtures: one Chromium per module, and the module's ``page`` opened in it.

Each module defines ``page``: the path of the report it renders.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.chromium import console_errors, driver_or_skip, open_page


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from driver_or_skip()


@pytest.fixture
def opened(driver: Any, page: Path) -> Any:
    """The module's page, freshly loaded; only this test's console errors are looked at."""
    open_page(driver, page.as_uri())
    console_errors(driver)
    return driver
