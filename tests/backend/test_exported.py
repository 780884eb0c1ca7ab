"""``lower_exported``: a ``torch.export`` program on the DUT, with the accounting, cycles and
numerics of ``torch.compile(backend="asic")`` on the same model; TorchAO- and PT2E-converted
programs lower whole."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim

import asic_backend.ops.linear  # noqa: F401  (registers asic::int_mm)
from asic_backend import lower_exported, make_backend
from asic_backend.sim.device import Device

from .models import assert_close_to_fp32


class Block(nn.Module):
    """Every kind of DUT site: linears, a convolution, attention (SDPA inside MHA), an einsum
    (a region lowered on the aten graph) and an activation matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.conv = nn.Conv1d(64, 64, 3, padding=1)
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.relu(self.fc1(x)))
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        a, _ = self.attn(h, h, h, need_weights=False)
        return torch.einsum("bsd,btd->bst", a, h).softmax(-1) @ h


def test_the_exported_program_runs_as_the_compiled_model_does(device: Device) -> None:
    model = Block().eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        compiled = torch.compile(model, backend=make_backend(), fullgraph=True)(x)
        by_compile = device.snapshot()
        device.reset()
        torch._dynamo.reset()
        program = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch")},))
        exported = lower_exported(program)(x)
        by_export = device.snapshot()
        eager = model(x)
    assert by_export.host_fallbacks == 0
    assert by_export.host_macs == 0
    assert (by_export.dut_ops, by_export.macs, by_export.cycles) == (
        by_compile.dut_ops,
        by_compile.macs,
        by_compile.cycles,
    )
    assert torch.equal(exported, compiled)  # the same DUT kernels on the same operands
    assert_close_to_fp32(exported, eager)


