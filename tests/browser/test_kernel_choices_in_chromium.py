"""The host GEMM kernels the ASIC backend chose by timing, on the ``--nobreak-html`` page in
headless Chromium: a fact of the run's header, after the host kernel's, its text the report's.
Rendered from a constructed report, so nothing is compiled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.report.html_report import render_html
from pytest_nobreak.report.json_report import build_report
from pytest_nobreak.report.kernel_choices import united
from tests.browser.chromium import console_errors

CHOICES = united(
    [
        (1, 2048, 6144, 1, "linear", "int16"),
        (3, 2048, 2048, 2, "gemm", "int_mm"),
        (3, 2048, 2048, 2, "gemm", "int16"),
    ]
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html-choices") / "report.html"
    document = build_report(
        "2.13.0", "asic", "default", [], host_gemm="int_mm (auto)", kernel_choices=CHOICES
    )
    path.write_text(render_html(document), encoding="utf-8")
    return path


def test_the_header_shows_each_shapes_kernel(opened: Any) -> None:
    text = opened.find_element("tag name", "body").text
    assert "host GEMM\nint_mm (auto)\nhost GEMM by timing\n" in text
    assert (
        "host GEMM by timing\n1×2048×6144 1T linear int16; "
        "3×2048×2048 2T gemm int16 or int_mm (by worker)\n"
    ) in text
    assert console_errors(opened) == []
