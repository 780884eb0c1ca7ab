"""write_atomic: the old file survives anything that goes wrong while writing the new one."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nobreak.gate.atomic import write_atomic

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions and symlinks")


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_writes_utf8_with_unix_newlines_and_creates_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "report.json"
    write_atomic(target, "π\nline 2\n")
    assert target.read_bytes() == "π\nline 2\n".encode()
    assert leftovers(target.parent) == []


def test_replaces_existing_content(tmp_path: Path) -> None:
    target = tmp_path / "baseline.json"
    target.write_text("old content that is longer than the new one\n")
    write_atomic(str(target), "new\n")
    assert target.read_text() == "new\n"
    assert leftovers(tmp_path) == []


@posix_only
def test_keeps_the_permissions_of_the_file_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "baseline.json"
    target.write_text("old")
    target.chmod(0o640)
    write_atomic(target, "new")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


@posix_only
def test_a_new_file_gets_the_usual_permissions_not_0600(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "new.json", "x")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


@posix_only
def test_writes_through_a_symlink_to_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink()
    assert real.read_text() == "new"


@pytest.mark.parametrize(
    ("function", "error"),
    [
        ("fsync", OSError("disk full")),
        ("replace", KeyboardInterrupt()),
        ("chmod", PermissionError("no")),
    ],
)
def test_a_crash_while_writing_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str, error: BaseException
) -> None:
    target = tmp_path / "baseline.json"
    target.write_bytes(b'{"old": true}\n')

    def crash(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(os, function, crash)
    with pytest.raises(type(error)):
        write_atomic(target, '{"new": true}\n' * 1000)
    monkeypatch.undo()
    assert target.read_bytes() == b'{"old": true}\n'
    assert leftovers(tmp_path) == []


def test_text_that_cannot_be_encoded_fails_before_touching_anything(tmp_path: Path) -> None:
    target = tmp_path / "baseline.json"
    target.write_bytes(b"old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, "lone surrogate \ud800")
    assert target.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_the_reporting_modules_import_neither_torch_nor_pytest() -> None:
    # They run on the xdist controller and in plain scripts: the project imports torch lazily,
    # on first use, so these must not pull it in.
    code = (
        "import sys\n"
        "import pytest_nobreak.gate.atomic, pytest_nobreak.gate.baseline\n"
        "import pytest_nobreak.report.github\n"
        "import pytest_nobreak.report.json_report, pytest_nobreak.report.junit\n"
        "print(sorted({'torch', 'pytest', '_pytest'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
