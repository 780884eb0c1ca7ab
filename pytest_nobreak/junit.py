"""The figures of a test as JUnit XML ``<property>`` elements.

pytest's junitxml writes ``item.user_properties`` from the teardown report, and xdist ships them
from the workers, so appending these in a runtest hook is all it takes.
"""

from __future__ import annotations

from pytest_nobreak.json_report import TestRecord

__all__ = ["PREFIX", "junit_properties"]

PREFIX = "nobreak_"


def junit_properties(record: TestRecord) -> list[tuple[str, object]]:
    """``[("nobreak_graphs", 1), ("nobreak_graph_breaks", 0), ...]``: every measured figure."""
    return [(PREFIX + name, value) for name, value in record.figures.as_dict().items()]
