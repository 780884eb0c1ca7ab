"""The MAC formulas equal torch.utils.flop_counter's (flops / 2) where it has one, and count what
a naive implementation does where it has none (FlopCounterMode then counts them through
``flop_counter_extras()``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from asic_backend.sim.macs import (
    FORMULAS,
    MAC_OPS,
    MacOp,
    conv_params,
    flop_counter_extras,
    mac_op,
    macs,
    shape_text,
)
from tests.accounting import REFERENCE_FORMULAS

aten = torch.ops.aten


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


class MacContract(TorchDispatchMode):
    """Runs every op, and for each one in MAC_OPS records (packet, our MACs, flop_registry's
    FLOPs or None): the contract checked on the arguments the op really receives."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, int, int | None]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        op = mac_op(func)
        if op is not None:
            packet = func.overloadpacket
            formula = flop_registry.get(packet)
            flops = None if formula is None else formula(*args, **(kwargs or {}), out_val=out)
            self.seen.append((packet, op.count(args), flops))
        return out


def flops(
    fn: Callable[[], Any], extras: bool = False, reference: bool = False
) -> tuple[int, dict[str, int]]:
    """FlopCounterMode's total for one call, and its per-op counts: with the backend's
    ``extras``, or the suite-wide check's own ``reference`` formulas (tests/accounting.py)."""
    mapping = REFERENCE_FORMULAS if reference else flop_counter_extras() if extras else None
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    counts = counter.get_flop_counts().get("Global", {})
    return counter.get_total_flops(), {str(k): v for k, v in counts.items()}


def check_contract(fn: Callable[[], Any], expected_macs: int) -> list[Any]:
    """``fn``'s MAC ops obey the contract, and FlopCounterMode counts ``2·expected_macs``."""
    with MacContract() as mode:
        fn()
    assert mode.seen, "no MAC op ran"
    for packet, ours, theirs in mode.seen:
        if theirs is not None:
            assert ours * 2 == theirs, packet
    assert sum(ours for _, ours, _ in mode.seen) == expected_macs
    assert flops(fn)[0] == 2 * expected_macs
    assert flops(fn, extras=True)[0] == 2 * expected_macs  # extras never double count
    return [packet for packet, _, _ in mode.seen]


# -- ops FlopCounterMode has a formula for: equal, on real tensors ------------------------------


A, B = randn(6, 5, seed=1), randn(5, 7, seed=2)
BA, BB = randn(3, 6, 5, seed=3), randn(3, 5, 7, seed=4)


@pytest.mark.parametrize(
    ("fn", "expected", "packets"),
    [
        (lambda: torch.mm(A, B), 6 * 5 * 7, [aten.mm]),
        (lambda: torch.addmm(randn(7), A, B), 6 * 5 * 7, [aten.addmm]),
        (lambda: torch.bmm(BA, BB), 3 * 6 * 5 * 7, [aten.bmm]),
        (lambda: torch.baddbmm(randn(3, 6, 7), BA, BB), 3 * 6 * 5 * 7, [aten.baddbmm]),
        (lambda: torch.matmul(BA, B), 3 * 6 * 5 * 7, [aten.mm]),  # folded into one mm
        (lambda: randn(2, 1, 6, 5) @ randn(4, 5, 7), 8 * 6 * 5 * 7, [aten.bmm]),
        (lambda: F.linear(BA, randn(7, 5), randn(7)), 3 * 6 * 5 * 7, [aten.addmm]),
        (lambda: F.linear(BA, randn(7, 5)), 3 * 6 * 5 * 7, [aten.mm]),
    ],
    ids=[
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul_3d_2d",
        "matmul_broadcast",
        "linear",
        "linear_nb",
    ],
)
def test_matmul_ops_equal_flop_counter(
    fn: Callable[[], Any], expected: int, packets: list[Any]
) -> None:
    assert check_contract(fn, expected) == packets


