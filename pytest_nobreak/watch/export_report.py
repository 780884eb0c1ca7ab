"""What an export check found, as a report: the modes, the kinds of findings with their
hints, :class:`ExportReport` and the error a marked test fails with."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from pytest_nobreak.watch.compile_report import CompileReport, GraphBreakError

#: The export modes, in the order they run and are preferred for ``ExportReport.program``.
MODES = ("non-strict", "strict")
EXPORT_TITLE = "torch.export did not produce a sound program"
#: ``BreakEvent.gb_type`` of draft_export's findings, by ``FailureType`` name.
FINDINGS = {
    "DATA_DEPENDENT_ERROR": "Data-dependent expression guessed",
    "MISSING_FAKE_KERNEL": "Missing fake kernel",
    "MISMATCHED_FAKE_KERNEL": "Mismatched fake kernel",
    "GUARD_ADDED": "Guard on a dynamic dimension",
}
HINTS = {
    "DATA_DEPENDENT_ERROR": "Add torch._check(...) for the assumption, or rewrite the branch "
    "with torch.cond / torch.where.",
    "MISSING_FAKE_KERNEL": "Register one with @torch.library.register_fake (it computes the "
    "output's shape and dtype from the inputs').",
    "MISMATCHED_FAKE_KERNEL": "Make the fake kernel compute the real kernel's output shape, "
    "dtype and strides.",
    "GUARD_ADDED": "Remove the shape test from the traced code, or declare the dimension "
    "static (Dim.STATIC) if it really is.",
}
SPECIALIZED_HINT = (
    "The exported program only accepts the example's size there: remove the shape-dependent "
    "code, or declare the dimension static if that is what it is."
)
NARROWED_HINT = (
    "The exported program rejects sizes outside {got}: remove the shape test, or declare the "
    "range the model really supports (Dim(..., min=, max=))."
)
#: How a narrowed dimension's reason says its range, and an ``allow=`` pattern for it; how a
#: reason says the dimension was made static, or kept dynamic with sizes the program rejects.
NARROWED_WORDS = "exported in"
STATIC_WORDS = "exported static"
REJECTED_WORDS = "exported dynamic, but the program rejects"
NARROWED = re.escape(NARROWED_WORDS + " [")


class ExportError(GraphBreakError):
    """An exported program has problems; the message lists every one."""


@dataclasses.dataclass
class ExportReport(CompileReport):
    """What :func:`export_check` found: the problems (``breaks``), and the programs.

    ``programs`` holds the ``ExportedProgram`` of each mode that exported, ``errors`` the
    exception of each that did not; ``draft`` is draft_export's program (``None`` when it was
    not run or raised).
    """

    programs: dict[str, Any] = dataclasses.field(default_factory=dict)
    errors: dict[str, BaseException] = dataclasses.field(default_factory=dict)
    draft: Any = None
    #: The program lowered to the DUT (``asic_backend.lower_exported``), when asked for.
    lowered: Any = None
    #: The modes whose program raised on the example inputs (the model ran on them).
    broken: set[str] = dataclasses.field(default_factory=set)

    @property
    def program(self) -> Any:
        """The first program that exported and runs on the example inputs (non-strict before
        strict), else the first that exported; raises :class:`ExportError` when no mode
        exported."""
        exported = [mode for mode in MODES if mode in self.programs]
        if exported:  # min: the first of those that run, else the first
            return self.programs[min(exported, key=lambda mode: mode in self.broken)]
        raise ExportError(self.render(self.events, title=EXPORT_TITLE), self.events)

    def check(  # type: ignore[override]
        self, *, allow: Sequence[str | re.Pattern[str]] = (), scope: Any = "all"
    ) -> None:
        """Raise :class:`ExportError` listing every problem ``allow`` (regexes searched in the
        id, type, reason and ``file:line``) does not match; ``scope="own"``: only those in
        the user's code."""
        try:
            super().check(allow=allow, scope=scope, title=EXPORT_TITLE)
        except GraphBreakError as exc:
            raise ExportError(str(exc), exc.breaks) from None
