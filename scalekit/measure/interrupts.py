"""A Ctrl-C that a run never loses.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives.  If that is inside a finalizer
(`__del__`, a weakref callback: the garbage collector runs them between any two bytecodes), Python reports the
exception as "ignored" and carries on, and the run would go on for all its steps.  While a run measures, SIGINT is
also remembered: the loop checks at each step whether one came, and stops as the KeyboardInterrupt would have made
it stop.  Only where SIGINT has Python's own handler (a script, a notebook cell): a command line that handles
Ctrl-C itself (stopping after the step) keeps its handler, and a thread (the Lab's run) cannot set one.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Interrupts:
    """Whether SIGINT came while it was being remembered."""

    def __init__(self):
        self.seen = False

    def raise_if_seen(self) -> None:
        """KeyboardInterrupt if a Ctrl-C came (its own KeyboardInterrupt may have been swallowed on the way)."""
        if self.seen:
            raise KeyboardInterrupt


@contextlib.contextmanager
def remembered_ctrl_c():
    """Interrupts for the block: SIGINT still raises KeyboardInterrupt, and is remembered too."""
    interrupts = Interrupts()
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield interrupts
        return

    def remember(signum, frame):
        interrupts.seen = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, remember)
    try:
        yield interrupts
    finally:
        signal.signal(signal.SIGINT, previous)
