"""The memory timeline of one step of a run: `step_timeline(RunConfig)` builds the run as `scalekit.run` does
(its toggles, on this rank's share of the batch when they need ranks), takes a step so the optimizer has
made its state, then records a step (scalekit/measure/memory_timeline.py).  Recording costs Python work on
every op, so each recorded step is paired with a plain one just before it: `Timeline.plain_ms` and
`recorded_ms` are their medians, and their ratio is what recording costs on this step."""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from ..distributed import runtime
from ..machine import hardware
from ..measure.load import LoadMeter
from ..measure.memory_timeline import Timeline, record_cuda_step, record_step
from ..measure.session import pin_threads
from ..toggles import needs_process_group
from . import build
from .config import RunConfig


def step_timeline(cfg: RunConfig, hw: hardware.Hardware | None = None, rounds: int = 1) -> Timeline:
    """The timeline of one step of `cfg` after a first one, on this process's device; `rounds` pairs of a plain
    step and a recorded one (the last recording is kept).  In a launched rank it joins the process group."""
    hw = hw or hardware.detect(runtime.rank_device("auto") if needs_process_group(cfg.toggles) else "auto")
    cfg = cfg.resolve(hw)
    meter = LoadMeter(hw.device_type)
    with contextlib.ExitStack() as stack:
        pin_threads(stack, cfg.threads)  # as a run pins them
        if needs_process_group(cfg.toggles):
            runtime.setup(hw, stack, cfg.batch_size)
        ctx = build.build(cfg, hw, stack)
        model, ctx.model = ctx.model, (ctx.base_model if ctx.compiled else ctx.model)  # a dispatch mode sees no
        eager = torch.compiler.set_stance("force_eager") if ctx.compiled else contextlib.nullcontext()  # kernel
        record = record_cuda_step if ctx.device.type == "cuda" else record_step
        plain, recorded = [], []
        try:
            with eager:
                build.train_step(ctx, next(ctx.batches))  # the optimizer makes its state
                for _ in range(rounds):
                    start = time.perf_counter()
                    build.train_step(ctx, next(ctx.batches))
                    plain.append((time.perf_counter() - start) * 1e3)
                    timeline = record(lambda: build.train_step(ctx, next(ctx.batches)), ctx.base_model, ctx.optimizer)
                    recorded.append(timeline.recorded_ms)
        finally:
            ctx.model = model
    timeline.plain_ms, timeline.recorded_ms = statistics.median(plain), statistics.median(recorded)
    timeline.load = meter.read()
    return timeline
