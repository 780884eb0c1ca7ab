"""``--nobreak-all`` only observes unmarked tests: outcomes, warnings and logs are those of a run
with ``-p no:nobreak``, and the figures are right even when the test resets Dynamo itself.

The patterns that changed outcomes, warnings or figures (issue 14) run as one suite, in fresh
processes (``warn_once``, the ``Tensor.item()`` warning and the ASIC backend's host warning are
once per process), with the plugin off and on. A conftest plays the user's side: a logging
handler on the ``torch`` and ``asic_backend`` loggers and a warnings hook write what they see,
per test, to a file; the two files must be equal.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.conftest import Models

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

# What a user's own handler and warnings hook see, per test. Addresses (`<function f at 0x..>`)
# differ between processes, and are blanked.
CONFTEST = r"""
import logging
import os
import re

SEEN = os.environ["NB_SEEN"]
_test = ["<none>"]


def _write(*fields):
    text = "\t".join(re.sub(r"0x[0-9a-f]+", "0x?", str(f)).replace("\n", " | ") for f in fields)
    with open(SEEN, "a") as out:
        out.write(text + "\n")


class Recorder(logging.Handler):
    def emit(self, record):
        _write(_test[0], "log", record.name, record.levelname, record.getMessage())


def pytest_configure(config):
    # torch's loggers that do not propagate (torch, torch._dynamo, ...) but its trace logger,
    # whose empty records the plugin keeps from pytest's own handlers.
    import torch  # noqa: F401  (sets its loggers up)

    names = [
        name
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch") and name != "torch.__trace"
        and isinstance(logger, logging.Logger) and not logger.propagate
    ]
    for name in [*names, "asic_backend"]:
        logging.getLogger(name).addHandler(Recorder())


def pytest_runtest_logstart(nodeid, location):
    _test[0] = nodeid


def pytest_warning_recorded(warning_message, when, nodeid, location):
    message = str(warning_message.message).splitlines()[0]
    _write(nodeid, "warning", when, warning_message.category.__name__, message)


def pytest_runtest_logreport(report):
    _write(report.nodeid, report.when, report.outcome)
"""

HELPERS = """
import functools

import torch


@functools.lru_cache
def scale():
    return 2.0


def uses_lru(x):
    return x * scale()  # Dynamo warns about the lru_cache through warn_once
"""

# torch._dynamo.test_case.TestCase needs expecttest; this does what it does around each test.
DYNAMO_CASE = """
import contextlib
import logging
import unittest

import torch
import torch._dynamo.utils
from torch._logging._internal import trace_log


def clean(x):
    return torch.relu(x) + 1


def branchy(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


class DynamoTestCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._stack = contextlib.ExitStack()
        cls._stack.enter_context(torch._dynamo.config.patch(suppress_errors=False))

    @classmethod
    def tearDownClass(cls):
        cls._stack.close()

    def setUp(self):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        self.handler = logging.NullHandler()
        trace_log.addHandler(self.handler)

    def tearDown(self):
        trace_log.removeHandler(self.handler)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()


class TestModels(DynamoTestCase):
    def test_clean(self):
        torch.compile(clean, backend="eager")(torch.ones(3))
        self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], 1)

    def test_branch(self):
        torch.compile(branchy, backend="eager")(torch.ones(3))
        self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], 2)
"""

REAL_DYNAMO_CASE = """
import pytest

pytest.importorskip("expecttest")

import torch
from torch._dynamo.test_case import TestCase


def branchy(x):
    if x.sum() > 0:
        return x * 3
    return x - 3


class TestReal(TestCase):
    def test_branch(self):
        torch.compile(branchy, backend="eager")(torch.ones(3))
"""

CLASS_STATE = """
import unittest

import torch
from torch._dynamo.testing import CompileCounter


def double(x):
    return x * 2


class TestWarm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.counter = CompileCounter()
        cls.fn = staticmethod(torch.compile(double, backend=cls.counter))
        cls.fn(torch.ones(3))

    def test_a(self):
        self.fn(torch.ones(3))
        self.assertEqual(self.counter.frame_count, 1)

    def test_b(self):
        self.fn(torch.ones(3))
        self.assertEqual(self.counter.frame_count, 1)
