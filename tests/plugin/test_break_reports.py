"""What a break report says: the root cause of a chain first, every eager run counted, the
user's calls that led to a break, the user's own line with a relative path, and errors raised
to the caller called what they are.

Each case runs a real inner pytest session (pytester, in-process) over ``breaks.py`` below and
checks the outcome, the message lines and the figures.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

BREAKS = '''
import os

import torch
from torch import nn


class Unsupported:
    """A context manager Dynamo cannot graph-break inside."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def break_in_with(x):
    x = x + 1
    with Unsupported():
        torch._dynamo.graph_break()  # LINE:with
        x = x * 2
    return x


def branch_in_loop(x):
    for _ in range(2):
        x = x + 1
        if x.sum() > 0:  # LINE:loop
            x = x - 1
    return x


def cannot_resume(x):
    x = x + 1
    y = x * 3
    torch._dynamo.step_unsupported()  # LINE:step
    return y * 2


def skips(x):
    torch._dynamo.skip_frame()  # LINE:skip
    return x + 1


def calls_skips(x):
    x = x * 2
    return skips(x) + 1  # LINE:calls_skips


class Record:
    def __setattr__(self, name, value):
        torch._dynamo.graph_break()  # LINE:setattr
        object.__setattr__(self, name, value)


def three_setattrs(x):
    r = Record()
    r.a = x + 1  # LINE:set_a
    r.b = x + 2  # LINE:set_b
    r.c = x + 3  # LINE:set_c
    return x


def inner(x):
    torch._dynamo.graph_break()  # LINE:inner
    return x + 1


def middle(x):
    return inner(x) * 2  # LINE:middle


def outer(x):
    return middle(x) + 3  # LINE:outer


def sets_env(x):
    x = x + 1
    os.environ["NOBREAK_TEST"] = "1"  # LINE:env
    return x * 2


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):  # LINE:forward
        return torch.relu(self.fc(x))


def shape_error(x):
    return x @ torch.ones(5, 5)  # LINE:shape_error


def item_branch(x):
    return x.sum().item() + x  # LINE:cond_branch


def uses_cond(x):
    return torch.cond(x.sum() > 0, item_branch, lambda x: x - 1, (x,))  # LINE:cond


def data_dependent(x):
    if x.sum() > 0:  # LINE:branch
        return x + 1
    return x - 1
