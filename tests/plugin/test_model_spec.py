"""``pytest --nobreak-model SPEC``: each SPEC form, the inferred inputs, each generated check
passing and failing, the baseline and xdist, and every bad SPEC or input as a usage error.

The models are tiny and compile with the ``eager`` backend (the default of the generated checks
without ``--asic-backend``), so each run costs about a second after the imports.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest
import torch

from pytest_nobreak.models.hf import hf_inputs
from pytest_nobreak.models.spec import InputSpec, SpecError, parse_inputs, parse_spec
from tests import zygote
from tests.conftest import inner_pythonpath

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

FACTORIES = '''
import os
import time

import torch
from torch import nn


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def pair():
    return mlp(), torch.randn(4, 8)


def keywords():
    class Keyed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x, scale=None):
            return self.fc(x) * scale

    return Keyed(), {"x": torch.randn(4, 8), "scale": torch.tensor(2.0)}


def embedding():
    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 4))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        x = self.fc(x)
        if os.environ.get("NB_BREAK") and x.sum() > 0:  # LINE:branch
            return x + 1
        return x - 1


def branchy():
    return Branchy()


class SizeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] == 3:  # specializes the batch size: every new size recompiles
            return self.fc(x) * 2
        return self.fc(x)


def size_branch():
    return SizeBranch()


class Capped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] > 4:  # a batch of at most 4: the exported range narrows to [2, 4]
            x = x[:4]
        return self.fc(x)


def capped():
    return Capped()


class Pinned(Capped):
    def forward(self, x):
        if x.shape[0] == 2:  # the example's batch: the exported program only takes 2
            return self.fc(x) * 2
        return self.fc(x)


def pinned():
    return Pinned()


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4).double()

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)).double())


def mixed():
    return Mixed()


class Cancel(nn.Module):
    """The difference of two nearly equal linears: the int8 errors do not cancel."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight + 1e-4 * torch.randn(32, 32))
            self.b.bias.copy_(self.a.bias)

    def forward(self, x):
        return self.a(x) - self.b(x)


def cancel():
    return Cancel()


class CancelNaN(Cancel):
    """Cancel, far off fp32 on the DUT, with one NaN column: NaN must not pass the bounds."""

    def forward(self, x):
        y = super().forward(x) * 1e4
        return torch.cat([y, torch.full_like(y[:, :1], float("nan"))], dim=1)


def cancel_nan():
    return CancelNaN()


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x, scale):
        return self.fc(x) * scale


def scaled():
    return Scaled()


