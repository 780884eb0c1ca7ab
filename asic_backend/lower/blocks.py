"""``torch.autocast`` and ``torch.no_grad`` blocks of an exported program, opened up as
``torch.compile`` sees them.

``torch.export`` turns ``with torch.autocast(...)`` in ``forward`` into a ``wrap_with_autocast``
higher-order op whose body is a subgraph (``with torch.no_grad()``, when it changes the grad
mode, into ``wrap_with_set_grad_enabled``); Dynamo, compiling the same code, inlines the block
between the calls that enter and leave it (``_enter_autocast`` / ``_exit_autocast``,
``_set_grad_enabled``). Left as they are, the ops cost an exported program what the compiled
model does not pay: Dynamo cannot trace an autocast body that uses a dynamic size
("wrap_with_autocast: unexpected freevars"), nor an autocast block opened inside a grad-mode
body; and the mark :func:`~asic_backend.lower.aten.tag_region` puts on an ``einsum`` inside a
body never reaches the ``bmm`` AOTAutograd makes of it, which then stays on the host
(Mochi's rotary ``einsum``, in ``torch.autocast(..., torch.float32)``, was one).
:func:`open_blocks` rewrites each such op of the program's module into the form Dynamo gives
the block, before Dynamo traces it, so an exported program lowers as the compiled model does.

>>> module = program.module()
>>> open_blocks(module)   # the number of blocks opened up
1
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import fx

from asic_backend.lower.fx_nodes import graph_modules

__all__ = ["open_blocks"]


def _enter_autocast(graph: fx.Graph, state: tuple[Any, ...]) -> Any:
    return graph.call_function(torch.amp.autocast_mode._enter_autocast, state)


def _exit_autocast(graph: fx.Graph, entered: Any) -> None:
    graph.call_function(torch.amp.autocast_mode._exit_autocast, (entered,))


def _enter_grad(graph: fx.Graph, state: tuple[Any, ...]) -> Any:
    before = graph.call_function(torch.is_grad_enabled, ())
    graph.call_function(torch._C._set_grad_enabled, state)
    return before


def _exit_grad(graph: fx.Graph, before: Any) -> None:
    graph.call_function(torch._C._set_grad_enabled, (before,))


class _Block(NamedTuple):
    """A context manager export makes a higher-order op of: how many of the op's arguments
    before the body are the manager's state, and the calls that enter and leave it as Dynamo
    emits them for the same block in a compiled model."""

    state_args: int
    enter: Callable[[fx.Graph, tuple[Any, ...]], Any]
    leave: Callable[[fx.Graph, Any], None]


#: By op name. Dynamo traces neither op's body when it uses a dynamic size, nor an opened
#: autocast block inside a ``set_grad_enabled`` body.
_BLOCKS: dict[str, _Block] = {
    "wrap_with_autocast": _Block(4, _enter_autocast, _exit_autocast),
    "wrap_with_set_grad_enabled": _Block(1, _enter_grad, _exit_grad),
}


def _block_ops() -> dict[Any, _Block]:
    """The ops of :data:`_BLOCKS` this torch has."""
    ops = {getattr(torch.ops.higher_order, name, None): block for name, block in _BLOCKS.items()}
    ops.pop(None, None)
    return ops


def open_blocks(gm: fx.GraphModule) -> int:
    """Replace every ``wrap_with_autocast`` and ``wrap_with_set_grad_enabled`` call of ``gm``
    and of the subgraphs it calls by its body between the calls that enter and leave the
    block, in place; the count. A subgraph is rewritten as a copy: ``program.module()``
    shares them with the ``ExportedProgram``, which stays as it was."""
    ops = _block_ops()
    count = _open_subgraphs(gm, ops)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in ops and _inline(gm, node, ops):
            count += 1
    if count:
        gm.delete_all_unused_submodules()
        gm.graph.lint()
        gm.recompile()
    return count


def _open_subgraphs(gm: fx.GraphModule, ops: dict[Any, _Block]) -> int:
    """The blocks inside the subgraphs ``gm`` calls, each subgraph replaced by a copy first."""
    count = 0
    for name in dict.fromkeys(str(n.target) for n in gm.graph.nodes if n.op == "get_attr"):
        sub = getattr(gm, name, None) if "." not in name else None
        if isinstance(sub, fx.GraphModule) and _holds(sub, ops):
            own = copy.deepcopy(sub)
            count += open_blocks(own)
            gm.register_module(name, own)
    return count


def _holds(gm: fx.GraphModule, ops: dict[Any, _Block]) -> bool:
    return any(n.target in ops for m in graph_modules(gm) for n in m.graph.nodes)


def _inline(gm: fx.GraphModule, node: fx.Node, ops: dict[Any, _Block]) -> bool:
    state_args, enter, leave = ops[node.target]
    state, (body_node, *args) = tuple(node.args[:state_args]), node.args[state_args:]
    if not (isinstance(body_node, fx.Node) and body_node.op == "get_attr") or node.kwargs:
        return False
    if any(u.target is not operator.getitem or not isinstance(u.args[1], int) for u in node.users):
        return False  # not the getitem form Dynamo gives a multi-output op: left as it is
    body = getattr(gm, str(body_node.target))
    if not isinstance(body, fx.GraphModule):
        return False
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        return False
    # The body is read, never written: its own blocks were opened on a copy (_open_subgraphs).
    graph = gm.graph
    env: dict[fx.Node, Any] = dict(zip(placeholders, args, strict=True))
    outputs: Any = ()
    with graph.inserting_before(node):
        entered = enter(graph, state)
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
        leave(graph, entered)
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
