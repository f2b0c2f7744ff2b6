"""RunResult: what one run measured, and `compare` for side-by-side ratios."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..files import write_atomic
from .timing import Spread

# ok: every step ran; stopped: Stop or Ctrl-C ended it early (what it measured is kept); diverged: the loss
# became NaN or infinite (the run ended there, its measurements so far kept); failed: an error, in `error`;
# skipped: not run (a rung of the ladder this machine cannot run).
STATUSES = ("ok", "stopped", "diverged", "failed", "skipped")


@dataclass
class StepRecord:
    """One step as streamed to callbacks and kept for plots."""

    step: int  # 0-based, counting warm-up steps
    warmup: bool
    step_ms: float
    tokens_per_s: float
    loss: float | None  # only read every log_every steps (a sync point)
    mem_bytes: int | None  # allocator bytes on GPU, RSS on CPU, read at sync points
    tokens: int | None = None  # tokens this step processed (this rank's)
    data_wait_ms: float | None = None  # of step_ms, the time spent waiting for the batch (and its copy to the device)


@dataclass
class RunResult:
    label: str
    config: dict
    status: str = "ok"  # one of STATUSES
    error: str | None = None  # for "failed" and "diverged": what went wrong, in plain words
    diverged_at_step: int | None = None  # the step whose loss went NaN/inf (counting warm-up steps from 0)
    device: str = ""
    torch_version: str = ""
    tokens_per_step: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    step_ms: Spread | None = None  # over measured steps only
    # waiting for data: each step's time from its start until it had its batch (on a GPU, with the copy to
    # the device unless that overlapped compute), over measured steps; the share is total wait / total step time
    data_wait_ms: Spread | None = None
    data_wait_frac: float | None = None
    batches_fetched: int | None = None  # batches the input pipeline delivered over the run's steps (warm-up too)
    tokens_per_s: float | None = None  # tokens_per_step / median step time
    tokens_per_s_wall: float | None = None  # measured tokens / wall time of the measured loop, harness included
    first_step_ms: float | None = None  # includes compilation when compile is on
    compile_s: float | None = None  # first step minus a steady step, when compile is on
    build_s: float | None = None  # model, data and optimizer set-up before the first step
    peak_mem_bytes: int | None = None
    peak_mem_reserved_bytes: int | None = None  # GPU allocator only
    mem_source: str = ""
    # the peak split in four (bytes): weights (and buffers), gradients, optimizer state, and the rest of
    # the peak, i.e. activations and temporaries live at that moment
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    activations_bytes: int | None = None
    # what trains: parameters counted as values (a 4-bit weight is one value, whatever it is packed in)
    trainable_params: int | None = None
    total_params: int | None = None
    trainable_weight_bytes: int | None = None  # bytes of the parameters that train
    frozen_weight_bytes: int | None = None  # bytes of the frozen ones (quantized where they are)
    heldout_loss_before: float | None = None  # fine-tuning data's held-out part, before the first step
    heldout_loss_after: float | None = None  # ... and after the last
    flops_per_step: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    mfu_note: str = ""
    final_loss: float | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    # evaluation during training (RunConfig.eval_every): each one's step, held-out loss, time (and sample)
    evals: list[dict] = field(default_factory=list)
    eval_s: float | None = None  # time the evaluations took, outside the steps' times
    measured_wall_s: float | None = None  # wall time of the measured loop, evaluations included
    eval_share: float | None = None  # eval_s / measured_wall_s
    notes: list[str] = field(default_factory=list)

    @property
    def median_step_ms(self) -> float | None:
        return self.step_ms.median if self.step_ms else None

    @property
    def steps_per_batch(self) -> float | None:
        """Optimizer steps per batch fetched from the input pipeline, warm-up included (k with data_echo=k)."""
        if not self.batches_fetched or not self.steps:
            return None
        return len(self.steps) / self.batches_fetched

    def memory_breakdown(self) -> dict[str, int] | None:
        """{part: bytes} for params, grads, optimizer_state, activations, and their sum the peak; None if not measured."""
        parts = (self.params_bytes, self.grads_bytes, self.optimizer_state_bytes, self.activations_bytes)
        if any(v is None for v in parts):
            return None
        return dict(zip(("params", "grads", "optimizer_state", "activations"), parts, strict=True), peak=sum(parts))

    @property
    def finished(self) -> bool:
        """It measured steps whose figures can be shown (a diverged run's, up to where it diverged)."""
        return self.status in ("ok", "stopped", "diverged") and bool(self.step_ms and self.step_ms.n)

    @property
    def trainable_share(self) -> float | None:
        return self.trainable_params / self.total_params if self.trainable_params is not None and \
            self.total_params else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_step_ms"] = self.median_step_ms
        d["steps_per_batch"] = self.steps_per_batch
        return d

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the full result as JSON, atomically (a temporary file, fsynced, renamed)."""
        write_results_json(path, self.to_dict())

    def summary_row(self) -> dict[str, Any]:
        s = self.step_ms
        return {
            "run": self.label,
            "status": self.status,
            "step_ms": s.median if s else None,
            "step_ms_iqr": s.iqr if s else None,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_wall": self.tokens_per_s_wall,
            "data_wait_ms": self.data_wait_ms.median if self.data_wait_ms and self.data_wait_ms.n else None,
            "data_wait_frac": self.data_wait_frac,
            "steps_per_batch": self.steps_per_batch,
            "peak_mem_mb": self.peak_mem_bytes / 2**20 if self.peak_mem_bytes else None,
            "mfu": self.mfu,
            "final_loss": self.final_loss,
            "compile_s": self.compile_s,
            "note": self.error or "; ".join(self.notes),
        }


def compare(results: list[RunResult]):
    """A pandas DataFrame, one row per run, with speed-up and memory ratio against the first row."""
    import pandas as pd

    rows = [r.summary_row() for r in results]
    df = pd.DataFrame(rows)
    if rows:
        base = rows[0]
        df["speedup"] = [_ratio(base["step_ms"], r["step_ms"]) for r in rows]
        df["mem_ratio"] = [_ratio(r["peak_mem_mb"], base["peak_mem_mb"]) for r in rows]
    cols = ["run", "status", "step_ms", "step_ms_iqr", "tokens_per_s", "speedup", "tokens_per_s_wall", "data_wait_ms",
            "data_wait_frac", "steps_per_batch", "peak_mem_mb", "mem_ratio", "mfu", "final_loss", "compile_s", "note"]
    if any(r.heldout_loss_before is not None or (r.trainable_share or 1) < 1 for r in results):
        # fine-tuning: what trains, and what it learned on the held-out part of the new data
        df["trainable_params"] = [r.trainable_params for r in results]
        df["trainable_%"] = [100 * r.trainable_share if r.trainable_share is not None else None for r in results]
        df["heldout_before"] = [r.heldout_loss_before for r in results]
        df["heldout_after"] = [r.heldout_loss_after for r in results]
        cols[cols.index("final_loss") + 1:cols.index("final_loss") + 1] = [
            "trainable_params", "trainable_%", "heldout_before", "heldout_after"]
    return df.reindex(columns=cols)


def _ratio(num, den):
    if num is None or den is None or not den or (isinstance(num, float) and math.isnan(num)):
        return None
    return num / den


def write_results_json(path: str | os.PathLike, doc) -> None:
    """JSON of results (a RunResult's dict, or a list of them), written atomically."""
    write_atomic(path, lambda f: json.dump(doc, f, indent=2, default=str))
