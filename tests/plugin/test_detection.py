"""A marked test fails on every kind of graph break and eager fallback, naming the user's line.

Each case runs a real inner pytest session (pytester, in-process) over ``models.py`` from
``conftest.py`` and checks the outcome and the message lines.
"""

from __future__ import annotations

import pytest

from tests.plugin.conftest import Models

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def run_marked(models: Models, body: str, *args: str) -> pytest.RunResult:
    models.pytester.makepyfile(
        test_case=f"""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_case():
            {body}
        """
    )
    return models.pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
    )


HEADER = "*@pytest.mark.no_graph_break: torch.compile did not run as whole graphs: *"


def assert_fails_with(result: pytest.RunResult, *lines: str, figures: str = "*") -> None:
    """One failed test whose message has a header with ``figures`` and then ``lines``."""
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"{HEADER}({figures})", *lines])


def test_data_dependent_branch(models: Models) -> None:
    result = run_marked(models, 'torch.compile(M.data_dependent, backend="eager")(torch.ones(3))')
    assert_fails_with(
        result,
        "*graph break GB0170: Data-dependent branching",
        f"*at {models.where('branch')}  >  if x.sum() > 0:*",
        "*why: Detected data-dependent branching*",
        "*hint: *",
        "*docs: https://*/gb/gb0170.html",
        '*To allow a known break: @pytest.mark.no_graph_break(allow=[[]r"GB0170"])*',
    )


def test_print_is_an_unsupported_call(models: Models) -> None:
    result = run_marked(models, 'torch.compile(M.prints, backend="eager")(torch.ones(3))')
    assert_fails_with(
        result,
        "*graph break GB0059: Failed to trace builtin operator",
        f'*at {models.where("print")}  >  print("debug")*',
        "*why: Dynamo does not know how to trace builtin operator `print`*",
    )


def test_item_without_scalar_capture(models: Models) -> None:
    result = run_marked(models, 'torch.compile(M.item, backend="eager")(torch.ones(3))')
    assert_fails_with(
        result,
        "*graph break GB0124: Unsupported Tensor.item() call*",
        f"*at {models.where('item')}  >  return x * x.sum().item()*",
    )


def test_disabled_callee(models: Models) -> None:
    result = run_marked(models, 'torch.compile(M.calls_disabled, backend="eager")(torch.ones(3))')
    assert_fails_with(
        result,
        "*graph break GB0098: Skip calling `torch.compiler.disable()`d function",
        f"*at {models.where('disabled')}  >  return host_helper(x * 2) + 1*",
    )


def test_break_inside_a_nested_submodule(models: Models) -> None:
    result = run_marked(models, 'torch.compile(M.Outer(), backend="eager")(torch.randn(2, 4))')
    assert_fails_with(
        result,
        "*graph break GB0170: Data-dependent branching*",
        f"*at {models.where('nested')}  >  return x.cos() if x.max() > 0 else x.sin()*",
    )


def test_all_breaks_of_a_test_are_listed(models: Models) -> None:
    result = run_marked(models, 'torch.compile(M.two_breaks, backend="eager")(torch.ones(3))')
    assert_fails_with(
        result,
        "1. graph break GB0059: Failed to trace builtin operator",
        f"*at {models.where('two_a')}*",
        "2. graph break GB0124: *",
        f"*at {models.where('two_b')}*",
        figures="graphs=3, graph_breaks=2, eager_frames=0, recompiles=0, host_syncs=0",
    )
    result.stdout.fnmatch_lines([f"{HEADER}2 problems*"])


def test_break_in_a_loop_skips_the_whole_frame(models: Models) -> None:
    """The print is the root cause, the loop what made Dynamo skip the frame (GB7000)."""
    result = run_marked(models, 'torch.compile(M.loop, backend="eager")(torch.ones(3))')
    assert_fails_with(
        result,
        "*eager fallback GB0059 → GB7000: Failed to trace builtin operator",
        f'*at {models.where("loop")}  >  print("iter", i)*',
        "*then GB7000: torch.compile detected a graph break in a for/while loop.*",
        "*docs: https://*/gb/gb0059.html",
        figures="graphs=0, graph_breaks=0, eager_frames=1, recompiles=0, host_syncs=0",
    )


def test_seed_backend_exception_becomes_eager_fallback(models: Models) -> None:
    """The user's story: a backend whose linear reads scalars under aot_autograd (gb0219)."""
    result = run_marked(
        models,
        "m = torch.compile(M.Seed(), backend=M.naive_backend)\n"
        "            for _ in range(3):\n"
        "                m(torch.randn(2, 8))",
    )
    assert_fails_with(
        result,
        "*backend compiler fallback (whole frame ran eagerly) GB0219: Backend compiler exception",
        f"*at {models.where('seed')}*",
        "*why: Backend compiler `naive_backend` failed with aten._local_scalar_dense.default",
        "*docs: https://*/gb/gb0219.html",
        figures="graphs=0, graph_breaks=0, eager_frames=1, recompiles=0, host_syncs=0",
    )
    # Dynamo's own 40-line warning is not repeated in the captured output.
    assert "Developer debug context" not in result.stdout.str()
    assert "torch.__trace" not in result.stdout.str()