class HeadFirst(nn.Module):
    """Registers its head before its conv: the first layer is not the one that runs first."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(32, 10)
        self.conv = nn.Conv2d(3, 2, 3)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1)[:, :32])


def head_first():
    return HeadFirst()


def seeded():
    return nn.Linear(8, 4), torch.ones(2, 8)


class Slow(nn.Module):
    def forward(self, x):
        time.sleep(8)  # past any time limit the tests set: interrupted, never waited out
        open("waited-out", "w").close()
        return x


def slow():
    return Slow(), torch.ones(2, 8)


def slow_factory():
    time.sleep(8)
    open("waited-out", "w").close()
    return mlp()


def not_a_module():
    return 42


def no_layers():
    return nn.ReLU()


def broken():
    raise RuntimeError("no weights here")
'''


@pytest.fixture
def fac(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(fac=FACTORIES)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*QUIET, *args)


# ----------------------------------------------------------------------------- SPEC forms


def test_a_file_factory_gets_one_item_per_check(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model", "fac.py:mlp", "-v", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "nobreak-model[[]fac.py:mlp[]]::compiles_whole PASSED*",
            "nobreak-model[[]fac.py:mlp[]]::no_recompile PASSED*",
            "nobreak-model[[]fac.py:mlp[]]::exports PASSED*",
        ]
    )
    tests = json.loads((fac.path / "r.json").read_text())["tests"]
    entry = tests["nobreak-model[fac.py:mlp]::compiles_whole"]
    assert (entry["marked"], entry["graphs"], entry["graph_breaks"]) == (True, 1, 0)
    assert tests["nobreak-model[fac.py:mlp]::no_recompile"]["recompiles"] == 1
    exports = tests["nobreak-model[fac.py:mlp]::exports"]
    assert (exports["export_problems"], exports["specialized_dims"]) == (0, 0)


def test_module_factory_pairs_and_keyword_inputs(fac: pytest.Pytester) -> None:
    fac.syspathinsert()
    result = run(
        fac,
        *("--nobreak-model", "fac:pair", "--nobreak-model", "fac:keywords"),
        *("--nobreak-model", "fac:embedding", "-k", "compiles_whole"),
    )
    result.assert_outcomes(passed=3)


def test_the_ini_list_and_k_select_models(fac: pytest.Pytester) -> None:
    fac.makeini("[pytest]\nnobreak_models =\n    fac.py:mlp\n    fac.py:branchy\n")
    result = run(fac, "-k", "branchy and compiles_whole", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["nobreak-model[[]fac.py:branchy[]]::compiles_whole", "*1/6 *"])


def test_ini_models_run_beside_the_suite(fac: pytest.Pytester) -> None:
    """Models of the ini file join a plain ``pytest``; only models named on the command line
    with no path check the models alone."""
    fac.makeini("[pytest]\nnobreak_models =\n    fac.py:mlp\n")
    fac.makepyfile(test_other="def test_x():\n    pass\n")
    run(fac).assert_outcomes(passed=4)
    run(fac, "--nobreak-model", "fac.py:mlp").assert_outcomes(passed=3)


def test_given_inputs_replace_the_inferred_ones(fac: pytest.Pytester) -> None:
    result = run(
        fac, "--nobreak-model", "fac.py:mlp", "--nobreak-model-inputs", "6x8", "-k", "whole"
    )
    result.assert_outcomes(passed=1)
    result = run(
        fac, "--nobreak-model", "fac.py:mlp", "--nobreak-model-inputs", "6x9", "-k", "whole"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*mat1 and mat2 shapes cannot be multiplied*"])


def test_an_hf_model_with_a_task_head(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--nobreak-model", "hf:bert:masked-lm", "-v", "-k", "whole")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["nobreak-model[[]hf:bert:masked-lm[]]::compiles_whole PASSED*"])


def test_a_named_model_whose_main_input_its_forward_describes_is_checked(
    pytester: pytest.Pytester,
) -> None:
    """Decision Transformer's main input (``states``) is none of the usual ones: its shape is
    read from the forward's docstring when the model is built, not refused up front."""
    result = run(pytester, "--nobreak-model", "hf:decision_transformer", "-v", "-k", "whole")
    result.assert_outcomes(passed=1)


def test_a_sweep_skips_what_cannot_be_built_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_nobreak.models.skips.MAX_PARAMS", 1000)
    monkeypatch.setattr("pytest_nobreak.models.hf.hf_set", lambda name: ["hf:bert", "hf:vit"])
    result = run(pytester, "--nobreak-model", "hf:vision", "-rs", "--nobreak-json", "r.json")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines(
        ["SKIPPED * hf:bert: still 0M parameters after shrinking (limit 0M)"]
    )
    notes = json.loads((pytester.path / "r.json").read_text())["models"]
    note = notes["nobreak-model[hf:vit]::compiles_whole"]
    assert note["reason"].startswith("hf:vit: still")
    assert note["finished"] is False  # skipped before its compiled call


