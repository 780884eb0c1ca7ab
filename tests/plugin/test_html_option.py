"""``--nobreak-html PATH`` as an option: where it may write (checked before any test), that it is
written on the xdist controller with the devices' roofs read where the tests ran, and that it
never lands on another of the run's files. (The page itself: tests/unit/test_html_report.py and
tests/browser/.)"""

from __future__ import annotations

import json

import pytest

from pytest_nobreak.report.html_report import GENERATOR

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

SUITE = """
import pytest
import torch
from torch import nn


@pytest.mark.no_graph_break
def test_linear(nobreak_compile):
    with torch.no_grad():
        nobreak_compile(nn.Linear(8, 4))(torch.randn(2, 8))
"""
#: A device of its own (not a preset): its key cannot be turned back into a config by a
#: process that never built it, such as the xdist controller.
DEVICE = 'preset = "default"\nrows = 64\n'


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "small.toml").write_text(DEVICE)
    (pytester.path / "adir").mkdir()
    (pytester.path / "notes.txt").write_text("my notes")
    return pytester


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nobreak-html", "adir"], "HTML report adir: is a directory; pass the path of a file"),
        (
            ["--nobreak-html", "notes.txt"],
            "HTML report notes.txt: exists and is not a pytest-nobreak HTML report; delete it "
            "or pass another path",
        ),
        (
            ["--nobreak-html", "r.out", "--nobreak-json", "r.out"],
            "HTML report r.out: is also the --nobreak-json file; pass another path",
        ),
        (
            [
                "--nobreak-html",
                "b.json",
                "--nobreak-baseline",
                "b.json",
                "--nobreak-update-baseline",
            ],
            "HTML report b.json: is also the --nobreak-baseline file; pass another path",
        ),
        (
            [
                "--nobreak-json",
                "b.json",
                "--nobreak-baseline",
                "b.json",
                "--nobreak-update-baseline",
            ],
            "JSON report b.json: is also the --nobreak-baseline file; pass another path",
        ),
    ],
    ids=["directory", "not-a-page", "the-json-report", "the-baseline", "json-on-baseline"],
)
def test_a_path_it_must_not_write_stops_the_run_at_start(
    suite: pytest.Pytester, args: list[str], message: str
) -> None:
    result = suite.runpytest(*QUIET, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert [line for line in result.stderr.lines if line] == [f"ERROR: {message}"]
    assert (suite.path / "notes.txt").read_text() == "my notes"
    assert not (suite.path / "r.out").exists()
    assert not (suite.path / "b.json").exists()


def test_under_xdist_the_controller_writes_the_page_with_a_custom_devices_roofs(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest_subprocess(
        *QUIET,
        *("-n", "1", "--asic-device", "small.toml"),
        *("--nobreak-json", "r.json", "--nobreak-html", "out/r.html"),
    )
    result.assert_outcomes(passed=1)
    assert "nobreak: HTML report written to out/r.html" in result.stdout.str()
    document = json.loads((suite.path / "r.json").read_text())
    (key,) = document["roofs"]
    assert key.startswith("default-")  # the custom device's key, from the worker
    assert document["roofs"][key]["peak_ops_per_s"] == 2 * 64 * 128 * 1e9
    page = (suite.path / "out" / "r.html").read_text()
    assert GENERATOR in page
    assert "test_suite.py::test_linear" in page
    assert "<section id='roofline'>" in page


def test_the_page_is_written_when_nothing_was_watched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    result = pytester.runpytest(*QUIET, "--nobreak-html", "r.html")
    result.assert_outcomes(passed=1)
    page = (pytester.path / "r.html").read_text()
    assert "No watched test ran." in page
    # A second run replaces its own page.
    result = pytester.runpytest(*QUIET, "--nobreak-html", "r.html")
    assert result.ret == 0
