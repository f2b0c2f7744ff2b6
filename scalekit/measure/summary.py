"""One summary of measured training steps, for scalekit's own loop and for a Trainer measured by the callback."""

from __future__ import annotations

import statistics

from ..training.results import RunResult, StepRecord
from .flops import mfu
from .timing import Spread


def summarise_steps(result: RunResult, peak_tflops: float | None, peak_why: str) -> list[StepRecord]:
    """Fill `result` from its measured (non-warm-up) steps: the median step time with its spread, the first
    step's time, tokens per step and tokens/s, and MFU against `peak_tflops` (the dense peak for the dtype in
    use; None: unknown, `peak_why` says why).  Returns the measured steps."""
    measured = [s for s in result.steps if not s.warmup]
    result.step_ms = Spread.of([s.step_ms for s in measured])
    result.first_step_ms = result.steps[0].step_ms if result.steps else None
    if not measured:
        return measured
    median_s = result.step_ms.median / 1e3
    sizes = {s.tokens for s in measured}
    if len(sizes) == 1:  # the tokens actually processed, which a user's batches may make fewer
        result.tokens_per_step = sizes.pop()
        result.tokens_per_s = result.tokens_per_step / median_s
    else:  # batches of different sizes (a user's batches, a short last batch): the median of each step's rate
        result.tokens_per_s = statistics.median(s.tokens_per_s for s in measured)
        # the mean of what the steps held (not the config's guess from one sample): the per-token comparisons use it
        result.tokens_per_step = round(statistics.fmean(s.tokens for s in measured))
        result.notes.append("batches differed in size: tokens/s is the median of each step's tokens/s, tokens per step "
                            "their mean")
    result.peak_tflops = peak_tflops
    result.mfu = mfu(result.flops_per_step, median_s, peak_tflops)
    result.mfu_note = peak_why if result.mfu is not None else f"n/a: {peak_why}"
    return measured
