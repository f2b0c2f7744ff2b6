"""One launch's folder and the files in it, named once: the ranks write them, the agent and the report read them.

A launcher killed outright (SIGKILL, the OOM killer) cannot remove its folder, so each launch holds a lock on
a file in it for as long as it runs, and the next launch removes the folders whose lock nobody holds.  The
kernel drops a lock when the last process holding it ends, however it ends, so a pid reused since, or a
launcher in another PID namespace sharing the temp folder, cannot make a live launch's folder look stale.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import LaunchError

try:
    import fcntl
except ImportError:  # Windows: no locks, and so no folder is ever taken for stale
    fcntl = None

PREFIX = "scalekit-launch-"
LOCK_NAME = "launcher.lock"  # held while the launch (and its forked ranks) run; absent from kept folders
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
MIN_FREE_BYTES = 64 << 10  # less free than this in the temp folder: the ranks cannot write their output there


@dataclass(frozen=True)
class RunFiles:
    root: Path  # a fresh folder in the temp folder, removed when the launch ends unless kept

    def out(self, rank: int) -> Path:
        return self.root / f"rank{rank}.out"  # the rank's stdout, streamed with its prefix

    def err(self, rank: int) -> Path:
        return self.root / f"rank{rank}.err"

    def failure(self, rank: int) -> Path:
        return self.root / f"failure-rank{rank}.json"  # a forked rank that failed: what, its traceback, when

    def done(self, rank: int) -> Path:
        return self.root / f"done-rank{rank}"  # a forked rank whose function returned: it waits for the others

    def stacks(self, rank: int) -> Path:
        return self.root / f"stack-rank{rank}.txt"  # where a forked rank was, asked at a timeout

    def torch_error(self, rank: int) -> Path:
        return self.root / f"rank{rank}.error.json"  # TORCHELASTIC_ERROR_FILE: a script's @record writes it

    def touch_logs(self, nprocs: int) -> None:
        for rank in range(nprocs):
            self.out(rank).touch()
            self.err(rank).touch()


@contextlib.contextmanager
def run_folder(keep_logs: bool, signals) -> Iterator[RunFiles]:
    """The folder of one launch's rank output and records: removed however the launch ends, unless kept;
    the folders of launches killed before they could remove theirs go first."""
    temp = Path(tempfile.gettempdir())
    remove_stale_folders(temp)
    error = out_of_space(temp)
    if error is not None:
        raise error
    files, lock = _new_folder(temp, keep_logs)
    try:
        yield files
    finally:
        with signals.held():
            if keep_logs:
                print(f"scalekit.launch: the ranks' logs are kept in {files.root}", file=sys.stderr, flush=True)
            else:
                os.close(lock)
                shutil.rmtree(files.root, ignore_errors=True)


def _new_folder(temp: Path, keep_logs: bool) -> tuple[RunFiles, int | None]:
    root = None
    try:
        root = Path(tempfile.mkdtemp(prefix=PREFIX))
        return RunFiles(root), None if keep_logs else _hold_lock(root)
    except OSError as exc:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
        if exc.errno in NO_SPACE:
            raise no_space_error(temp) from None
        raise


def _hold_lock(root: Path) -> int:
    """Lock a file in the folder for as long as the returned descriptor (and the forked ranks' copies) stay
    open.  It is locked under another name and then renamed: a cleaner never meets an unlocked LOCK_NAME."""
    path = root / f".{LOCK_NAME}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (OSError, AttributeError):  # no locks here (Windows, some network file systems): never taken for stale
        return fd
    os.rename(path, root / LOCK_NAME)
    return fd


def remove_stale_folders(temp: Path) -> list[Path]:
    """Remove the folders of earlier launches that nothing holds any more (their launcher and every rank have
    ended); returns them.  A folder without a lock file (kept logs, or a launch being set up) stays."""
    removed = []
    with contextlib.suppress(OSError):
        for folder in temp.glob(f"{PREFIX}*"):
            if _stale(folder / LOCK_NAME):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _stale(lock_path: Path) -> bool:
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:  # no lock file, or not ours to read
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: the launch, or one of its ranks, is alive (or this file system has no locks)
        return False
    else:
        return True
    finally:
        os.close(fd)


def out_of_space(temp: Path) -> LaunchError | None:
    """The error for a temp folder too full for the ranks' output and records, or None while it has room."""
    with contextlib.suppress(OSError):
        if shutil.disk_usage(temp).free < MIN_FREE_BYTES:
            return no_space_error(temp)
    return None


def no_space_error(temp: Path) -> LaunchError:
    free = ""
    with contextlib.suppress(OSError):
        free = f" ({shutil.disk_usage(temp).free:,} bytes free)"
    return LaunchError(f"no space left in the temp folder {temp}{free}: the ranks write their output and how "
                       f"they ended there; free some space there, or point TMPDIR at a folder with room")
