"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, which ``.ci/run``
installs) driven by Selenium, for the tests and the benchmark of the HTML report."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def driver_or_skip() -> Iterator[Any]:
    """A headless Chromium session, closed after use. Without a browser the test is skipped
    on a workstation, and fails in CI (``$CI`` set), where ``.ci/run`` installs one."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        why = f"no headless browser: {', '.join(missing)} missing (apt-get install chromium "
        why += "chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, url: str, timeout: float = 60.0) -> None:
    """Load ``url`` and wait until the page's script has run (it sets ``data-ready``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.documentElement.dataset.ready") == "1"
    )


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors since the last call, and the page's own count of
    uncaught errors."""
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    counted = driver.execute_script("return document.documentElement.dataset.jsErrors")
    if counted:
        errors.append(f"{counted} uncaught error(s) counted by the page")
    return errors


def visible_ids(driver: Any) -> list[str]:
    """The node ids of the report's test rows the filters leave shown, in page order."""
    ids: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tests > tbody:not([hidden])'))"
        ".map(g => g.dataset.nodeid)"
    )
    return ids
