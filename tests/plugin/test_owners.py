"""Whose break it is: an owner for every problem, and a verdict scoped to the user's own code.

Each case runs a real pytest session (pytester) over a project whose code calls two installed
packages, written into a ``site-packages`` folder of the test's own: ``vendorlib`` (a library,
with a ``print`` in it and a helper that calls back into the user's code) and ``mypkg`` (the
project's own package installed beside it, which ``nobreak_first_party`` claims).
"""

from __future__ import annotations

import json

import pytest
import torch

import pytest_nobreak
from pytest_nobreak import GraphBreakError

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

VENDORLIB = '''
def helper(x):
    x = x + 1
    print("vendorlib")  # LINE:vendor
    return x


def apply(fn, x):
    """Calls the user's function: a break in it is the user's."""
    return fn(x) * 2


def rescale(x):
    return x * (x > 0).sum().item()  # LINE:vendor_sync


def project(x, w):
    return (x.double() @ w.double()).float()  # LINE:vendor_host
'''

MYPKG = """
def block(x):
    x = x * 3
    print("mypkg")  # LINE:mypkg
    return x
"""

CODE = """
import mypkg
import vendorlib


def calls_library(x):
    x = x * 2
    return vendorlib.helper(x)  # LINE:calls


def callback(x):
    print("mine")  # LINE:callback
    return x + 1


def through_library(x):
    return vendorlib.apply(callback, x)  # LINE:through


def calls_mypkg(x):
    return mypkg.block(x) - 1  # LINE:calls_mypkg


def on_the_dut(x, w):
    return vendorlib.project(vendorlib.rescale(x), w)  # LINE:on_dut


def own_break(x):
    x = x * 2
    if x.sum() > 0:  # LINE:own
        return x + 1
    return x - 1
"""

TESTS = """
import pytest
import torch

import code_under_test as c


def run(fn):
    return torch.compile(fn, backend="eager")(torch.ones(3))


@pytest.mark.no_graph_break{options}
def test_library():
    run(c.calls_library)


@pytest.mark.no_graph_break{options}
def test_callback():
    run(c.through_library)


@pytest.mark.no_graph_break{options}
def test_mypkg():
    run(c.calls_mypkg)


@pytest.mark.no_graph_break{options}
def test_mine():
    run(c.own_break)
"""


def line_of(text: str, tag: str) -> int:
    # The files are written without the texts' leading newline (as makepyfile does).
    for number, line in enumerate(text.lstrip("\n").splitlines(), start=1):
        if line.rstrip().endswith(f"# LINE:{tag}"):
            return number
    raise KeyError(tag)


