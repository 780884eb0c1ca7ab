"""Autocast blocks of an exported program, opened up as ``torch.compile`` sees them.

``torch.export`` turns ``with torch.autocast(...)`` in ``forward`` into a
``wrap_with_autocast`` higher-order op whose body is a subgraph; Dynamo, compiling the same
code, inlines the block between ``_enter_autocast`` and ``_exit_autocast`` calls. Left as it
is, the op costs an exported program two things the compiled model does not pay: Dynamo cannot
trace a body that uses a dynamic size ("wrap_with_autocast: unexpected freevars"), and the mark
:func:`~asic_backend.lower.aten.tag_region` puts on an ``einsum`` inside a body never reaches
the ``bmm`` AOTAutograd makes of it, which then stays on the host (Mochi's rotary ``einsum``,
in ``torch.autocast(..., torch.float32)``, was one). :func:`inline_autocast` rewrites each such
op of the program's module into the form Dynamo gives the block, before Dynamo traces it, so
an exported program lowers as the compiled model does.

>>> module = program.module()
>>> inline_autocast(module)   # the number of autocast blocks opened up
1
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

__all__ = ["inline_autocast"]


def _autocast_op() -> Any:
    return getattr(torch.ops.higher_order, "wrap_with_autocast", None)


def inline_autocast(gm: fx.GraphModule) -> int:
    """Replace every ``wrap_with_autocast`` call of ``gm`` (and of the bodies it inlines) by
    its body between ``_enter_autocast`` and ``_exit_autocast``, in place; the count."""
    op = _autocast_op()
    if op is None:
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is op and _inline(gm, node):
            count += 1
    if count:
        gm.delete_all_unused_submodules()
        gm.graph.lint()
        gm.recompile()
    return count


def _inline(gm: fx.GraphModule, node: fx.Node) -> bool:
    device, dtype, enabled, cache, body_node, *args = node.args
    if not (isinstance(body_node, fx.Node) and body_node.op == "get_attr") or node.kwargs:
        return False
    if any(u.target is not operator.getitem or not isinstance(u.args[1], int) for u in node.users):
        return False  # not the getitem form Dynamo gives a multi-output op: left as it is
    body = getattr(gm, str(body_node.target))
    if not isinstance(body, fx.GraphModule):
        return False
    inline_autocast(body)  # an autocast block inside this one
    graph = gm.graph
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        return False
    env.update(zip(placeholders, args, strict=True))
    outputs: Any = ()
    with graph.inserting_before(node):
        enter = graph.call_function(
            torch.amp.autocast_mode._enter_autocast, (device, dtype, enabled, cache)
        )
        for inner in body.graph.nodes:
            if inner.op == "placeholder":
                continue
            if inner.op == "output":
                outputs = inner.args[0]
                break
            if inner.op == "get_attr":  # the body's own attribute (a nested subgraph)
                name = _free_name(gm, f"{body_node.target}_{inner.target}")
                gm.register_module(name, getattr(body, str(inner.target)))
                env[inner] = graph.get_attr(name)
                env[inner].meta = dict(inner.meta)
                continue
            env[inner] = graph.node_copy(inner, lambda n: env[n])
        graph.call_function(torch.amp.autocast_mode._exit_autocast, (enter,))
    results = fx.map_arg(outputs, lambda n: env[n])
    for user in list(node.users):
        user.replace_all_uses_with(results[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(node)
    if not body_node.users:
        graph.erase_node(body_node)
    return True


def _free_name(gm: fx.GraphModule, base: str) -> str:
    name, index = base, 0
    while hasattr(gm, name):
        index += 1
        name = f"{base}_{index}"
    return name
