"""Dynamo's logging: the recompile-limit WARNING read for its location, the multi-line graph-break
WARNINGs kept out of a quiet test's output, pytest's handlers kept off torch's trace logger."""

from __future__ import annotations

import logging
import re

from pytest_nobreak.watch.dynamo.records import RawLimitHit, _dispatch, _sinks

_TRACE_LOGGER = "torch.__trace"


_LIMIT_LOCATION_RE = re.compile(r"^'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)$")


class _DynamoWarningFilter(logging.Filter):
    """Reads the recompile-limit WARNING (where its location comes from) while a monitor is
    listening, and swallows Dynamo's multi-line graph-break WARNINGs while a quiet one is.

    A marked test's failure renders the same facts in a few lines at the user's own code;
    letting the originals through would put 40-line dumps in its captured output. An observer
    (an unmarked test) filters nothing: ``caplog``, ``assertLogs`` and the user's handlers see
    the records they see without the plugin.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _sinks or record.levelno < logging.WARNING:
            return True
        message = str(record.msg)
        if message.startswith("torch._dynamo hit config."):
            self._forward_limit_hit(record)
        if not any(sink.quiet for sink in list(_sinks)):
            return True
        return not message.startswith(_NOISY_PREFIXES)

    @staticmethod
    def _forward_limit_hit(record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 4:
            return
        m = _LIMIT_LOCATION_RE.match(str(args[2]))
        _dispatch(
            "on_limit_hit",
            RawLimitHit(
                limit=str(args[0]),
                value=str(args[1]),
                function=m.group("name") if m else None,
                file=m.group("file") if m else None,
                line=int(m.group("line")) if m else None,
                last_reason=str(args[3]),
            ),
        )


# The WARNINGs Dynamo prints for what the monitor reports itself, by logger.
_NOISY_LOGGERS = (
    "torch._dynamo.exc",  # "Backend compiler exception" (gb0219) and other fallbacks
    "torch._dynamo.convert_frame",  # recompile limit, "WON'T CONVERT"
    "torch._dynamo.variables.tensor",  # "Graph break from `Tensor.item()`"
)


_NOISY_PREFIXES = (
    "Backend compiler exception",
    "WON'T CONVERT",
    "Graph break from `Tensor.item()`",
    "torch._dynamo hit config.",
)


def _install_warning_filter() -> None:
    noise_filter = _DynamoWarningFilter()
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).addFilter(noise_filter)


def detach_foreign_trace_handlers(owner_prefix: str = "_pytest.") -> None:
    """Remove pytest's capture handlers from torch's structured-trace logger.

    pytest attaches its handlers to every non-propagating logger, ``torch.__trace`` included;
    torch then thinks tracing is on, does the work, and failures show dozens of empty
    ``DEBUG torch.__trace`` lines. Handlers installed by torch itself (``TORCH_TRACE``) stay.
    """
    logger = logging.getLogger(_TRACE_LOGGER)
    for handler in list(logger.handlers):
        if type(handler).__module__.startswith(owner_prefix):
            logger.removeHandler(handler)
