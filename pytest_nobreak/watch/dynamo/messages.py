"""Dynamo's graph-break text, parsed: the chain of breaks, each with its type, explanation, hints
and GBxxxx id."""

from __future__ import annotations

import dataclasses
import re

import torch
import torch._dynamo

_GB_LINK_RE = re.compile(r"/gb/gb(\d+)\.html")


_FIELD_RE = re.compile(r"^\s{0,4}(Explanation|Hint|Developer debug context):\s?(.*)$")


#: Between two breaks of a chain in a Dynamo message (the first is the root cause).
_CHAIN_SEPARATOR = "*** While handling this graph break, another graph break occurred: ***"


#: A higher-order op (``torch.cond``, ...) whose subgraph broke: the inner break follows.
_HOP_SEPARATOR = "Got graph break/error:"


_HOP_NAME_RE = re.compile(r"^\s*Higher Order Operator: (\S+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ParsedMessage:
    """A ``format_graph_break_message()`` text split into its fields."""

    gb_type: str
    explanation: str
    hints: tuple[str, ...]
    gb_id: str | None


def parse_graph_break_message(msg: str) -> ParsedMessage:
    lines = msg.splitlines()
    gb_type = lines[0].strip() if lines else ""
    explanation: list[str] = []
    hints: list[str] = []
    field = None
    for raw in lines[1:]:
        if raw.startswith("*** While handling this graph break") or raw.startswith(
            " For more details"
        ):
            break
        m = _FIELD_RE.match(raw)
        if m:
            field, value = m.groups()
            if field == "Explanation":
                explanation.append(value.strip())
            elif field == "Hint":
                hints.append(value.strip())
        # Continuation lines (graph dumps, "While executing %node ...") are left out: the
        # message names the user's line instead.
    link = _GB_LINK_RE.search(msg)
    return ParsedMessage(
        gb_type=gb_type,
        explanation=explanation[0] if explanation else "",
        hints=tuple(h for h in hints if h),
        gb_id=f"GB{link.group(1)}" if link else None,
    )


def parse_chain(msg: str, text: str = "") -> list[ParsedMessage]:
    """The breaks of a message, root cause first; one for a break that is not chained.

    ``text``: the exception's ``str()``, which alone names a higher-order op.
    """
    head, hop, inner = msg.partition(_HOP_SEPARATOR)
    if hop:
        name = _HOP_NAME_RE.search(text or msg)
        wrapper = ParsedMessage(
            gb_type=f"{name.group(1) if name else 'higher-order op'} not captured whole",
            explanation=head.strip(),
            hints=(),
            gb_id=None,
        )
        return [*parse_chain(inner.strip("\n"), text), wrapper]
    return [parse_graph_break_message(part.strip("\n")) for part in msg.split(_CHAIN_SEPARATOR)]


def gb_link(gb_type: str | None) -> str | None:
    """The graph-break documentation page for a ``gb_type``, if torch's registry knows it."""
    if not gb_type:
        return None
    getter = getattr(torch._dynamo.exc, "get_gbid_documentation_link", None)
    if getter is None:
        return None
    try:
        link = getter(gb_type)
    except Exception:  # the registry is data shipped with torch; a bad file must not crash tests
        return None
    return link if link and _GB_LINK_RE.search(link) else None


def gb_id_of_link(link: str | None) -> str | None:
    m = _GB_LINK_RE.search(link or "")
    return f"GB{m.group(1)}" if m else None