def conv_call(
    x: tuple[int, ...],
    w: tuple[int, ...],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool = False,
    output_padding: list[int] | None = None,
    groups: int = 1,
) -> Callable[[], torch.Tensor]:
    spatial = len(w) - 2
    op = output_padding or [0] * spatial
    xt, wt = randn(*x, seed=5), randn(*w, seed=6)
    return lambda: aten.convolution(xt, wt, None, stride, padding, dilation, transposed, op, groups)


CONV_CASES = [
    # (x, w, stride, padding, dilation, transposed, output_padding, groups), MACs by hand
    pytest.param(
        ((2, 3, 10), (4, 3, 3), [1], [0], [1]), 2 * 8 * 4 * 3 * 3, id="1d"
    ),  # out 10 − 2 = 8
    pytest.param(
        ((1, 4, 9, 9), (6, 2, 3, 3), [2, 2], [1, 1], [1, 1], False, None, 2),
        1 * 25 * 6 * 2 * 9,  # out (9 + 2 − 3)//2 + 1 = 5 per dim
        id="2d_grouped_strided_padded",
    ),
    pytest.param(
        ((1, 3, 12, 12), (3, 1, 3, 3), [1, 1], [2, 2], [2, 2], False, None, 3),
        1 * 144 * 3 * 1 * 9,  # depthwise, dilation 2 with padding 2: "same", out 12 x 12
        id="2d_depthwise_dilated",
    ),
    pytest.param(
        ((2, 2, 4, 5, 6), (4, 2, 2, 3, 1), [1, 2, 1], [0, 1, 0], [1, 1, 2]),
        2 * (3 * 3 * 6) * 4 * 2 * 6,  # out (3, (5 + 2 − 3)//2 + 1 = 3, 6)
        id="3d",
    ),
    pytest.param(
        ((2, 4, 5), (4, 3, 3), [2], [1], [1], True, [1]),
        2 * 5 * 4 * 3 * 3,  # each input point meets the whole [4, 3, 3] kernel
        id="1d_transposed",
    ),
    pytest.param(
        ((1, 4, 3, 3), (4, 2, 3, 3), [2, 2], [1, 0], [1, 2], True, [1, 0], 2),
        1 * 9 * 4 * 2 * 9,
        id="2d_transposed_grouped",
    ),
    pytest.param(
        ((1, 2, 2, 3, 2), (2, 3, 2, 2, 2), [1, 2, 1], [0, 0, 1], [1, 1, 1], True),
        1 * 12 * 2 * 3 * 8,
        id="3d_transposed",
    ),
]


@pytest.mark.parametrize(("args", "expected"), CONV_CASES)
def test_convolution_equals_flop_counter(args: tuple[Any, ...], expected: int) -> None:
    fn = conv_call(*args)
    assert check_contract(fn, expected) == [aten.convolution]
    x, w, stride, padding, dilation, *rest = args
    transposed = bool(rest and rest[0])
    assert macs("conv", [x, w], conv_params(transposed, stride, padding, dilation)) == expected


@pytest.mark.parametrize("transposed", [False, True])
def test_functional_convs_and_underscore_convolution(transposed: bool) -> None:
    x, w = randn(1, 4, 6, 6), randn(4, 2, 3, 3)
    if transposed:  # each of the 36 input points meets the whole [4, 2, 3, 3] kernel
        fn = lambda: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2)  # noqa: E731
    else:  # 36 output points ("same"), each a [4, 2, 3, 3] kernel's worth
        fn = lambda: F.conv2d(x, w, padding="same", groups=2)  # noqa: E731
    assert check_contract(fn, 36 * 72) == [aten.convolution]
    # aten._convolution, stride 2 and padding 1: a conv has (6 + 2 − 3)//2 + 1 = 3 x 3 outputs.
    args = (x, w, None, [2, 2], [1, 1], [1, 1], transposed, [0, 0], 2, False, False, True, True)
    expected = 36 * 72 if transposed else 9 * 72
    assert check_contract(lambda: aten._convolution(*args), expected) == [aten._convolution]


