"""``pytest --asic-backend``: the fixtures, the ``asic`` device, host fallbacks, the report."""

from __future__ import annotations

import json

import pytest

from tests.plugin.conftest import Models

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

HOST_FALLBACK_MODEL = """
import torch
from torch import nn


class MixedPrecision(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4).double()

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.head(h.double())  # LINE:host
"""


def test_nobreak_compile_runs_linears_on_the_dut(models: Models) -> None:
    models.pytester.makepyfile(
        test_dut="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_mlp(nobreak_compile, nobreak_report, asic):
            with torch.no_grad():
                nobreak_compile(M.MLP())(torch.randn(4, 8))
            assert asic.snapshot().dut_ops == 2
            assert asic.snapshot().host_fallbacks == 0
            assert nobreak_report.asic.dut_ops == 2
            assert asic.config.name == "gemmini"
        """
    )
    result = models.pytester.runpytest(
        *QUIET, "--asic-backend", "--asic-device", "gemmini", "--nobreak-json", "r.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["nobreak: backend=asic, device=gemmini (16x16 ws @ * GHz), watching marked tests"]
    )
    report = json.loads((models.pytester.path / "r.json").read_text())
    assert report["backend"] == "asic"
    entry = report["tests"]["test_dut.py::test_mlp"]
    assert entry["asic"]["dut_ops"] == 2
    assert entry["asic"]["host_fallbacks"] == 0
    assert entry["asic"]["macs"] == 4 * 8 * 16 + 4 * 16 * 4
    assert entry["asic"]["cycles"] > 0


def test_asic_counters_are_reset_per_test(models: Models) -> None:
    models.pytester.makepyfile(
        test_reset="""
        import pytest, torch
        import models as M

        @pytest.mark.parametrize("run", [1, 2])
        def test_each_starts_at_zero(nobreak_compile, asic, run):
            assert asic.snapshot().dut_ops == 0
            with torch.no_grad():
                nobreak_compile(M.MLP())(torch.randn(4, 8))
            assert asic.snapshot().dut_ops == 2
        """
    )
    models.pytester.runpytest(*QUIET, "--asic-backend").assert_outcomes(passed=2)


def test_host_fallback_fails_a_marked_test_unless_allowed(models: Models) -> None:
    models.pytester.makepyfile(mixed=HOST_FALLBACK_MODEL)
    models.pytester.makepyfile(
        test_fallback="""
        import pytest, torch
        import mixed

        def run(nobreak_compile):
            with torch.no_grad():
                nobreak_compile(mixed.MixedPrecision())(torch.randn(4, 8))

        @pytest.mark.no_graph_break
        def test_strict(nobreak_compile):
            run(nobreak_compile)

        @pytest.mark.no_graph_break(allow_host_fallback=True)
        def test_allowed(nobreak_compile, asic):
            run(nobreak_compile)
            assert (asic.snapshot().dut_ops, asic.snapshot().host_fallbacks) == (1, 1)
        """
    )
    result = models.pytester.runpytest(*QUIET, "--asic-backend")
    result.assert_outcomes(passed=1, failed=1)
    line = next(
        n
        for n, text in enumerate((models.pytester.path / "mixed.py").read_text().splitlines(), 1)
        if text.endswith("# LINE:host")
    )
    result.stdout.fnmatch_lines(
        [
            "*1 problem (graphs=1, graph_breaks=0, eager_frames=0, recompiles=0, host_syncs=0, "
            "dut_ops=1, host_fallbacks=1, macs=256, host_macs=128, cycles=*, syncs=0)",
            "1. host fallback (ran on the host, not the DUT): linear  (1 call, 128 host MACs, "
            "33.3% of the test's MACs)",
            f"   at mixed.py:{line}  >  return self.head(h.double()) # LINE:host",
            "   shapes: [4, 8] x [8, 4]",
            "   why: torch.float64 operands: the DUT path quantizes float32/bfloat16/float16 only*",
            "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True).",
        ]
    )


def test_seed_network_passes_under_the_asic_backend(models: Models) -> None:
    """The user's story end to end: the naive backend fails with gb0219 named; the same network
    under the ASIC backend compiles whole, runs on the DUT, and stays close to fp32."""
    models.pytester.makepyfile(
        test_seed="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_naive():
            m = torch.compile(M.Seed(), backend=M.naive_backend)
            m(torch.randn(2, 8))

        @pytest.mark.no_graph_break
        def test_asic(nobreak_compile, asic):
            torch.manual_seed(0)
            net, x = M.Seed(), torch.randn(16, 8)
            with torch.no_grad():
                ref = net(x)
                out = nobreak_compile(net)(x)
            assert asic.snapshot().dut_ops == 1
            assert not torch.equal(out, ref)  # int8 on the DUT, not the fp32 host path
            torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05)
        """
    )
    result = models.pytester.runpytest(*QUIET, "--asic-backend")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_naive*", "*GB0219: Backend compiler exception*"])