def test_a_named_model_that_cannot_be_built_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gate on a model the user named must not pass the day the model stops building."""
    monkeypatch.setattr("pytest_nobreak.models.skips.MAX_PARAMS", 1000)
    result = run(pytester, "--nobreak-model", "hf:bert", "--nobreak-json", "r.json")
    result.assert_outcomes(failed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    reason = "hf:bert: still 0M parameters after shrinking (limit 0M)"
    why = "not skipped: --nobreak-model names it (a sweep's members skip instead)"
    result.stdout.fnmatch_lines(
        [
            "*_ nobreak-model[[]hf:bert[]]::compiles_whole _*", reason, why,
            "*_ nobreak-model[[]hf:bert[]]::no_recompile _*", reason, why,
        ]
    )  # fmt: skip
    assert "During handling" not in result.stdout.str()
    notes = json.loads((pytester.path / "r.json").read_text())["models"]
    assert notes["nobreak-model[hf:bert]::no_recompile"] == {
        "reason": reason,
        "finished": False,
        "built": False,
    }


# ----------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("bert", {"input_ids": (2, 16), "attention_mask": (2, 16)}),
        ("vit", {"pixel_values": (2, 3, 32, 32)}),
        ("whisper", {"input_features": (2, 80, 64), "decoder_input_ids": (2, 16)}),
        ("wav2vec2", {"input_values": (2, 5120)}),
    ],
    ids=["text", "vision", "audio-features+decoder", "audio-waveform"],
)
def test_inputs_are_inferred_per_modality(
    model_type: str, expected: dict[str, tuple[int, ...]]
) -> None:
    from pytest_nobreak.models.hf import build_hf

    inputs = hf_inputs(build_hf(model_type, ""), batch=2, seq=16)
    shapes = {k: tuple(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    assert shapes == expected


def test_input_strings_parse() -> None:
    assert parse_inputs("4x3x32x32, mask=ids:2x16") == (
        InputSpec(None, "float", (4, 3, 32, 32)),
        InputSpec("mask", "ids", (2, 16)),
    )
    assert parse_spec("hf:llama:causal-lm").attr == "causal-lm"
    with pytest.raises(SpecError, match="did you mean ids"):
        parse_inputs("idz:2x16")


# ----------------------------------------------------------------------------- the checks


def test_compiles_whole_fails_on_a_break_with_its_site(
    fac: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = next(
        n
        for n, text in enumerate((fac.path / "fac.py").read_text().splitlines(), 1)
        if text.endswith("# LINE:branch")
    )
    monkeypatch.setenv("NB_BREAK", "1")
    result = run(fac, "--nobreak-model", "fac.py:branchy", "-k", "compiles_whole")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 problem (graphs=2, graph_breaks=1, eager_frames=0, recompiles=0, host_syncs=0)",
            "1. graph break GB0170: Data-dependent branching",
            f"   at fac.py:{line}  >  if os.environ.get(*",
        ]
    )


def test_no_recompile_fails_naming_the_guard(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model", "fac.py:size_branch", "-k", "no_recompile")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "1. too many recompiles: 2 recompiles (max_recompiles=1)",
            "   why: *size mismatch at index 0. expected 2, actual 3*",
        ]
    )


def test_exports_reports_a_narrowed_range_and_fails_a_static_one(fac: pytest.Pytester) -> None:
    result = run(
        fac,
        *("--nobreak-model", "fac.py:capped", "--nobreak-model", "fac.py:pinned"),
        *("-k", "exports", "--nobreak-json", "r.json"),
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1. dynamic dimension specialized: args[[]0[]] dim 0 (Dim.AUTO)",
            "*why: declared dynamic (Dim.AUTO), exported static: 2*",
        ]
    )
    tests = json.loads((fac.path / "r.json").read_text())["tests"]
    capped = tests["nobreak-model[fac.py:capped]::exports"]
    assert (capped["outcome"], capped["specialized_dims"]) == ("passed", 1)
    (narrowed,) = capped["breaks"]
    assert "exported in [2, 4]" in narrowed["reason"]
    assert tests["nobreak-model[fac.py:pinned]::exports"]["outcome"] == "failed"


def test_on_dut_passes_within_the_int8_bound(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model", "fac.py:mlp", "--asic-backend", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=4)
    entry = json.loads((fac.path / "r.json").read_text())["tests"]
    asic = entry["nobreak-model[fac.py:mlp]::on_dut"]["asic"]
    assert (asic["dut_ops"], asic["host_macs"], asic["macs"]) == (2, 0, 2 * (8 * 16 + 16 * 4))


def test_on_dut_fails_on_host_fallbacks_and_on_numerics(fac: pytest.Pytester) -> None:
    result = run(
        fac,
        *("--nobreak-model", "fac.py:mixed", "--nobreak-model", "fac.py:cancel"),
        *("--asic-backend", "-k", "on_dut"),
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "1. host fallback (ran on the host, not the DUT): linear  (1 call, 64 host MACs, *",
            "fac.py:cancel: the DUT output is off the fp32 eager output by more than int8 error: "
            "max error * of its range (bound 0.05), cosine * (bound 0.999)",
        ]
    )


def test_on_dut_fails_on_a_nan_output(fac: pytest.Pytester) -> None:
    """NaN compares false with every bound: an output holding one fails, whatever the rest."""
    result = run(fac, "--nobreak-model", "fac.py:cancel_nan", "--asic-backend", "-k", "on_dut")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fac.py:cancel_nan: the DUT output holds NaN or infinite *"])


def test_inputs_of_other_batch_sizes_keep_a_broadcast_one(fac: pytest.Pytester) -> None:
    """Only the inputs of the first one's batch size follow it to the other sizes."""
    result = run(fac, "--nobreak-model", "fac.py:scaled", "--nobreak-model-inputs", "8x16,1x4")
    result.assert_outcomes(passed=3)


