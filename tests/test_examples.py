"""The README's main job: the example suite under --asic-backend exits 0 and shows its report."""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path

import pytest

from tests import zygote
from tests.mac_check import LOG
from tests.test_readme import README, shown_slice

ROOT = Path(__file__).resolve().parents[1]


def test_example_suite_runs_green_and_shows_the_caught_breaks(tmp_path: Path) -> None:
    mac_log = tmp_path / "macs.log"
    proc = zygote.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "examples",
            "--asic-backend",
            "-v",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env={**os.environ, LOG: str(mac_log)},
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert (
        "nobreak: backend=asic, device=default (128x128 ws @ 1 GHz), watching marked tests" in out
    )
    assert "test_data_dependent_branch_is_caught XFAIL" in out
    assert "test_naive_backend_fallback_is_caught XFAIL" in out
    assert "test_qat_model_runs_on_the_dut PASSED" in out
    assert "test_cnn_runs_on_the_dut PASSED" in out
    assert "test_forgotten_no_grad_is_caught XFAIL" in out
    assert "graph break GB0170 at examples/models.py:" in out
    assert "GB0219 at examples/models.py:" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if "::" in line}
    # Every MAC of the CNN on the DUT; with autograd live, every one on the host, and named.
    assert rows["examples/test_cnn_on_dut.py::test_cnn_runs_on_the_dut"][7] == "100%"
    assert rows["examples/test_cnn_on_dut.py::test_forgotten_no_grad_is_caught"][7] == "0%"
    assert "host fallback (ran on the host, not the DUT) at examples/models.py:" in out
    assert ": conv2d (x3 calls, 106,496 host MACs)" in out
    # The suite-wide MAC accounting check (tests/mac_check.py) ran in that process, on every
    # call of the examples' asic graphs, and found them all accounted for.
    ((graphs, calls),) = re.findall(r"graphs=(\d+) calls=(\d+)", mac_log.read_text())
    assert int(graphs) > 0
    assert int(calls) > 0
    # And the README's pasted run is this one, line for line (durations aside).
    (block,) = re.findall(r"<!-- main-command-output -->\n```\n(.*?)```", README, re.DOTALL)
    shown = block.splitlines()
    if not shown_slice(shown, out.splitlines()):
        start = next((i for i, line in enumerate(out.splitlines()) if line == shown[0]), 0)
        diff = difflib.unified_diff(
            shown, out.splitlines()[start:], "README", "real run", lineterm=""
        )
        pytest.fail("the README's example-suite run drifted:\n" + "\n".join(diff), pytrace=False)