class Project:
    """A pytester project with ``code_under_test.py`` and two installed packages."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.site = pytester.path / "env" / "lib" / "site-packages"
        for name, text in (("vendorlib", VENDORLIB), ("mypkg", MYPKG)):
            (self.site / name).mkdir(parents=True)
            (self.site / name / "__init__.py").write_text(text.lstrip("\n"))
        # The packages are importable before the plugin reads its settings (and in an xdist
        # worker), as an installed package is.
        pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(self.site)!r})\n")
        pytester.makepyfile(code_under_test=CODE)
        pytester.syspathinsert()

    def tests(self, options: str = "") -> None:
        self.pytester.makepyfile(test_scoped=TESTS.format(options=options))

    def ini(self, text: str) -> None:
        self.pytester.makeini(f"[pytest]\n{text}\n")

    def run(self, *args: str) -> pytest.RunResult:
        return self.pytester.runpytest(*QUIET, *args)

    def report(self, result: pytest.RunResult) -> dict[str, dict[str, object]]:
        return json.loads((self.pytester.path / "r.json").read_text())["tests"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


CALLS = line_of(CODE, "calls")
VENDOR = line_of(VENDORLIB, "vendor")


def test_by_default_a_librarys_break_fails_the_test_and_names_its_owner(project: Project) -> None:
    project.tests()
    result = project.run("-k", "library", "--nobreak-json", "r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*torch.compile did not run as whole graphs: 2 problems (*, foreign_breaks=2)",
            "1. graph break GB0059: Failed to trace builtin operator  (x2)",
            f"   at code_under_test.py:{CALLS}  >  return vendorlib.helper(x)*",
            f"   inside vendorlib (vendorlib/__init__.py:{VENDOR}, in helper)",
            "   owner: vendorlib",
            "To fail only on problems in your own code: "
            '@pytest.mark.no_graph_break(scope="own") (those in vendorlib are then reported, '
            "not failed; nobreak_first_party names installed packages that are yours).",
        ]
    )
    entry = project.report(result)["test_scoped.py::test_library"]
    assert entry["foreign_breaks"] == 2
    assert "scope" not in entry
    [event] = entry["breaks"]  # type: ignore[misc]
    assert (event["owner"], event["file"], event["line"]) == (
        "vendorlib",
        "code_under_test.py",
        CALLS,
    )


def test_scope_own_reports_a_librarys_break_and_fails_only_on_the_users(
    project: Project,
) -> None:
    project.tests('(scope="own")')
    result = project.run("--nobreak-json", "r.json")
    result.assert_outcomes(passed=2, failed=2)
    tests = project.report(result)
    assert {nodeid: entry["outcome"] for nodeid, entry in tests.items()} == {
        "test_scoped.py::test_library": "passed",
        "test_scoped.py::test_callback": "failed",  # the user's callback, called by the library
        "test_scoped.py::test_mypkg": "passed",  # an installed package nobody claimed
        "test_scoped.py::test_mine": "failed",
    }
    result.stdout.fnmatch_lines(
        [
            f'   at code_under_test.py:{line_of(CODE, "callback")}  >  print("mine")*',
        ]
    )
    # The test that passed lists what it did not fail on; the run's summary counts by owner.
    result.stdout.fnmatch_lines(
        [
            "*nobreak compile report*",
            "test *graphs*breaks*foreign*outcome",
            "test_scoped.py::test_library * passed",
            "    not yours (reported, not failed):",
            f"      graph break GB0059 at code_under_test.py:{CALLS} (inside vendorlib): *",
            "test_scoped.py::test_mypkg * passed",
            "    not yours (reported, not failed):",
            "      graph break GB0059 at code_under_test.py:* (inside mypkg): *",
            "nobreak: 4 problems: 2 in your code, 1 in mypkg, 1 in vendorlib",
        ]
    )
    assert {nodeid: entry["scope"] for nodeid, entry in tests.items()} == dict.fromkeys(
        tests, "own"
    )
    assert {nodeid: entry["foreign_breaks"] for nodeid, entry in tests.items()} == {
        "test_scoped.py::test_library": 2,  # the print, and the resumed frame's break
        "test_scoped.py::test_callback": 0,
        "test_scoped.py::test_mypkg": 2,
        "test_scoped.py::test_mine": 0,
    }
    owners = {nodeid: [e["owner"] for e in entry["breaks"]] for nodeid, entry in tests.items()}  # type: ignore[union-attr]
    assert owners["test_scoped.py::test_callback"] == ["own"]
    assert owners["test_scoped.py::test_mypkg"] == ["mypkg"]


@pytest.mark.parametrize(
    ("setting", "marker", "fails"),
    [
        (("--nobreak-scope", "own"), "", False),
        (("-o", "nobreak_scope=own"), "", False),
        (("--nobreak-scope", "all"), "", True),
        ((), "", True),
        (("--nobreak-scope", "own"), '(scope="all")', True),  # the marker wins
        (("--nobreak-scope", "all"), '(scope="own")', False),
        (("-o", "nobreak_scope=own"), "(scope=None)", False),  # None: the session's
    ],
)
def test_the_scope_comes_from_the_marker_else_the_option_else_the_ini(
    project: Project, setting: tuple[str, ...], marker: str, fails: bool
) -> None:
    project.tests(marker)
    result = project.run("-k", "library", *setting)
    result.assert_outcomes(**({"failed": 1} if fails else {"passed": 1}))


def test_first_party_packages_are_the_users_code(project: Project) -> None:
    project.ini("nobreak_scope = own\nnobreak_first_party =\n    mypkg\n    # a comment line")
    project.tests()
    result = project.run("-k", "mypkg or library", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=1, failed=1)
    mypkg = line_of(MYPKG, "mypkg")
    result.stdout.fnmatch_lines(
        [
            "*test_mypkg*",
            f'   at mypkg/__init__.py:{mypkg}  >  print("mypkg")*',
            f"   called from code_under_test.py:{line_of(CODE, 'calls_mypkg')}  >  *",
        ]
    )
    assert "owner: mypkg" not in result.stdout.str()
    tests = project.report(result)
    [event] = tests["test_scoped.py::test_mypkg"]["breaks"]  # type: ignore[misc]
    assert (event["owner"], tests["test_scoped.py::test_mypkg"]["foreign_breaks"]) == ("own", 0)
    # The command line names them too (it wins over the ini: vendorlib alone is claimed).
    result = project.run("-k", "mypkg or library", "--nobreak-first-party", "vendorlib")
    result.assert_outcomes(passed=1, failed=1)
    assert "test_scoped.py::test_mypkg" in result.stdout.str().split("nobreak compile report")[1]


def test_allow_still_applies_on_top_of_the_scope(project: Project) -> None:
    project.tests('(scope="own", allow=[r"GB0170"])')
    result = project.run("-k", "mine or library")
    result.assert_outcomes(passed=2)


def test_under_scope_own_observed_tests_fail_the_run_only_on_their_own_breaks(
    project: Project,
) -> None:
    project.pytester.makepyfile(
        test_observed="""
        import torch
        import code_under_test as c

        def test_library():
            torch.compile(c.calls_library, backend="eager")(torch.ones(3))
        """
    )
    own = project.run("--nobreak-unmarked", "fail", "--nobreak-scope", "own")
    assert own.ret == pytest.ExitCode.OK
    own.stdout.fnmatch_lines(["nobreak: 1 problem: 1 in vendorlib"])
    every = project.run("--nobreak-unmarked", "fail")
    assert every.ret == pytest.ExitCode.TESTS_FAILED
    every.stdout.fnmatch_lines(["*1 unmarked test with breaks*"])


def test_the_baseline_gates_a_librarys_new_break_even_under_scope_own(project: Project) -> None:
    project.ini("nobreak_scope = own\nnobreak_baseline = baseline.json")
    project.tests()
    vendor = project.site / "vendorlib" / "__init__.py"
    vendor.write_text("def helper(x):\n    return x + 1\n")
    result = project.run("-k", "library", "--nobreak-update-baseline")
    result.assert_outcomes(passed=1)
    entry = json.loads((project.pytester.path / "baseline.json").read_text())["tests"]
    assert entry["test_scoped.py::test_library"]["foreign_breaks"] == 0
    # An upgrade of the library that adds a break: the test passes, the gate does not.
    vendor.write_text(VENDORLIB.lstrip("\n"))
    result = project.run("-k", "library")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["REGRESSION test_scoped.py::test_library  foreign_breaks 0 -> 2"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--nobreak-scope", "mine"), "*--nobreak-scope: invalid choice: 'mine'*"),
        (("-o", "nobreak_scope=mine"), "ERROR: ini key nobreak_scope: 'mine' is not one of *"),
        (
            ("--nobreak-first-party", "not_installed_anywhere"),
            "ERROR: nobreak_first_party: no package 'not_installed_anywhere' can be imported by"
            " *; install it (pip install -e .) or fix the name",
        ),
        (
            ("--nobreak-first-party", "mypkg.layers"),
            "ERROR: nobreak_first_party: 'mypkg.layers' is not a top-level package name (the "
            "top-level package is 'mypkg')",
        ),
        (
            ("--nobreak-first-party", "json"),
            "ERROR: nobreak_first_party: 'json' is the standard library's, not a package of yours",
        ),
    ],
)
def test_a_bad_scope_or_first_party_name_is_a_usage_error(
    project: Project, args: tuple[str, ...], message: str
) -> None:
    project.tests()
    result = project.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("(scope=1)", "scope must be one of 'all', 'own' or None, got 1"),
        ('(scope="mine")', "scope must be one of 'all', 'own' or None, got 'mine'"),
        (
            '(scope="owm")',
            "scope must be one of 'all', 'own' or None, got 'owm' (did you mean 'own'?)",
        ),
    ],
)
def test_a_bad_marker_scope_is_a_usage_error(project: Project, marker: str, message: str) -> None:
    project.tests(marker)
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: test_scoped.py::test_library: @pytest.mark.no_graph_break: {message}"]
    )


def test_xdist_gives_the_serial_verdicts_and_owner_lines(project: Project) -> None:
    project.tests('(scope="own")')
    args = (*QUIET, "-p", "no:hypothesispytest", "-p", "no:anyio", "--nobreak-json", "r.json")
    result = project.pytester.runpytest_subprocess(*args, "-n", "2")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["nobreak: 4 problems: 2 in your code, 1 in mypkg, 1 in vendorlib"])
    tests = project.report(result)
    assert tests["test_scoped.py::test_library"]["scope"] == "own"
    assert [e["owner"] for e in tests["test_scoped.py::test_library"]["breaks"]] == ["vendorlib"]  # type: ignore[union-attr]


@pytest.mark.parametrize("scope", ["own", "all"])
def test_a_librarys_host_sync_and_host_fallback_have_its_owner(
    project: Project, scope: str
) -> None:
    project.pytester.makepyfile(
        test_dut=f"""
        import pytest
        import torch

        import code_under_test as c


        @pytest.mark.no_graph_break(scope="{scope}")
        def test_on_the_dut():
            w = torch.randn(4, 4)
            with torch._dynamo.config.patch(capture_scalar_outputs=True):
                torch.compile(c.on_the_dut, backend="asic")(torch.randn(2, 4), w)
        """
    )
    result = project.run("test_dut.py", "--asic-backend", "--nobreak-json", "r.json")
    result.assert_outcomes(**({"passed": 1} if scope == "own" else {"failed": 1}))
    [entry] = project.report(result).values()
    events = {e["kind"]: e for e in entry["breaks"]}  # type: ignore[union-attr]
    on_dut = line_of(CODE, "on_dut")
    assert {kind: (e["owner"], e["line"]) for kind, e in events.items()} == {
        "host_sync": ("vendorlib", on_dut),
        "host_fallback": ("vendorlib", on_dut),
    }
    if scope == "all":
        result.stdout.fnmatch_lines(
            [
                "1. host fallback (*): matmul  (1 call, 32 host MACs, *)",
                f"   at code_under_test.py:{on_dut}  >  *",
                f"   inside vendorlib (vendorlib/__init__.py:{line_of(VENDORLIB, 'vendor_host')},"
                " in project)",
                "   owner: vendorlib",
                "*",
                "2. host sync (*): Tensor.item  (1 call)",
                f"   at code_under_test.py:{on_dut}  >  *",
                f"   inside vendorlib (vendorlib/__init__.py:{line_of(VENDORLIB, 'vendor_sync')},"
                " in rescale)",
                "   owner: vendorlib",
            ]
        )
    else:
        result.stdout.fnmatch_lines(
            [
                "    not yours (reported, not failed):",
                "      host fallback (*) at code_under_test.py:* (inside vendorlib): matmul *",
                "      host sync (*) at code_under_test.py:* (inside vendorlib): Tensor.item *",
            ]
        )


# ----------------------------------------------------------------------------- watch()


def test_watch_checks_with_a_scope_and_first_party_packages(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(project.site))
    monkeypatch.syspath_prepend(str(project.pytester.path))
    import code_under_test as c  # type: ignore[import-not-found]

    with pytest_nobreak.watch() as report:
        torch.compile(c.calls_library, backend="eager")(torch.ones(3))
    assert [(e.owner, e.line) for e in report.breaks] == [("vendorlib", CALLS)]
    assert report.figures().foreign_breaks == 2
    report.check(scope="own")
    with pytest.raises(GraphBreakError, match=r"owner: vendorlib"):
        report.check()
    with pytest.raises(ValueError, match=r"scope must be one of 'all', 'own', got 'mine'"):
        report.check(scope="mine")  # type: ignore[arg-type]
    with pytest_nobreak.watch(first_party=["vendorlib"]) as report:
        torch.compile(c.calls_library, backend="eager")(torch.ones(3))
    with pytest.raises(GraphBreakError, match=r"at vendorlib/__init__.py:\d+  >  print"):
        report.check(scope="own")