"""

LOGS = """
import logging
import unittest

import torch

import models as M


def reads_item(x):
    return x * x.sum().item()


def by_dtype(x):
    return x + 1


class TestLogs(unittest.TestCase):
    def test_item_warning(self):
        with self.assertLogs("torch._dynamo", logging.WARNING) as seen:
            torch.compile(reads_item, backend="eager")(torch.ones(3))
        self.assertIn("Graph break from `Tensor.item()`", seen.output[0])

    def test_backend_fallback_warning(self):
        with self.assertLogs("torch._dynamo", logging.WARNING) as seen:
            torch.compile(M.Seed(), backend=M.naive_backend)(torch.randn(2, 8))
        self.assertIn("Backend compiler exception", seen.output[0])


class OtherSeed(M.Seed):  # another forward: Dynamo skips the one above for good
    def forward(self, x):
        return torch.relu(self.fc1(x)) * 2


def test_a_users_handler_sees_the_backend_fallback():  # the conftest's handler
    torch.compile(OtherSeed(), backend=M.naive_backend)(torch.randn(3, 8))


def test_caplog(caplog):
    caplog.set_level(logging.WARNING, logger="torch._dynamo")
    f = torch.compile(by_dtype, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1):
        f(torch.ones(3))
        f(torch.ones(3, dtype=torch.float64))
    # torch.__trace's empty records are the one thing the plugin keeps from pytest's handlers.
    seen = [r.getMessage().splitlines()[0] for r in caplog.records if r.name != "torch.__trace"]
    assert seen == ["torch._dynamo hit config.recompile_limit (1)"]
"""

WARN_ONCE = """
import torch

import helpers


def test_first():
    torch.compile(helpers.uses_lru, backend="eager")(torch.ones(6))


def test_second():  # a recompile traces the same line again: warn_once stays quiet
    torch.compile(helpers.uses_lru, backend="eager")(torch.ones(6, dtype=torch.float64))
"""

FILTERWARNINGS = """
import pytest
import torch


def branchy(x):
    if x.sum() > 0:
        return x * 5
    return x - 5


@pytest.mark.filterwarnings("error")
def test_break_under_error():
    torch.compile(branchy, backend="eager")(torch.ones(4))
"""

EXPECTED_REJECTION = """
import pytest
import torch


def branchy(x):
    if x.sum() > 0:
        return x * 7
    return x - 7


def test_rejected():
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(branchy, backend="eager", fullgraph=True)(torch.ones(5))
"""

DISABLED_AND_STANCE = """
import pytest
import torch


@torch.compiler.disable
def on_host(x):
    return x.cos()


def calls_disabled(x):
    return on_host(x * 2) + 1


def plain(x):
    return torch.relu(x) - 1


def shifted(x):
    return x + 3


def test_disabled_callee():
    torch.compile(calls_disabled, backend="eager")(torch.ones(7))


def test_force_eager():
    with torch.compiler.set_stance("force_eager"):
        torch.compile(plain, backend="eager")(torch.ones(7))


def test_fail_on_recompile():
    f = torch.compile(shifted, backend="eager", dynamic=False)
    f(torch.ones(3))
    with torch.compiler.set_stance("fail_on_recompile"):
        f(torch.ones(3))
        with pytest.raises(RuntimeError, match="Detected recompile"):
            f(torch.ones(3, dtype=torch.float64))
"""

ASIC = """
import torch
from torch import nn

from asic_backend.sim.device import get_device


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def test_device_reset_in_the_test():
    model = torch.compile(mlp(), backend="asic")
    with torch.no_grad():
        model(torch.randn(2, 8))
        get_device().reset()
        model(torch.randn(2, 8))
    assert get_device().snapshot().dut_ops == 2


def test_autograd_live():  # the backend warns once per process: here, plugin or not
    torch.compile(mlp(), backend="asic")(torch.randn(2, 8))


def test_autograd_live_again():
    torch.compile(mlp(), backend="asic")(torch.randn(3, 8))
