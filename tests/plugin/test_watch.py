"""The pytest-free core: ``watch()`` and ``CompileReport.check()``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import pytest_nobreak
from pytest_nobreak import GraphBreakError


def branchy(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # the break
        return x + 1
    return x - 1


def clean(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2


def test_clean_region_checks_ok() -> None:
    with pytest_nobreak.watch() as report:
        torch.compile(clean, backend="eager")(torch.ones(3))
    report.check()
    assert (report.graphs, report.graph_breaks, report.eager_frames, report.recompiles) == (
        1,
        0,
        0,
        0,
    )


def test_break_raises_graph_break_error_with_the_marker_message() -> None:
    with pytest_nobreak.watch() as report:
        torch.compile(branchy, backend="eager")(torch.ones(3))
    with pytest.raises(GraphBreakError) as excinfo:
        report.check()
    message = str(excinfo.value)
    line = branchy.__code__.co_firstlineno + 1
    assert message.splitlines()[0].startswith(
        "torch.compile did not run as whole graphs: 1 problem"
    )
    assert f"test_watch.py:{line}  >  if x.sum() > 0:" in message
    assert [b.gb_id for b in excinfo.value.breaks] == ["GB0170"]
    report.check(allow=["GB0170"])  # allowed: no error


def test_watch_stops_collecting_after_the_block() -> None:
    with pytest_nobreak.watch() as report:
        pass
    torch.compile(branchy, backend="eager")(torch.ones(3))
    assert report.breaks == ()
    report.check()


def test_watch_is_reentrant_per_block() -> None:
    for _ in range(2):
        with pytest_nobreak.watch() as report:
            torch.compile(branchy, backend="eager")(torch.ones(3))
        assert report.graph_breaks == 1


WATCHED_HOST_SCRIPT = """
import warnings

import torch

import pytest_nobreak
from pytest_nobreak import GraphBreakError

warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as inside:
    with pytest_nobreak.watch() as report:
        torch.compile(torch.nn.Linear(8, 4), backend="asic")(torch.randn(2, 8))  # autograd live
torch._dynamo.reset()  # compile again (Dynamo would reuse the graph for another Linear(8, 4))
with warnings.catch_warnings(record=True) as after:
    torch.compile(torch.nn.Linear(8, 4), backend="asic")(torch.randn(2, 8))
try:
    report.check()
except GraphBreakError as exc:
    print("kinds", sorted({b.kind for b in exc.breaks}))
print("inside", [w.category.__name__ for w in inside])
print("after", [w.category.__name__ for w in after])
"""


def test_watch_reports_host_fallbacks_instead_of_the_backends_warning(
    pytester: pytest.Pytester,
) -> None:
    """watch() hands host fallbacks to check(), so the backend's once-per-process warning is
    neither issued nor spent inside it: the first compile after the block still warns. In a
    fresh process, since "once per process" is the point."""
    script = pytester.makepyfile(watched=WATCHED_HOST_SCRIPT)
    result = pytester.runpython(script)
    assert result.ret == 0, result.stderr.str()
    assert result.outlines == [
        "kinds ['host_fallback']",
        "inside []",
        "after ['AsicHostWarning']",
    ]


def recompiling(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@pytest.mark.parametrize(
    ("options", "hint"),
    [
        ({}, 'To allow a known break: report.check(allow=[r"GB0170"])'),
        ({"allow": ["GB0170"], "max_recompiles": 0}, "To accept more recompiles: report.check("),
    ],
)
def test_check_spells_the_options_as_check_takes_them(options: dict[str, Any], hint: str) -> None:
    """Outside pytest, the message says how to pass the options to ``check()``, not the
    marker's spelling."""
    with pytest_nobreak.watch() as report:
        torch.compile(branchy, backend="eager")(torch.ones(3))
        f = torch.compile(recompiling, backend="eager", dynamic=False)
        f(torch.ones(2))
        f(torch.ones(3))
    with pytest.raises(GraphBreakError) as excinfo:
        report.check(**options)
    message = str(excinfo.value)
    assert message.splitlines()[-1].startswith(hint)
    assert "pytest.mark" not in message


WATCHED_PACKAGE_SCRIPT = """
import torch

import pytest_nobreak
from pkg.model import branchy

with pytest_nobreak.watch() as report:
    torch.compile(branchy, backend="eager")(torch.ones(3))  # the call
try:
    report.check()
except pytest_nobreak.GraphBreakError as exc:
    print(exc)
"""


def test_outside_pytest_paths_are_relative_to_the_working_directory(
    pytester: pytest.Pytester,
) -> None:
    pytester.mkpydir("pkg")
    pytester.path.joinpath("pkg", "model.py").write_text(
        "def branchy(x):\n    if x.sum() > 0:\n        return x + 1\n    return x - 1\n"
    )
    script = pytester.makepyfile(watched=WATCHED_PACKAGE_SCRIPT)
    (call,) = [n for n, t in enumerate(script.read_text().splitlines(), 1) if "# the call" in t]
    result = pytester.runpython(script)
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(
        [
            "1. graph break GB0170: Data-dependent branching",
            "   at pkg/model.py:2  >  if x.sum() > 0:",
            f"   called from watched.py:{call}  >  torch.compile(branchy, *# the call",
        ]
    )
    assert str(pytester.path) not in result.stdout.str()
