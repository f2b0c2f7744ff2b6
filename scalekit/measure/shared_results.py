"""What training's and generation's results share: the statuses a run ends in, a repeat's round, the
like-for-like rule two results must meet to be compared, and the atomic JSON writer."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass

from ..files import write_atomic

# ok: every step ran; stopped: Stop or Ctrl-C ended it early (what it measured is kept); diverged: the loss
# became NaN or infinite (the run ended there, its measurements so far kept); failed: an error, in `error`;
# skipped: not run (a rung of the ladder this machine cannot run).
STATUSES = ("ok", "stopped", "diverged", "failed", "skipped")


@dataclass

class Round:
    """One more measurement of a configuration (repeats=), taken in alternating order with the other rows."""

    step_ms: list[float]  # its measured steps' times (for a generation: its decode steps')
    per_s_wall: float | None = None  # its wall-clock throughput (tokens/s)


def geometric_mean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def not_like_for_like(base, r) -> str:
    """Why two results (training or generation) cannot be compared as they are, or ''."""
    if base.device and r.device and base.device != r.device:
        return f"not compared: measured on {r.device} and {base.device}"
    # threads over all of a run's processes: two ranks of one thread use the cores one process of two does
    a, b = (x.threads * getattr(x, "world_size", 1) if x.threads else None for x in (base, r))
    if a and b and a != b:
        return f"not compared: {b} against {a} threads (give every run the same threads=)"
    return ""


def write_results_json(path: str | os.PathLike, doc) -> None:
    """JSON of results (a RunResult's dict, or a list of them), written atomically."""
    write_atomic(path, lambda f: json.dump(doc, f, indent=2, default=str))