"""

SUITE = {
    "conftest": CONFTEST,
    "helpers": HELPERS,
    "test_a_dynamo_case": DYNAMO_CASE,
    "test_b_real_dynamo_case": REAL_DYNAMO_CASE,
    "test_c_class_state": CLASS_STATE,
    "test_d_logs": LOGS,
    "test_e_warn_once": WARN_ONCE,
    "test_f_filterwarnings": FILTERWARNINGS,
    "test_g_expected_rejection": EXPECTED_REJECTION,
    "test_h_disabled_and_stance": DISABLED_AND_STANCE,
    "test_i_asic": ASIC,
}
QUIET = ("-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:benchmark")
QUIET += ("-p", "no:hypothesispytest", "-W", "ignore::pytest.PytestAssertRewriteWarning")
HAS_EXPECTTEST = importlib.util.find_spec("expecttest") is not None
OUTCOMES = {
    "passed": 18 + HAS_EXPECTTEST,
    # The lru_cache warning (once: warn_once) and the ASIC backend's host warning (once).
    "warnings": 2,
    **({} if HAS_EXPECTTEST else {"skipped": 1}),
}


def run_suite(models: Models, monkeypatch: pytest.MonkeyPatch, name: str, *args: str) -> Any:
    """One fresh-process run of the suite; what the user's side saw, and the pytest result."""
    seen = models.pytester.path / f"seen-{name}.txt"
    monkeypatch.setenv("NB_SEEN", str(seen))
    result = models.pytester.runpytest_subprocess(*QUIET, *args)
    return result, seen.read_text().splitlines()


def warnings_summary(result: pytest.RunResult) -> list[str]:
    """pytest's warnings summary, but where the ASIC backend's warning points: its location and
    source line (see ``test_the_asic_backends_warning_points_at_the_users_line``)."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "warnings summary" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("-- Docs"))
    out: list[str] = []
    for line in lines[start:end]:
        if out and out[-1] == "AsicHostWarning":
            out.append("<source line>")
            continue
        out.append(re.sub(r"^\s+\S+:\d+: AsicHostWarning.*", "AsicHostWarning", line))
    return out


#: The watched runs compared with the unwatched one: the plugin alone, and with the ASIC backend.
WATCHED = {"all": ("--nobreak-all",), "asic": ("--nobreak-all", "--asic-backend")}


def test_the_suite_runs_as_without_the_plugin(
    models: Models, monkeypatch: pytest.MonkeyPatch, subtests: pytest.Subtests
) -> None:
    models.pytester.makepyfile(**SUITE)
    off, seen_off = run_suite(models, monkeypatch, "off", "-p", "no:nobreak")
    for name, plugin_args in WATCHED.items():  # one unwatched run serves both comparisons
        with subtests.test(name):
            json_path = models.pytester.path / f"{name}.json"
            on, seen_on = run_suite(
                models, monkeypatch, name, *plugin_args, "--nobreak-json", str(json_path)
            )
            _assert_runs_alike(off, seen_off, on, seen_on, json_path)


def _assert_runs_alike(
    off: pytest.RunResult, seen_off: list[str], on: pytest.RunResult, seen_on: list[str],
    json_path: Path,
) -> None:  # fmt: skip
    # The same outcomes, warnings, log records: test for test, line for line.
    for result in (off, on):
        assert result.ret == 0, result.stdout.str()
        result.assert_outcomes(**OUTCOMES)
    assert seen_on == seen_off
    assert warnings_summary(on) == warnings_summary(off)
    assert "NobreakWarning" not in on.stdout.str()
    # The user's handler saw Dynamo's WARNINGs (assertLogs holds them itself while it runs).
    # What a test logged (a CUDA build of torch logs "No CUDA runtime is found" at import).
    logged = [
        line.split("\t") for line in seen_off if "\tlog\t" in line and not line.startswith("<none>")
    ]
    assert [(test, logger, text.split(" | ")[0]) for test, _, logger, _, text in logged] == [
        (
            "test_d_logs.py::test_a_users_handler_sees_the_backend_fallback",
            "torch._dynamo.exc",
            "Backend compiler exception",
        ),
        (
            "test_d_logs.py::test_caplog",
            "torch._dynamo.convert_frame",
            "torch._dynamo hit config.recompile_limit (1)",
        ),
    ]
    warned = [line.split("\t")[0] for line in seen_off if "\twarning\t" in line]
    assert warned == ["test_e_warn_once.py::test_first", "test_i_asic.py::test_autograd_live"]

    # The figures: what each test ran, whatever it reset or compiled before it.
    tests = json.loads(json_path.read_text())["tests"]

    def figures(nodeid: str) -> tuple[int, int, int, int]:
        entry = tests[nodeid]
        return entry["graphs"], entry["graph_breaks"], entry["eager_frames"], entry["recompiles"]

    # tearDown resets Dynamo and clears its counters: the figures stay.
    assert figures("test_a_dynamo_case.py::TestModels::test_clean") == (1, 0, 0, 0)
    assert figures("test_a_dynamo_case.py::TestModels::test_branch") == (2, 1, 0, 0)
    if HAS_EXPECTTEST:
        assert figures("test_b_real_dynamo_case.py::TestReal::test_branch") == (2, 1, 0, 0)
    # The warm-up in setUpClass compiled the graph; each test ran it, and counts it.
    assert figures("test_c_class_state.py::TestWarm::test_a") == (1, 0, 0, 0)
    assert figures("test_c_class_state.py::TestWarm::test_b") == (1, 0, 0, 0)
    assert figures("test_e_warn_once.py::test_second") == (1, 0, 0, 1)
    assert figures("test_f_filterwarnings.py::test_break_under_error") == (2, 1, 0, 0)
    assert figures("test_h_disabled_and_stance.py::test_disabled_callee") == (2, 1, 0, 0)
    assert figures("test_h_disabled_and_stance.py::test_force_eager") == (0, 0, 1, 0)
    # The expected rejection is a compile error (nothing ran), in the JSON report only.
    rejected = tests["test_g_expected_rejection.py::test_rejected"]
    assert figures("test_g_expected_rejection.py::test_rejected") == (0, 0, 0, 0)
    assert [(b["kind"], b["gb_id"]) for b in rejected["breaks"]] == [("compile_error", "GB0170")]
    section = on.stdout.str().split("nobreak compile report")[1]
    assert "test_rejected" not in section
    assert "test_disabled_callee" in section  # a break the user did not ask for: reported
    # Two GEMMs a call, two calls, the device reset between them.
    asic = tests["test_i_asic.py::test_device_reset_in_the_test"]["asic"]
    assert (asic["dut_ops"], asic["host_fallbacks"]) == (4, 0)
    live = tests["test_i_asic.py::test_autograd_live"]["asic"]
    assert (live["dut_ops"], live["host_fallbacks"], live["host_macs"]) == (
        0,
        2,
        2 * 8 * 16 + 2 * 16 * 4,
    )


MARKED_AND_UNMARKED = """
import logging

