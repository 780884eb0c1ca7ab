"""Marker options, command-line options, fixtures and isolation, through real pytest runs."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nobreak.config import OPTIONS, NobreakConfig
from pytest_nobreak.watch.fixes import fix_for
from tests.plugin.conftest import Models, without_html_details

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def run(models: Models, *args: str, **files: str) -> pytest.RunResult:
    models.pytester.makepyfile(**files)
    return models.pytester.runpytest(*QUIET, *args)


# ----------------------------------------------------------------------------- marker options


def test_allowed_break_passes_and_others_still_fail(models: Models) -> None:
    result = run(
        models,
        test_allow="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break(allow=[r"GB0170"])
        def test_allowed_by_id():
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))

        @pytest.mark.no_graph_break(allow=[r"models\\.py:\\d+"])
        def test_allowed_by_location():
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))

        @pytest.mark.no_graph_break(allow=["Data-dependent"])
        def test_other_break_still_fails():
            torch.compile(M.two_breaks, backend="eager")(torch.ones(3))
        """,
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*2 problems*", "1. graph break GB0059*", "2. graph break GB0124*"]
    )


def test_max_recompiles_gates_recompiles(models: Models) -> None:
    result = run(
        models,
        test_recompiles="""
        import pytest, torch
        import models as M

        def two_dtypes():
            f = torch.compile(M.clean, backend="eager")
            f(torch.ones(3))
            f(torch.ones(3, dtype=torch.float64))

        @pytest.mark.no_graph_break
        def test_reported_not_gated(nobreak_report):
            two_dtypes()
            assert nobreak_report.recompiles == 1

        @pytest.mark.no_graph_break(max_recompiles=1)
        def test_within_limit():
            two_dtypes()

        @pytest.mark.no_graph_break(max_recompiles=0)
        def test_over_limit():
            two_dtypes()
        """,
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*too many recompiles: 1 recompiles (max_recompiles=0)",
            f"*at {models.where('clean')}*",
            "*why: *dtype mismatch*",
            "To accept more recompiles: @pytest.mark.no_graph_break(max_recompiles=N).",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "no_graph_break(max_recompile=2)",
            "unknown option 'max_recompile' (did you mean 'max_recompiles'?); "
            "known options: max_recompiles, allow, allow_host_fallback, "
            "max_host_syncs, scope",
        ),
        ("no_graph_break(max_recompiles='2')", "max_recompiles must be a non-negative int*"),
        ("no_graph_break(max_recompiles=-1)", "max_recompiles must be a non-negative int*"),
        ("no_graph_break(allow='(')", "allow pattern '(' is not a valid regex*"),
        ("no_graph_break(allow=[3])", "allow entries must be regex strings, got 3"),
        ("no_graph_break(allow_host_fallback='yes')", "allow_host_fallback must be True or False*"),
        ("no_graph_break(True)", "takes keyword options only*"),
    ],
)
def test_bad_marker_options_are_a_usage_error_naming_the_test(
    models: Models, marker: str, message: str
) -> None:
    result = run(
        models,
        test_bad=f"""
        import pytest

        def test_fine():
            pass

        @pytest.mark.{marker}
        def test_typo():
            pass
        """,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: test_bad.py::test_typo: @pytest.mark.no_graph_break: {message}"]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_every_invalid_marker_of_the_run_is_reported_together(models: Models) -> None:
    result = run(
        models,
        test_bad="""
        import pytest

        @pytest.mark.no_graph_break(max_recompile=1)
        def test_typo():
            pass

        def test_fine():
            pass

        @pytest.mark.no_graph_break(allow="(")
        class TestScoped:
            def test_one(self):
                pass

            def test_two(self):
                pass
        """,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    marker = "@pytest.mark.no_graph_break"
    regex = (
        "allow pattern '(' is not a valid regex: missing ), unterminated subpattern at position 0"
    )
    assert [line for line in result.stderr.lines if line.strip()] == [
        f"ERROR: test_bad.py::test_typo: {marker}: unknown option 'max_recompile' (did you mean "
        "'max_recompiles'?); known options: max_recompiles, allow, allow_host_fallback, "
        "max_host_syncs, scope",
        f"ERROR: test_bad.py::TestScoped::test_one: {marker}: {regex}",
        f"ERROR: test_bad.py::TestScoped::test_two: {marker}: {regex}",
    ]
    result.stdout.fnmatch_lines(["*no tests ran in *"])


def test_marker_on_a_class_or_module_applies_to_its_tests(models: Models) -> None:
    result = run(
        models,
        test_scoped="""
        import pytest, torch
        import models as M

        pytestmark = pytest.mark.no_graph_break

        def test_module_level():
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))

        @pytest.mark.no_graph_break(allow=["GB0170"])
        class TestClass:
            def test_closest_marker_wins(self):
                torch.compile(M.data_dependent, backend="eager")(torch.ones(3))
        """,
    )
    result.assert_outcomes(passed=1, failed=1)


def test_marker_is_registered_for_strict_markers(models: Models) -> None:
    result = run(
        models,
        "--strict-markers",
        test_strict="""
        import pytest

        @pytest.mark.no_graph_break
        def test_ok():
            pass
        """,
    )
    result.assert_outcomes(passed=1)
    listing = models.pytester.runpytest("--markers")
    listing.stdout.fnmatch_lines(["@pytest.mark.no_graph_break(max_recompiles=None, allow=()*"])


# ----------------------------------------------------------------------------- --nobreak-all


UNMARKED_SUITE = """
import pytest
import torch
import models as M

def test_breaks():
    torch.compile(M.data_dependent, backend="eager")(torch.ones(3))

def test_clean():
    torch.compile(M.clean, backend="eager")(torch.ones(3))

def test_expected_rejection():
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(M.prints, backend="eager", fullgraph=True)(torch.ones(3))
"""


def test_nobreak_all_reports_unmarked_breaks_without_failing(models: Models) -> None:
    """Reported after the run, never as a warning inside the test; the rejection the test
    expected (a compile error it caught) is no break of its."""
    # A filter naming the warning the plugin used to issue still loads.
    ignore = ("-W", "ignore::pytest_nobreak.session.NobreakWarning")
    result = run(models, "--nobreak-all", *ignore, test_unmarked=UNMARKED_SUITE)
    assert result.ret == 0
    result.assert_outcomes(passed=3)
    assert "NobreakWarning" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*nobreak compile report*",
            "test_unmarked.py::test_breaks * 2 * 1 * 0 * 0 *passed",
            f"    graph break GB0170 at {models.where('branch')}: Data-dependent branching",
        ]
    )
    section = result.stdout.str().split("compile report")[1]
    assert "test_unmarked.py::test_clean" not in section
    assert "test_unmarked.py::test_expected_rejection" not in section