def test_inferred_inputs_that_do_not_fit_are_one_line(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model", "fac.py:head_first")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*fac.py:head_first: the inputs inferred from its first layer (2x32) do not fit it: "
            "RuntimeError: *; pass --nobreak-model-inputs, or return (module, example_inputs) *"
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_two_files_of_one_name_are_two_models(pytester: pytest.Pytester) -> None:
    """``a/models.py`` and ``b/models.py`` (and a file named like a stdlib module) are each
    loaded from their own file, not whichever module of that name was imported first."""
    whole = "from torch import nn\n\ndef make():\n    return nn.Linear(8, 4)\n"
    broken = (
        "import torch\nfrom torch import nn\n\nclass B(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 4)\n"
        "    def forward(self, x):\n        return self.fc(x) if x.sum() > 0 else -self.fc(x)\n"
        "\ndef make():\n    return B()\n"
    )
    for name, text in (("a/models.py", whole), ("b/models.py", broken), ("c/json.py", whole)):
        (pytester.path / name).parent.mkdir(exist_ok=True)
        (pytester.path / name).write_text(text)
    specs = ("a/models.py:make", "b/models.py:make", "c/json.py:make")
    options = [arg for spec in specs for arg in ("--nobreak-model", spec)]
    result = run(pytester, *options, "-k", "compiles_whole")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED nobreak-model[[]b/models.py:make[]]::compiles_whole*"])


def test_a_factory_builds_the_same_weights_in_every_process(fac: pytest.Pytester) -> None:
    import random

    from pytest_nobreak.models.build import build
    from pytest_nobreak.models.spec import ModelSpec

    def factory() -> torch.nn.Module:
        return torch.nn.Linear(8, 4)

    spec = ModelSpec("t", "factory", "t", "f")
    torch.manual_seed(random.randrange(1000))
    first = build(spec, factory, ())
    torch.manual_seed(random.randrange(1000, 2000))
    second = build(spec, factory, ())
    assert torch.equal(first.module.weight, second.module.weight)


def test_benchmark_is_timed_by_pytest_benchmark_with_the_dut_figures(
    fac: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest-benchmark times nothing in an xdist worker, which this test may run in.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = run(
        fac,
        *("--nobreak-model", "fac.py:mlp", "--asic-backend", "--benchmark-enable"),
        *("-k", "benchmark", "--benchmark-json", "b.json", "-p", "no:xdist"),
    )
    result.assert_outcomes(passed=1)
    bench = json.loads((fac.path / "b.json").read_text())["benchmarks"][0]
    assert bench["fullname"] == "nobreak-model[fac.py:mlp]::benchmark"
    info = bench["extra_info"]
    assert info["asic_dut_ops"] == 2
    assert info["asic_dut_share"] == 1.0
    assert info["asic_cycles"] > 0
    assert 0 < info["asic_utilization"] <= 1


def test_the_time_limit_fails_a_slow_check(fac: pytest.Pytester) -> None:
    result = run(
        fac, "--nobreak-model", "fac.py:slow", "--nobreak-model-timeout", "0.5", "-k", "whole"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*fac.py:slow: compiles_whole took more than 0.5s (--nobreak-model-timeout; 0 lifts*"]
    )
    assert not (fac.path / "waited-out").exists()


def test_the_time_limit_holds_the_factorys_first_call_before_any_test(
    fac: pytest.Pytester,
) -> None:
    """The factory is called when the run starts, to check its inputs: a hung one stops the run
    there, under the same limit, instead of holding it."""
    result = run(fac, "--nobreak-model", "fac.py:slow_factory", "--nobreak-model-timeout", "0.5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --nobreak-model fac.py:slow_factory: the factory took more than 0.5s "
            "(--nobreak-model-timeout; 0 lifts the limit)"
        ]
    )
    assert not (fac.path / "waited-out").exists()


def test_the_baseline_gates_generated_checks(
    fac: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("--nobreak-model", "fac.py:branchy", "--nobreak-baseline", "b.json")
    run(fac, *args, "--nobreak-update-baseline").assert_outcomes(passed=3)
    baseline = json.loads((fac.path / "b.json").read_text())
    assert "nobreak-model[fac.py:branchy]::compiles_whole" in json.dumps(baseline)
    monkeypatch.setenv("NB_BREAK", "1")
    result = run(fac, *args)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        ["*nobreak-model[[]fac.py:branchy[]]::compiles_whole*graph_breaks*"]
    )


def test_xdist_workers_run_the_same_checks(fac: pytest.Pytester) -> None:
    result = fac.runpytest_subprocess(*QUIET, "--nobreak-model", "fac.py:mlp", "-n", "2")
    result.assert_outcomes(passed=3)


# ----------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fac.py"], "--nobreak-model fac.py: no factory named; write module:factory or *"),
        (["nope.py:f"], "--nobreak-model nope.py:f: file nope.py does not exist; *"),
        (["fac.py:mpl"], "--nobreak-model fac.py:mpl: */fac.py has no 'mpl' (did you mean mlp?)"),
        (["fac.py:not_a_module"], "*the factory returned int; return an nn.Module or a *"),
        (["fac.py:no_layers"], "*cannot infer the inputs of ReLU *; pass --nobreak-model-inputs*"),
        (["fac.py:broken"], "*the factory raised RuntimeError: no weights here"),
        (
            ["hf:lama"],
            "--nobreak-model hf:lama: transformers * has no model type 'lama' (did you *",
        ),
        (
            ["hf:bert:chat"],
            "--nobreak-model hf:bert:chat: unknown task 'chat'; tasks: causal-lm, *",
        ),
        (["hf:vit:causal-lm"], "*vit has no causal-lm model; its tasks: (base), image-classif*"),
        (
            ["hf:llm:causal-lm"],
            "--nobreak-model hf:llm:causal-lm: a sweep takes no task; write hf:llm",
        ),
        (["fac.py:mlp", "4xZ"], "--nobreak-model-inputs 4xZ: '4xZ' is not a shape; write *"),
        (["fac.py:mlp", "ids:2x3x4"], "*token ids are batch x sequence, e.g. ids:2x16"),
        (["fac.py:mlp", "pix:2x3"], "--nobreak-model-inputs pix:2x3: unknown kind 'pix' *"),
        (["fac.py:mlp", None, "nan"], "--nobreak-model-timeout nan: write a number of seconds *"),
        (["fac.py:mlp", None, "inf"], "--nobreak-model-timeout inf: write a number of seconds *"),
        (["fac.py:mlp", None, "-1"], "--nobreak-model-timeout -1: write a number of seconds *"),
    ],
)
def test_bad_specs_and_inputs_are_usage_errors(
    fac: pytest.Pytester, args: list[str | None], message: str
) -> None:
    options = ["--nobreak-model", args[0]]
    if len(args) > 1 and args[1] is not None:
        options += ["--nobreak-model-inputs", args[1]]
    if len(args) > 2:
        options += ["--nobreak-model-timeout", args[2]]
    result = run(fac, *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_hf_models_without_transformers_are_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = pytester.mkdir("no_transformers") / "transformers"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(blocker.parent), inner_pythonpath()]))
    result = pytester.runpytest_subprocess(*QUIET, "--nobreak-model", "hf:llama", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --nobreak-model hf:...: needs transformers, which cannot be imported *"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_the_time_limit_leaves_an_outer_timer_running() -> None:
    import signal

    from pytest_nobreak.models.build import time_limit

    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        with time_limit(50.0):
            assert 49 < signal.getitimer(signal.ITIMER_REAL)[0] <= 50
        assert 99 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100  # re-armed
        with time_limit(500.0):  # the outer one fires first: it stands
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_inputs_without_a_model_are_a_usage_error(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model-inputs", "4x8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --nobreak-model-inputs: no model to give them to; *"])


@pytest.mark.fresh_interpreter  # a claim about what is imported
def test_the_plugin_does_not_import_torch_without_a_model(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_no_torch():
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess(*QUIET, "-p", "no:randomly")
    result.assert_outcomes(passed=1)


# ----------------------------------------------------------------------------- the README

README_RUN = re.compile(
    r"<!-- nobreak-model-run: exit=(?P<exit>\d+) -->\n```console\n\$ (?P<command>[^\n]*)\n"
    r"(?P<shown>.*?)```",
    re.DOTALL,
)


def _readme_runs() -> list[re.Match[str]]:
    from tests.test_readme import TEXT

    return list(README_RUN.finditer(TEXT))


def test_the_pages_show_a_failing_and_a_real_architecture_run() -> None:
    commands = [example["command"] for example in _readme_runs()]
    assert commands == [
        "pytest --nobreak-model examples/factories.py:tiny_cnn"
        " --nobreak-model examples/factories.py:gated_mlp -k compiles_whole",
        "pytest --nobreak-model hf:llama --asic-backend -v",
    ]


@pytest.mark.parametrize("example", _readme_runs(), ids=lambda m: m["command"].split()[2])
def test_the_readme_example_prints_what_the_readme_shows(example: re.Match[str]) -> None:
    from tests.test_readme import ROOT, _environment, _pytest, shown_slice

    command = shlex.split(example["command"])
    assert command[0] == "pytest"
    proc = zygote.run([*_pytest(), *command[1:]], cwd=ROOT, env=_environment(), timeout=600)
    assert proc.returncode == int(example["exit"]), proc.stdout[-3000:]
    shown = example["shown"].splitlines()
    assert shown_slice(shown, proc.stdout.splitlines()), proc.stdout[-3000:]
