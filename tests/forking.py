"""The deadline and the cleanup every test file that forks ranks shares (tests/launch, tests/distributed):
import `no_process_left_behind` into the module, and every test there has a deadline and must leave no
child process."""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
import pytest

TEST_DEADLINE_S = 300  # above the longest launch timeout_s in the files that share this fixture (240 s): a slow
# machine meets the launcher's own limit first, and a hang still ends here


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test here has a deadline and must leave no child process, even when it fails.

    The deadline is SIGALRM raising in the main thread: it interrupts the launcher's wait, and the
    launcher's own cleanup then stops the ranks."""
    with deadline(TEST_DEADLINE_S, "test still running"):
        yield
    me = psutil.Process()
    until = time.monotonic() + 10
    while me.children(recursive=True) and time.monotonic() < until:
        time.sleep(0.1)
    left = me.children(recursive=True)
    for p in left:  # clean up before failing, so one broken test does not leak into the next
        p.kill()
    assert not left, f"processes left behind: {left}"


@contextlib.contextmanager
def deadline(seconds: int, what: str):
    """SIGALRM raises TimeoutError('<what> after <seconds> s') in the main thread: a wait or a loop that never ends
    becomes a failure."""
    def expire(signum, frame):
        raise TimeoutError(f"{what} after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
