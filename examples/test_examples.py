"""The example suite: what pytest-nobreak catches, and what a clean model looks like.

Run it with ``pytest examples --asic-backend -v``. The two models that do not compile whole are
marked ``xfail(strict=True, raises=pytest.fail.Exception)``: the plugin fails them, so they show
as expected failures (XFAIL) and the run exits 0; if a change made them compile whole, or made
them fail another way (a crash), they would turn red.
"""

from __future__ import annotations

import pytest
import torch

from examples.models import MLP, GatedMLP, naive_asic_backend

pytestmark = pytest.mark.no_graph_break


def test_mlp_compiles_whole(nobreak_compile, nobreak_report):  # type: ignore[no-untyped-def]
    model = nobreak_compile(MLP())
    with torch.no_grad():
        for batch in (4, 8):
            model(torch.randn(batch, 64))
    assert nobreak_report.graph_breaks == 0


@pytest.mark.xfail(
    reason="GatedMLP branches on a tensor value: a graph break",
    strict=True,
    raises=pytest.fail.Exception,
)
def test_data_dependent_branch_is_caught(nobreak_compile):  # type: ignore[no-untyped-def]
    model = nobreak_compile(GatedMLP())
    with torch.no_grad():
        model(torch.randn(4, 64))


@pytest.mark.xfail(
    reason="the seed: the naive backend falls back to eager (gb0219)",
    strict=True,
    raises=pytest.fail.Exception,
)
def test_naive_backend_fallback_is_caught():  # type: ignore[no-untyped-def]
    model = torch.compile(MLP(), backend=naive_asic_backend)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 64))