def test_nobreak_unmarked_fail_fails_the_run_not_the_tests(models: Models) -> None:
    """The documented way to make unmarked breaks fail: the run exits 1 and says why in
    pytest's last line; each test keeps its own outcome. It implies --nobreak-all."""
    result = run(models, "--nobreak-unmarked", "fail", test_unmarked=UNMARKED_SUITE)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "nobreak: backend=inductor, watching every test "
            "(breaks in unmarked tests fail the run)",
            "*nobreak compile report*",
            "test_unmarked.py::test_breaks * 2 * 1 * 0 * 0 *passed",
            f"    graph break GB0170 at {models.where('branch')}: Data-dependent branching",
            "nobreak: 1 unmarked test with breaks (--nobreak-unmarked fail: the run fails)",
        ]
    )
    assert fnmatch.fnmatchcase(
        result.stdout.lines[-1], "*= 3 passed, 1 unmarked test with breaks in *s =*"
    )
    # A baseline holding exactly these figures hides a row, but not one that fails the run.
    fail = ("--nobreak-unmarked", "fail", "--nobreak-baseline", "b.json")
    update = models.pytester.runpytest(*QUIET, *fail, "--nobreak-update-baseline")
    assert update.ret == pytest.ExitCode.TESTS_FAILED
    gated = models.pytester.runpytest(*QUIET, *fail)
    gated.stdout.fnmatch_lines(["test_unmarked.py::test_breaks * 2 * 1 * 0 * 0 *passed"])
    # The default reports only, and so does a run whose only "break" was expected.
    assert (
        models.pytester.runpytest(*QUIET, "--nobreak-unmarked", "report", "--nobreak-all").ret == 0
    )
    models.pytester.makepyfile(
        test_unmarked=UNMARKED_SUITE.split("def test_breaks")[0]
        + "def test_expected_rejection"
        + UNMARKED_SUITE.split("def test_expected_rejection")[1]
    )
    assert models.pytester.runpytest(*QUIET, "--nobreak-unmarked", "fail").ret == 0