def test_recompile_limit(models: Models) -> None:
    result = run_marked(
        models,
        'f = torch.compile(M.clean, backend="eager", dynamic=False)\n'
        "            with torch._dynamo.config.patch(recompile_limit=2):\n"
        "                for dt in (torch.float32, torch.float64, torch.float16):\n"
        "                    f(torch.ones(3, dtype=dt))",
    )
    assert_fails_with(
        result,
        "*recompile limit hit (unmatched inputs run eagerly) GB0039: *",
        f"*at {models.where('clean')}*",
        "*why: recompile_limit (2) hit; last recompile reason: *dtype mismatch*",
    )


@pytest.mark.parametrize(
    ("switch", "cause"),
    [
        ('torch.compiler.set_stance("force_eager")', 'set_stance("force_eager")'),
        ('torch.compiler.set_stance("eager_on_recompile")', 'set_stance("eager_on_recompile")'),
        ("torch._dynamo.config.patch(disable=True)", "torch._dynamo.config.disable is set"),
    ],
)
def test_silent_eager(models: Models, switch: str, cause: str) -> None:
    result = run_marked(
        models,
        f'f = torch.compile(M.clean, backend="eager")\n'
        f"            with {switch}:\n"
        f"                f(torch.ones(3))",
    )
    assert_fails_with(
        result,
        "*eager fallback: Silent eager",
        "*at test_case.py:*  >  f(torch.ones(3))",
        f"*why: `clean` ran eagerly: *{cause}*",
    )


def test_backend_that_raises_keeps_its_error_and_adds_the_breaks(models: Models) -> None:
    result = run_marked(
        models,
        "def bad(gm, ex):\n"
        '                raise RuntimeError("cannot handle this graph")\n'
        "            torch.compile(M.clean, backend=bad)(torch.ones(3))",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*BackendCompilerFailed*",
            "*Captured nobreak call*",
            # Raised to the test, not run eagerly: a compile error, and no eager frame.
            f"{HEADER}(graphs=0, graph_breaks=0, eager_frames=0, recompiles=0, host_syncs=0)",
            "*compile error (raised to the caller, nothing ran): BackendCompilerFailed",
            f"*at {models.where('clean')}  >  def clean(x):*",
            "*why: backend='bad' raised: RuntimeError: cannot handle this graph",
            "*raised: torch._dynamo.exc.BackendCompilerFailed",
        ]
    )


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_tests_own_torch_compile_is_watched_whatever_its_backend(
    models: Models, backend: str
) -> None:
    result = run_marked(
        models, f'torch.compile(M.data_dependent, backend="{backend}")(torch.ones(3))'
    )
    assert_fails_with(result, "*GB0170*")


def test_clean_models_pass(models: Models) -> None:
    models.pytester.makepyfile(
        test_clean="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_mlp(nobreak_compile):
            nobreak_compile(M.MLP(), backend="eager")(torch.randn(2, 8))

        @pytest.mark.no_graph_break
        def test_dynamic_batch(nobreak_compile, nobreak_report):
            m = nobreak_compile(M.MLP(), backend="aot_eager", dynamic=True)
            for batch in (2, 3, 5, 9):
                m(torch.randn(batch, 8))
            assert nobreak_report.recompiles == 0
            assert nobreak_report.graphs == 1

        @pytest.mark.no_graph_break
        def test_compiles_nothing():
            assert torch.ones(2).sum() == 2
        """
    )
    result = models.pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_message_stays_short(models: Models) -> None:
    """Twelve distinct breaks: the first eight, the rest counted, ~70 lines at most (hints and
    docs shared by several breaks are shown once; each break keeps its own fix line)."""
    funcs = "\n".join(f"def f{i}(x):\n    print('b{i}')\n    return x + {i}\n" for i in range(12))
    models.pytester.makepyfile(
        many=funcs,
        test_case="""
        import pytest, torch
        import many

        @pytest.mark.no_graph_break
        def test_case():
            for i in range(12):
                torch.compile(getattr(many, f"f{i}"), backend="eager")(torch.ones(1))
        """,
    )
    result = models.pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    start = text.index("@pytest.mark.no_graph_break: torch.compile")
    end = text.index("To allow a known break")
    assert len(text[start:end].splitlines()) <= 70
    result.stdout.fnmatch_lines(
        [
            f"{HEADER}12 problems*",
            "8. graph break GB0059*",
            "   fix: move print('b7') to the caller, after the compiled call returns*",
            "   hints and docs: as for 1.",
            "... and 4 more (see --nobreak-json*",
        ]
    )
