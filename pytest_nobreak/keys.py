"""The stash keys and report attributes the plugin's modules share: one place, imported by the
hooks that write them and the fixtures, reports and checks that read them."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_nobreak.markers import NoGraphBreakOptions
from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.monitor import Monitor

MONITOR_KEY = pytest.StashKey[Monitor]()
OPTIONS_KEY = pytest.StashKey[NoGraphBreakOptions]()
RECORD_KEY = pytest.StashKey[TestRecord]()
#: Key in xdist's ``workeroutput`` carrying a worker's marker errors to the controller.
USAGE_ERRORS_OUTPUT = "nobreak_usage_errors"
#: Key in xdist's ``workeroutput`` carrying the host GEMM kernels a worker's ASIC backend chose
#: by timing (:mod:`pytest_nobreak.report.kernel_choices`).
CHOICES_OUTPUT = "nobreak_kernel_choices"
COMPLETE_KEY = pytest.StashKey[bool]()
#: Attribute of the call-phase ``TestReport`` carrying the record (JSON, so xdist can ship it).
REPORT_ATTR = "nobreak_record"
#: Attribute of the same report: whether the test body ran to its end (its figures are whole).
COMPLETE_ATTR = "nobreak_complete"
ROOFS_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()
#: Attribute of the same report: the roofs of the devices its DUT GEMMs ran on, by device key,
#: read where the test ran (the controller cannot rebuild a device from a custom config's key).
ROOFS_ATTR = "nobreak_roofs"