@pytest.mark.parametrize(
    ("where", "error"),
    [
        (
            "ini",
            "ERROR: ini key nobreak_unmarked: 'fial' is not one of report, fail (did you mean "
            "fail?)",
        ),
        ("cli", "*argument --nobreak-unmarked: invalid choice: 'fial' (choose from *report*fail*)"),
    ],
)
def test_nobreak_unmarked_takes_report_or_fail_only(
    pytester: pytest.Pytester, where: str, error: str
) -> None:
    """A typo is a usage error, never a quiet "report"."""
    pytester.makepyfile(test_x="def test_x(): pass")
    if where == "ini":
        pytester.makeini("[pytest]\nnobreak_unmarked = fial\n")
        result = pytester.runpytest(*QUIET)
    else:
        result = pytester.runpytest(*QUIET, "--nobreak-unmarked", "fial")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.stdout.lines + result.stderr.lines if line.strip()]
    assert any(fnmatch.fnmatchcase(line, error) for line in lines), lines


def test_unmarked_tests_are_not_watched_without_nobreak_all(models: Models) -> None:
    result = run(
        models,
        "--nobreak-json",
        "report.json",
        test_plain="""
        import torch
        import models as M

        def test_breaks():
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))
        """,
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["nobreak: JSON report written to report.json"])
    assert "nobreak compile report" in result.stdout.str()  # only the file line, no table
    assert "test_plain.py::test_breaks" not in result.stdout.str()
    # Written anyway, with no test in it: a CI step uploads it unconditionally.
    report = json.loads((models.pytester.path / "report.json").read_text())
    assert report["tests"] == {}
    assert report["backend"] == "inductor"


# ----------------------------------------------------------------------------- ini keys

# One case per ini key: (key, value, the resolved setting, its expected value). A path is
# relative to the rootdir, the pytester directory.
INI_CASES = [
    ("asic_backend", "true", "fixture_backend", "asic"),
    ("asic_device", "gemmini", "fixture_backend", "asic"),  # implies asic_backend
    ("asic_roofline", "charts/roof.svg", "roofline_path", "<root>/charts/roof.svg"),
    ("nobreak_backend", "eager", "fixture_backend", "eager"),
    ("nobreak_all", "true", "watch_all", True),
    ("nobreak_unmarked", "fail", "fail_unmarked", True),
    ("nobreak_scope", "own", "scope", "own"),
    ("nobreak_first_party", "pluggy", "first_party", ("pluggy",)),
    ("nobreak_json", "out/r.json", "json_path", "<root>/out/r.json"),
    ("nobreak_html", "out/r.html", "html_path", "<root>/out/r.html"),
    ("nobreak_baseline", "b.json", "baseline_path", "<root>/b.json"),
    ("nobreak_strict", "true", "strict", True),
    # The spellings the ASIC keys had first.
    ("nobreak_asic_backend", "true", "fixture_backend", "asic"),
    ("nobreak_asic_device", "tpu_v1", "asic_device", "tpu_v1"),
    ("nobreak_asic_roofline", "roof.svg", "roofline_path", "<root>/roof.svg"),
]


def settings_from_ini(pytester: pytest.Pytester, ini: str, *args: str) -> NobreakConfig:
    """The settings a run with this ini and these arguments resolves. Parsed, not configured:
    an inner session's unconfigure collects garbage, a second with torch loaded."""
    pytester.makeini(f"[pytest]\n{ini}\n")
    return NobreakConfig.from_pytest_config(pytester.parseconfig(*args))


def test_every_ini_key_is_the_option_name_and_has_a_test() -> None:
    """The README's rule: --x-y is x_y. Every key (and older spelling) has a case above."""
    keys = {opt.ini for opt in OPTIONS if opt.ini}
    assert keys == {opt.flag.removeprefix("--").replace("-", "_") for opt in OPTIONS} - {
        "nobreak_update_baseline"
    }
    old = {key for opt in OPTIONS for key in opt.old_ini}
    assert {case[0] for case in INI_CASES} == keys | old