class AutocastBlock(nn.Module):
    """GEMMs inside ``torch.autocast`` (inside ``torch.no_grad()`` too, as transformers' rotary
    embeddings have it): export makes each block a higher-order op with a subgraph, Dynamo
    inlines it. The einsum is a region, lowered on the aten graph."""

    def __init__(self, dtype: torch.dtype, enabled: bool, no_grad: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.dtype, self.enabled, self.no_grad = dtype, enabled, no_grad

    def forward(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        grad = torch.no_grad() if self.no_grad else contextlib.nullcontext()
        with grad, torch.autocast("cpu", self.dtype, enabled=self.enabled):
            r = torch.einsum("nd,dhf->nhf", x, f)
            h = (self.fc(x) @ x.T) @ x
        return h.float() + r.float().sum(1)


@pytest.mark.filterwarnings("ignore:CPU Autocast only supports", "ignore:In CPU autocast")
@pytest.mark.parametrize(
    ("dtype", "enabled", "no_grad", "on_host"),
    [
        # A no-op on the CPU, as Mochi's rotary einsum has it: everything on the DUT.
        (torch.float32, True, False, 0),
        (torch.bfloat16, False, False, 0),
        # Exported with grad on, the no_grad block is a subgraph holding the autocast one.
        (torch.bfloat16, False, True, 0),
        # bf16 activations: the activation matmuls stay on the host, in both paths.
        (torch.bfloat16, True, False, 2),
    ],
    ids=["float32", "disabled", "disabled-in-no-grad", "bfloat16"],
)
def test_an_autocast_block_runs_as_the_compiled_model_runs_it(
    device: Device, dtype: torch.dtype, enabled: bool, no_grad: bool, on_host: int
) -> None:
    model = AutocastBlock(dtype, enabled, no_grad).eval()
    x, f = torch.randn(32, 32), torch.randn(32, 3, 32)
    program = torch.export.export(model, (x, f), dynamic_shapes=({0: Dim("batch")}, None))
    before = program.graph_module.print_readable(print_output=False)
    with torch.no_grad():
        compiled = torch.compile(model, backend=make_backend(), fullgraph=True)(x, f)
        by_compile = device.snapshot()
        device.reset()
        torch._dynamo.reset()
        dut = lower_exported(program)
        exported = dut(x, f)
        by_export = device.snapshot()
        # A body that uses a dynamic size, which Dynamo cannot trace as a subgraph.
        other = torch.randn(17, 32)
        assert_close_to_fp32(dut(other, f), model(other, f))
    assert by_compile.host_fallbacks == on_host
    assert (by_export.dut_ops, by_export.host_fallbacks, by_export.macs, by_export.cycles) == (
        by_compile.dut_ops,
        by_compile.host_fallbacks,
        by_compile.macs,
        by_compile.cycles,
    )
    assert torch.equal(exported, compiled)
    # The caller's program is left as it was (its subgraphs were opened on copies).
    assert program.graph_module.print_readable(print_output=False) == before


def test_a_dynamic_dimension_stays_dynamic_on_the_dut(device: Device) -> None:
    model = Block().eval()
    program = torch.export.export(
        model, (torch.randn(2, 16, 64),), dynamic_shapes=({0: Dim("batch")},)
    )
    dut = lower_exported(program)
    with torch.no_grad():
        for batch in (2, 5):
            x = torch.randn(batch, 16, 64)
            assert_close_to_fp32(dut(x), model(x))
    assert device.snapshot().host_fallbacks == 0


def test_a_program_that_is_not_an_exported_program_is_refused() -> None:
    with pytest.raises(TypeError, match=r"must be a torch\.export\.ExportedProgram, not Block"):
        lower_exported(Block())


def test_a_bad_option_is_the_backends_error() -> None:
    program = torch.export.export(nn.Linear(4, 4), (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="quantize='int4' is not one of"):
        lower_exported(program, quantize="int4")


def test_a_torchao_qat_program_lowers_whole(device: Device) -> None:
    pytest.importorskip("torchao")
    from tests.backend.test_torchao import qat_int8_then_int8_dynamic

    model = qat_int8_then_int8_dynamic().eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        out, ref = lower_exported(program)(x), model(x)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (2, 0, 0)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-3


@pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated:UserWarning")
def test_a_pt2e_program_lowers_whole(device: Device) -> None:
    pytest.importorskip("torchao")
    from tests.backend.test_pt2e import QUANTIZERS, Residual, _convert

    x = torch.randn(8, 64)
    converted = _convert(Residual(), "xnnpack_dynamic", x)
    with torch.no_grad():
        program = torch.export.export(converted, (x,))
        out, ref = lower_exported(program)(x), converted(x)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (3, 0)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-5
    assert "xnnpack_dynamic" in QUANTIZERS


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 40),
    n=st.integers(1, 9),
    unsigned=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int_mm_on_the_dut_is_the_exact_integer_product(
    m: int, k: int, n: int, unsigned: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    low, high = (0, 256) if unsigned else (-128, 128)
    dtype = torch.uint8 if unsigned else torch.int8
    a = torch.randint(low, high, (m, k), generator=gen).to(dtype)
    b = torch.randint(-128, 128, (k, n), generator=gen).to(torch.int8)
    b[0] = -128  # the extremes: -128 * -128 and 255 * -128
    a[:, 0] = high - 1 if unsigned else -128
    exact = [
        [sum(int(a[i, j]) * int(b[j, c]) for j in range(k)) for c in range(n)] for i in range(m)
    ]
    out = torch.ops.asic.int_mm(a, b, "default")
    assert out.dtype == torch.int32
    assert out.tolist() == exact


@pytest.mark.parametrize("kernel", ["int_mm@columns", "int_mm@rows", "float32"])
def test_int_mm_by_a_row_major_weight_copies_it_at_most_once(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program's own ``[K, N]`` int8 weight: ``int_mm`` in the ``columns`` layout reads it as
    it is from two rows on and one kept row-major ``[N, K]`` copy for a single row (its GEMV's
    layout), in the ``rows`` layout that copy for every call; ``float32`` keeps one float copy
    of it over every call."""
    from asic_backend.sim import host_gemm

    host_gemm.int_mm_is_exact()  # its own check runs before the spies, once a process
    kernel, _, layout = kernel.partition("@")
    if layout:
        monkeypatch.setenv(host_gemm.LAYOUT_ENV_VAR, layout)
    gen = torch.Generator().manual_seed(8)
    b = torch.randint(-128, 128, (2048, 16), dtype=torch.int8, generator=gen)
    rows = torch.randint(-128, 128, (4, 2048), dtype=torch.int8, generator=gen)
    read: list[torch.Tensor] = []  # kept alive, so a copy per call would be a new address
    real_int_mm = torch._int_mm
    monkeypatch.setattr(
        torch, "_int_mm", lambda x, y, **kw: read.append(y) or real_int_mm(x, y, **kw)
    )
    made: list[int] = []
    slices = host_gemm._weight_copies["slices"]
    real_get = slices.get
    monkeypatch.setattr(
        slices,
        "get",
        lambda key, version, make: real_get(key, version, lambda: made.append(1) or make()),
    )
    with host_gemm.forced(kernel):
        for a in (rows, rows, rows[:1], rows[:1], rows[:1]):
            out = torch.ops.asic.int_mm(a, b, "default")
            assert torch.equal(out.long(), a.long() @ b.long())
    if layout == "columns":
        addresses = [y.data_ptr() for y in read]
        assert addresses[:2] == [b.data_ptr()] * 2
        assert addresses[2:] == [addresses[2]] * 3
        assert read[2].t().is_contiguous()
    elif layout == "rows":
        assert [y.data_ptr() for y in read] == [read[0].data_ptr()] * 5
        assert read[0].t().is_contiguous()
        assert read[0].data_ptr() != b.data_ptr()
    else:
        assert made == [1]
