"""The LaunchError for a failed launch, led by the rank that failed FIRST and how.

When one rank fails the others usually fail after it, on a closed connection; torch reports whichever it
happens to look at first, which is how rank 0's "Connection reset by peer" used to hide the rank 1 that had
exited first.  So the report orders the ranks by when they failed (a forked rank's own record, or the exit
the agent watched) and lists the others after the first as consequences.  After a timeout it names the
ranks still running and where each one was, from the stack it dumped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import LaunchError
from .rank import rank_main
from .run_files import RunFiles, out_of_space

if TYPE_CHECKING:
    from .agent import Outcome

# how a rank fails when a rank it talks to has gone (gloo, NCCL, the c10d store): a consequence, not a cause
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
             "remote process exited", "communicator was aborted", "DistNetworkError", "DistStoreError",
             "Socket Timeout", "Timed out waiting", "Watchdog caught collective operation timeout")
FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')
TORCH_DIR = os.path.dirname(torch.__file__)
LAUNCH_DIR = os.path.dirname(__file__)


@dataclass
class RankEnd:
    """How one rank ended, as the report tells it."""

    rank: int
    kind: str  # "raised" (a Python exception), "exited" (an exit code or a signal), "stopped", "finished"
    time: float = math.inf  # when it failed (time.time()); inf when not known
    text: str = ""  # what happened, in words, after "rank N "
    traceback: str = ""
    consequence: bool = False  # it failed because another rank had gone (a closed connection, a timeout)


def report(outcome: Outcome, files: RunFiles, keep_logs: bool) -> LaunchError:
    """The LaunchError for a failed launch: the first rank that failed, how, then what the others did."""
    ends = {rank: _rank_end(rank, outcome, files) for rank in range(outcome.nprocs)}
    logs = f"\nLogs: {files.root}" if keep_logs else ""
    logs_dir = str(files.root) if keep_logs else None
    if outcome.still_running:
        return _timeout_error(outcome, ends, files, logs, logs_dir)
    full = None if any(e.kind == "raised" for e in ends.values()) else out_of_space(files.root.parent)
    if full is not None:  # no rank could say why: what each would have written had nowhere to go
        return full
    failures = sorted((e for e in ends.values() if e.kind in ("raised", "exited")),
                      key=lambda e: (e.consequence, e.time))
    if not failures:  # torch saw a failure none of our records shows
        if not outcome.exit_codes:
            return LaunchError(f"the launch failed and no rank says why; the ranks' output is above{logs}",
                               logs_dir=logs_dir)
        rank, code = min(outcome.exit_codes.items())
        return LaunchError(f"rank {rank} ended with {_how(code)}; its output is above{logs}", rank=rank,
                           logs_dir=logs_dir)
    first = failures[0]
    message = f"rank {first.rank} {first.text}" + (f"\n\n{first.traceback.rstrip()}" if first.traceback else "")
    after = []
    for end in sorted(ends.values(), key=lambda e: (e.time, e.rank)):
        if end is first or end.kind == "finished":
            continue
        if end.kind == "stopped":
            after.append(f"  rank {end.rank} was stopped by the launcher")
        else:
            note = " — most likely a consequence: a rank it was talking to had gone" if end.consequence else ""
            after.append(f"  rank {end.rank} {_short(end.text)}{note}")
    if after:
        message += "\nAfter it:\n" + "\n".join(after)
    return LaunchError(message + logs, rank=first.rank, rank_traceback=first.traceback, logs_dir=logs_dir)


def _rank_end(rank: int, outcome: Outcome, files: RunFiles) -> RankEnd:
    exit_time, code = outcome.exits.get(rank, (None, None))
    when = math.inf if exit_time is None else exit_time
    if code is None:
        code = outcome.exit_codes.get(rank)
    stopping = outcome.stopping_since
    after_stop = stopping is not None and exit_time is not None and exit_time >= stopping
    # ended by the launcher's SIGTERM (or its SIGKILL after SHUTDOWN_S); torch may reap such a rank before
    # the watcher sees it, so an unseen exit by these signals counts as stopped too
    stopped = stopping is not None and code in (-signal.SIGTERM, -signal.SIGKILL) and (
        exit_time is None or exit_time >= stopping)
    record = _failure_record(files.failure(rank))
    if record is not None:  # a forked rank that raised: its traceback and the time it raised
        return RankEnd(rank, "raised", record["time"], record["text"] or f"failed: {record['error']}",
                       record["traceback"], consequence=_peer_gone(record["error"]))
    if rank in outcome.still_running:
        return RankEnd(rank, "stopped")
    if code == 0 or (outcome.forked and files.done(rank).exists()):
        return RankEnd(rank, "finished")
    if code is None:  # torch reaped it (stopping it, as a rule) before the watcher saw how it ended
        return RankEnd(rank, "stopped")
    if stopped:
        return RankEnd(rank, "stopped", when)
    if outcome.forked:
        return RankEnd(rank, "exited", when, f"ended with {_how(code)} and no Python exception (killed, out of "
                       f"memory, or a crash in native code); its output is above", consequence=after_stop)
    # a script: its traceback, if any, is in its output; the last line says what it was
    last = _last_line(files.err(rank))
    return RankEnd(rank, "exited", when, f"ended with {_how(code)}; its output is above"
                   + (f" (its last line: {last[:300]})" if last else ""), consequence=after_stop or _peer_gone(last))


def _failure_record(path: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        record = json.loads(path.read_text())
        return {"text": record.get("text", ""), **{key: record[key] for key in ("time", "error", "traceback")}}
    return None


def _timeout_error(outcome: Outcome, ends: dict, files: RunFiles, logs: str, logs_dir) -> LaunchError:
    running = outcome.still_running
    lines = [f"the launch reached its time limit of {outcome.timeout_s:g} s (timeout_s): {_ranks(running)} "
             f"{'was' if len(running) == 1 else 'were'} still running, and every rank was stopped"]
    for rank in running:
        where = _where(files.stacks(rank))
        if where:
            lines.append(f"  rank {rank} was in {where}")
    finished = [r for r, e in ends.items() if e.kind == "finished"]
    if finished:
        lines.append(f"  {_ranks(finished)} had finished")
    return LaunchError("\n".join(lines) + logs, still_running=tuple(running), logs_dir=logs_dir)


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"


def _peer_gone(text: str) -> bool:
    return any(p in text for p in PEER_GONE)


def _short(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + " …"


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else ""
    return ""


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _where(stack_file: Path) -> str:
    """Where a rank's function was, from the faulthandler dump it wrote on STACK_SIGNAL: the innermost frame
    of its main thread (the one running rank_main), and the innermost frame of the user's code if that is
    another (a rank waiting in a collective is in torch, called from the user's function)."""
    entry = rank_main.__name__
    with contextlib.suppress(OSError):
        for block in stack_file.read_text(errors="replace").split("\n\n"):
            frames = [m.groupdict() for m in FRAME.finditer(block)]
            if not any(f["fn"] == entry for f in frames):
                continue
            frames = frames[:next(i for i, f in enumerate(frames) if f["fn"] == entry)]
            if not frames:
                return ""
            inner = frames[0]
            text = f"{inner['fn']} ({_short_path(inner['path'])}:{inner['line']})"
            user = next((f for f in frames if not f["path"].startswith((TORCH_DIR, LAUNCH_DIR))), None)
            if user is not None and user is not inner:
                text += f", called from {user['fn']} ({_short_path(user['path'])}:{user['line']})"
            return text
    return ""


def _short_path(path: str) -> str:
    if path.startswith(TORCH_DIR):
        return "torch" + path[len(TORCH_DIR):]
    with contextlib.suppress(ValueError):
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return path