@pytest.mark.parametrize(("key", "value", "setting", "expected"), INI_CASES)
def test_each_ini_key_sets_its_option(
    pytester: pytest.Pytester, key: str, value: str, setting: str, expected: object
) -> None:
    settings = settings_from_ini(pytester, f"{key} = {value}")
    if isinstance(expected, str) and expected.startswith("<root>/"):
        expected = pytester.path / expected.removeprefix("<root>/")
    assert getattr(settings, setting) == expected
    default = settings_from_ini(pytester, "")
    assert getattr(default, setting) != expected  # the key, not a default, set it


def test_the_command_line_wins_over_the_ini(pytester: pytest.Pytester) -> None:
    settings = settings_from_ini(pytester, "nobreak_json = ini.json", "--nobreak-json", "cli.json")
    assert settings.json_path == Path("cli.json")  # relative to the invocation directory


def test_the_asic_backend_ini_key_runs_the_fixtures_on_the_asic(models: Models) -> None:
    """The README's rule gave asic_backend, which used to warn "Unknown config option" and run
    the tests on inductor."""
    models.pytester.makeini("[pytest]\nasic_backend = true\n")
    result = run(
        models,
        test_dut="""
        import torch
        import models as M

        def test_on_the_dut(nobreak_compile, asic):
            with torch.no_grad():
                nobreak_compile(M.MLP())(torch.randn(2, 8))
            assert asic.snapshot().dut_ops == 2
        """,
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["nobreak: backend=asic, device=default (128x128 ws @ 1 GHz), *"])
    assert "Unknown config option" not in result.stdout.str() + result.stderr.str()


def test_asic_device_implies_asic_backend(models: Models) -> None:
    result = run(
        models,
        "--asic-device",
        "gemmini",
        test_dut="""
        import torch
        import models as M

        def test_on_the_dut(nobreak_compile, asic):
            with torch.no_grad():
                nobreak_compile(M.MLP())(torch.randn(2, 8))
            assert (asic.config.name, asic.snapshot().dut_ops) == ("gemmini", 2)
        """,
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["nobreak: backend=asic, device=gemmini (16x16 ws @ 1 GHz), *"])


def test_an_ini_device_file_is_relative_to_the_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "lab_device.toml"
    (pytester.path / "devices").mkdir()
    (pytester.path / "devices" / "lab.toml").write_text(example.read_text())
    (pytester.path / "sub").mkdir()
    monkeypatch.chdir(pytester.path / "sub")
    settings = settings_from_ini(pytester, "asic_device = devices/lab.toml", str(pytester.path))
    assert settings.asic_config().describe() == "lab64 (64x64 os @ 0.8 GHz)"
    assert settings_from_ini(pytester, "asic_device = tpu_v1").asic_device == "tpu_v1"