def test_bad_device_is_a_usage_error(models: Models) -> None:
    models.pytester.makepyfile(test_x="def test_x(): pass")
    result = models.pytester.runpytest(*QUIET, "--asic-backend", "--asic-device", "tpu_v9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --asic-device: ASIC config 'tpu_v9' is neither a preset (default, *) nor a*"]
    )


# ---------------------------------------------------------------------- host fallbacks in full

HOST_OPS_MODEL = """
import torch
from torch import nn


class Float64Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3).double()
        self.fc = nn.Linear(16, 8)
        self.head = nn.Linear(8, 4).double()

    def forward(self, x):
        y = self.conv(x.double())  # LINE:conv
        for _ in range(2):
            y = self.conv(y[:, :3])  # LINE:conv_again
        h = torch.relu(self.fc(y.float().flatten(1)))
        return self.head(h.double())  # LINE:head
"""

HOST_OPS_SUITE = """
import pytest, torch
import host_ops

@pytest.mark.no_graph_break
def test_host_ops(nobreak_compile):
    with torch.no_grad():
        nobreak_compile(host_ops.Float64Convs())(torch.randn(2, 3, 8, 8))
"""

# x[2, 3, 8, 8] -> conv -> [2, 4, 6, 6] -> conv -> [2, 4, 4, 4] -> conv -> [2, 4, 2, 2]: MACs are
# output elements x (3 input channels x 3 x 3).
CONV_MACS = (2 * 4 * 6 * 6 + 2 * 4 * 4 * 4 + 2 * 4 * 2 * 2) * 27
HEAD_MACS = 2 * 8 * 4
FC_MACS = 2 * 16 * 8  # the one float32 linear, on the DUT