'''


class Breaks:
    """A pytester directory holding ``breaks.py``, and the line numbers of its tagged lines."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.path = pytester.makepyfile(breaks=BREAKS)
        pytester.syspathinsert()

    def where(self, tag: str) -> str:
        for number, text in enumerate(self.path.read_text().splitlines(), start=1):
            if text.rstrip().endswith(f"# LINE:{tag}"):
                return f"breaks.py:{number}"
        raise KeyError(tag)

    def run(self, body: str, *args: str, marker: str = "no_graph_break") -> pytest.RunResult:
        """One test, ``body`` its lines, marked with ``marker``; the test's call of the
        compiled region is ``test_case.py:CALL`` (the body's line tagged ``# CALL``)."""
        lines = "\n".join(f"    {line}" for line in body.strip().splitlines())
        self.pytester.makepyfile(
            test_case=f"import pytest, torch\nimport breaks as B\n\n\n"
            f"@pytest.mark.{marker}\ndef test_case():\n{lines}\n"
        )
        return self.pytester.runpytest(
            "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
        )

    def call(self) -> str:
        text = (self.pytester.path / "test_case.py").read_text().splitlines()
        (number,) = [i for i, line in enumerate(text, start=1) if line.endswith("# CALL")]
        return f"test_case.py:{number}"


@pytest.fixture
def breaks(pytester: pytest.Pytester) -> Breaks:
    return Breaks(pytester)


HEADER = "*@pytest.mark.no_graph_break: torch.compile did not run as whole graphs: *"


def message(result: pytest.RunResult) -> str:
    """The failure message, from its header to the allow hint."""
    text = result.stdout.str()
    start = text.index("@pytest.mark.no_graph_break: torch.compile")
    return text[start : text.index("\nTo ", start)]


# ----------------------------------------------------------------------------- 1. root cause


def test_a_break_in_a_with_block_names_its_root_cause_first(breaks: Breaks) -> None:
    result = breaks.run('torch.compile(B.break_in_with, backend="eager")(torch.ones(3))  # CALL')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "1. eager fallback GB0025 → GB0066: Call to `torch._dynamo.graph_break()`",
            f"   at {breaks.where('with')}  >  torch._dynamo.graph_break()*",
            f"   called from {breaks.call()}  >  torch.compile(B.break_in_with*",
            "   why: User-inserted graph break.*",
            "   then GB0066: Attempted to graph break in an active context manager(s)*",
            "   hint: Remove the `torch._dynamo.graph_break()` call.",
            "   hint: Move the offending context manager(s) to outside the compiled region.",
            "   docs: https://*/gb/gb0025.html",
            '*allow=[[]r"GB0025"]*',
        ]
    )


def test_a_break_in_a_loop_names_its_root_cause_first(breaks: Breaks) -> None:
    result = breaks.run('torch.compile(B.branch_in_loop, backend="eager")(torch.ones(3))  # CALL')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"{HEADER}(graphs=0, graph_breaks=0, eager_frames=1, recompiles=0, host_syncs=0)",
            "1. eager fallback GB0170 → GB7000: Data-dependent branching",
            f"   at {breaks.where('loop')}  >  if x.sum() > 0:*",
            "   then GB7000: torch.compile detected a graph break in a for/while loop.*",
            "   docs: https://*/gb/gb0170.html",
        ]
    )


@pytest.mark.parametrize(
    ("function", "allow"),
    [
        ("break_in_with", "GB0025"),  # the root cause
        ("break_in_with", "GB0066"),  # what it caused
        ("break_in_with", "graph_break\\(\\)"),  # the root's type
        ("branch_in_loop", "GB0170"),
        ("branch_in_loop", "graph break in loop"),
    ],
)
def test_allowing_any_break_of_a_chain_allows_the_chain(
    breaks: Breaks, function: str, allow: str
) -> None:
    result = breaks.run(
        f'torch.compile(B.{function}, backend="eager")(torch.ones(3))',
        marker=f'no_graph_break(allow=[r"{allow}"])',
    )
    result.assert_outcomes(passed=1)


def test_the_json_report_names_the_root_cause(breaks: Breaks) -> None:
    breaks.run(
        'torch.compile(B.break_in_with, backend="eager")(torch.ones(3))',
        "--nobreak-json",
        "r.json",
    )
    (entry,) = json.loads((breaks.pytester.path / "r.json").read_text())["tests"].values()
    (event,) = entry["breaks"]
    assert (event["kind"], event["gb_id"], event["file"]) == (
        "eager_fallback",
        "GB0025",
        "breaks.py",
    )


# ----------------------------------------------------------------------------- 2. figures


def test_the_rest_of_a_frame_run_eagerly_after_a_break_is_an_eager_frame(
    breaks: Breaks,
) -> None:
    """Dynamo compiles up to the break, cannot resume after it and runs the rest eagerly: its
    frame counters say nothing ran eagerly; the figures must not."""
    result = breaks.run(
        'torch.compile(B.cannot_resume, backend="eager")(torch.ones(3))', "--nobreak-json", "r.json"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"{HEADER}(graphs=1, graph_breaks=0, eager_frames=1, recompiles=0, host_syncs=0)",
            "1. eager fallback after a break (the rest of the function ran eagerly) GB4636: *",
            f"   at {breaks.where('step')}  >  torch._dynamo.step_unsupported()*",
        ]
    )
    (entry,) = json.loads((breaks.pytester.path / "r.json").read_text())["tests"].values()
    assert (entry["graph_breaks"], entry["eager_frames"]) == (0, 1)
    assert entry["breaks"][0]["kind"] == "partial_fallback"


def test_a_skip_in_a_nested_frame_is_a_break_of_its_caller_and_an_eager_frame(
    breaks: Breaks,
) -> None:
    result = breaks.run('torch.compile(B.calls_skips, backend="eager")(torch.ones(3))')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"{HEADER}(graphs=2, graph_breaks=1, eager_frames=1, recompiles=0, host_syncs=0)",
            "1. graph break GB4297: Call to `torch._dynamo.skip_frame()`",
            f"   at {breaks.where('skip')}  >  torch._dynamo.skip_frame()*",
            f"   called from {breaks.where('calls_skips')}  >  return skips(x) + 1*",
            "2. eager fallback GB4297: Call to `torch._dynamo.skip_frame()`",
            f"   at {breaks.where('skip')}  >  torch._dynamo.skip_frame()*",
        ]
    )


def test_a_region_run_eagerly_by_a_stance_is_an_eager_frame(breaks: Breaks) -> None:
    result = breaks.run(
        'f = torch.compile(B.MLP(), backend="eager")\n'
        'with torch.compiler.set_stance("force_eager"):\n'
        "    f(torch.ones(2, 4))\n"
        "    f(torch.ones(2, 4))  # CALL"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"{HEADER}(graphs=0, graph_breaks=0, eager_frames=2, recompiles=0, host_syncs=0)",
            "1. eager fallback: Silent eager",
            # The module's own name, not the wrapper torch.compile puts around it.
            '   why: `MLP.forward` ran eagerly: torch.compiler.set_stance("force_eager")*',
            "2. eager fallback: Silent eager",
            f"   at {breaks.call()}  >  f(torch.ones(2, 4))*",
        ]
    )


# ----------------------------------------------------------------------------- 3. call sites


def test_a_break_in_a_helper_is_reported_at_each_call_site(breaks: Breaks) -> None:
    result = breaks.run(
        'f = torch.compile(B.three_setattrs, backend="eager")\n'
        "for n in (3, 4):  # a recompile: the same breaks, crossed again\n"
        "    f(torch.ones(n))  # CALL"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*3 problems (graphs=3, graph_breaks=3, eager_frames=0, recompiles=3, *",
            "1. graph break GB0025: Call to `torch._dynamo.graph_break()`  (x3)",
            f"   at {breaks.where('setattr')}  >  torch._dynamo.graph_break()*",
            f"   called from {breaks.where('set_a')}  >  r.a = x + 1 *",
            f"   called from {breaks.where('set_b')}  >  r.b = x + 2 *",
            f"   called from {breaks.where('set_c')}  >  r.c = x + 3 *",
            f"   all called from {breaks.call()}  >  f(torch.ones(n))*",
            "   why: User-inserted graph break.*",
        ]
    )


def test_a_break_in_a_nested_function_shows_its_callers_innermost_first(
    breaks: Breaks,
) -> None:
    result = breaks.run('torch.compile(B.outer, backend="eager")(torch.ones(3))  # CALL')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            # Dynamo breaks in outer, then in middle and inner as each runs: one break.
            "1. graph break GB0025: Call to `torch._dynamo.graph_break()`  (x3)",
            f"   at {breaks.where('inner')}  >  torch._dynamo.graph_break()*",
            f"   called from {breaks.where('middle')}  >  return inner(x) * 2*",
            f"   called from {breaks.where('outer')}  >  return middle(x) + 3*",
            f"   called from {breaks.call()}  >  torch.compile(B.outer*",
            "   why: *",
        ]
    )
    assert "2. " not in message(result)


# ----------------------------------------------------------------------------- 4. user's line


def assert_no_absolute_path(breaks: Breaks, result: pytest.RunResult) -> None:
    text = message(result)
    assert str(breaks.pytester.path) not in text
    assert "site-packages" not in text


def test_a_break_inside_a_library_is_at_the_users_line_and_names_the_library(
    breaks: Breaks,
) -> None:
    result = breaks.run(
        'torch.compile(B.sets_env, backend="eager")(torch.ones(3))',
        "-W",
        "ignore::UserWarning",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "1. graph break GB0007: Attempted to call function marked as skipped",
            f'   at {breaks.where("env")}  >  os.environ[[]"NOBREAK_TEST"] = "1"*',
            "   inside os (<frozen os>:*, in __setitem__)",
        ]
    )
    assert_no_absolute_path(breaks, result)


def test_a_recompiled_module_points_at_its_forward(breaks: Breaks) -> None:
    result = breaks.run(
        'm = torch.compile(B.MLP(), backend="eager", dynamic=False)\n'
        "m(torch.ones(2, 4))\n"
        "m(torch.ones(3, 4))  # CALL",
        marker="no_graph_break(max_recompiles=0)",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "1. too many recompiles: 1 recompiles (max_recompiles=0)",
            f"   at {breaks.where('forward')}  >  def forward(self, x):*",
            f"   called from {breaks.call()}  >  m(torch.ones(3, 4))*",
            "   why: *size mismatch*",
        ]
    )
    assert "external_utils" not in result.stdout.str()
    assert_no_absolute_path(breaks, result)


def test_a_recompiled_library_module_is_at_the_call_and_names_the_library(
    breaks: Breaks,
) -> None:
    result = breaks.run(
        'm = torch.compile(torch.nn.Linear(4, 4), backend="eager", dynamic=False)\n'
        "m(torch.ones(2, 4))\n"
        "m(torch.ones(3, 4))  # CALL",
        marker="no_graph_break(max_recompiles=0)",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"   at {breaks.call()}  >  m(torch.ones(3, 4))*",
            "   inside torch (torch/nn/modules/linear.py:*, in Linear.forward)",
        ]
    )
    assert_no_absolute_path(breaks, result)


def test_a_host_fallback_of_a_compiled_library_module_is_at_the_users_line(
    breaks: Breaks,
) -> None:
    """``torch.compile(nn.Linear(...).double())``: Dynamo traces torch's code only, so the
    user's line is the one that called the compiled module."""
    result = breaks.run(
        "import asic_backend\n"
        'm = torch.compile(torch.nn.Linear(4, 4).double(), backend="asic")\n'
        "with torch.no_grad():\n"
        "    m(torch.ones(2, 4, dtype=torch.float64))  # CALL"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "1. host fallback (ran on the host, not the DUT): linear  (1 call, 32 host MACs*",
            f"   at {breaks.call()}  >  m(torch.ones(2, 4, dtype=torch.float64))*",
            "   why: torch.float64 operands*",
        ]
    )


# ----------------------------------------------------------------------------- 5. errors


@pytest.mark.parametrize(
    ("body", "lines"),
    [
        pytest.param(
            'torch.compile(B.shape_error, backend="eager")(torch.ones(3, 3))',
            [
                "1. compile error (raised to the caller, nothing ran) GB4315: RuntimeError "
                "when making fake tensor call",
                "   at breaks.py:*  >  return x @ torch.ones(5, 5)*",
                "   raised: torch._dynamo.exc.TorchRuntimeError",
                "   docs: https://*/gb/gb4315.html",
            ],
            id="fake-tensor-error",
        ),
        pytest.param(
            'torch.compile(B.uses_cond, backend="eager")(torch.ones(3))',
            [
                "1. compile error (raised to the caller, nothing ran) GB0124 → torch.cond not "
                "captured whole: Unsupported Tensor.item() call*",
                "   at breaks.py:*  >  return x.sum().item() + x*",
                "   called from breaks.py:*  >  return torch.cond(*",
                "   then torch.cond not captured whole: This higher order operator doesn't work*",
                "   raised: torch._dynamo.exc.UncapturedHigherOrderOpError",
            ],
            id="uncapturable-cond",
        ),
        pytest.param(
            'torch.compile(B.data_dependent, backend="eager", fullgraph=True)(torch.ones(3))',
            [
                "1. compile error (raised to the caller, nothing ran) GB0170: Data-dependent "
                "branching",
                "   at breaks.py:*  >  if x.sum() > 0:*",
                "   raised: torch._dynamo.exc.Unsupported",
            ],
            id="fullgraph",
        ),
    ],
)
def test_an_error_raised_to_the_caller_is_a_compile_error_not_an_eager_fallback(
    breaks: Breaks, body: str, lines: list[str]
) -> None:
    result = breaks.run(body)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Captured nobreak call*",
            f"{HEADER}(graphs=0, graph_breaks=0, eager_frames=0, recompiles=0, host_syncs=0)",
            *lines,
        ]
    )
    assert "eager fallback" not in result.stdout.str()


def test_a_rejection_the_test_expects_fails_unless_allowed(breaks: Breaks) -> None:
    """Code that catches a compile error usually runs the model eagerly instead: a marked test
    fails on it even when caught, and allowing its id is how a test says it expects it."""
    body = (
        "with pytest.raises(torch._dynamo.exc.Unsupported):\n"
        '    torch.compile(B.data_dependent, backend="eager", fullgraph=True)(torch.ones(3))'
    )
    result = breaks.run(body)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["1. compile error (raised to the caller, nothing ran) GB0170: *"])
    result = breaks.run(body, marker='no_graph_break(allow=[r"GB0170"])')
    result.assert_outcomes(passed=1)


def test_paths_are_relative_to_the_rootdir_from_a_subdirectory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run from tests/, below the rootdir, with the model in src/: the report says src/models.py
    # (from the rootdir, as pytest's own paths), not ../src/models.py or models.py.
    pytester.makeini("[pytest]\n")
    src = pytester.mkdir("src")
    (src / "models.py").write_text(
        "import torch\n\n\ndef branch(x):\n"
        "    if x.sum() > 0:  # the break\n"
        "        return x + 1\n"
        "    return x - 1\n"
    )
    tests = pytester.mkdir("tests")
    (tests / "test_sub.py").write_text(
        "import sys, pytest, torch\n"
        f"sys.path.insert(0, {str(src)!r})\n"
        "import models\n\n"
        "@pytest.mark.no_graph_break\n"
        "def test_branch():\n"
        "    torch.compile(models.branch, backend='eager')(torch.ones(3))\n"
    )
    monkeypatch.chdir(tests)
    result = pytester.runpytest("-p", "no:cacheprovider", "test_sub.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["   at src/models.py:5  >  if x.sum() > 0: # the break"])
