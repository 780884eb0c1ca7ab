"""Code the README shows as runnable runs, and prints what the README says it prints.

A ``<!-- readme-test: NAME -->`` line marks a ```python block; the ```text block right after it is
that code's output, verbatim. Each pair runs in a fresh interpreter from the repository root.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PAIR = re.compile(
    r"<!-- readme-test: (?P<name>[\w-]+) -->\n```python\n(?P<code>.*?)```\n\n```text\n"
    r"(?P<out>.*?)```",
    re.DOTALL,
)


def _pairs() -> list[tuple[str, str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(m["name"], m["code"], m["out"]) for m in _PAIR.finditer(text)]


def test_the_readme_has_runnable_examples() -> None:
    assert [name for name, _, _ in _pairs()] == ["host-fallbacks"]


@pytest.mark.parametrize(("name", "code", "expected"), _pairs(), ids=[p[0] for p in _pairs()])
def test_readme_example_prints_what_the_readme_shows(name: str, code: str, expected: str) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == expected