def test_every_registry_covered_op_is_checked() -> None:
    """The ops the contract holds for: the ones above on real tensors, the rest below by shapes."""
    covered = {packet for packet in MAC_OPS if packet in flop_registry}
    assert covered == {
        aten.mm,
        aten.bmm,
        aten.addmm,
        aten.baddbmm,
        aten._scaled_mm,
        aten.convolution,
        aten._convolution,
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_cudnn_attention,
        aten.convolution_backward,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention_backward,
    }
    assert set(flop_counter_extras()) == set(MAC_OPS) - covered


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_transpose"])
@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_convolution_backward_equals_flop_counter(
    transposed: bool, mask: tuple[bool, bool]
) -> None:
    # The backward of a real (grouped, strided) conv, recorded as FlopCounterMode sees it.
    x = torch.randn(2, 4, 7, 7, requires_grad=mask[0])
    w = torch.randn(4, 3, 3, 3) if transposed else torch.randn(6, 2, 3, 3)
    w.requires_grad_(mask[1])
    conv = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    out = conv(x, w, None, 2, 1, groups=2)
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    ours = mac_op(aten.convolution_backward)
    assert ours is not None
    grad_out = out.shape
    args = [grad_out, x.shape, w.shape, None, [2, 2], [1, 1], [1, 1], transposed, [0, 0], 2]
    count = ours.count([*args, [mask[0], mask[1], False]])
    assert 2 * count == counter.get_total_flops() > 0


