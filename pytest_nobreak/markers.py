"""The ``no_graph_break`` marker: its documentation line and strict option parsing."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from typing import Any, Literal

from pytest_nobreak.watch.events import SCOPES, Scope

MARKER = "no_graph_break"
MARKER_DOC = (
    f"{MARKER}(max_recompiles=None, allow=(), allow_host_fallback=False, max_host_syncs=None, "
    "scope=None): fail the test on any torch.compile graph break, eager fallback or (under "
    "--asic-backend) host fallback or host sync. allow: regexes of known breaks to tolerate; "
    "max_recompiles: gate recompiles; max_host_syncs: gate device-to-host syncs (default under "
    "--asic-backend: 0); scope: 'own' fails only on problems in your own code, 'all' on every "
    "one (default: --nobreak-scope)."
)


#: ``max_host_syncs`` when the marker does not give it: the backend decides.
BACKEND_DEFAULT: Literal["backend"] = "backend"


class MarkerError(ValueError):
    """A ``no_graph_break`` marker was given options it does not take."""


@dataclasses.dataclass(frozen=True)
class NoGraphBreakOptions:
    """Validated options of one test's ``@pytest.mark.no_graph_break(...)``.

    >>> options = NoGraphBreakOptions.from_kwargs({"allow": [r"GB0170"]}, where="t.py::test")
    >>> options.allow, options.max_host_syncs
    (('GB0170',), 'backend')

    ``max_host_syncs`` not given leaves host syncs to the backend's default (``"backend"``):
    none allowed on the simulated ASIC (``--asic-backend``), reported but not failed under any
    other; ``max_host_syncs=None`` reports them and fails on none, whatever the backend.
    ``scope`` not given (``None``) is the session's ``--nobreak-scope``; ``"own"`` fails the
    test only on problems in the user's own code, ``"all"`` on every one.
    """

    max_recompiles: int | None = None
    allow: tuple[str, ...] = ()
    allow_host_fallback: bool = False
    max_host_syncs: int | Literal["backend"] | None = BACKEND_DEFAULT
    scope: Scope | None = None

    @classmethod
    def from_kwargs(
        cls, kwargs: Mapping[str, Any], *, args: tuple[Any, ...] = (), where: str
    ) -> NoGraphBreakOptions:
        def fail(problem: str) -> MarkerError:
            return MarkerError(f"{where}: @pytest.mark.{MARKER}: {problem}")

        if args:
            raise fail(
                f"takes keyword options only, got positional {args!r}; "
                f"e.g. @pytest.mark.{MARKER}(allow=[...])"
            )
        known = [f.name for f in dataclasses.fields(cls)]
        for name in kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                suggestion = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(
                    f"unknown option {name!r}{suggestion}; known options: {', '.join(known)}"
                )

        max_recompiles = kwargs.get("max_recompiles")
        if max_recompiles is not None and (
            isinstance(max_recompiles, bool)
            or not isinstance(max_recompiles, int)
            or max_recompiles < 0
        ):
            raise fail(f"max_recompiles must be a non-negative int or None, got {max_recompiles!r}")

        max_host_syncs = kwargs.get("max_host_syncs", BACKEND_DEFAULT)
        if (
            "max_host_syncs" in kwargs
            and max_host_syncs is not None
            and (
                isinstance(max_host_syncs, bool)
                or not isinstance(max_host_syncs, int)
                or max_host_syncs < 0
            )
        ):
            raise fail(f"max_host_syncs must be a non-negative int or None, got {max_host_syncs!r}")

        allow_raw = kwargs.get("allow", ())
        if isinstance(allow_raw, (str, re.Pattern)):
            allow_raw = (allow_raw,)
        if not isinstance(allow_raw, (list, tuple)):
            raise fail(f"allow must be a list of regex strings, got {allow_raw!r}")
        allow: list[str] = []
        for pattern in allow_raw:
            text = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
            if not isinstance(text, str):
                raise fail(f"allow entries must be regex strings, got {pattern!r}")
            try:
                re.compile(text)
            except re.error as exc:
                raise fail(f"allow pattern {text!r} is not a valid regex: {exc}") from None
            allow.append(text)

        allow_host_fallback = kwargs.get("allow_host_fallback", False)
        if not isinstance(allow_host_fallback, bool):
            raise fail(f"allow_host_fallback must be True or False, got {allow_host_fallback!r}")
        scope = kwargs.get("scope")
        if scope is not None and not isinstance(scope, str):
            raise fail(
                f"scope must be one of {', '.join(map(repr, SCOPES))} or None, got {scope!r}"
            )
        if scope is not None and scope not in SCOPES:
            close = difflib.get_close_matches(scope, SCOPES, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            raise fail(
                f"scope must be one of {', '.join(map(repr, SCOPES))} or None, "
                f"got {scope!r}{suggestion}"
            )
        return cls(
            max_recompiles=max_recompiles,
            allow=tuple(allow),
            allow_host_fallback=allow_host_fallback,
            max_host_syncs=max_host_syncs,
            scope=scope,  # type: ignore[arg-type]
        )