def test_host_fallbacks_are_listed_per_op_and_reason(models: Models) -> None:
    """Three float64 conv calls at two lines are one entry (the first site in full, the other as
    "also at"), with calls, host MACs and their share, the first call's shapes and the reason;
    the float64 linear is another. The JSON report carries the MACs, the table the DUT share."""
    path = models.pytester.makepyfile(host_ops=HOST_OPS_MODEL)
    models.pytester.makepyfile(test_host=HOST_OPS_SUITE)
    line = {
        tag: n
        for n, text in enumerate(path.read_text().splitlines(), 1)
        for tag in ("conv", "conv_again", "head")
        if text.endswith(f"# LINE:{tag}")
    }
    result = models.pytester.runpytest(*QUIET, "--asic-backend", "--nobreak-json", "r.json", "-v")
    result.assert_outcomes(failed=1)
    why = (
        "   why: torch.float64 operands: the DUT path quantizes float32/bfloat16/float16 only "
        "(cast to float32 to run it on the DUT)"
    )
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.no_graph_break: torch.compile did not run as whole graphs: 2 problems "
            "(graphs=1, graph_breaks=0, eager_frames=0, recompiles=0, host_syncs=0, dut_ops=1, "
            f"host_fallbacks=4, macs={FC_MACS}, host_macs={CONV_MACS + HEAD_MACS}, cycles=*, "
            "syncs=0)",
            "",
            f"1. host fallback (ran on the host, not the DUT): conv2d  (x3 calls, {CONV_MACS:,} "
            "host MACs, 97.4% of the test's MACs)",
            f"   at host_ops.py:{line['conv']}  >  y = self.conv(x.double()) # LINE:conv",
            "   shapes: x[2, 3, 8, 8] w[4, 3, 3, 3]",
            why,
            f"   also at host_ops.py:{line['conv_again']} (x2)",
            "",
            f"2. host fallback (ran on the host, not the DUT): linear  (1 call, {HEAD_MACS} host "
            "MACs, 0.5% of the test's MACs)",
            f"   at host_ops.py:{line['head']}  >  return self.head(h.double()) # LINE:head",
            "   shapes: [2, 8] x [8, 4]",
            why,
            "",
            "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True).",
        ],
        consecutive=True,
    )
    entry = json.loads((models.pytester.path / "r.json").read_text())["tests"][
        "test_host.py::test_host_ops"
    ]
    assert entry["asic"] == {
        "dut_ops": 1,
        "host_fallbacks": 4,
        "macs": FC_MACS,
        "host_macs": CONV_MACS + HEAD_MACS,
        "cycles": entry["asic"]["cycles"],
        "syncs": 0,
    }
    assert [
        (b["kind"], b["gb_type"], b["line"], b["calls"], b["macs"]) for b in entry["breaks"]
    ] == [
        ("host_fallback", "Host fallback: conv2d", line["conv"], 3, CONV_MACS),
        ("host_fallback", "Host fallback: linear", line["head"], 1, HEAD_MACS),
    ]
    # 256 of 12,416 MACs ran on the DUT.
    result.stdout.fnmatch_lines(
        [
            "test                         graphs  breaks   eager  recomp  dut_ops    host    dut%  "
            "cycles  outcome",
            "test_host.py::test_host_ops       1       0       0       0        1       4    2.1%  "
            "   ???  failed",
            f"    host fallback (ran on the host, not the DUT) at host_ops.py:{line['conv']}: "
            f"conv2d (x3 calls, {CONV_MACS:,} host MACs)",
        ],
        consecutive=True,
    )


AUTOGRAD_SUITE = """
import pytest, torch
import models as M

# Autograd is live (no torch.no_grad()): every linear runs on the host.

@pytest.mark.no_graph_break
def test_marked(nobreak_compile):
    nobreak_compile(M.MLP())(torch.randn(4, 8))

def test_unmarked(nobreak_compile):
    nobreak_compile(M.MLP())(torch.randn(4, 8))
"""


def test_autograd_live_fails_a_marked_test_without_the_backends_warning(models: Models) -> None:
    """A marked test reports its host fallbacks itself, so the backend's once-per-process
    AsicHostWarning is neither issued nor spent in it; the unmarked test after it (only observed,
    even under --nobreak-all) still gets it. In a subprocess: "once per process" is the point."""
    models.pytester.makepyfile(test_grad=AUTOGRAD_SUITE)
    result = models.pytester.runpytest_subprocess(
        *QUIET, "--asic-backend", "--nobreak-all", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*: 1 problem (graphs=1, *, dut_ops=0, host_fallbacks=2, macs=0, host_macs="
            f"{4 * 8 * 16 + 4 * 16 * 4}, cycles=0, syncs=0)",
            "",
            "1. host fallback (ran on the host, not the DUT): linear  (x2 calls, 768 host MACs, "
            "100% of the test's MACs)",
            f"   at {models.where('mlp')}  >  return self.fc2(torch.relu(self.fc1(x))) # LINE:mlp",
            "   shapes: [4, 8] x [8, 16]",
            "   why: autograd is live (grad mode on and an input or parameter requires grad), so "
            "the graph runs on the host: the DUT is inference-only; call the model under "
            "torch.no_grad() or torch.inference_mode()",
        ],
        consecutive=True,
    )
    # Once, and in the unmarked test: the marked test ran first and did not spend it.
    text = result.stdout.str()
    assert text.count("AsicHostWarning") == 1, text
    result.stdout.fnmatch_lines(
        ["*= warnings summary =*", "test_grad.py::test_unmarked", "*AsicHostWarning: *"]
    )


