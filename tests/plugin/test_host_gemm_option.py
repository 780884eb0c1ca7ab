"""``$ASIC_HOST_GEMM``, ``$ASIC_INT_MM_LAYOUT`` and ``$ASIC_HOST_PASSES`` under
``--asic-backend``: the header and the reports name the kernel (with ``int_mm``'s weight layout)
and the passes, a bad value is a usage error before any test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asic_backend.sim import host_gemm, int16_gemm
from tests.amx import needs_amx


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    return pytester


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ("float64", "nobreak: host GEMM kernel float64 ($ASIC_HOST_GEMM=float64)"),
        (
            "int_mm",
            "nobreak: host GEMM kernel int_mm ($ASIC_HOST_GEMM=int_mm)"
            + (
                ", weights as [[]*] * (measured)"
                if host_gemm.int_mm_is_exact()
                else "; torch._int_mm is not exact on this host: float32 computes every GEMM"
            ),
        ),
        pytest.param(
            "int16",
            "nobreak: host GEMM kernel int16 ($ASIC_HOST_GEMM=int16)",
            marks=pytest.mark.skipif(
                not int16_gemm.available(), reason=int16_gemm.unavailable_reason()
            ),
        ),
        pytest.param(
            "amx",
            "nobreak: host GEMM kernel amx ($ASIC_HOST_GEMM=amx); int_mm for products without"
            " a kept weight (attention, convolutions)",
            marks=needs_amx,
        ),
        ("auto", "nobreak: host GEMM kernel * (auto: *int8 * on this CPU*)*"),
    ],
)
def test_the_header_names_the_kernel(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: str, line: str
) -> None:
    monkeypatch.setenv("ASIC_HOST_GEMM", env)
    result = suite.runpytest("-p", "no:cacheprovider", "--asic-backend")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["nobreak: backend=asic, *", line, "nobreak: host passes native (auto: built with *)"]
    )


@pytest.mark.skipif(
    not host_gemm.int_mm_is_exact(), reason="torch._int_mm is not exact here: float32 computes"
)
@pytest.mark.parametrize(
    ("layout", "shown"), [("rows", "[[]N, K] rows"), ("columns", "[[]K, N] columns")]
)
def test_the_header_names_a_forced_weight_layout(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, layout: str, shown: str
) -> None:
    monkeypatch.setenv("ASIC_HOST_GEMM", "int_mm")
    monkeypatch.setenv("ASIC_INT_MM_LAYOUT", f" {layout.upper()} ")
    result = suite.runpytest(
        "-p", "no:cacheprovider", "--asic-backend", "--nobreak-json=r.json", "--nobreak-html=r.html"
    )
    result.assert_outcomes(passed=1)
    kernel = (
        "int_mm ($ASIC_HOST_GEMM=int_mm), weights as "
        f"{shown.replace('[[]', '[')} ($ASIC_INT_MM_LAYOUT={layout})"
    )
    result.stdout.fnmatch_lines([f"nobreak: host GEMM kernel {kernel.replace('[', '[[]')}"])
    assert json.loads((suite.path / "r.json").read_text())["host_gemm"] == kernel
    assert kernel in (suite.path / "r.html").read_text()


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("ASIC_HOST_GEMM", "fastest", "int_mm, float32, float64, int16, amx, auto"),
        ("ASIC_INT_MM_LAYOUT", "kn", "rows, columns, auto"),
    ],
)
def test_a_bad_kernel_or_layout_is_a_usage_error(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, value: str, allowed: str
) -> None:
    monkeypatch.setenv(name, value)
    result = suite.runpytest("-p", "no:cacheprovider", "--asic-backend")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: asic: ${name}={value!r} is not one of {allowed}"])


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"ASIC_HOST_PASSES": "aten"}, "nobreak: host passes aten ($ASIC_HOST_PASSES=aten)"),
        (
            {"CC": "/nonexistent/cc", "PATH": ""},
            "nobreak: host passes aten (auto: no C compiler *)",
        ),
    ],
    ids=["forced", "no compiler"],
)
def test_the_header_names_the_host_passes(
    suite: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    env: dict[str, str],
    line: str,
) -> None:
    result = _run_in(suite, monkeypatch, tmp_path, env)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["nobreak: host GEMM kernel *", line])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"ASIC_HOST_PASSES": "fast"},
            "ERROR: asic: $ASIC_HOST_PASSES='fast' is not one of native, aten, auto",
        ),
        (
            {"ASIC_HOST_PASSES": "native", "CC": "/nonexistent/cc", "PATH": ""},
            "ERROR: asic: the native host passes are not available: no C compiler found *",
        ),
        (
            {"ASIC_HOST_GEMM": "int16", "CC": "/nonexistent/cc", "PATH": ""},
            "ERROR: asic: $ASIC_HOST_GEMM=int16, but the int16 kernel is not available: the "
            "native library is not available (no C compiler found *",
        ),
    ],
    ids=["unknown", "native without a compiler", "int16 without a compiler"],
)
def test_bad_host_passes_or_kernel_are_a_usage_error(
    suite: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    env: dict[str, str],
    message: str,
) -> None:
    result = _run_in(suite, monkeypatch, tmp_path, env)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def _run_in(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cache: Path, env: dict[str, str]
) -> pytest.RunResult:
    """``--asic-backend`` run with ``env`` set and a build cache of its own (no earlier build to
    find)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return suite.runpytest("-p", "no:cacheprovider", "--asic-backend")


def test_without_the_asic_backend_the_kernel_is_not_read(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASIC_HOST_GEMM", "fastest")
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "host GEMM" not in result.stdout.str()


def test_the_reports_name_the_kernel(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASIC_HOST_GEMM", "float32")
    result = suite.runpytest(
        "-p", "no:cacheprovider", "--asic-backend", "--nobreak-json=r.json", "--nobreak-html=r.html"
    )
    result.assert_outcomes(passed=1)
    document = json.loads((suite.path / "r.json").read_text())
    assert document["host_passes"].startswith("native (auto: built with ")
    assert "host passes" in (suite.path / "r.html").read_text()
    monkeypatch.setenv("ASIC_HOST_PASSES", "aten")
    result = suite.runpytest(
        "-p", "no:cacheprovider", "--asic-backend", "--nobreak-json=r.json", "--nobreak-html=r.html"
    )
    result.assert_outcomes(passed=1)
    document = json.loads((suite.path / "r.json").read_text())
    assert document["host_gemm"] == "float32 ($ASIC_HOST_GEMM=float32)"
    assert document["host_passes"] == "aten ($ASIC_HOST_PASSES=aten)"
    page = (suite.path / "r.html").read_text()
    assert "host GEMM" in page
    assert "float32 ($ASIC_HOST_GEMM=float32)" in page
    assert "aten ($ASIC_HOST_PASSES=aten)" in page


def test_without_the_asic_backend_the_report_has_no_kernel(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-p", "no:cacheprovider", "--nobreak-json=r.json")
    result.assert_outcomes(passed=1)
    document = json.loads((suite.path / "r.json").read_text())
    assert "host_gemm" not in document
    assert "host_passes" not in document
