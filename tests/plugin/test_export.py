"""The export path: ``nobreak_export`` in real pytest runs, one model per failure kind.

Each inner test exports a small model with the fixture; a marked test must fail with the
right entry (its kind label, type, line and mode) and a clean model must pass in both modes.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from torch.export import Dim

import pytest_nobreak
from pytest_nobreak import ExportError, export_check

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

MODELS = """
import torch
from torch import nn


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu()


class Branch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # LINE:branch
            return x + 1
        return x - 1


class ItemView(nn.Module):
    def forward(self, x, n):
        return x.new_zeros(n.item(), 8) + x  # LINE:item


class ShapeTest(nn.Module):
    def forward(self, x):
        if x.shape[0] == 4:  # LINE:shape
            return x * 2
        return x


class ViewTwo(nn.Module):
    def forward(self, x):
        return x.view(2, -1) * 2  # LINE:view


class Frame(nn.Module):
    def forward(self, x):
        import inspect

        if inspect.currentframe() is not None:  # LINE:frame
            return x + 1
        return x


class Doubles(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return (h.double() @ h.double().T).float()  # LINE:double


@torch.library.custom_op("nobreak_test::nofake", mutates_args=())
def nofake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class NoFake(nn.Module):
    def forward(self, x):
        return nofake(x) * 2  # LINE:nofake


@torch.library.custom_op("nobreak_test::badfake", mutates_args=())
def badfake(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


@badfake.register_fake
def _(x):
    return x.new_empty(x.shape[1] + 1)


class BadFake(nn.Module):
    def forward(self, x):
        return badfake(x) * 2  # LINE:badfake
"""


def lines_of(source: str) -> dict[str, int]:
    """``# LINE:name`` markers -> line numbers, as the file is written (leading newline gone)."""
    out = {}
    for number, text in enumerate(source.lstrip("\n").splitlines(), start=1):
        if "# LINE:" in text:
            out[text.split("# LINE:")[1].strip()] = number
    return out


LINES = lines_of(MODELS)


def only_record(pytester: pytest.Pytester) -> dict[str, object]:
    (record,) = json.loads((pytester.path / "r.json").read_text())["tests"].values()
    return record  # type: ignore[no-any-return]


def run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(export_models=MODELS)
    pytester.makepyfile(
        test_it="import pytest\nimport torch\nfrom torch.export import Dim\n"
        "import export_models as m\n\n" + body
    )
    return pytester.runpytest_inprocess(*QUIET, *args)


def test_a_clean_model_passes_in_both_modes(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_clean(nobreak_export):
    result = nobreak_export(m.Clean(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
    assert sorted(result.programs) == ["non-strict", "strict"]
    assert result.program.module()(torch.randn(6, 8)).shape == (6, 8)
""",
        "--nobreak-json=r.json",
    )
    result.assert_outcomes(passed=1)
    record = only_record(pytester)
    assert record["export_problems"] == 0
    assert record["specialized_dims"] == 0


def test_a_data_dependent_branch_fails_both_modes_at_its_line(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_branch(nobreak_export):
    nobreak_export(m.Branch(), (torch.randn(4, 8),))
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*no_graph_break: torch.export did not produce a sound program: 1 problem (*",
            "*1. export failed GB0170: Data-dependent branching",
            f"*at export_models.py:{LINES['branch']}  >  if x.sum() > 0:*",
            "*mode: non-strict and strict",
            "*fix: compute both branches and select*",
        ]
    )


def test_item_driving_a_shape_is_a_host_sync_in_the_program(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_item(nobreak_export):
    result = nobreak_export(m.ItemView(), (torch.randn(4, 8), torch.tensor(4)))
    assert sorted(result.programs) == ["non-strict", "strict"]
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 problem (*export_problems=1*",
            "*1. host sync in the exported program: aten.item",
            f"*at export_models.py:{LINES['item']}  >  return x.new_zeros(n.item(), 8) + x*",
            "*why: the program makes the host wait for a device value (data-dependent output)*",
            "*mode: non-strict and strict",
        ]
    )


@pytest.mark.parametrize(
    ("batch", "why"),
    [
        (4, "*why: declared dynamic (Dim.AUTO), exported static: 4 by the guard Eq(*, 4)"),
        # At batch 3 the shape test `== 4` only adds `!= 4`: the range stays [2, inf] and the
        # program looks dynamic, but rejects 4, the size the check tries next.
        (
            3,
            "*why: exported dynamic, but the program rejects inputs [[](4, 8)[]] inside its "
            "range by the guard Ne(*, 4): Guard failed: *",
        ),
    ],
    ids=["made_static", "rejecting_a_size_in_its_range"],
)
def test_a_dimension_specialized_by_a_shape_test_is_named_at_the_guard(
    pytester: pytest.Pytester, batch: int, why: str
) -> None:
    result = run(
        pytester,
        f"""
@pytest.mark.no_graph_break
def test_auto(nobreak_export):
    nobreak_export(m.ShapeTest(), (torch.randn({batch}, 8),), dynamic_shapes=({{0: Dim.AUTO}},))
""",
        "--nobreak-json=r.json",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 problem (*export_problems=1, specialized_dims=1*",
            "*1. dynamic dimension specialized: args[[]0[]] dim 0 (Dim.AUTO)",
            f"*at export_models.py:{LINES['shape']}  >  if x.shape[[]0[]] == 4:*",
            why,
            "*mode: non-strict and strict",
        ]
    )
    record = only_record(pytester)
    assert record["specialized_dims"] == 1
    (entry,) = record["breaks"]
    assert entry["kind"] == "specialized_dim"
    assert entry["line"] == LINES["shape"]


def test_a_named_dim_that_export_specializes_fails_and_is_named(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_named(nobreak_export):
    nobreak_export(m.ShapeTest(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*2 problems (*export_problems=2, specialized_dims=1*",
            "*1. export failed: Guard on a dynamic dimension",
            f"*at export_models.py:{LINES['shape']}  >  if x.shape[[]0[]] == 4:*",
            "*why: Constraints violated (batch)!*",
            "*2. dynamic dimension specialized: args[[]0[]] dim 0 (batch)",
            "*mode: draft_export",
        ]
    )


def test_a_view_that_needs_an_even_size_fails_at_the_view(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_view(nobreak_export):
    nobreak_export(m.ViewTwo(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1. export failed: Guard on a dynamic dimension",
            f"*at export_models.py:{LINES['view']}  >  return x.view(2, -1) * 2*",
            "*satisfy the generated guard*",
        ]
    )


def test_a_strict_only_failure_names_strict_mode(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_both(nobreak_export):
    nobreak_export(m.Frame(), (torch.randn(4, 8),))


@pytest.mark.no_graph_break
def test_non_strict_only(nobreak_export):
    result = nobreak_export(m.Frame(), (torch.randn(4, 8),), strict=False)
    assert list(result.programs) == ["non-strict"]
""",
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_both*",
            "*1. export failed*",
            "*mode: strict",
        ]
    )
    assert "mode: non-strict" not in result.stdout.str()


def test_fake_kernels_missing_or_wrong_fail_at_the_ops_call(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_missing(nobreak_export):
    nobreak_export(m.NoFake(), (torch.randn(4, 8),))


@pytest.mark.no_graph_break
def test_mismatched(nobreak_export):
    nobreak_export(m.BadFake(), (torch.randn(4, 8),))
""",
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*1. export failed: Missing fake kernel",
            f"*at export_models.py:{LINES['nofake']}  >  return nofake(x) * 2*",
            "*mode: non-strict and strict",
            "*hint: Register one with @torch.library.register_fake*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*1. unsound export (draft_export guessed): Mismatched fake kernel",
            f"*at export_models.py:{LINES['badfake']}  >  return badfake(x) * 2*",
            "*why: torch.ops.nobreak_test.badfake.default's fake kernel disagrees*",
        ]
    )


def test_allow_matches_export_problems_by_id_and_type(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break(allow=[r"GB0170"])
def test_branch(nobreak_export):
    nobreak_export(m.Branch(), (torch.randn(4, 8),))


@pytest.mark.no_graph_break(allow=[r"dim 0 \\(Dim\\.AUTO\\)"])
def test_auto(nobreak_export):
    nobreak_export(m.ShapeTest(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim.AUTO},))
""",
    )
    result.assert_outcomes(passed=2)


def test_an_unmarked_test_reports_but_does_not_fail(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
def test_branch(nobreak_export):
    nobreak_export(m.Branch(), (torch.randn(4, 8),))
""",
        "--nobreak-baseline=b.json",
        "--nobreak-update-baseline",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "test * export  static  outcome",
            "test_it.py::test_branch * 1 * 0  passed",
            f"*export failed GB0170 at export_models.py:{LINES['branch']}: Data-dependent*",
        ]
    )
    entry = json.loads((pytester.path / "b.json").read_text())["tests"]["test_it.py::test_branch"]
    assert entry["export_problems"] == 1
    assert entry["specialized_dims"] == 0


def test_a_new_export_problem_is_a_baseline_regression(pytester: pytest.Pytester) -> None:
    clean = """
@pytest.mark.no_graph_break(allow=[r"."])
def test_model(nobreak_export):
    nobreak_export(m.ShapeTest(), (torch.randn(4, 8),), dynamic_shapes=({0: %s},))
"""
    run(pytester, clean % "Dim.STATIC", "--nobreak-baseline=b.json", "--nobreak-update-baseline")
    result = run(pytester, clean % "Dim.AUTO", "--nobreak-baseline=b.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*test_model*export_problems 0 -> 1*"])


def test_under_asic_backend_the_program_runs_on_the_dut_at_two_sizes(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break(max_recompiles=0)
def test_clean(nobreak_export):
    result = nobreak_export(m.Clean(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
    assert result.lowered is not None


@pytest.mark.no_graph_break
def test_doubles(nobreak_export):
    nobreak_export(m.Doubles(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
""",
        "--asic-backend",
        "--nobreak-json=r.json",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_doubles*",
            "*1. host fallback (ran on the host, not the DUT): matmul*",
            f"*at export_models.py:{LINES['double']}  >  return (h.double() @ h.double().T)*",
        ]
    )
    tests = json.loads((pytester.path / "r.json").read_text())["tests"]
    clean = tests["test_it.py::test_clean"]
    # The linear at batch 4, then at batch 5 (one more size of the dynamic dimension).
    assert clean["asic"]["dut_ops"] == 2
    assert clean["asic"]["host_fallbacks"] == 0
    assert (clean["graphs"], clean["recompiles"], clean["export_problems"]) == (0, 0, 0)
    doubles = tests["test_it.py::test_doubles"]
    assert doubles["asic"]["host_fallbacks"] == 2
    assert [e["kind"] for e in doubles["breaks"]] == ["host_fallback"]


def test_asic_false_keeps_the_program_off_the_dut(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.no_graph_break
def test_doubles(nobreak_export):
    result = nobreak_export(m.Doubles(), (torch.randn(4, 8),), asic=False)
    assert result.lowered is None
""",
        "--asic-backend",
    )
    result.assert_outcomes(passed=1)


# --------------------------------------------------------------------------- outside pytest


class _Branch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x + 1
        return x - 1


class _ShapeTest(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 4:  # the guard draft_export finds
            return x * 2
        return x


def test_draft_export_runs_without_a_stack_per_expression_and_keeps_its_findings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Traced, each symbolic expression draft_export creates costs two symbolized stacks (most
    of its time on a real model). The check turns those entries off; its findings keep their
    own stacks, and torch gets its tracer back."""
    from torch._logging import _internal
    from torch.fx.experimental import sym_node

    traced: list[str] = []
    original = sym_node.dtrace_structured

    def spy(name: str, *args: object, **kwargs: object) -> None:
        if _internal.GET_DTRACE_STRUCTURED:  # on inside draft_export: the entry is built
            traced.append(name)
        original(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sym_node, "dtrace_structured", spy)
    x, shapes = torch.randn(4, 8), ({0: Dim("batch")},)
    torch.export.draft_export(_ShapeTest(), (x,), dynamic_shapes=shapes)
    assert "expression_created" in traced  # what the check leaves out
    traced.clear()

    result = export_check(_ShapeTest(), (x,), dynamic_shapes=shapes)
    assert "expression_created" not in traced
    assert sym_node.dtrace_structured is spy
    guard_line = inspect.getsourcelines(_ShapeTest.forward)[1] + 1
    found = [e for e in result.breaks if e.detail == "draft_export"]
    assert [(e.kind, e.line) for e in found] == [("specialized_dim", guard_line)]


def test_export_check_raises_export_error_with_the_entries() -> None:
    result = export_check(_Branch(), (torch.randn(4, 8),))
    assert result.errors.keys() == {"non-strict", "strict"}
    assert result.figures().export_problems == 1
    with pytest.raises(ExportError) as info:
        result.check()
    (event,) = info.value.breaks
    assert (event.kind, event.gb_id, event.detail) == (
        "export_error",
        "GB0170",
        "non-strict and strict",
    )
    assert str(info.value).startswith("torch.export did not produce a sound program: 1 problem")
    result.check(allow=[r"GB0170"])
    with pytest.raises(ExportError, match="1 problem"):
        _ = result.program


def test_export_check_inside_watch_leaves_the_compile_figures_alone() -> None:
    with pytest_nobreak.watch() as report:
        export_check(_Branch(), (torch.randn(4, 8),), strict=True)
    assert report.breaks == ()
    assert report.figures().graphs == 0


class _Cancel(torch.nn.Module):
    """The difference of two nearly equal linears: the int8 errors do not cancel."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight + 1e-4 * torch.randn(32, 32))
            self.b.bias.copy_(self.a.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) - self.b(x)


def test_a_dut_program_off_eager_is_a_problem_at_each_size() -> None:
    torch.manual_seed(0)
    result = export_check(
        _Cancel(), (torch.randn(4, 32),), dynamic_shapes=({0: Dim("batch")},), asic=True
    )
    off = [e for e in result.breaks if e.gb_type == "DUT program differs from eager"]
    assert [e.kind for e in off] == ["export_mismatch", "export_mismatch"]
    assert "output 0 on inputs [(4, 32)]: relative error" in off[0].reason
    assert "output 0 on inputs [(5, 32)]: relative error" in off[1].reason
    assert (off[0].detail, result.figures().export_problems) == ("on the DUT", 2)


def test_export_check_on_the_dut_has_the_dut_figures() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    result = export_check(
        model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},), asic=True
    )
    figures = result.figures()
    assert (figures.dut_ops, figures.host_fallbacks, figures.host_macs) == (4, 0, 0)
    assert figures.macs == 4 * (8 * 16 + 16 * 4) + 5 * (8 * 16 + 16 * 4)
    result.check()


class _Bf16Block(torch.nn.Module):
    """Strict export types the bf16 einsum's output float32, and its program then fails on the
    example inputs (torch 2.12 and 2.13); non-strict export gets it right."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16):
            r = torch.einsum("nd,dhf->nhf", x, f)
        return self.fc(x) + r.float().sum(1)


def test_a_program_that_fails_on_the_example_inputs_is_a_problem_and_the_other_runs() -> None:
    with torch.no_grad():
        result = export_check(
            _Bf16Block().eval(),
            (torch.randn(4, 32), torch.randn(32, 3, 32)),
            dynamic_shapes=({0: Dim("batch")}, None),
            asic=True,
        )
    failed = [e for e in result.breaks if e.gb_type.endswith("fails on the example inputs")]
    assert [(e.kind, e.gb_type, e.detail) for e in failed] == [
        ("export_mismatch", "strict program fails on the example inputs", "strict")
    ]
    assert failed[0].reason.startswith("RuntimeError: Tensor dtype mismatch!")
    assert failed[0].reason.endswith("(eager ran on them)")
    # Not also a batch it rejects: it failed before a second batch was tried.
    assert not [e for e in result.breaks if e.kind == "specialized_dim"]
    # The non-strict program ran on the DUT, at two batches: the linear and the einsum.
    figures = result.figures()
    assert (figures.dut_ops, figures.host_fallbacks) == (4, 0)
    assert result.broken == {"strict"}
    assert result.program is result.programs["non-strict"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: export_check(lambda x: x, (torch.randn(2),)), "must be a torch.nn.Module"),
        (lambda: export_check(_Branch(), torch.randn(2)), "args must be a tuple"),
        (lambda: export_check(_Branch(), (torch.randn(2),), strict="yes"), "strict must be"),
        (lambda: export_check(_Branch(), (torch.randn(2),), kwargs=[1]), "kwargs must be"),
    ],
)
def test_bad_inputs_are_clear_errors(call: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        call()  # type: ignore[operator]


def test_dynamic_shapes_that_do_not_fit_the_inputs_raise_torchs_error() -> None:
    with pytest.raises(torch._dynamo.exc.UserError, match="dynamic_shapes"):
        export_check(_Branch(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("b")}, {1: Dim("c")}))