OP_FAMILIES_MODELS = """
import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.fc = nn.Linear(8, 4).to(dtype)

    def forward(self, x):
        return self.fc(x)  # LINE:linear


def matmuls(a, b):
    return torch.einsum("bij,bjk->bik", a, b) + torch.baddbmm(a @ b, a, b)  # LINE:matmuls


class Conv(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=2).to(dtype)

    def forward(self, x):
        return self.conv(x)  # LINE:conv


def attention(q, k, v, dropout):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)  # LINE:sdpa
"""

OP_FAMILIES_SUITE = """
import pytest, torch
import families as F

CASES = {
    "linear": lambda dtype: (F.Linear(dtype), (torch.randn(2, 8, dtype=dtype),)),
    "matmuls": lambda dtype: (F.matmuls, (torch.randn(2, 3, 3, dtype=dtype),) * 2),
    "conv": lambda dtype: (F.Conv(dtype), (torch.randn(2, 4, 5, 5, dtype=dtype),)),
    "attention": lambda dtype: (
        lambda q, k, v: F.attention(q, k, v, 0.0 if dtype == torch.float32 else 0.5),
        (torch.randn(1, 2, 4, 8),) * 3,
    ),
}


@pytest.mark.no_graph_break
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["dut", "host"])
@pytest.mark.parametrize("family", list(CASES))
def test_family(nobreak_compile, asic, family, dtype):
    fn, args = CASES[family](dtype)
    with torch.no_grad():
        nobreak_compile(fn)(*args)
"""


def test_every_op_family_runs_on_the_dut_or_fails_naming_the_host_op(models: Models) -> None:
    models.pytester.makepyfile(families=OP_FAMILIES_MODELS, test_families=OP_FAMILIES_SUITE)
    result = models.pytester.runpytest(*QUIET, "--asic-backend", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=4, failed=4)
    report = json.loads((models.pytester.path / "r.json").read_text())["tests"]
    for family in ("linear", "matmuls", "conv", "attention"):
        dut = report[f"test_families.py::test_family[{family}-dut]"]
        assert dut["outcome"] == "passed"
        assert dut["asic"]["host_macs"] == 0 < dut["asic"]["macs"], family
        host = report[f"test_families.py::test_family[{family}-host]"]
        assert host["outcome"] == "failed"
        assert host["asic"]["macs"] == 0 < host["asic"]["host_macs"], family
        assert {b["kind"] for b in host["breaks"]} == {"host_fallback"}

    def where(tag: str) -> str:
        path = models.pytester.path / "families.py"
        lines = path.read_text().splitlines()
        return f"families.py:{next(i for i, t in enumerate(lines, 1) if t.endswith(tag))}"

    float64 = "why: torch.float64 operands: the DUT path quantizes float32/bfloat16/float16 only*"
    host = "host fallback (ran on the host, not the DUT)"
    result.stdout.fnmatch_lines(
        [
            "*test_family?linear-host?*",
            f"1. {host}: linear  (1 call, 64 host MACs, 100%*",
            f"   at {where('# LINE:linear')}  >  return self.fc(x)*",
            "   shapes: [2, 8] x [8, 4]",
            f"   {float64}",
            "*test_family?matmuls-host?*",
            f"1. {host}: einsum  (1 call, 54 host MACs, 33.3%*",
            f"   at {where('# LINE:matmuls')}  >  *",
            f"2. {host}: matmul  (1 call*",
            f"3. {host}: baddbmm  (1 call*",
            "*test_family?conv-host?*",
            f"1. {host}: conv2d  (1 call, 3,600 host MACs, 100%*",
            "   shapes: x[2, 4, 5, 5] w[4, 2, 3, 3]",
            f"   {float64}",
            "*test_family?attention-host?*",
            f"1. {host}: scaled_dot_product_attention  (x2 calls*",
            f"   at {where('# LINE:sdpa')}  >  *",
            "   why: attention dropout (dropout_p=0.5) is random and for training; the DUT path *",
        ]
    )
