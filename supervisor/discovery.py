"""ADAPTER: the discovery file, the only file I/O of the host list (decide/hosts.py renders it).

`write_atomic` (temp file in the same directory, fsync, rename, fsync of the directory) and
`withdraw`; `foreign_line` tells a file the supervisor wrote from someone else's, which it must
never replace or remove.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path


def write_atomic(path: Path, content: str) -> None:
    """Replace `path` with `content` atomically: readers see the old or the new file, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def withdraw(path: Path) -> bool:
    """Remove the discovery file so the script fails; return whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    _fsync_dir(path.parent)
    return True


HOST_LINE = re.compile(r"^\S+:\d+$")


def foreign_line(content: str) -> str | None:
    """Return the first line of `content` that is not a `host:slots` line (so the file is not a
    host list this supervisor wrote), or None."""
    return next((line for line in content.splitlines() if not HOST_LINE.match(line)), None)


def read_current(path: Path) -> str | None:
    """Return the file's content, or None if it does not exist."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
