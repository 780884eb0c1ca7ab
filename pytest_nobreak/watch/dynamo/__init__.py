"""Every private torch API the plugin relies on, feature-detected, in one place.

Dynamo does not offer a public "tell me about every graph break" API in torch 2.13, so the
monitor taps a handful of internals. They live here, and only here, so a torch upgrade that
moves one of them breaks one module with one clear error naming the torch version, instead of
the plugin silently reporting zero breaks:

- ``InstructionTranslatorBase.log_graph_break``: called with the ``Unsupported`` of every handled
  graph break and frame skip (the only place that sees data-dependent jumps, which
  ``counters["graph_break"]`` misses). Its message chains the breaks Dynamo hit while handling
  an earlier one, root cause first; its ``real_stack`` starts at the compiled frame, and the
  Python stack above Dynamo's compiler holds the user's calls that led there.
- ``torch._dynamo.convert_frame.CatchErrorsWrapper.__call__``: Dynamo's entry point for every
  frame it has no compiled code for. An exception leaving it reaches the caller (a compile
  error, not an eager run); a call with cached entries is a recompile, whose compiled callable
  (a module's ``forward`` behind ``wrap_inline``) is in the frame's locals. What Dynamo adds to
  ``torch._dynamo.utils.counters`` during the call (graphs, frames, frames compiled) is the
  frame's: the taps count it there, so code that clears the counters or calls
  ``torch._dynamo.reset()`` (``torch._dynamo.test_case.TestCase.tearDown``) cannot zero it.
- ``CompilationMetrics.create``: called once per compile attempt with its record (failed
  compiles: backend fallbacks, the recompile limit; recompile reasons); tapped for the same
  reason, instead of reading torch's deque, which a reset clears and which keeps only 64.
- ``torch._dynamo.eval_frame._callback_from_stance``: called each time a compiled region is
  entered; the only way to see a region silently run eagerly under ``set_stance("force_eager")``,
  ``"eager_on_recompile"`` or ``torch._dynamo.config.disable``, which leave no other trace.
- ``OutputGraph.call_user_compiler``: where Dynamo hands each graph to the backend. The graph's
  host syncs (:mod:`asic_backend.lower.host_syncs`) are read there, and the compiled callable it
  returns is wrapped to count each call: a test counts the graphs it runs, the breaks of
  their compile (recorded with the compile, in ``FrameRecord``) and their syncs, whenever
  they were compiled. A frame Dynamo gave up on is seen again where its region is entered
  (the stance tap below). A backend that goes through
  AOTAutograd runs ``graph_compile._apply_tensorify_python_scalars`` first, which turns a float
  ``.item()`` used only in tensor math back into tensor ops: the syncs of such a graph are read
  from the graph that pass leaves (tapped too), which is what runs.
- The ``torch._dynamo.convert_frame`` WARNING record of a recompile-limit hit (its location).
- The graph-break registry (``gb_type`` -> ``GBxxxx`` id and documentation link).

One module per thing tapped (:mod:`.frames`: frame entry, graph breaks, errors and metrics;
:mod:`.graphs`: the backend call; :mod:`.stance`: eager runs; :mod:`.logs`: logging), with the
records they deliver (:mod:`.records`) and the text they parse (:mod:`.messages`); this package
re-exports what the monitor uses. It imports torch; import it lazily (the plugin module must
not import torch).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pytest_nobreak.watch.dynamo.frames import (
    _install_entry_tap,
    _install_log_tap,
    _install_metrics_tap,
)
from pytest_nobreak.watch.dynamo.graphs import _install_compiler_tap
from pytest_nobreak.watch.dynamo.logs import _install_warning_filter, detach_foreign_trace_handlers
from pytest_nobreak.watch.dynamo.messages import (
    ParsedMessage,
    gb_id_of_link,
    gb_link,
    parse_chain,
    parse_graph_break_message,
)
from pytest_nobreak.watch.dynamo.records import (
    FrameRecord,
    RawCompileError,
    RawEagerRun,
    RawGraph,
    RawGraphBreak,
    RawGraphSyncs,
    RawLimitHit,
    RawRecompile,
    RawSilentEager,
    Sink,
    SyncSite,
    _sinks,
    gave_up_on,
)
from pytest_nobreak.watch.dynamo.release import (
    MIN_TORCH,
    SUPPORTED,
    TorchCompatError,
    check_torch,
    release,
    torch_version,
)
from pytest_nobreak.watch.dynamo.stance import _install_stance_tap, silent_eager_now
from pytest_nobreak.watch.dynamo.state import (
    CounterView,
    MetricRecord,
    current_compile_id,
    reset_dynamo,
)

__all__ = [
    "MIN_TORCH",
    "SUPPORTED",
    "CounterView",
    "FrameRecord",
    "MetricRecord",
    "ParsedMessage",
    "RawCompileError",
    "RawEagerRun",
    "RawGraph",
    "RawGraphBreak",
    "RawGraphSyncs",
    "RawLimitHit",
    "RawRecompile",
    "RawSilentEager",
    "Sink",
    "SyncSite",
    "TorchCompatError",
    "check_torch",
    "current_compile_id",
    "detach_foreign_trace_handlers",
    "gave_up_on",
    "gb_id_of_link",
    "gb_link",
    "install_taps",
    "parse_chain",
    "parse_graph_break_message",
    "release",
    "reset_dynamo",
    "silent_eager_now",
    "tapped",
    "torch_version",
    "untapped",
]

_install_lock = threading.Lock()
_installed = False


def _install_taps() -> None:
    """Patch the Dynamo entry points once per process; they forward to registered sinks.

    Installed once (not per test) because patching and unpatching around every test would
    fight with other tools doing the same; with no sink registered the patches cost one list
    check.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        _install_log_tap()
        _install_stance_tap()
        _install_entry_tap()
        _install_metrics_tap()
        _install_compiler_tap()
        _install_warning_filter()
        _installed = True


@contextmanager
def tapped(sink: Sink) -> Iterator[None]:
    """Deliver Dynamo's events to ``sink`` while the block runs."""
    check_torch()
    _install_taps()
    _sinks.append(sink)
    try:
        yield
    finally:
        _sinks.remove(sink)


@contextmanager
def untapped() -> Iterator[None]:
    """Deliver nothing to the sinks while the block runs: its Dynamo work is reported another
    way (strict ``torch.export`` traces with Dynamo, and its errors are export problems, not
    compile errors of the test). Process-wide, like the taps: a compile in another thread
    during the block is not seen either."""
    saved = list(_sinks)
    _sinks.clear()
    try:
        yield
    finally:
        _sinks[:] = [*saved, *(sink for sink in _sinks if sink not in saved)]


def install_taps() -> None:
    """Tap Dynamo now, with no sink yet: graphs compiled from here on are counted wherever
    they run later. Raises ``TorchCompatError`` for a torch that cannot be watched."""
    check_torch()
    _install_taps()
