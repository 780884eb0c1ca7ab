"""CI fails on a skip: a test that stopped running must not pass as green."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import INNER_ADDOPTS, unexpected_skips
from tests.skip_reasons import AMX_SKIP

ROOT = Path(__file__).resolve().parents[2]


def test_every_skip_but_an_allowed_reasons_is_unexpected() -> None:
    skipped = [("t.py::test_a", "no chromium"), ("t.py::test_b", "could not import 'x'")]
    assert unexpected_skips(skipped) == skipped
    assert unexpected_skips([]) == []
    amx = ("t.py::test_c", f"{AMX_SKIP}: the native library was built without AMX")
    assert unexpected_skips([*skipped, amx]) == skipped
    assert unexpected_skips([("t.py::test_d", f"not {AMX_SKIP}")]) != []


def test_a_ci_run_with_a_skip_fails_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    for path in (ROOT / "tests").glob("*.py"):  # the conftest and the modules it imports
        if not path.name.startswith("test_"):
            (tmp_path / "tests" / path.name).write_text(path.read_text())
    (tmp_path / "tests" / "test_it.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\n"
        "def test_gone():\n    pytest.skip('no chromium here')\n"
    )
    (tmp_path / "tests" / "test_module.py").write_text(
        "import pytest\n\npytest.importorskip('no_such_module_here')\n"
    )
    env_ci = {
        "CI": "true",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(tmp_path),
        "PYTEST_ADDOPTS": INNER_ADDOPTS,
    }
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"]
    ci = subprocess.run(args, cwd=tmp_path, env=env_ci, capture_output=True, text=True)
    assert ci.returncode == 1, ci.stdout
    assert "CI: 2 test(s) skipped (tests/conftest.py ALLOWED_CI_SKIPS):" in ci.stdout
    assert "tests/test_it.py::test_gone: no chromium here" in ci.stdout
    assert "tests/test_module.py: could not import 'no_such_module_here'" in ci.stdout
    local = subprocess.run(
        args,
        cwd=tmp_path,
        env={k: v for k, v in env_ci.items() if k != "CI"},
        capture_output=True,
        text=True,
    )
    assert local.returncode == 0, local.stdout
