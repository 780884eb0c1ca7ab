"""Check the ``torch.export`` path: what a device toolchain is handed, not what a JIT runs.

>>> import pytest_nobreak
>>> result = pytest_nobreak.export_check(model, (x,), dynamic_shapes=({0: Dim("batch")},))
>>> result.check()        # raises ExportError listing every problem, if any
>>> ep = result.program   # the non-strict ExportedProgram (else the strict one)

Export fails differently from compile: a break is an exception, not a fallback, and the quiet
failures are the ones that reach the device. ``export_check`` exports the model in each mode
asked for (non-strict and strict by default), and makes a problem (a
:class:`~pytest_nobreak.watch.events.BreakEvent`, rendered like a break) of:

- each mode that raised (``export_error``), at the user's line, with Dynamo's gb id if any;
- each finding of ``torch.export.draft_export`` (``export_unsound``): a data-dependent
  expression it had to guess, a custom op with no fake kernel or one that disagrees with the
  real kernel, a guard that constrained a dimension the user declared dynamic;
- each dimension the user declared dynamic (``Dim``, ``Dim.AUTO``, ``Dim.DYNAMIC``) that the
  program made static or narrower than asked (``specialized_dim``), named
  ``args[0] dim 0 (batch)``;
- strict and non-strict programs that disagree, in their ops or their outputs on the example
  inputs, a program whose outputs differ from the eager model's, or one that raises on the
  inputs the model ran on (``export_mismatch``);
- each host sync a program holds (``export_sync``: ``.item()``, a boolean mask), where the
  device that runs it would stop and wait for the host.

Importing this module does not import torch; ``export_check`` does.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pytest_nobreak.watch.events import BreakEvent
from pytest_nobreak.watch.export_program import (
    FILE_LINE,
    _bad_spec,
    _bound,
    _Declared,
    _declared_dims,
    _differ,
    _finding_reason,
    _head,
    _input_path,
    _intern_table,
    _named_autos,
    _named_expr,
    _op_counts,
    _op_stack,
    _quiet,
    _resized,
    _tensor_pairs,
    _user_input_values,
    _without_expression_stacks,
    combine_args,
)
from pytest_nobreak.watch.export_report import (
    FINDINGS,
    HINTS,
    MODES,
    NARROWED_HINT,
    NARROWED_WORDS,
    REJECTED_WORDS,
    SPECIALIZED_HINT,
    STATIC_WORDS,
    ExportReport,
)
from pytest_nobreak.watch.monitor import Monitor, chained_event
from pytest_nobreak.watch.monitor import where_fields as _where
from pytest_nobreak.watch.sites import Frame, Location, is_user_file, library_name, locate

#: Dynamic dimensions may always be specialized at 0 and 1 (export's 0/1 specialization):
#: a lower bound up to this is not a narrowing.
_ZERO_ONE = 2


def export_check(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool | None = None,
    draft: bool = True,
    asic: bool = False,
    device: Any = None,
    root: str | None = None,
    first_party: Sequence[str] = (),
    caller: Sequence[Frame] = (),
) -> ExportReport:
    """Export ``model`` (an ``nn.Module``) on ``args``/``kwargs`` and report every problem.

    ``strict=None`` exports in both modes, ``True`` or ``False`` in that one. ``draft``: also
    run ``torch.export.draft_export`` (non-strict) for its findings. ``asic``: also run the
    program on the simulated DUT (:func:`asic_backend.lower_exported` on ``device``, an
    ``AsicConfig``, preset or TOML path; ``None``: the default) on the example inputs and on
    a second size of each dynamic dimension, and check its outputs against eager within the
    int8 bound; the report then has the DUT figures and host fallbacks. ``root``: paths are
    relative to it (default: the working directory); ``first_party``: installed packages that
    are the user's code; ``caller``: the stack a problem with no line of its own is placed at
    (default: the caller of ``export_check``).

    Bad inputs (not a module, ``args`` not a tuple, ``strict`` not a bool) raise
    ``TypeError``; ``dynamic_shapes`` that do not fit the inputs raise the ``UserError`` of
    ``torch.export`` with its own message (nothing was exported).
    """
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from pytest_nobreak.watch import dynamo

    dynamo.check_torch()
    _check_inputs(torch, model, args, kwargs, strict)
    kwargs = dict(kwargs or {})
    here = list(caller) or _caller_stack()
    checker = _Checker(torch, model, args, kwargs, dynamic_shapes, root, first_party, here)
    modes = MODES if strict is None else (("strict",) if strict else ("non-strict",))
    report = checker.run(modes, draft=draft)
    if asic and report.programs:
        checker.run_on_dut(device)
    return report


def _check_inputs(torch: Any, model: Any, args: Any, kwargs: Any, strict: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"export_check: model must be a torch.nn.Module, not {type(model).__name__} "
            "(wrap a function in a Module whose forward calls it)"
        )
    if not isinstance(args, tuple):
        raise TypeError(
            f"export_check: args must be a tuple of the model's positional inputs, not "
            f"{type(args).__name__} (one input: (x,))"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"export_check: kwargs must be a mapping, not {type(kwargs).__name__}")
    if strict is not None and not isinstance(strict, bool):
        raise TypeError(f"export_check: strict must be True, False or None, not {strict!r}")


def _caller_stack() -> list[Frame]:
    """The stack outside this package, outermost first: where the user asked for the check."""
    frames = [Frame(f.filename, f.lineno, f.function) for f in inspect.stack()[1:]]
    return [f for f in reversed(frames) if "pytest_nobreak" not in f.file.replace("\\", "/")]


class _Checker:
    def __init__(
        self,
        torch: Any,
        model: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        dynamic_shapes: Any,
        root: str | None,
        first_party: Sequence[str],
        caller: list[Frame],
    ) -> None:

        self.torch = torch
        self.model = model
        self.args = args
        self.kwargs = kwargs
        self.dynamic_shapes = dynamic_shapes
        self.root = root or os.getcwd()
        self.first_party = tuple(first_party)
        self.caller = caller
        self.report = ExportReport()
        #: (input name, dim) -> the finding, expression and location of the first guard on it.
        self.guards: dict[tuple[str, int], tuple[BreakEvent, str, Location]] = {}
        #: Per program (by id), the inputs of one more size inside its dynamic range that it
        #: ran on; ``None`` when it has no dynamic dimension or rejected them.
        self.second: dict[int, tuple[tuple[Any, ...], dict[str, Any]] | None] = {}

    def run(self, modes: Sequence[str], *, draft: bool) -> ExportReport:
        report = self.report
        report.exports = 1
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo

        with _quiet(), dynamo.untapped():
            for mode in modes:
                try:
                    report.programs[mode] = self.torch.export.export(
                        self.model,
                        self.args,
                        self.kwargs,
                        dynamic_shapes=self.dynamic_shapes,
                        strict=mode == "strict",
                    )
                except Exception as exc:  # every failure is a finding
                    if _bad_spec(self.torch, exc):
                        raise
                    report.errors[mode] = exc
            if draft:
                self._draft()
        self._add_errors()
        self._add_syncs()
        self._add_specialized()
        self._add_mismatches()
        self._add_rejected_sizes()
        return report

    # ----------------------------------------------------------------- the modes' errors

    def _add_errors(self) -> None:
        """One entry per line of the user's code: both modes failing there is one problem
        (told by the mode whose error has a gb id, which has a fix). A draft_export finding
        at that line is the same problem seen once more, and is left out."""
        merged: dict[tuple[object, ...], tuple[BreakEvent, list[str]]] = {}
        for mode, exc in self.report.errors.items():
            event = self._error_event(exc)
            key = (event.file, event.line)
            known, modes = merged.get(key, (event, []))
            better = event if known.gb_id is None and event.gb_id is not None else known
            merged[key] = (better, [*modes, mode])
        for finding in [e for e in self.report.events if (e.file, e.line) in merged]:
            error, modes = merged[(finding.file, finding.line)]
            if error.gb_id is None:  # the finding names the problem better than an exception
                named = dataclasses.replace(
                    error,
                    gb_type=finding.gb_type,
                    hints=tuple(dict.fromkeys([*finding.hints, *error.hints])),
                )
                merged[(finding.file, finding.line)] = (named, modes)
        for event in [e for e in self.report.events if (e.file, e.line) in merged]:
            self.report.events.remove(event)
            del self.report.counts[event.dedupe_key()]
        for event, modes in merged.values():
            self.report.add(dataclasses.replace(event, detail=" and ".join(modes)))

    def _error_event(self, exc: BaseException) -> BreakEvent:
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo as tc

        text = str(exc)
        location = self._where_raised(exc)
        if isinstance(exc, self.torch._dynamo.exc.Unsupported):
            # Dynamo's break, as the compile path reads one (its chain, id, hints and docs).
            return chained_event(
                "export_error", tc.parse_chain(getattr(exc, "msg", text), text), location
            )
        lines = [ln.strip(" -") for ln in text.splitlines() if ln.strip()]
        head = lines[0] if lines else type(exc).__name__
        # A constraint violation's first line only says that one happened; the next says how.
        reason = " ".join(lines[:2]) if head.startswith("Constraints violated") else head
        return BreakEvent(
            kind="export_error",
            gb_type=type(exc).__name__,
            reason=reason,
            hints=tuple(ln for ln in lines if ln.lower().startswith("consider"))[:1],
            **_where(location),
        )

    def _where_raised(self, exc: BaseException) -> Location:
        """The user's line an export error is about: Dynamo's stack of the traced code, else
        the traceback's frames in the user's code, else a file:line the message names, else
        the first guard draft_export found, else the call of the check."""
        stack: list[Frame] = []
        real = getattr(exc, "real_stack", None)
        if real:
            stack = [Frame(f.filename, f.lineno, f.name) for f in real]
        if not any(is_user_file(f.file, self.first_party) for f in stack):
            tb = exc.__traceback__
            frames = []
            while tb is not None:
                code = tb.tb_frame.f_code
                frames.append(Frame(code.co_filename, tb.tb_lineno, code.co_name))
                tb = tb.tb_next
            # It starts in this module: the caller's frames are not in it.
            stack = frames if any(is_user_file(f.file, self.first_party) for f in frames) else []
        # Raised inside torch's tracer: the problem is the line that called into it.
        while stack and library_name(stack[-1].file) == "torch":
            stack.pop()
        if not stack:
            named = [Frame(m.group(1), int(m.group(2))) for m in FILE_LINE.finditer(str(exc))]
            stack = [f for f in named if is_user_file(f.file, self.first_party)][-1:]
        if not stack and self.guards:
            return next(iter(self.guards.values()))[2]
        return self._locate(stack)

    def _locate(self, stack: Sequence[Frame]) -> Location:
        """Where a problem is: its stack below the caller's (the test's line called it)."""
        return locate([*self.caller, *stack], self.root, self.first_party)

    # ----------------------------------------------------------------- draft_export

    def _draft(self) -> None:
        """draft_export's findings. Each ``Dim.AUTO`` of a top-level input goes in as a named
        ``Dim``: draft_export reports the guards that constrain a dimension only when a
        constraint is violated, and an AUTO one never is. A guard on such a dimension is only
        kept as the cause of a dimension the programs specialized (:meth:`_add_specialized`):
        what else AUTO allowed (two dimensions found equal) is no problem."""
        torch = self.torch
        shapes, relaxed = _named_autos(
            torch, self.model, self.args, self.kwargs, self.dynamic_shapes
        )
        try:
            with _without_expression_stacks():
                program = torch.export.draft_export(
                    self.model, self.args, self.kwargs, dynamic_shapes=shapes
                )
        except Exception:  # the modes' own errors already say why
            return
        self.report.draft = program
        files = {index: name for name, index in _intern_table(torch).items()}
        sources = self._input_sources()
        draft_report = getattr(program, "_report", None)
        for failure in getattr(draft_report, "failures", None) or ():
            kind = failure.failure_type.name
            data = dict(failure.data)
            stack = [
                Frame(files.get(frame["filename"], "<unknown>"), frame["line"], frame["name"])
                for frame in data.get("user_stack") or ()
            ]
            if not stack and "op" in data:  # a fake kernel's finding: where the op is called
                stack = _op_stack(program, str(data["op"]))
            location = self._locate(stack)
            event = BreakEvent(
                kind="export_unsound",
                gb_type=FINDINGS.get(kind, kind),
                reason=_finding_reason(kind, data),
                hints=(HINTS[kind],) if kind in HINTS else (),
                **_where(location),
            )
            dims = set()
            if kind == "GUARD_ADDED":
                named = _named_expr(str(data["expr"]), data.get("symbol_to_sources") or {}, sources)
                for symbol, source in (data.get("symbol_to_sources") or {}).items():
                    dim = sources.get(source)
                    if dim is not None and re.search(rf"\b{symbol}\b", str(data["expr"])):
                        dims.add(dim)
                        self.guards.setdefault(dim, (event, named, location))
            if kind == "GUARD_ADDED" and (dims <= relaxed or self.report.programs):
                # Pending: the cause of a specialized AUTO dimension, or nothing. A guard that
                # broke a declared range would have failed the export, and one did not (seen:
                # draft_export's real-tensor run guards a batch that export keeps dynamic).
                continue
            self.report.add(event)

    def _input_sources(self) -> dict[str, tuple[str, int]]:
        """``L['x'].size()[0]`` (how a guard names a dimension) -> (``x``, 0), per input."""
        out: dict[str, tuple[str, int]] = {}
        for name, value in combine_args(self.model, self.args, self.kwargs).items():
            if isinstance(value, self.torch.Tensor):
                for dim in range(value.dim()):
                    out[f"L[{name!r}].size()[{dim}]"] = (name, dim)
        return out

    # ----------------------------------------------------------------- host syncs

    def _add_syncs(self) -> None:
        """Every host sync an exported program holds (``.item()``, a boolean mask, ``nonzero``):
        the device that runs the program stops there for the host. One entry per op and line,
        naming the modes."""
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from asic_backend.lower.host_syncs import find_host_syncs

        found: dict[tuple[object, ...], tuple[BreakEvent, list[str]]] = {}
        for mode, program in self.report.programs.items():
            for sync in find_host_syncs(program.graph_module):
                stack = [Frame(file, line, function) for file, line, function in sync.frames]
                event = BreakEvent(
                    kind="export_sync",
                    gb_type=sync.op,
                    reason=(
                        f"the program makes the host wait for a device value ({sync.form}): a "
                        "device that runs it drains its queue, copies the value back and idles "
                        "until the host decides what comes next"
                    ),
                    fix=sync.fix,
                    **_where(self._locate(stack)),
                )
                found.setdefault(event.site_key(), (event, []))[1].append(mode)
        for event, modes in found.values():
            self.report.add(dataclasses.replace(event, detail=" and ".join(modes)))

    # ----------------------------------------------------------------- dynamic dimensions

    def _add_specialized(self) -> None:
        """Every declared dynamic dimension the programs made static or narrowed: one entry
        per dimension, naming the modes. Read from each exported program; when none exported,
        from draft_export's (which relaxes the user's dims to AUTO to get one)."""
        programs = dict(self.report.programs)
        if not programs and self.report.draft is not None:
            programs = {"draft": self.report.draft}
        found: dict[str, tuple[BreakEvent, list[str]]] = {}
        declared = _declared_dims(
            self.torch, self.model, self.args, self.kwargs, self.dynamic_shapes
        )
        for mode, program in programs.items():
            for event in self._specialized_in(program, declared):
                found.setdefault(event.gb_type, (event, []))[1].append(mode)
        for event, modes in found.values():
            shown = " and ".join(m for m in modes if m != "draft") or "draft_export"
            self.report.add(dataclasses.replace(event, detail=shown))
        # A guard that made a dimension static is that entry's cause, not a second problem.
        for guard, _, _ in self.guards.values():
            if guard.dedupe_key() in self.report.counts and any(
                e.kind == "specialized_dim" and (e.file, e.line) == (guard.file, guard.line)
                for e in self.report.events
            ):
                self.report.events.remove(guard)
                del self.report.counts[guard.dedupe_key()]

    def _specialized_in(self, program: Any, declared: list[_Declared]) -> Iterator[BreakEvent]:
        torch = self.torch
        values = _user_input_values(torch, program)
        for name, dim, label, low, high in declared:
            value = values.get(name)
            if value is None or dim >= value.dim():
                continue
            size = value.shape[dim]
            guard = self.guards.get((name, dim))
            location = guard[2] if guard else self._locate([])
            caused = f" by the guard {guard[1]}" if guard else ""
            hint = SPECIALIZED_HINT
            expr = size.node.expr if isinstance(size, torch.SymInt) else size
            if isinstance(expr, int) or getattr(expr, "is_number", False):
                # A fake tensor's static size may still be a SymInt, of a constant.
                reason = f"declared dynamic ({label}), {STATIC_WORDS}: {int(expr)}{caused}"
            else:
                bounds = program.range_constraints.get(expr)
                if bounds is None:
                    continue
                lower, upper = _bound(bounds.lower), _bound(bounds.upper)
                narrowed = lower > max(low, _ZERO_ONE) or (
                    upper is not None and (high is None or upper < high)
                )
                if not narrowed:
                    continue
                asked = f"[{low}, {'inf' if high is None else high}]"
                got = f"[{lower}, {'inf' if upper is None else upper}]"
                reason = f"declared dynamic ({label}) in {asked}, {NARROWED_WORDS} {got}{caused}"
                hint = NARROWED_HINT.format(got=got)
            yield BreakEvent(
                kind="specialized_dim",
                gb_type=f"{_input_path(name, self.model, self.args)} dim {dim} ({label})",
                reason=reason,
                hints=(hint,),
                **_where(location),
            )

    # ----------------------------------------------------------------- on the DUT

    def run_on_dut(self, device: Any) -> None:
        """Run the program on the DUT on the example inputs and, when it has a dynamic
        dimension, on one more size of each; compare with eager. Watched by a monitor of its
        own, whose host fallbacks and DUT figures join the report (its host syncs are the
        ``export_sync`` entries already)."""
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from asic_backend.lower.exported import lower_exported

        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from asic_backend.sim.tolerance import (
            DYN_INT8_MIN_COSINE,
            DYN_INT8_REL_TOL,
            cosine,
            rel_err,
        )

        torch = self.torch
        report = self.report
        if set(report.programs) <= report.broken:  # each one's failure is reported already
            return
        program = report.program
        report.lowered = lowered = lower_exported(program, device=device)
        runs = [(self.args, self.kwargs)]
        second = self.second.get(id(program))
        if second is not None:
            runs.append(second)
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo

        monitor = Monitor(reset=False, root=self.root, first_party=self.first_party)
        monitor.start()
        try:
            # Dynamo's events of the DUT program's compile are not the test's: it compiled
            # nothing itself (a second size recompiles, which no max_recompiles should see).
            # What ran on the DUT is counted by the devices, which are not muted.
            with torch.no_grad(), dynamo.untapped():
                for args, kwargs in runs:
                    out, ref = lowered(*args, **kwargs), self.model(*args, **kwargs)
                    for index, (o, r) in enumerate(_tensor_pairs(torch, out, ref)):
                        err, cos = rel_err(o, r), cosine(o, r)
                        if err > DYN_INT8_REL_TOL or cos < DYN_INT8_MIN_COSINE:
                            shapes = [
                                tuple(t.shape)
                                for t in [*args, *kwargs.values()]
                                if isinstance(t, torch.Tensor)
                            ]
                            self._mismatch(
                                "DUT program differs from eager",
                                f"output {index} on inputs {shapes}: relative error "
                                f"{err:.3g} (bound {DYN_INT8_REL_TOL}), cosine {cos:.5f}"
                                f" (bound {DYN_INT8_MIN_COSINE})",
                                "on the DUT",
                            )
        finally:
            ran = monitor.stop()
        report._asic = ran._asic
        report.run_macs = ran.run_macs
        for event in ran.events:
            if event.kind == "host_fallback":
                for _ in range(ran.counts[event.dedupe_key()]):
                    report.add(event)

    def _second_inputs(self, program: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The example inputs with each dynamic dimension one longer (one shorter at the top
        of its range); inputs sharing a dimension change together. ``None``: none is dynamic."""
        torch = self.torch
        values = _user_input_values(torch, program)
        combined = combine_args(self.model, self.args, self.kwargs)
        sizes: dict[Any, int] = {}
        changed: dict[int, Any] = {}
        for name, tensor in combined.items():
            value = values.get(name)
            if not isinstance(tensor, torch.Tensor) or value is None:
                continue
            for dim, size in enumerate(value.shape):
                expr = size.node.expr if isinstance(size, torch.SymInt) else None
                if expr is None or getattr(expr, "is_number", True):
                    continue
                if expr not in sizes:
                    bounds = program.range_constraints.get(expr)
                    upper = _bound(bounds.upper) if bounds is not None else None
                    now = tensor.shape[dim]
                    sizes[expr] = now + 1 if upper is None or now + 1 <= upper else now - 1
                new = sizes[expr]
                base = changed.get(id(tensor), tensor)
                changed[id(tensor)] = _resized(torch, base, dim, new)
        if not changed:
            return None
        args = tuple(changed.get(id(a), a) for a in self.args)
        kwargs = {k: changed.get(id(v), v) for k, v in self.kwargs.items()}
        return args, kwargs

    def _add_rejected_sizes(self) -> None:
        """Each program run on one more size inside its own dynamic range: a program that
        raises there holds a guard its range constraints do not show (``if x.shape[0] == 3``
        under ``Dim.AUTO`` keeps the dimension dynamic but rejects 3), which the device's
        toolchain would only find at run time. An entry for the dimension draft_export saw
        the guard on (at the guard's line), else for the sizes the program rejected."""
        torch = self.torch
        declared = {
            (name, dim): label
            for name, dim, label, _, _ in _declared_dims(
                torch, self.model, self.args, self.kwargs, self.dynamic_shapes
            )
        }
        found: dict[str, tuple[BreakEvent, list[str]]] = {}
        for mode, program in self.report.programs.items():
            if mode in self.report.broken:  # its failure is reported already
                self.second[id(program)] = None
                continue
            second = self.second[id(program)] = self._second_inputs(program)
            if second is None:
                continue
            args, kwargs = second
            try:
                with torch.no_grad():
                    program.module()(*args, **kwargs)
            except Exception as exc:  # the program's own guard, or a kernel's shape check
                self.second[id(program)] = None
                shapes = [
                    tuple(t.shape) for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)
                ]
                head = _head(exc)
                guarded = [key for key in self.guards if key in declared]
                if guarded:
                    name, dim = guarded[0]
                    _, expr, location = self.guards[(name, dim)]
                    what = f"{_input_path(name, self.model, self.args)} dim {dim} "
                    what += f"({declared[(name, dim)]})"
                    caused = f" by the guard {expr}"
                else:
                    what, caused, location = "a dynamic dimension", "", self._locate([])
                event = BreakEvent(
                    kind="specialized_dim",
                    gb_type=what,
                    reason=f"{REJECTED_WORDS} inputs {shapes} inside its range{caused}: {head}",
                    hints=(HINTS["GUARD_ADDED"],),
                    **_where(location),
                )
                found.setdefault(event.gb_type, (event, []))[1].append(mode)
        for event, modes in found.values():
            self.report.add(dataclasses.replace(event, detail=" and ".join(modes)))

    # ----------------------------------------------------------------- agreement

    def _add_mismatches(self) -> None:
        torch = self.torch
        programs = self.report.programs
        if not programs:
            return
        outputs = {}
        with torch.no_grad():
            expected = self.model(*self.args, **self.kwargs)
            for mode, program in programs.items():
                try:
                    outputs[mode] = program.module()(*self.args, **self.kwargs)
                except Exception as exc:  # seen: strict export typing a bf16 autocast output f32
                    self.report.broken.add(mode)
                    self._mismatch(
                        f"{mode} program fails on the example inputs",
                        f"{type(exc).__name__}: {_head(exc)} (eager ran on them)",
                        mode,
                    )
        for mode, out in outputs.items():
            problem = _differ(torch, expected, out)
            if problem:
                self._mismatch(
                    f"{mode} program differs from eager", f"on the example inputs: {problem}", mode
                )
        if len(programs) == 2:
            ops = {mode: _op_counts(program) for mode, program in programs.items()}
            strict, loose = ops["strict"], ops["non-strict"]
            if strict != loose:
                only = sorted((strict - loose) + (loose - strict))
                self._mismatch(
                    "strict and non-strict programs differ",
                    f"ops in one program only: {', '.join(only[:6])}"
                    f"{' ...' if len(only) > 6 else ''} (strict {sum(strict.values())}"
                    f" ops, non-strict {sum(loose.values())})",
                    "strict and non-strict",
                )

    def _mismatch(self, what: str, reason: str, detail: str) -> None:
        """An ``export_mismatch`` problem, at the call of the check (no line of the model's
        own is to blame)."""
        self.report.add(
            BreakEvent(
                kind="export_mismatch",
                gb_type=what,
                reason=reason,
                detail=detail,
                **_where(self._locate([])),
            )
        )


# --------------------------------------------------------------------------- torch's parts


__all__ = ["export_check"]
