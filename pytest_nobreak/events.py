"""What a watched block produced: break events and the per-test integer figures.

These two records are the project's data model. The failure message, the JSON report, the
baseline file and the JUnit properties are all rendered from them, so their field names are the
schema (DESIGN.md, "Reports") and live only here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, get_args

BreakKind = Literal[
    "graph_break",  # the frame was split; both halves still compiled
    "eager_fallback",  # a whole frame ran eagerly (skip, loop break, silent stance)
    "backend_error",  # the backend compiler failed and Dynamo fell back (gb0219, the seed)
    "recompile_limit",  # the recompile limit was hit; unmatched inputs now run eagerly
    "recompile",  # more recompiles than the marker's max_recompiles allows
    "host_fallback",  # under the ASIC backend, a linear ran on the host instead of the DUT
]
BREAK_KINDS: tuple[str, ...] = get_args(BreakKind)

CORE_FIGURES = ("graphs", "graph_breaks", "eager_frames", "recompiles")
ASIC_FIGURES = ("dut_ops", "host_fallbacks", "macs", "cycles")
ALL_FIGURES = CORE_FIGURES + ASIC_FIGURES


@dataclasses.dataclass(frozen=True)
class BreakEvent:
    """One reason a watched region did not run as one compiled graph.

    ``file``/``line`` point at the user's code (the innermost user frame Dynamo reported),
    ``source`` is that line's text, ``reason`` the one-line explanation and ``hints`` Dynamo's
    hints, in order.
    """

    kind: BreakKind
    gb_type: str
    gb_id: str | None = None
    file: str | None = None
    line: int | None = None
    source: str | None = None
    reason: str = ""
    hints: tuple[str, ...] = ()
    link: str | None = None

    @property
    def location(self) -> str:
        if self.file is None:
            return "<unknown location>"
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def dedupe_key(self) -> tuple[object, ...]:
        return (self.kind, self.gb_type, self.file, self.line, self.reason)

    def to_json(self) -> dict[str, Any]:
        """The event as it appears under ``breaks`` in the JSON report."""
        return {
            "kind": self.kind,
            "gb_id": self.gb_id,
            "gb_type": self.gb_type,
            "file": self.file,
            "line": self.line,
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True)
class Figures:
    """The integer figures of one test: what the baseline stores and CI gates on.

    Which way each figure should move is ``baseline.BETTER`` (only ``dut_ops`` is "higher is
    better"). ASIC figures are ``None`` when the test ran no ASIC backend.
    """

    graphs: int = 0
    graph_breaks: int = 0
    eager_frames: int = 0
    recompiles: int = 0
    dut_ops: int | None = None
    host_fallbacks: int | None = None
    macs: int | None = None
    cycles: int | None = None

    def core(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in CORE_FIGURES}

    def asic(self) -> dict[str, int] | None:
        if self.dut_ops is None:
            return None
        return {name: int(getattr(self, name) or 0) for name in ASIC_FIGURES}

    def as_dict(self) -> dict[str, int]:
        """Every figure that was measured, flat (the baseline entry)."""
        out = self.core()
        out.update(self.asic() or {})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Figures:
        return cls(**{k: int(v) for k, v in data.items() if k in ALL_FIGURES})