def test_sdpa_backward_kernels_equal_flop_registry() -> None:
    g, q, k, v = (2, 4, 6, 16), (2, 4, 6, 8), (2, 4, 9, 8), (2, 4, 9, 16)
    cpu = mac_op(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    assert cpu is not None
    for packet in (
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention_backward,
    ):
        assert 2 * cpu.count([g, q, k, v]) == flop_registry[packet](g, q, k, v, out_val=None)


@pytest.mark.parametrize(
    "packet",
    [
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_cudnn_attention,
    ],
)
@pytest.mark.parametrize(
    "qkv",
    [
        ((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8)),
        ((1, 8, 5, 16), (1, 2, 9, 16), (1, 2, 9, 32)),  # grouped-query, d_v != d_qk
    ],
    ids=["mha", "gqa"],
)
def test_cuda_sdpa_kernels_equal_flop_registry(
    packet: Any, qkv: tuple[tuple[int, ...], ...]
) -> None:
    # CUDA-only kernels: their formulas called with shapes, as FlopCounterMode would.
    q, k, v = qkv
    ours = mac_op(packet)
    assert ours is not None
    assert ours.formula == "sdpa"
    assert 2 * ours.count([q, k, v]) == flop_registry[packet](q, k, v, out_val=None)
    assert ours.count([q, k, v]) == q[0] * q[1] * q[2] * k[2] * (q[3] + v[3])


def test_scaled_mm_equals_flop_registry() -> None:
    a, b = torch.empty(16, 32, device="meta"), torch.empty(32, 48, device="meta")
    scale = torch.empty((), device="meta")
    op = mac_op(aten._scaled_mm)
    assert op is not None
    assert 2 * op.count([a, b, scale, scale]) == flop_registry[aten._scaled_mm](
        a, b, scale, scale, out_val=None
    )


# -- ops FlopCounterMode has no formula for: flop_counter_extras() counts the naive MACs --------


V5 = randn(5, seed=7)


@pytest.mark.parametrize(
    ("fn", "expected", "packet"),
    [
        (lambda: torch.mv(A, V5), 6 * 5, "aten.mv"),
        (lambda: torch.dot(V5, V5), 5, "aten.dot"),
        (lambda: torch.vdot(V5, V5), 5, "aten.vdot"),
        (lambda: torch.addmv(randn(6), A, V5), 6 * 5, "aten.addmv"),
        (lambda: torch.addbmm(randn(6, 7), BA, BB), 3 * 6 * 5 * 7, "aten.addbmm"),
        (lambda: BA @ V5, 3 * 6 * 5, "aten.mv"),  # matmul folds [3, 6, 5] @ [5] into one mv
        (
            lambda: torch._int_mm(
                torch.ones(32, 64, dtype=torch.int8), torch.ones(64, 16, dtype=torch.int8)
            ),
            32 * 64 * 16,
            "aten._int_mm",
        ),
    ],
    ids=["mv", "dot", "vdot", "addmv", "addbmm", "matmul_3d_1d", "int_mm"],
)
def test_extras_count_ops_flop_counter_misses(
    fn: Callable[[], Any], expected: int, packet: str
) -> None:
    total, counts = flops(fn, extras=True)
    assert total == 2 * expected
    assert counts == {packet: 2 * expected}
    assert flops(fn, reference=True) == (2 * expected, {packet: 2 * expected})
    assert flops(fn)[0] == 0  # why the extras exist (a newer torch may add formulas: then drop)
    with MacContract() as mode:
        fn()
    assert [(str(p), ours) for p, ours, _ in mode.seen] == [(packet, expected)]


def sdpa_macs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """By hand, not with the table under test: QKᵀ and PV for every query head (GQA's key and
    value heads are shared, their work is not)."""
    *batch, length, e = q.shape
    return math.prod(batch) * length * k.shape[-2] * (e + v.shape[-1])


FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"
SDPA_CASES = [  # q, k, v, kwargs, what FlopCounterMode sees on CPU by default (torch 2.13)
    pytest.param((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8), {}, FLASH_CPU, id="mha"),
    pytest.param(
        (2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 8), {"is_causal": True}, FLASH_CPU, id="causal"
    ),
    pytest.param(
        (1, 3, 5, 8), (1, 3, 9, 8), (1, 3, 9, 8), {"attn_mask": "bool"}, FLASH_CPU, id="mask"
    ),
    pytest.param((2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 16), {}, "aten.bmm", id="d_v"),
    pytest.param(
        (2, 8, 5, 8), (2, 2, 7, 8), (2, 2, 7, 12), {"enable_gqa": True}, "aten.bmm", id="gqa"
    ),
    pytest.param((5, 8), (7, 8), (7, 8), {}, "aten.mm", id="unbatched_2d"),
]


def sdpa_call(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    kwargs: dict[str, Any],
) -> tuple[Callable[[], torch.Tensor], int]:
    q, k, v = randn(*q_shape, seed=1), randn(*k_shape, seed=2), randn(*v_shape, seed=3)
    kw = dict(kwargs)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.rand(q_shape[-2], k_shape[-2]) > 0.3
    return lambda: F.scaled_dot_product_attention(q, k, v, **kw), sdpa_macs(q, k, v)


@pytest.mark.parametrize(("q", "k", "v", "kwargs", "cpu_kernel"), SDPA_CASES)
def test_sdpa_math_path_equals_the_formula(
    q: tuple[int, ...],
    k: tuple[int, ...],
    v: tuple[int, ...],
    kwargs: dict[str, Any],
    cpu_kernel: str,
) -> None:
    fn, expected = sdpa_call(q, k, v, kwargs)
    with sdpa_kernel(SDPBackend.MATH):
        assert flops(fn)[0] == 2 * expected  # FlopCounterMode sees the math path's bmm
        assert flops(fn, extras=True)[0] == 2 * expected  # and the extras add nothing


@pytest.mark.parametrize(("q", "k", "v", "kwargs", "cpu_kernel"), SDPA_CASES)
def test_sdpa_default_cpu_path_counted_by_extras(
    q: tuple[int, ...],
    k: tuple[int, ...],
    v: tuple[int, ...],
    kwargs: dict[str, Any],
    cpu_kernel: str,
) -> None:
    fn, expected = sdpa_call(q, k, v, kwargs)
    # No backend forced: the CPU flash kernel where it applies (invisible to FlopCounterMode
    # without the extras), else the math path.
    assert flops(fn, extras=True) == (2 * expected, {cpu_kernel: 2 * expected})
    assert flops(fn, reference=True) == (2 * expected, {cpu_kernel: 2 * expected})


@pytest.fixture
def fastpath() -> Iterator[Callable[[bool], None]]:
    before = torch.backends.mha.get_fastpath_enabled()
    yield torch.backends.mha.set_fastpath_enabled
    torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_fast_path_equals_its_slow_path(
    fastpath: Callable[[bool], None], norm_first: bool, activation: str
) -> None:
    b, length, e, heads, ff = 2, 5, 16, 4, 24
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        e, heads, ff, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    x = randn(b, length, e)
    tokens = b * length
    # in-projection (3E), QKᵀ and PV over every head, out-projection, two FFN matmuls
    expected = tokens * e * 3 * e + 2 * tokens * length * e + tokens * e * e + 2 * tokens * e * ff
    with torch.no_grad():
        fast_total, fast_counts = flops(lambda: layer(x), extras=True)
        fastpath(False)
        with sdpa_kernel(SDPBackend.MATH):
            slow_total, _ = flops(lambda: layer(x))
        fastpath(True)
        reference = flops(lambda: layer(x), reference=True)
    assert fast_counts == {"aten._transformer_encoder_layer_fwd": 2 * expected}  # it was fast
    assert fast_total == slow_total == 2 * expected
    assert reference == (fast_total, fast_counts)


@pytest.mark.parametrize("need_weights", [False, True])
def test_multi_head_attention_fast_path_equals_its_slow_path(
    fastpath: Callable[[bool], None], need_weights: bool
) -> None:
    b, length, e, heads = 2, 6, 16, 4
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(e, heads, batch_first=True).eval()
    x = randn(b, length, e)
    tokens = b * length
    expected = tokens * e * e + 2 * tokens * e * e + 2 * tokens * length * e + tokens * e * e
    with torch.no_grad():
        fast_total, fast_counts = flops(lambda: mha(x, x, x, need_weights=need_weights), True)
        fastpath(False)
        with sdpa_kernel(SDPBackend.MATH):
            slow_total, _ = flops(lambda: mha(x, x, x, need_weights=need_weights))
        fastpath(True)
        reference = flops(lambda: mha(x, x, x, need_weights=need_weights), reference=True)
    assert fast_counts == {"aten._native_multi_head_attention": 2 * expected}
    assert fast_total == slow_total == 2 * expected
    assert reference == (fast_total, fast_counts)


def test_native_mha_formula_with_a_longer_key() -> None:
    # q [B, Lq, E], k [B, Lk, E]: projections of Lq queries, Lk keys and values, QKᵀ and PV.
    assert macs("native_mha", [(2, 3, 8), (2, 5, 8)]) == (
        6 * 64 + 2 * 10 * 64 + 2 * 6 * 5 * 8 + 6 * 64
    )


def test_the_reference_formulas_cover_every_op_the_extras_count() -> None:
    """The suite-wide check counts each op FlopCounterMode lacks with a formula of its own: a
    new ``MAC_OPS`` entry without one fails here, not silently in the check."""
    aten_ops = {
        packet for packet in REFERENCE_FORMULAS if packet._qualified_op_name.startswith("aten")
    }
    assert aten_ops == set(flop_counter_extras())


# -- the table and its helpers ----------------------------------------------------------------


def test_macs_formulas_by_hand() -> None:
    assert macs("mm", [(8, 64), (64, 32)]) == 16384
    assert macs("mm", [(64,), (64,)]) == 64  # dot
    assert macs("mm", [(8, 64), (64,)]) == 512  # mv
    assert macs("mm", [(64,), (3, 64, 32)]) == 3 * 64 * 32  # a vector against a batch
    assert macs("mm", [(2, 1, 8, 64), (5, 64, 32)]) == 10 * 8 * 64 * 32  # broadcast batch
    assert macs("linear", [(2, 3, 64), (32, 64)]) == 6 * 64 * 32
    params = conv_params(False, [1, 1], [1, 1], [1, 1])
    assert macs("conv", [(1, 3, 8, 8), (4, 3, 3, 3)], params) == 6912
    assert macs("conv", [(3, 8, 8), (4, 3, 3, 3)], params) == 6912  # unbatched
    assert macs("sdpa", [(2, 4, 6, 8), (2, 1, 7, 8), (2, 1, 7, 16)]) == 8 * 6 * 7 * 24
    assert macs("encoder_layer", [(1, 4, 8), (24, 8), (16, 8)]) == (
        4 * 8 * 24 + 2 * 4 * 4 * 8 + 4 * 8 * 8 + 2 * 4 * 8 * 16
    )
    with pytest.raises(ValueError, match=r"unknown MAC formula 'fft'"):
        macs("fft", [(1,)])  # type: ignore[arg-type]


def test_every_table_entry_uses_a_known_formula() -> None:
    assert set(FORMULAS) == {op.formula for op in MAC_OPS.values()}
    for packet, op in MAC_OPS.items():
        assert isinstance(packet, torch._ops.OpOverloadPacket)
        assert isinstance(op, MacOp)
        schema_args = len(packet.default._schema.arguments)
        assert max(op.operands) < schema_args, packet


def test_shape_text() -> None:
    assert shape_text("mm", [(8, 64), (64, 32)]) == "[8, 64] x [64, 32]"
    assert shape_text("linear", [torch.Size([2, 64]), (32, 64)]) == "[2, 64] x [32, 64]"
    assert shape_text("conv", [(1, 3, 8, 8), (4, 3, 3, 3)]) == "x[1, 3, 8, 8] w[4, 3, 3, 3]"
    assert shape_text("sdpa", [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6)]) == (
        "q[1, 2, 3, 4] k[1, 2, 5, 4] v[1, 2, 5, 6]"
    )
    assert shape_text("mm", [(64,), (64,)]) == "[64] x [64]"


