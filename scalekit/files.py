"""Writing files so that a crash never leaves half of one: every file scalekit writes goes through here.

The bytes go to a temporary file in the target's own directory (so the rename cannot cross file systems),
are flushed and fsynced, and the temporary file is then renamed over the target: a reader sees the old
file or the new one, never a part.  The new file gets the permissions the user's umask gives any new file
(a bare temporary file would be private, 0600).

What a user names is not always a plain file.  A symlink is followed and its target replaced (the link
stays a link); a character device (/dev/null, a terminal) or a FIFO is written directly, never replaced by
a regular file; "-" is standard output.  `check_writable` says, before any long work starts, whether the
real destination can be written at all, in one line that names it; `save_text` keeps the results when the
final write fails anyway (a full disk, a folder removed meanwhile): a copy goes to the temporary folder.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .errors import ConfigError

STDOUT = "-"  # the name that means standard output
FIFO_READER_WAIT_S = 3.0  # how long a FIFO is given to find a reader before the results go elsewhere


def expand_user(path: str | os.PathLike) -> Path:
    """`path` with a leading ~ or ~user expanded as the shell would; a ~name that names no user stays as written
    (pathlib's expanduser raises RuntimeError there, which reached a user giving --model '~0')."""
    return Path(os.path.expanduser(os.fspath(path)))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_stdout(path) -> bool:
    return os.fspath(path) == STDOUT


def _real(path: str | os.PathLike) -> Path:
    """The path with every symlink followed (also a dangling one: its target is where the file goes)."""
    return Path(os.path.realpath(expand_user(path)))


def _stat(real: Path, given: str, what: str) -> os.stat_result | None:
    try:
        return os.stat(real)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a symlink loop, a name too long, a folder on the way that is a file
        raise ConfigError(f"{what} {given!r} cannot be reached: {exc.strerror}") from None


def _is_stream(st: os.stat_result | None) -> bool:
    """Written directly, never replaced: a character device (/dev/null, a terminal) or a FIFO."""
    return st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode))


def check_writable(path: str | os.PathLike, what: str = "output file") -> Path:
    """The path as a Path if a file can be written there; else ConfigError in one line naming it.  The real
    destination is checked (a symlink's target), by creating and removing a file beside it: that also finds
    read-only mounts and pseudo file systems (/proc) that permission bits do not show."""
    if _is_stdout(path):
        return Path(STDOUT)
    try:
        given = str(expand_user(path))
    except RuntimeError:  # "~name" of a user this machine does not have
        raise ConfigError(f"{what} {os.fspath(path)!r} starts with ~ but names no user's home folder here") from None
    if "\0" in given:  # no file system takes one; os.stat would raise ValueError
        raise ConfigError(f"{what} {given!r} holds a NUL character: no file can have that name")
    real = _real(path)
    target = f" (the symlink's target {str(real)!r})" if os.path.islink(given) else ""
    st = _stat(real, given, what)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {given!r} is a directory{target}: give a file name")
    if _is_stream(st):
        if not os.access(real, os.W_OK):
            raise ConfigError(f"{what} {given!r}{target} is a device or FIFO that is not writable")
        return Path(given)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {given!r}{target} is neither a file, a character device nor a FIFO: refused")
    if not real.parent.is_dir():
        raise ConfigError(f"{what} {given!r}: the directory {str(real.parent)!r}{target and ' (of its target)'} "
                          f"does not exist")
    if st is not None and not os.access(real, os.W_OK):
        raise ConfigError(f"{what} {given!r}{target} exists and is not writable")
    try:
        fd, probe = tempfile.mkstemp(dir=real.parent, prefix=_temp_prefix(real), suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{what} {given!r}: the directory {str(real.parent)!r} is not writable "
                          f"({exc.strerror})") from None
    return Path(given)


TEMP_NAME_CHARS = 32  # of the target's name kept in a temporary file's: at most 128 bytes, far below 255


def _temp_prefix(real: Path) -> str:
    """The start of a hidden temporary file's name beside `real`, saying whose it is.  Cut short: a target's
    name may already take the whole of a file system's 255-byte limit, and the temporary name must still fit."""
    return f".{real.name[:TEMP_NAME_CHARS]}."


def write_atomic(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = False) -> Path:
    """Call write(file) on a temporary file beside `path`'s real destination, fsync it, then rename it there.
    A character device or FIFO is written directly, "-" is standard output."""
    if _is_stdout(path):
        stream = sys.stdout.buffer if binary else sys.stdout
        write(stream)
        stream.flush()
        return Path(STDOUT)
    real = _real(path)
    if _is_stream(_stat(real, str(path), "output file")):
        _write_stream(real, write, binary)
        return real
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=_temp_prefix(real), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(real.parent)
    return real


def _write_stream(real: Path, write: Callable[[IO], None], binary: bool) -> None:
    """Write into a character device or FIFO as it is (no temporary file, no rename, no fsync).  A FIFO is
    opened without blocking, so one that nobody reads fails after FIFO_READER_WAIT_S instead of hanging."""
    deadline = time.monotonic() + FIFO_READER_WAIT_S
    nonblocking = getattr(os, "O_NONBLOCK", 0)  # POSIX, where FIFOs are
    while True:
        try:
            fd = os.open(real, os.O_WRONLY | nonblocking)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:  # ENXIO: a FIFO with no reader yet
                raise OSError(exc.errno, "nobody reads this FIFO" if exc.errno == errno.ENXIO else exc.strerror,
                              str(real)) from None
            time.sleep(0.05)
    if nonblocking:
        os.set_blocking(fd, True)  # from here the reader sets the pace
    with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
        write(f)
        f.flush()


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text))


@dataclass(frozen=True)
class Saved:
    """What became of text given to save_text: written where asked (`ok`), or why not and where it went."""

    ok: bool
    message: str = ""  # one line naming the path, the reason, and where the copy went
    kept: Path | None = None  # the fallback copy (None: written where asked, or nowhere: print it)


def save_text(path: str | os.PathLike, text: str, what: str = "output file") -> Saved:
    """Write `text` to `path` (write_atomic); if that fails, keep it in a fallback file and say so: results
    measured over minutes are never lost to a full disk or a folder removed meanwhile."""
    try:
        write_text_atomic(path, text)
        return Saved(True)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
    name = Path(os.fspath(path)).name or "results"
    kept = keep_copy(text, name)
    where = f"the results are kept in {kept}" if kept is not None else "no fallback copy could be written either; " \
        "the results follow on standard output"
    return Saved(False, f"could not write {what} {str(path)!r} ({why}); {where}", kept)


def keep_copy(text: str, name: str) -> Path | None:
    """A fallback copy of `text` in the temporary folder, else in the current one; None if neither works."""
    stem, suffix = os.path.splitext(name)
    stem, suffix = stem[:100], suffix[:20]  # the copy's name must fit where the given one (up to 255 bytes) did
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for folder in (tempfile.gettempdir, os.getcwd):
        try:
            return write_text_atomic(Path(folder()) / f"scalekit-{stem or 'results'}-{stamp}{suffix or '.json'}", text)
        except OSError:  # full, read-only, or gone too
            continue
    return None


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
