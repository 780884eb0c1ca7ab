"""Write a file so that readers see either the old content or the new one, never half of it.

The baseline is committed and the JSON report is a CI artifact; a run killed by a timeout or a
Ctrl-C in the middle of writing either must not leave a truncated file behind: nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8, ``\\n`` line endings) atomically.

    The text goes to a temporary file in the same directory, is flushed to disk, and is then
    renamed over ``path``. On any error (including ``KeyboardInterrupt``) the temporary file is
    removed, the exception propagates and ``path`` keeps its previous content. Missing parent
    directories are created. An existing file keeps its permission bits.
    """
    # Write through a symlink to its target, as a plain open() would, instead of replacing the
    # link with a regular file.
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")  # fail on unencodable text before anything touches the disk

    # Same directory as the target: os.replace is only atomic within one filesystem.
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    # 0o666 and O_EXCL: the umask applies as for any new file, and we never clobber a stranger.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.filename == os.fspath(tmp):  # name the file the caller asked for, not ours
            raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable on POSIX. Windows cannot open a directory; the data is
    # already safe there, and so is the old file, so this is best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
