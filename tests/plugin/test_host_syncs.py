"""Host syncs: each recognised form found at the user's line, counted per call, and gated.

With Dynamo's capture settings on, a read of a device value stays inside the compiled graph
(a host sync); with them off it is a graph break, as before, and never both. Each case runs a
real inner pytest session (pytester) and reads its JSON report or its output lines.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

SYNC_MODELS = """
import torch


def item(h):
    return h * h.abs().max().item()  # LINE:item


def int_of(h):
    return h * int(h.sum())  # LINE:int


def float_of(h):
    return h * float(h.sum())  # LINE:float


def tolist(h):
    return h * h[0].long().tolist()[1]  # LINE:tolist


def mask(h):
    return h[h > 0].sum()  # LINE:mask


def nonzero(h):
    return torch.nonzero(h).sum()  # LINE:nonzero


def unique(h):
    return torch.unique(h.round()).sum()  # LINE:unique


def masked_select(h):
    return torch.masked_select(h, h > 0).sum()  # LINE:masked_select


def repeat_interleave(h):
    return torch.repeat_interleave(h[0], (h[0] > 0).long()).sum()  # LINE:repeat_interleave


def select_by_item(h):
    top = int(h.argmax())  # LINE:select_by_item
    return h.flatten()[top] * 2


def clean(h):
    return torch.where(h > 0, h, 0).sum() * h.abs().max()


def helper(h):
    return h.sum().item()  # LINE:helper


def two_callers(h):
    a = helper(h)  # LINE:caller_a
    b = helper(h * 2)  # LINE:caller_b
    return h * a + b
"""

#: form -> (function, the op as reports name it, the form's text)
FORMS = {
    "item": ("item", "Tensor.item", "data-dependent scalar"),
    "int": ("int_of", "int(tensor)", "data-dependent scalar"),
    "float": ("float_of", "float(tensor)", "data-dependent scalar"),
    "tolist": ("tolist", "Tensor.tolist", "data-dependent scalar"),
    "mask": ("mask", "boolean mask indexing", "data-dependent shape"),
    "nonzero": ("nonzero", "torch.nonzero", "data-dependent shape"),
    "unique": ("unique", "torch.unique", "data-dependent shape"),
    "masked_select": ("masked_select", "torch.masked_select", "data-dependent shape"),
    "repeat_interleave": (
        "repeat_interleave",
        "torch.repeat_interleave",
        "data-dependent shape",
    ),
}
CAPTURE = "capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True"


def line_of(pytester: pytest.Pytester, tag: str) -> int:
    text = (pytester.path / "sync_models.py").read_text().splitlines()
    return next(i for i, t in enumerate(text, 1) if t.rstrip().endswith(f"# LINE:{tag}"))


@pytest.fixture
def sync_models(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sync_models=SYNC_MODELS)
    pytester.syspathinsert()
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--nobreak-json",
        "report.json",
        *args,
    )
    report = json.loads((pytester.path / "report.json").read_text())
    return result, report["tests"]


def test_every_form_is_a_sync_with_capture_and_a_break_without(
    sync_models: pytest.Pytester,
) -> None:
    """One inner session: each form under both settings, called three times."""
    tests = []
    for name, (fn, _, _) in FORMS.items():
        for capture in (True, False):
            patch = (
                f"torch._dynamo.config.patch({CAPTURE})" if capture else "contextlib.nullcontext()"
            )
            tests.append(
                f"""
@pytest.mark.no_graph_break
def test_{name}_{"on" if capture else "off"}():
    with {patch}:
        compiled = torch.compile(M.{fn}, backend="eager")
        for _ in range(3):
            compiled(torch.randn(4, 4))