@pytest.mark.parametrize(
    ("ini", "errors"),
    [
        (
            "asic_bakend = true\nnobreak_jsn = r.json",
            [
                "ERROR: ini key asic_bakend is not a pytest-nobreak setting (did you mean "
                "asic_backend?); known keys: asic_backend, asic_device, asic_roofline, "
                "nobreak_backend, nobreak_all, nobreak_unmarked, nobreak_scope, "
                "nobreak_first_party, nobreak_json, nobreak_html, nobreak_baseline, "
                "nobreak_strict",
                "ERROR: ini key nobreak_jsn is not a pytest-nobreak setting (did you mean "
                "nobreak_json?); known keys: *",
            ],
        ),
        (
            "nobreak_update_baseline = true",
            [
                "ERROR: ini key nobreak_update_baseline: --nobreak-update-baseline is a "
                "command-line action only, so that no ini file leaves every run doing it"
            ],
        ),
        (
            "asic_backend = true\nnobreak_asic_backend = true",
            [
                "ERROR: ini keys asic_backend and nobreak_asic_backend are the same setting "
                "(--asic-backend): keep only asic_backend"
            ],
        ),
    ],
    ids=["misspelt", "update-baseline", "both-spellings"],
)
def test_a_wrong_ini_key_of_ours_is_a_usage_error(
    pytester: pytest.Pytester, ini: str, errors: list[str]
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest(*QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.stdout.lines + result.stderr.lines if line.strip()]
    assert len(lines) == len(errors), lines
    for line, error in zip(lines, errors, strict=True):
        assert fnmatch.fnmatchcase(line, error), line


# ----------------------------------------------------------------------------- JSON report


BRANCH_FIX = fix_for("GB0170", "if x.sum() > 0:")


def test_json_report_has_every_watched_test(models: Models) -> None:
    result = run(
        models,
        "--nobreak-all",
        "--nobreak-json",
        "out/report.json",
        test_json="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_marked_break():
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))

        def test_unmarked_clean(nobreak_compile):
            nobreak_compile(M.MLP(), backend="eager")(torch.randn(2, 8))
        """,
    )
    result.assert_outcomes(passed=1, failed=1)
    report = json.loads((models.pytester.path / "out" / "report.json").read_text())
    assert report["version"] == 1
    assert report["torch"] == torch_release()
    assert report["backend"] == "inductor"
    marked = without_html_details(report["tests"]["test_json.py::test_marked_break"])
    assert marked == {
        "outcome": "failed",
        "marked": True,
        "graphs": 2,
        "graph_breaks": 1,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
        "breaks": [
            {
                "kind": "graph_break",
                "gb_id": "GB0170",
                "gb_type": "Data-dependent branching",
                "file": "models.py",
                "line": models.line("branch"),
                "reason": marked["breaks"][0]["reason"],
                "call_sites": [{"file": "test_json.py", "line": 6}],  # the test's own line
                # The fix rewrites the user's line (pytest_nobreak.watch.fixes).
                "fix": BRANCH_FIX,
                "owner": "own",
            }
        ],
    }
    assert marked["breaks"][0]["reason"].startswith("Detected data-dependent branching")
    clean = report["tests"]["test_json.py::test_unmarked_clean"]
    assert (clean["outcome"], clean["marked"], clean["graphs"], clean["breaks"]) == (
        "passed",
        False,
        1,
        [],
    )


def torch_release() -> str:
    import torch

    return torch.__version__.split("+")[0]


# ----------------------------------------------------------------------------- fixtures


def test_nobreak_compile_uses_the_session_backend(models: Models) -> None:
    models.pytester.makeconftest(
        """
        import torch
        from torch._dynamo import register_backend

        SEEN = []

        @register_backend(name="counting_backend")
        def counting_backend(gm, example_inputs):
            SEEN.append(len(list(gm.graph.nodes)))
            return gm.forward
        """
    )
    files = {
        "test_backend": """
        import torch
        import conftest
        import models as M

        def test_uses_backend(nobreak_compile):
            nobreak_compile(M.MLP())(torch.randn(2, 8))
            assert len(conftest.SEEN) == 1
        """
    }
    models.pytester.makepyfile(**files)
    # A subprocess each: registering the backend twice in one process is an error.
    result = models.pytester.runpytest_subprocess(*QUIET, "--nobreak-backend", "counting_backend")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["nobreak: backend=counting_backend, watching marked tests"])
    models.pytester.makeini("[pytest]\nnobreak_backend = counting_backend\n")
    result = models.pytester.runpytest_subprocess(*QUIET)
    result.assert_outcomes(passed=1)


def test_unknown_backend_is_a_usage_error(models: Models) -> None:
    result = run(models, "--nobreak-backend", "inductr", test_x="def test_x(): pass")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --nobreak-backend inductr: unknown torch.compile backend; known: *inductor*"]
    )


def test_nobreak_report_is_live_and_watches_unmarked_tests(models: Models) -> None:
    result = run(
        models,
        test_live="""
        import torch
        import models as M

        def test_live(nobreak_report):
            assert nobreak_report.graphs == 0
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))
            assert (nobreak_report.graphs, nobreak_report.graph_breaks) == (2, 1)
            assert nobreak_report.breaks[0].gb_id == "GB0170"
            assert nobreak_report.figures().eager_frames == 0
        """,
    )
    result.assert_outcomes(passed=1)


# ----------------------------------------------------------------------------- isolation


def test_each_watched_test_starts_from_a_clean_dynamo(models: Models) -> None:
    """The same function compiled in two tests: the second still sees (and fails on) the break,
    whichever order they run in."""
    test = """
        import pytest, torch
        import models as M

        FN = torch.compile(M.data_dependent, backend="eager")

        @pytest.mark.no_graph_break
        def test_first():
            FN(torch.ones(3))

        @pytest.mark.no_graph_break
        def test_second():
            FN(torch.ones(3))
        """
    forward = run(models, test_order=test)
    forward.assert_outcomes(failed=2)
    backward = models.pytester.runpytest(*QUIET, "test_order.py::test_second", "test_order.py")
    backward.assert_outcomes(failed=2)
    for result in (forward, backward):
        assert result.stdout.str().count("graphs=2, graph_breaks=1") == 2


def test_plugin_can_be_disabled(models: Models) -> None:
    result = run(
        models,
        "-p",
        "no:nobreak",
        test_off="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_break_is_not_caught():
            torch.compile(M.data_dependent, backend="eager")(torch.ones(3))
        """,
    )
    result.assert_outcomes(passed=1)


