"""``pytest --nobreak-model SPEC``: each SPEC form, the inferred inputs, each generated check
passing and failing, the baseline and xdist, and every bad SPEC or input as a usage error.

The models are tiny and compile with the ``eager`` backend (the default of the generated checks
without ``--asic-backend``), so each run costs about a second after the imports.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
import torch

from pytest_nobreak.hf_models import hf_inputs
from pytest_nobreak.model_spec import InputSpec, SpecError, parse_inputs, parse_spec

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


def slow():
    time.sleep(1.5)
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
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "nobreak-model[[]fac.py:mlp[]]::compiles_whole PASSED*",
            "nobreak-model[[]fac.py:mlp[]]::no_recompile PASSED*",
        ]
    )
    tests = json.loads((fac.path / "r.json").read_text())["tests"]
    entry = tests["nobreak-model[fac.py:mlp]::compiles_whole"]
    assert (entry["marked"], entry["graphs"], entry["graph_breaks"]) == (True, 1, 0)
    assert tests["nobreak-model[fac.py:mlp]::no_recompile"]["recompiles"] == 1


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
    result.stdout.fnmatch_lines(["nobreak-model[[]fac.py:branchy[]]::compiles_whole", "*1/4 *"])


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


def test_a_sweep_skips_what_cannot_be_built_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_nobreak.hf_models.MAX_PARAMS", 1000)
    monkeypatch.setattr("pytest_nobreak.hf_models.hf_set", lambda name: ["hf:bert", "hf:vit"])
    result = run(pytester, "--nobreak-model", "hf:vision", "-rs", "--nobreak-json", "r.json")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(
        ["SKIPPED * hf:bert: still 0M parameters after shrinking (limit 0M)"]
    )
    notes = json.loads((pytester.path / "r.json").read_text())["models"]
    assert notes["nobreak-model[hf:vit]::compiles_whole"].startswith("hf:vit: still")


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
    from pytest_nobreak.hf_models import build_hf

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
            "*1 problem (graphs=2, graph_breaks=1, eager_frames=0, recompiles=0)",
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


def test_on_dut_passes_within_the_int8_bound(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model", "fac.py:mlp", "--asic-backend", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=3)
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


def test_the_baseline_gates_generated_checks(
    fac: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("--nobreak-model", "fac.py:branchy", "--nobreak-baseline", "b.json")
    run(fac, *args, "--nobreak-update-baseline").assert_outcomes(passed=2)
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
    result.assert_outcomes(passed=2)


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
    ],
)
def test_bad_specs_and_inputs_are_usage_errors(
    fac: pytest.Pytester, args: list[str], message: str
) -> None:
    options = ["--nobreak-model", args[0]]
    if len(args) > 1:
        options += ["--nobreak-model-inputs", args[1]]
    result = run(fac, *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_inputs_without_a_model_are_a_usage_error(fac: pytest.Pytester) -> None:
    result = run(fac, "--nobreak-model-inputs", "4x8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --nobreak-model-inputs: no model to give them to; *"])


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


def test_the_readme_example_prints_what_the_readme_shows() -> None:
    from tests.test_readme import README, ROOT, _environment, _pytest, shown_slice

    (example,) = README_RUN.finditer(README)
    command = shlex.split(example["command"])
    assert command[0] == "pytest"
    proc = subprocess.run(
        [*_pytest(), *command[1:]],
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == int(example["exit"]), proc.stdout[-3000:]
    shown = example["shown"].splitlines()
    assert shown_slice(shown, proc.stdout.splitlines()), proc.stdout[-3000:]