import pytest
import torch

import models as M

SEEN = []


class Recorder(logging.Handler):
    def emit(self, record):
        SEEN.append(record.getMessage().splitlines()[0])


@pytest.fixture(autouse=True)
def recorder():
    handler = Recorder()
    logging.getLogger("torch._dynamo").addHandler(handler)
    SEEN.clear()
    yield
    logging.getLogger("torch._dynamo").removeHandler(handler)


@pytest.mark.no_graph_break(allow=["GB0219"])
def test_marked():
    torch.compile(M.Seed(), backend=M.naive_backend)(torch.randn(2, 8))
    assert SEEN == []  # the failure message would say it in a few lines: no 40-line dump


class OtherSeed(M.Seed):  # another forward: Dynamo skips the one above for good
    def forward(self, x):
        return torch.relu(self.fc1(x)) * 2


def test_unmarked():
    torch.compile(OtherSeed(), backend=M.naive_backend)(torch.randn(2, 8))
    assert SEEN == ["Backend compiler exception"]
"""


def test_only_a_marked_test_keeps_dynamos_warnings_from_the_handlers(models: Models) -> None:
    models.pytester.makepyfile(test_quiet=MARKED_AND_UNMARKED)
    result = models.pytester.runpytest(*QUIET, "--nobreak-all")
    result.assert_outcomes(passed=2)


CLEARS_COUNTERS = """
import torch
import torch._dynamo.utils

from asic_backend.sim.device import reset_all


