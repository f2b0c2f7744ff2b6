"""When each rank's process ended, and how, seen as it happens (torch reports only one failure)."""

from __future__ import annotations

import os
import threading
import time


class ExitWatcher:
    """When each rank's process ended, and how, noted as it happens: waitid(WNOWAIT) reads a child's exit
    status without reaping it, so torch still collects it as usual.  A thread looks every POLL_S, and the
    agent once more just before each time it asks torch (which reaps what it sees).  torch reports one
    failure, in the order it happens to look, which is how rank 0's "Connection reset by peer" used to hide
    the rank 1 that had exited first."""

    POLL_S = 0.005

    def __init__(self):
        self.exits: dict[int, tuple[float, int | None]] = {}  # rank: (time.time(), exit code, or -signal)
        self._pids: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pids: dict[int, int]) -> None:
        if not hasattr(os, "waitid"):  # then the report falls back on the exit codes torch reports
            return
        self._pids = dict(pids)
        self._thread = threading.Thread(target=self._loop, name="scalekit-launch-exits", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._pids and not self._stop.is_set():
            self.look()
            self._stop.wait(self.POLL_S)

    def look(self) -> None:
        with self._lock:
            for rank, pid in list(self._pids.items()):
                try:
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:  # torch reaped it before we looked: the time is all we have
                    code = None
                else:
                    if info is None:
                        continue
                    code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                self.exits[rank] = (time.time(), code)
                del self._pids[rank]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
