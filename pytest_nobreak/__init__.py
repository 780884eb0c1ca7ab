"""pytest-nobreak: fail tests on torch.compile graph breaks and eager fallbacks.

Outside pytest:

>>> import pytest_nobreak
>>> with pytest_nobreak.watch() as report:
...     compiled(x)
>>> report.check()   # raises GraphBreakError listing every break
>>> pytest_nobreak.export_check(model, (x,)).check()   # the torch.export path

Importing this package does not import torch.
"""

from pytest_nobreak.watch.compile_report import CompileReport, GraphBreakError
from pytest_nobreak.watch.events import BreakEvent, Figures
from pytest_nobreak.watch.export_report import ExportError, ExportReport
from pytest_nobreak.watch.exporting import export_check
from pytest_nobreak.watch.monitor import watch

__version__ = "0.1.0"

__all__ = [
    "BreakEvent",
    "CompileReport",
    "ExportError",
    "ExportReport",
    "Figures",
    "GraphBreakError",
    "__version__",
    "export_check",
    "watch",
]
