"""The figures of a test as JUnit XML ``<property>`` elements.

pytest's junitxml writes ``item.user_properties`` from the teardown report, and xdist ships them
from the workers, so appending these in a runtest hook is all it takes.
"""

from __future__ import annotations

from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.render import event_line

__all__ = ["PREFIX", "junit_properties"]

PREFIX = "nobreak_"


def junit_properties(record: TestRecord) -> list[tuple[str, object]]:
    """``[("nobreak_graphs", 1), ("nobreak_graph_breaks", 0), ...]``: every measured figure
    (``nobreak_host_syncs``, and the ASIC's ``nobreak_syncs``, when measured), then a
    ``nobreak_break`` per break or host sync the reports name, as the terminal table lists it
    (for an unmarked test, the only place in the JUnit file its breaks show: it is not failed
    for them)."""
    figures = [(PREFIX + name, value) for name, value in record.figures.as_dict().items()]
    breaks = [(PREFIX + "break", event_line(event)) for event in record.reported_breaks]
    return [*figures, *breaks]
