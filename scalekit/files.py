"""Writing files so that a crash never leaves half of one: every file scalekit writes goes through here.

The bytes go to a temporary file in the target's own directory (so the rename cannot cross file systems),
are flushed and fsynced, and the temporary file is then renamed over the target: a reader sees the old
file or the new one, never a part.  The new file gets the permissions the user's umask gives any new file
(a bare temporary file would be private, 0600).  `check_writable` says, before any long work starts,
whether a path can be written at all, in one line that names it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import ConfigError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable(path: str | os.PathLike, what: str = "output file") -> Path:
    """The path as a Path if a file can be written there; else ConfigError in one line naming it."""
    path = Path(os.fspath(path)).expanduser()
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a directory: give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{what} {str(path)!r}: the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(path)!r}: the directory {str(parent)!r} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {str(path)!r} exists and is not writable")
    return path


def write_atomic(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = False) -> Path:
    """Call write(file) on a temporary file beside `path`, fsync it, then rename it to `path`."""
    path = Path(os.fspath(path)).expanduser()
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text))


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