def branchy(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def test_resets_everything(nobreak_report):
    with torch.no_grad():
        torch.compile(torch.nn.Linear(8, 4), backend="asic")(torch.randn(2, 8))
    torch.compile(branchy, backend="eager")(torch.ones(3))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.clear_compilation_metrics()
    reset_all()
    report = nobreak_report
    assert (report.graphs, report.graph_breaks, report.eager_frames) == (3, 1, 0)
    assert (report.asic.dut_ops, report.asic.host_fallbacks) == (1, 0)
"""


def test_a_test_that_resets_dynamo_and_the_device_keeps_its_figures(models: Models) -> None:
    """Live, in the test (``nobreak_report``), and in the JSON report."""
    models.pytester.makepyfile(test_clears=CLEARS_COUNTERS)
    result = models.pytester.runpytest(*QUIET, "--nobreak-json", "r.json")
    result.assert_outcomes(passed=1)
    entry = json.loads((models.pytester.path / "r.json").read_text())["tests"]
    entry = entry["test_clears.py::test_resets_everything"]
    assert (entry["graphs"], entry["graph_breaks"], entry["asic"]["dut_ops"]) == (3, 1, 1)


def test_an_observed_test_leaves_dynamos_counters_alone(models: Models) -> None:
    """Reading Dynamo's counters must not add groups to them (they are a defaultdict)."""
    models.pytester.makepyfile(
        test_counters="""
        import torch
        import torch._dynamo.utils

        def fails(x):
            raise ValueError("no graph")

        def test_counters():
            torch._dynamo.utils.counters.clear()
            try:
                torch.compile(fails, backend="eager")(torch.ones(2))
            except ValueError:
                pass
            assert "stats" not in torch._dynamo.utils.counters
        """
    )
    models.pytester.runpytest(*QUIET, "--nobreak-all").assert_outcomes(passed=1)


def test_the_asic_backends_warning_points_at_the_users_line(models: Models) -> None:
    """In a fresh process: the warning is once per process."""
    models.pytester.makepyfile(test_live=ASIC)
    result = models.pytester.runpytest_subprocess(*QUIET, "--nobreak-all", "-k", "live")
    result.stdout.fnmatch_lines(["*test_live.py:22: AsicHostWarning: *"])


DEVICE_STATE = """
import torch

from asic_backend.sim.device import get_device


def test_first():
    get_device().reset()
    with torch.no_grad():
        torch.compile(torch.nn.Linear(8, 4), backend="asic")(torch.randn(2, 8))


def test_second_sees_the_counters_of_the_first():
    assert get_device().snapshot().dut_ops == 1
"""


def test_an_observed_test_leaves_the_simulated_devices_alone(models: Models) -> None:
    """Only an isolated test (marked, or using a fixture of the plugin) zeroes the devices."""
    models.pytester.makepyfile(test_device=DEVICE_STATE)
    for args in (("-p", "no:nobreak"), ("--nobreak-all",)):
        models.pytester.runpytest(*QUIET, *args).assert_outcomes(passed=2)


FAILING = """
import torch


def test_raises_to_the_user():
    f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        f(torch.ones(2))
        f(torch.ones(3))  # raised inside Dynamo's frame callback, where a tap sits
"""


def test_a_failing_tests_traceback_is_the_one_without_the_plugin(models: Models) -> None:
    """The plugin's taps on Dynamo sit in the call stack of every compile; they hide from
    pytest's tracebacks (``__tracebackhide__``), so a failure reads as it does without it."""
    models.pytester.makepyfile(test_fails=FAILING)

    def failure(*args: str) -> list[str]:
        result = models.pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
        result.assert_outcomes(failed=1)
        text = result.stdout.str()
        section = text.split(" FAILURES ")[1].split("short test summary")[0]
        # The traceback alone: the captured log differs by design (without the plugin it holds
        # torch.__trace's empty DEBUG records, the README's one exception), and the captured
        # stderr by its timestamps and process ids.
        section = re.split(r"-+ Captured ", section)[0]
        lines = re.sub(r"0x[0-9a-f]+", "0x?", section).splitlines()  # addresses differ
        while lines and not lines[-1].strip(" =-"):  # the next section's rule
            lines.pop()
        return lines

    off = failure("-p", "no:nobreak")
    on = failure("--nobreak-all")
    assert on == off
    assert not any("pytest_nobreak" in line for line in on)