"""
            )
    sync_models.makepyfile(
        test_forms="import contextlib, pytest, torch\nimport sync_models as M\n" + "".join(tests)
    )
    _, entries = run(sync_models)
    for name, (_, op, form) in FORMS.items():
        on = entries[f"test_forms.py::test_{name}_on"]
        assert on["outcome"] == "passed", (name, on)
        assert (on["graph_breaks"], on["host_syncs"]) == (0, 3), (name, on)
        (sync,) = (b for b in on["breaks"] if b["kind"] == "host_sync")
        assert (sync["gb_type"], sync["detail"], sync["calls"]) == (op, form, 3), name
        assert (sync["file"], sync["line"]) == ("sync_models.py", line_of(sync_models, name))
        assert "fix" in sync, name

        off = entries[f"test_forms.py::test_{name}_off"]
        assert off["outcome"] == "failed", (name, off)
        assert off["graph_breaks"] >= 1, (name, off)
        assert off["host_syncs"] == 0, (name, off)  # a break, not also a sync
        assert not [b for b in off["breaks"] if b["kind"] == "host_sync"], name


def write_test(pytester: pytest.Pytester, body: str, marker: str = "no_graph_break") -> None:
    pytester.makepyfile(
        test_case=f"""
        import pytest, torch
        import sync_models as M

        @pytest.mark.{marker}
        def test_case():
            with torch._dynamo.config.patch({CAPTURE}):
                {body}
        """
    )


def test_max_host_syncs_fails_above_the_limit_and_lists_each_sync(
    sync_models: pytest.Pytester,
) -> None:
    write_test(
        sync_models,
        'f = torch.compile(M.item, backend="eager")\n'
        "                for _ in range(3): f(torch.randn(4))",
        marker="no_graph_break(max_host_syncs=2)",
    )
    result, entries = run(sync_models)
    result.assert_outcomes(failed=1)
    line = line_of(sync_models, "item")
    result.stdout.fnmatch_lines(
        [
            "*torch.compile did not run as whole graphs: 1 problem (graphs=1, graph_breaks=0, "
            "eager_frames=0, recompiles=0, host_syncs=3)",
            "1. host sync (the host waited for a device value): Tensor.item  (x3 calls)",
            f"   at sync_models.py:{line}  >  return h * h.abs().max().item() # LINE:item",
            "   called from test_case.py:*  >  for _ in range(3): f(torch.randn(4))",
            "   why: the host waits for a device value (data-dependent scalar)*",
            "   fix: keep the value a tensor*",
            "To accept host syncs: @pytest.mark.no_graph_break(max_host_syncs=3)*",
        ]
    )
    assert entries["test_case.py::test_case"]["host_syncs"] == 3


def test_max_host_syncs_passes_at_the_limit(sync_models: pytest.Pytester) -> None:
    write_test(
        sync_models,
        'f = torch.compile(M.item, backend="eager")\n'
        "                for _ in range(3): f(torch.randn(4))",
        marker="no_graph_break(max_host_syncs=3)",
    )
    result, entries = run(sync_models)
    result.assert_outcomes(passed=1)
    assert entries["test_case.py::test_case"]["host_syncs"] == 3


def test_other_backends_report_syncs_without_failing(sync_models: pytest.Pytester) -> None:
    write_test(sync_models, 'torch.compile(M.mask, backend="eager")(torch.randn(4))')
    result, entries = run(sync_models)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*nobreak compile report*",
            "test                     graphs  breaks   eager  recomp   syncs  outcome",
            "test_case.py::test_case       1       0       0       0       1  passed",
            "    host sync (the host waited for a device value) at "
            f"sync_models.py:{line_of(sync_models, 'mask')}: boolean mask indexing (1 call)",
        ]
    )
    assert entries["test_case.py::test_case"]["host_syncs"] == 1


def test_asic_backend_fails_on_any_sync_and_the_device_pays_for_it(
    sync_models: pytest.Pytester,
) -> None:
    write_test(
        sync_models,
        "f = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), "
        'backend="asic")\n'
        "                with torch.no_grad():\n"
        "                    for _ in range(2): M.mask(f(torch.randn(2, 4)))\n"
        '                g = torch.compile(M.int_of, backend="asic")\n'
        "                with torch.no_grad(): g(torch.randn(2, 4)); g(torch.randn(2, 4))",
    )
    result, entries = run(sync_models, "--asic-backend")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["1. host sync (the host waited for a device value): int(tensor)  (x2 calls)"]
    )
    entry = entries["test_case.py::test_case"]
    assert entry["host_syncs"] == 2
    assert entry["asic"]["syncs"] == 2  # the device stalled for each of them
    from asic_backend.sim.config import DEFAULT_SYNC_CYCLES

    # The linear's GEMMs ran; the syncs added their fixed cost on top.
    assert entry["asic"]["cycles"] > 2 * DEFAULT_SYNC_CYCLES


def test_asic_sync_cycles_come_from_the_device_config(sync_models: pytest.Pytester) -> None:
    (sync_models.path / "dev.toml").write_text('name = "lab"\nsync_cycles = 7\n')
    write_test(
        sync_models,
        'g = torch.compile(M.int_of, backend="asic", options={"config": "dev.toml"})\n'
        "                with torch.no_grad(): g(torch.randn(2, 4)); g(torch.randn(2, 4))",
        marker="no_graph_break(max_host_syncs=2)",
    )
    result, entries = run(sync_models)
    result.assert_outcomes(passed=1)
    asic = entries["test_case.py::test_case"]["asic"]
    assert (asic["syncs"], asic["cycles"], asic["dut_ops"]) == (2, 14, 0)


def test_a_clean_model_reports_zero(sync_models: pytest.Pytester) -> None:
    write_test(sync_models, 'torch.compile(M.clean, backend="eager")(torch.randn(4))')
    result, entries = run(sync_models, "--asic-backend")
    result.assert_outcomes(passed=1)
    assert entries["test_case.py::test_case"]["host_syncs"] == 0
    assert entries["test_case.py::test_case"]["breaks"] == []


def test_indexing_with_a_value_already_read_is_not_another_sync(
    sync_models: pytest.Pytester,
) -> None:
    """``h.flatten()[top]`` binds a symbol for the wrapped index, made from ``top``, which the
    host already has: the one sync is the ``int()``, under Dynamo's graph and AOTAutograd's."""
    write_test(
        sync_models,
        'torch.compile(M.select_by_item, backend="eager")(torch.randn(4))\n'
        '                torch.compile(M.select_by_item, backend="aot_eager")(torch.randn(4))',
        marker="no_graph_break(max_host_syncs=None)",
    )
    result, entries = run(sync_models)
    result.assert_outcomes(passed=1)
    syncs = entries["test_case.py::test_case"]["breaks"]
    line = line_of(sync_models, "select_by_item")
    assert [(s["gb_type"], s["line"], s["calls"]) for s in syncs] == [("int(tensor)", line, 1)] * 2


def test_a_float_item_that_aot_turns_back_into_tensor_math_is_no_sync(
    sync_models: pytest.Pytester,
) -> None:
    """AOTAutograd's backends run the graph after a pass that removes such reads: counted is
    what runs, not what was traced."""
    write_test(
        sync_models,
        'torch.compile(M.item, backend="aot_eager")(torch.randn(4))\n'
        '                torch.compile(M.int_of, backend="aot_eager")(torch.randn(4))',
    )
    result, entries = run(sync_models)
    result.assert_outcomes(passed=1)
    (sync,) = entries["test_case.py::test_case"]["breaks"]
    assert (sync["gb_type"], sync["line"]) == ("int(tensor)", line_of(sync_models, "int"))


def test_a_helper_called_from_two_lines_is_one_site_each(sync_models: pytest.Pytester) -> None:
    write_test(
        sync_models,
        'f = torch.compile(M.two_callers, backend="eager")\n'
        "                f(torch.randn(4)); f(torch.randn(4))",
        marker="no_graph_break(max_host_syncs=0)",
    )
    result, entries = run(sync_models)
    result.assert_outcomes(failed=1)
    syncs = entries["test_case.py::test_case"]["breaks"]
    assert [(s["line"], s["calls"]) for s in syncs] == [(line_of(sync_models, "helper"), 2)] * 2
    callers = [s["call_sites"][0]["line"] for s in syncs]
    assert callers == [line_of(sync_models, "caller_a"), line_of(sync_models, "caller_b")]
    assert entries["test_case.py::test_case"]["host_syncs"] == 4


def test_an_observed_test_counts_the_syncs_of_code_compiled_before_it(
    sync_models: pytest.Pytester,
) -> None:
    """Counted per call, so the figure does not depend on which test compiled the graph."""
    sync_models.makepyfile(
        test_order="""
        import pytest, torch
        import sync_models as M

        compiled = torch.compile(M.item, backend="eager")  # compiled by its first call

        @pytest.fixture(autouse=True, scope="module")
        def capture():
            with torch._dynamo.config.patch(capture_scalar_outputs=True):
                yield

        def test_first():
            compiled(torch.randn(4))

        def test_second():
            compiled(torch.randn(4)); compiled(torch.randn(4))
        """
    )
    result, entries = run(sync_models, "--nobreak-all")
    result.assert_outcomes(passed=2)
    assert entries["test_order.py::test_first"]["host_syncs"] == 1
    assert entries["test_order.py::test_second"]["host_syncs"] == 2
    # Each test's sync is reached from its own line, not from the line that compiled it.
    text = (sync_models.path / "test_order.py").read_text().splitlines()
    for name, call in (("test_first", "compiled(torch.randn(4))"), ("test_second", "compiled(")):
        (sync,) = entries[f"test_order.py::{name}"]["breaks"]
        line = sync["call_sites"][-1]["line"]
        start = next(i for i, t in enumerate(text, 1) if f"def {name}" in t)
        assert line == start + 1, (name, sync["call_sites"])
        assert call in text[line - 1], (name, sync["call_sites"])


def test_bad_max_host_syncs_is_a_usage_error(sync_models: pytest.Pytester) -> None:
    write_test(sync_models, "pass", marker='no_graph_break(max_host_syncs="2")')
    result = sync_models.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*test_case.py::test_case: @pytest.mark.no_graph_break: max_host_syncs must be a "
            "non-negative int or None, got '2'"
        ]
    )


def test_check_takes_max_host_syncs(sync_models: pytest.Pytester) -> None:
    """Outside pytest: ``report.check(max_host_syncs=N)``, the same message."""
    sync_models.makepyfile(
        script=f"""
        import torch, pytest_nobreak
        import sync_models as M

        with torch._dynamo.config.patch({CAPTURE}):
            with pytest_nobreak.watch() as report:
                torch.compile(M.nonzero, backend="eager")(torch.randn(4))
        print("host_syncs", report.host_syncs)
        report.check()  # no limit: passes
        report.check(max_host_syncs=1)
        try:
            report.check(max_host_syncs=0)
        except pytest_nobreak.GraphBreakError as exc:
            print(exc)
        try:
            report.check(max_host_syncs=-1)
        except TypeError as exc:
            print(exc)
        """
    )
    result = sync_models.runpython(sync_models.path / "script.py")
    result.stdout.fnmatch_lines(
        [
            "host_syncs 1",
            "*1 problem (graphs=1, graph_breaks=0, eager_frames=0, recompiles=0, host_syncs=1)",
            "1. host sync (the host waited for a device value): torch.nonzero  (1 call)",
            "To accept host syncs: report.check(max_host_syncs=1)*",
            "max_host_syncs must be a non-negative int, got -1",
        ]
    )


QAT_MODEL = """
import torch
from torchao.quantization.pt2e.learnable_fake_quantize import LearnableFakeQuantize
from torchao.quantization.pt2e.observer import MovingAverageMinMaxObserver