def test_mac_op_of_overloads_packets_and_other_targets() -> None:
    assert mac_op(aten.mm) is mac_op(aten.mm.default) is mac_op(aten.mm.out) is MAC_OPS[aten.mm]
    conv = mac_op(aten.convolution.default)
    assert conv is not None
    assert conv.formula == "conv"
    assert mac_op(aten.addmm.default) == MacOp("mm", (1, 2))
    assert mac_op(aten.add.Tensor) is None
    assert mac_op(aten.add) is None
    assert mac_op(torch.add) is None
    assert mac_op("mm") is None
    assert mac_op([aten.mm]) is None  # unhashable: not a MAC op, not an error
    assert mac_op(None) is None


def test_mac_op_params_and_count_from_op_arguments() -> None:
    x, w = torch.empty(2, 3, 9, device="meta"), torch.empty(4, 3, 3, device="meta")
    args = (x, w, None, [2], [1], [1], False, [0], 1)
    op = mac_op(aten.convolution)
    assert op is not None
    assert op.params(args) == [0, 2, 1, 1]
    assert op.count(args) == 2 * 5 * 4 * 3 * 3  # out (9 + 2 − 3)//2 + 1 = 5
    # FlopCounterMode passes shapes for tensors.
    assert op.count((x.shape, w.shape, *args[2:])) == op.count(args)
    mm = mac_op(aten.mm)
    assert mm is not None
    assert mm.params((x, w)) == []
