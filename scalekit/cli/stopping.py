"""How the command line stops: the first Ctrl-C, SIGTERM or SIGHUP ends the current step and keeps what was
measured (the exit code says which signal), a second stops at once; what the first one says while it waits."""

from __future__ import annotations

import signal
import threading

from ..measure.load import in_launched_rank

# Ctrl-C, a scheduler's or `timeout`'s SIGTERM, a closed terminal's SIGHUP: each is a stop (SIGHUP is POSIX only)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
# the commands whose work checks `stop` between steps, and so can end keeping what they measured
STOPPABLE = ("ladder", "bench", "generate", "tune")


class StopRequest(threading.Event):
    """The commands' `stop`: set by the first stop signal, whose number it keeps (the exit code says it)."""

    signum: int | None = None
    at_once = False  # a launch has no step here to finish: its launcher stops every rank at once


class Interrupted(KeyboardInterrupt):
    """A stop that does not wait for a step: the second signal, or any signal to a command without steps."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def catch_stop_signals(stop: StopRequest, stoppable: bool, say) -> dict:
    """Install the stop handler for every stop signal (its first word said through `say`); returns the handlers
    it replaced."""

    def on_signal(signum, frame) -> None:
        if stop.is_set() or stop.at_once or not stoppable:  # again, or nothing to finish first: stop now
            raise Interrupted(signum)
        stop.signum = signum
        stop.set()  # the first ends the current step cleanly, keeping what was measured
        say(stop_message(frame, signum))

    # a rank under torchrun keeps SIGTERM's default: its launcher ends every rank with it, and a rank that
    # finished its step alone would wait for the others in the next collective
    signals = STOP_SIGNALS if not in_launched_rank() else (signal.SIGINT,)
    return {signum: signal.signal(signum, on_signal) for signum in signals}


# Where torch.compile's compiler runs (dynamo tracing a frame, inductor compiling a graph, also a backward
# compiled lazily at the first backward); a compiled model's steps run through neither.
COMPILER_MODULES = ("torch._dynamo.convert_frame", "torch._inductor.compile_fx")


def stop_message(frame, signum: int = signal.SIGINT) -> str:
    """What the first stop signal says, at once: the step it waits for, and why that may take long (a compile)."""
    ctrl_c = signum == signal.SIGINT
    heard = "" if ctrl_c else f"{signal_name(signum)}: "
    again = "Ctrl-C again to stop at once" if ctrl_c else "another signal stops at once"
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(COMPILER_MODULES):
            return (f"{heard}stopping once torch.compile finishes compiling: a compile cannot be stopped midway, and "
                    f"a cold one can take a minute on a CPU ({again}: nothing measured is lost)")
        frame = frame.f_back
    return f"{heard}stopping after this step… ({again})"
