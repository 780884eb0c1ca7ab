"""``python -m pytest_nobreak zoo REPORT OUTPUT``: the model-zoo page, from a JSON report:
its headline, the counts per library and family (:mod:`.families`), and one row per model
(:mod:`.page`)."""

from pytest_nobreak.report.zoo.page import Row, breakdown, main, render_zoo, rows_of

__all__ = ["Row", "breakdown", "main", "render_zoo", "rows_of"]
