"""Ctrl-C and the termination signals while a launch runs: every rank is stopped, none is left half-started."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from torch.distributed.elastic.multiprocessing import SignalException

AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
INTERRUPTED = "launch interrupted: every rank was stopped"


class Signals:
    """Ctrl-C (SIGINT), SIGTERM, SIGHUP and SIGQUIT while a launch runs in the main thread.

    They raise torch's SignalException, which the agent answers by stopping every rank, except while ranks
    are being started or stopped or the launch is cleaning up (`held`): a signal then waits until that is
    done, so no rank is left half-started and no folder half-removed, however often Ctrl-C is pressed.
    torch installs handlers of its own that raise at any moment; the agent keeps them out (SIGNALS_TO_HANDLE
    in torch_hooks).
    Leaving, a SIGINT becomes KeyboardInterrupt."""

    def __init__(self):
        self.pending: int | None = None
        self._holding = 0
        self._saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
            self.install()
        return self

    def install(self) -> None:
        for s in self._saved:
            signal.signal(s, self._handler)

    def _handler(self, signum, frame) -> None:
        if self._holding:
            self.pending = signum
            return
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    @contextlib.contextmanager
    def held(self):
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    def raise_pending(self) -> None:
        if self.pending is not None and not self._holding:
            signum, self.pending = self.pending, None
            self._handler(signum, None)

    def __exit__(self, exc_type, exc, tb):
        for s, h in self._saved.items():
            signal.signal(s, h)
        if exc_type is None and self.pending is not None:  # it came while the launch was cleaning up
            exc = SignalException("", sigval=signal.Signals(self.pending))
        if isinstance(exc, SignalException):
            if exc.sigval == signal.SIGINT:
                raise KeyboardInterrupt(INTERRUPTED) from None
            raise exc
        return False