class QatLinear(torch.nn.Module):
    \"\"\"A linear whose input scale is a TorchAO QAT fake-quantizer's, read on every call.\"\"\"

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.fq = LearnableFakeQuantize(
            observer=MovingAverageMinMaxObserver,
            quant_min=-128,
            quant_max=127,
            dtype=torch.qint8,
            qscheme=torch.per_tensor_symmetric,
        )
        self.fq(torch.randn(4, 16))  # observe once: a trained scale
        self.fq.disable_observer()

    def forward(self, x):
        scale, _ = self.fq.calculate_qparams()  # LINE:qparams
        return self.fc(x / scale)
"""


def test_a_torchao_qat_observer_keeps_its_item_in_the_graph(pytester: pytest.Pytester) -> None:
    """TorchAO's learnable fake-quantizer clamps its scale with ``self.eps.item()``: with scalar
    capture on, the read stays in the graph, and on the ASIC it fails the test at the user's
    line, naming the library line it came from."""
    pytest.importorskip("torchao")
    pytester.makepyfile(qat_model=QAT_MODEL)
    pytester.syspathinsert()
    pytester.makepyfile(
        test_qat=f"""
        import pytest, torch
        import qat_model

        @pytest.mark.no_graph_break
        def test_qat(nobreak_compile):
            model = qat_model.QatLinear()
            with torch._dynamo.config.patch({CAPTURE}), torch.no_grad():
                nobreak_compile(model)(torch.randn(2, 16))
        """
    )
    result, entries = run(pytester, "--asic-backend")
    result.assert_outcomes(failed=1)
    line = line_of_file(pytester, "qat_model.py", "qparams")
    result.stdout.fnmatch_lines(
        [
            "1. host sync (the host waited for a device value): Tensor.item  (1 call)",
            f"   at qat_model.py:{line}  >  scale, _ = self.fq.calculate_qparams() # LINE:qparams",
            "   inside torchao (torchao/quantization/pt2e/learnable_fake_quantize.py:*, in "
            "calculate_qparams)",
        ]
    )
    entry = entries["test_qat.py::test_qat"]
    assert (entry["graph_breaks"], entry["host_syncs"]) == (0, 1)
    assert entry["asic"]["dut_ops"] == 1
    assert entry["asic"]["syncs"] == 1


def line_of_file(pytester: pytest.Pytester, name: str, tag: str) -> int:
    text = (pytester.path / name).read_text().splitlines()
    return next(i for i, t in enumerate(text, 1) if t.rstrip().endswith(f"# LINE:{tag}"))


def test_the_on_dut_model_check_fails_on_host_syncs(sync_models: pytest.Pytester) -> None:
    """``--nobreak-model``: ``on_dut`` fails on a sync; ``compiles_whole`` only reports it."""
    sync_models.makepyfile(
        factories="""
        import torch

        class Gated(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                return h * int(h.abs().sum())  # LINE:gated

        def gated():
            torch._dynamo.config.capture_scalar_outputs = True  # the model's own setting
            return Gated(), (torch.randn(2, 8),)
        """
    )
    # In-process: tests/conftest.py puts the factory's Dynamo setting back afterwards.
    _result, entries = run(sync_models, "--asic-backend", "--nobreak-model", "factories.py:gated")
    prefix = "nobreak-model[factories.py:gated]::"
    assert entries[prefix + "compiles_whole"]["outcome"] == "passed"
    on_dut = entries[prefix + "on_dut"]
    assert on_dut["outcome"] == "failed"
    assert on_dut["host_syncs"] == 1
    (sync,) = (b for b in on_dut["breaks"] if b["kind"] == "host_sync")
    assert (sync["gb_type"], sync["line"]) == (
        "int(tensor)",
        line_of_file(sync_models, "factories.py", "gated"),
    )


def test_figures_are_the_same_serially_and_under_xdist(sync_models: pytest.Pytester) -> None:
    """Counted per call of each graph, wherever it was compiled: an observed test that reuses
    a graph compiled by the test before it counts the same on either worker."""
    sync_models.makepyfile(
        test_order="""
        import pytest, torch
        import sync_models as M

        compiled = torch.compile(M.mask, backend="eager")

        @pytest.fixture(autouse=True, scope="module")
        def capture():
            with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
                yield

        @pytest.mark.parametrize("calls", [1, 2, 3, 4])
        def test_calls(calls):
            for _ in range(calls):
                compiled(torch.randn(4))
        """
    )
    args = ("-p", "no:cacheprovider", "--nobreak-all", "--nobreak-json", "r.json")
    figures = []
    for extra in ((), ("-p", "no:benchmark", "-p", "no:hypothesispytest", "-n", "2")):
        runner = sync_models.runpytest_subprocess if extra else sync_models.runpytest
        result = runner(*args, *extra)
        result.assert_outcomes(passed=4)
        tests = json.loads((sync_models.path / "r.json").read_text())["tests"]
        figures.append({nodeid: entry["host_syncs"] for nodeid, entry in tests.items()})
    assert figures[0] == figures[1] == {f"test_order.py::test_calls[{n}]": n for n in (1, 2, 3, 4)}


def test_the_count_does_not_depend_on_inductors_caches(sync_models: pytest.Pytester) -> None:
    """A float ``.item()`` inductor turns back into tensor math is no sync, in the test that
    compiled it first (cold caches) and in the one after it (a warm AOTAutograd cache, which
    skips the graph that tells)."""
    sync_models.makepyfile(
        test_cache=f"""
        import pytest, torch
        import sync_models as M

        @pytest.mark.no_graph_break(max_host_syncs=0)
        @pytest.mark.parametrize("run", [1, 2])
        def test_item(run):
            with torch._dynamo.config.patch({CAPTURE}):
                torch.compile(M.item, backend="inductor")(torch.randn(4))
                torch.compile(M.int_of, backend="inductor")(torch.randn(4))
        """
    )
    result, entries = run(sync_models, "--nobreak-backend", "inductor")
    result.assert_outcomes(failed=2)  # the int() read is a sync either way
    for n in (1, 2):
        syncs = entries[f"test_cache.py::test_item[{n}]"]["breaks"]
        assert [(s["gb_type"], s["calls"]) for s in syncs] == [("int(tensor)", 1)], n


def test_syncs_on_the_asic_keep_dynamic_shapes_dynamic(sync_models: pytest.Pytester) -> None:
    """The device's count of a sync adds no guard: one graph for every batch size."""
    write_test(
        sync_models,
        "lin = torch.nn.Linear(4, 4)\n"
        '                g = torch.compile(lambda x: M.mask(lin(x)), backend="asic", '
        "dynamic=True)\n"
        "                with torch.no_grad():\n"
        "                    for b in (2, 3, 5, 7): g(torch.randn(b, 4))",
        marker="no_graph_break(max_host_syncs=4, max_recompiles=0)",
    )
    result, entries = run(sync_models)
    result.assert_outcomes(passed=1)
    entry = entries["test_case.py::test_case"]
    assert (entry["graphs"], entry["recompiles"], entry["host_syncs"]) == (1, 0, 4)
    assert (entry["asic"]["syncs"], entry["asic"]["dut_ops"]) == (4, 4)


def test_nobreak_report_counts_host_syncs_while_the_test_runs(
    sync_models: pytest.Pytester,
) -> None:
    write_test(
        sync_models,
        'f = torch.compile(M.mask, backend="eager")\n'
        "                f(torch.randn(4)); f(torch.randn(4))\n"
        "                assert nobreak_report.host_syncs == 2",
        marker="no_graph_break(max_host_syncs=None)",
    )
    path = sync_models.path / "test_case.py"
    path.write_text(path.read_text().replace("def test_case():", "def test_case(nobreak_report):"))
    result, _ = run(sync_models)
    result.assert_outcomes(passed=1)


def test_unmarked_syncs_fail_the_run_only_where_marked_ones_would(
    sync_models: pytest.Pytester,
) -> None:
    """``--nobreak-unmarked fail``: an unmarked test's syncs are reported; they fail the run
    under the ASIC, as they fail a marked test there, and not under another backend."""
    sync_models.makepyfile(
        test_unmarked=f"""
        import torch
        import sync_models as M

        def test_syncs():
            with torch._dynamo.config.patch({CAPTURE}), torch.no_grad():
                torch.compile(M.int_of, backend="asic")(torch.randn(4))
        """
    )
    result, entries = run(sync_models, "--nobreak-all", "--nobreak-unmarked", "fail")
    assert result.ret == 0, result.stdout.str()
    assert entries["test_unmarked.py::test_syncs"]["host_syncs"] == 1
    result, _ = run(sync_models, "--nobreak-all", "--nobreak-unmarked", "fail", "--asic-backend")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["nobreak: 1 unmarked test with breaks*"])


def test_the_failure_says_how_to_accept_each_kind_of_problem(sync_models: pytest.Pytester) -> None:
    write_test(
        sync_models,
        'f = torch.compile(M.mask, backend="eager", dynamic=False)\n'
        "                f(torch.randn(4)); f(torch.randn(5))",
        marker="no_graph_break(max_host_syncs=0, max_recompiles=0)",
    )
    result, _ = run(sync_models)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "To accept more recompiles: @pytest.mark.no_graph_break(max_recompiles=N).",
            "To accept host syncs: @pytest.mark.no_graph_break(max_host_syncs=2)*",
        ]
    )
