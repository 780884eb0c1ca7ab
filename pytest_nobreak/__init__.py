"""pytest-nobreak: fail tests on torch.compile graph breaks and eager fallbacks.

Outside pytest:

>>> import pytest_nobreak
>>> with pytest_nobreak.watch() as report:
...     compiled(x)
>>> report.check()   # raises GraphBreakError listing every break

Importing this package does not import torch.
"""

from pytest_nobreak.events import BreakEvent, Figures
from pytest_nobreak.monitor import CompileReport, GraphBreakError, watch

__version__ = "0.1.0"

__all__ = ["BreakEvent", "CompileReport", "Figures", "GraphBreakError", "__version__", "watch"]
