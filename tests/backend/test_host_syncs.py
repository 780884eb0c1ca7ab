"""The host-sync detector on hand-made graphs: the forms a CPU-only compile cannot produce
(a copy from an accelerator, an op known only by its tags) and the grouping by place."""

from __future__ import annotations

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from asic_backend.lower.host_syncs import FORMS, find_host_syncs, sync_form


def _graph(method: str, value_in: torch.Tensor, value_out: torch.Tensor) -> fx.Node:
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_method(method, (x,))
    graph.output(y)
    x.meta["example_value"] = value_in
    y.meta["example_value"] = value_out
    return y


def test_a_copy_from_an_accelerator_to_the_host_is_a_sync() -> None:
    with FakeTensorMode():
        on_gpu = torch.empty(4, device="cuda")
        on_host = on_gpu.cpu()
        host = torch.empty(4)
    assert sync_form(_graph("cpu", on_gpu, on_host)) == FORMS["copy"]
    assert sync_form(_graph("cpu", host, host)) is None  # already on the host
    assert sync_form(_graph("cuda", host, on_gpu)) is None  # host to device: no wait
    # A host tensor made from a device one's metadata reads no data back.
    assert sync_form(_graph("new_zeros", on_gpu, host)) is None


def test_an_op_known_only_by_its_tags_is_a_sync() -> None:
    """Without a fake value (a graph built by hand, a pass that dropped it), the tags decide:
    ``_local_scalar_dense`` reads data, ``nonzero`` may have a data-dependent size."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    scalar = graph.call_function(torch.ops.aten._local_scalar_dense.default, (x,))
    nz = graph.call_function(torch.ops.aten.nonzero.default, (x,))
    plain = graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.output((scalar, nz, plain))
    assert sync_form(scalar) == FORMS["output"]
    assert sync_form(nz) == FORMS["shape"]
    assert sync_form(plain) is None


def test_syncs_are_grouped_by_op_and_place_with_their_count() -> None:
    torch._dynamo.reset()
    found = []

    def backend(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        found.extend(find_host_syncs(gm))
        return gm.forward

    def f(h: torch.Tensor) -> torch.Tensor:
        a, b = (h > 0).long()[:2].tolist()  # two reads, one line
        return h * a + h.sum().item() * b

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch.compile(f, backend=backend)(torch.randn(4))
    ops = [(s.op, s.form, s.count, s.frames[-1][2]) for s in found]
    assert ops == [
        ("Tensor.tolist", FORMS["scalar"], 2, "f"),
        ("Tensor.item", FORMS["scalar"], 1, "f"),
    ]
    assert all(sync.fix for sync in found)
