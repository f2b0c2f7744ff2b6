"""A pipeline's timeline as it ran: when each rank's stage started and ended each micro-batch's forward and
backward, recorded in the real run (`record_pipeline`), then gathered from every rank (`Timeline.gather`).

The recorder wraps `forward_one_chunk` and `backward_one_chunk` of torch.distributed.pipelining's stages while it
is open (every schedule, GPipe and 1F1B included, runs a micro-batch through those two methods), so the times
are the work itself: a stage waiting to receive an activation or a gradient waits outside them, and that wait is
the gap between two bars.  Times are `time.perf_counter()`, CLOCK_MONOTONIC on Linux, the same clock in every
process of one machine: ranks on several hosts would need their clocks aligned first."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch.distributed as dist


@dataclass(frozen=True)
class Pass:
    """One forward or backward of one micro-batch on one stage."""

    rank: int
    stage: int
    kind: str  # "forward" or "backward"
    micro_batch: int
    start_s: float
    end_s: float


@dataclass
class Timeline:
    """Every pass recorded while `record_pipeline` was open, this rank's until `gather`, then every rank's."""

    passes: list[Pass] = field(default_factory=list)

    def gather(self) -> Timeline:
        """Every rank's passes, on every rank (a collective: every rank of the default group calls it)."""
        if not (dist.is_available() and dist.is_initialized()):
            return Timeline(sorted(self.passes, key=lambda p: p.start_s))
        rows: list = [None] * dist.get_world_size()
        dist.all_gather_object(rows, self.passes)
        return Timeline(sorted((p for r in rows for p in r), key=lambda p: p.start_s))

    def steps(self) -> list[Timeline]:
        """The passes cut into the run's steps: a stage runs each micro-batch's forward and backward once per step,
        so a stage's k-th forward (or backward) of micro-batch i belongs to step k."""
        seen: dict[tuple, int] = {}
        by_step: dict[int, list[Pass]] = {}
        for p in self.passes:
            key = (p.stage, p.kind, p.micro_batch)
            step = seen.get(key, 0)
            seen[key] = step + 1
            by_step.setdefault(step, []).append(p)
        return [Timeline(by_step[k]) for k in sorted(by_step)]

    def typical_step(self) -> Timeline:
        """The step whose span is the median of the steps after the first (the first is the run's warm-up)."""
        steps = self.steps()
        later = sorted(steps[1:] or steps, key=Timeline.span_ms)
        return later[len(later) // 2] if later else Timeline()

    def rows(self) -> list[dict]:
        """One dict per pass, times in ms from the first start (a table, or a chart's bars)."""
        if not self.passes:
            return []
        zero = min(p.start_s for p in self.passes)
        return [dict(rank=p.rank, stage=p.stage, kind=p.kind, micro_batch=p.micro_batch,
                     start_ms=1e3 * (p.start_s - zero), end_ms=1e3 * (p.end_s - zero)) for p in self.passes]

    def span_ms(self) -> float:
        """From the first pass's start to the last one's end."""
        return 1e3 * (max(p.end_s for p in self.passes) - min(p.start_s for p in self.passes)) if self.passes else 0.0

    def idle_share(self) -> float:
        """The share of the stages' time, over the span, spent in no pass: the bubble as measured (with the sends,
        receives and anything else outside a forward or backward)."""
        stages = {p.stage for p in self.passes}
        span = self.span_ms()
        if not span:
            return 0.0
        busy = sum(1e3 * (p.end_s - p.start_s) for p in self.passes)
        return 1 - busy / (span * len(stages))


@contextlib.contextmanager
def record_pipeline():
    """Record every pipeline stage's forward and backward of each micro-batch in this process while open; yields
    the Timeline they go into."""
    from torch.distributed.pipelining.stage import _PipelineStageBase  # the base of every stage torch builds

    timeline = Timeline()
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    forward, backward = _PipelineStageBase.forward_one_chunk, _PipelineStageBase.backward_one_chunk

    def timed(method, kind):
        def wrapper(stage, chunk_id, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(stage, chunk_id, *args, **kwargs)
            finally:
                timeline.passes.append(Pass(rank, stage.stage_index, kind, chunk_id, start, time.perf_counter()))
        return wrapper

    _PipelineStageBase.forward_one_chunk = timed(forward, "forward")
    _PipelineStageBase.backward_one_chunk = timed(backward, "backward")
    try:
        yield timeline
    finally:
        _PipelineStageBase.forward_one_chunk, _PipelineStageBase.backward_one_chunk = forward, backward