def test_plugin_import_does_not_import_torch() -> None:
    code = (
        "import sys, pytest_nobreak, pytest_nobreak.plugin; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.fresh_interpreter  # a claim about what is imported
def test_a_plain_run_without_watched_tests_does_not_import_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_no_torch():
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(passed=1)


@pytest.fixture
def recheck(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``check_torch`` run afresh under the test's patches, and afresh after they are undone
    (it is cached for the process)."""
    from pytest_nobreak.watch import dynamo

    dynamo.check_torch.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    dynamo.check_torch.cache_clear()


def refusal() -> str:
    """The one line ``check_torch`` refuses this torch with."""
    from pytest_nobreak.watch import dynamo

    with pytest.raises(dynamo.TorchCompatError) as excinfo:
        dynamo.check_torch()
    return str(excinfo.value)


def test_a_torch_without_the_needed_apis_is_one_clear_error(
    models: Models, recheck: pytest.MonkeyPatch
) -> None:
    import torch._dynamo

    recheck.delattr(torch._dynamo, "error_on_graph_break")
    assert refusal() == (
        f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: missing "
        "torch._dynamo.error_on_graph_break. "
        "Supported: torch>=2.12 (tested on 2.12 and 2.13)."
    )
    result = run(
        models,
        test_old="""
        import pytest

        @pytest.mark.no_graph_break
        def test_marked():
            pass
        """,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["*Exit: pytest-nobreak cannot watch torch.compile on torch *"])


def test_a_tapped_function_with_other_parameters_is_refused(recheck: pytest.MonkeyPatch) -> None:
    """torch 2.10's ``log_graph_break`` took ``(code_options, reason="", user_stack=None)``:
    wrapped as if it took ``exc``, every break became an error inside the user's compile."""
    import torch
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    def log_graph_break(self, code_options, reason="", user_stack=None):  # type: ignore[no-untyped-def]
        pass

    recheck.setattr(InstructionTranslatorBase, "log_graph_break", log_graph_break)
    assert refusal() == (
        f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: "
        "InstructionTranslatorBase.log_graph_break(code_options, reason, user_stack), not "
        "(code_options, reason, exc). Supported: torch>=2.12 (tested on 2.12 and 2.13)."
    )


def test_an_older_torch_is_refused_in_one_line(recheck: pytest.MonkeyPatch) -> None:
    import torch

    recheck.setattr(torch, "__version__", "2.11.0+cpu")
    assert refusal() == (
        "pytest-nobreak needs torch>=2.12 (tested on 2.12 and 2.13); this is torch "
        "2.11.0+cpu. Upgrade torch or run with -p no:nobreak."
    )


def test_the_accept_command_repeats_nobreak_unmarked(pytester: pytest.Pytester) -> None:
    """``fail`` watches every test: re-recording without it would drop their entries."""
    from pytest_nobreak.report.controller import update_command

    config = pytester.parseconfig("--nobreak-unmarked", "fail", "--nobreak-baseline", "b.json")
    settings = NobreakConfig.from_pytest_config(config)
    assert settings.watch_all
    assert update_command(config, settings) == (
        "pytest --nobreak-baseline b.json --nobreak-unmarked fail --nobreak-update-baseline"
    )
