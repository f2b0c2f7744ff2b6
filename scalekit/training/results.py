"""RunResult: what one run measured, and `compare` for side-by-side ratios with their intervals."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..measure.attention_backend import backends_said
from ..measure.compiled import compile_flags
from ..measure.load import MachineLoad, any_busy, busiest
from ..measure.shared_results import Round, geometric_mean, not_like_for_like, write_results_json
from ..measure.stats import Interval, speedup_interval, too_few_steps, verdict
from ..measure.timing import Spread


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
    graphs_compiled: int | None = None  # graphs torch.compile made over the steps, when compile is on (0: it ran eagerly)
    graph_breaks: int | None = None  # places dynamo split the model, the code there run eagerly
    recompiles_measured: int | None = None  # graphs made inside measured steps after the first (should be 0)
    compile_note: str = ""  # what compile did not capture, in words ("": the whole model, or no compile)
    # the kernel of each SDPA call in the measured steps (measure.attention_backend): {"flash": 8}, {} when none was
    # seen (no SDPA call, or a compiled model, whose attention runs inside graphs)
    sdpa_backends: dict[str, int] = field(default_factory=dict)
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
    threads: int | None = None  # torch's intra-op threads the run computed on
    load: MachineLoad | None = None  # what else the machine ran meanwhile (the busiest round's, with repeats)
    rounds: list[Round] = field(default_factory=list)  # repeats: the later rounds (this run's own steps are the first)
    notes: list[str] = field(default_factory=list)

    @property
    def median_step_ms(self) -> float | None:
        """The median step time; with repeats, the geometric mean of the rounds' medians (so that two rows'
        ratio is their paired speed-up's estimate)."""
        rounds = [r for r in self.timing_rounds() if r]  # a round that measured no step has no median
        if not self.step_ms or not self.step_ms.n or not self.rounds or not rounds:
            return self.step_ms.median if self.step_ms else None
        return geometric_mean([statistics.median(r) for r in rounds])

    @property
    def all_steps_ms(self) -> Spread | None:
        """The spread of the measured steps over every round (this run's own Spread when there are no repeats)."""
        if not self.rounds:
            return self.step_ms
        return Spread.of([ms for r in self.timing_rounds() for ms in r])

    def timing_rounds(self) -> list[list[float]]:
        """Each round's measured step times: this run's own, then its repeats'."""
        return [[s.step_ms for s in self.steps if not s.warmup], *(r.step_ms for r in self.rounds)]

    @property
    def work_per_step(self) -> float:
        """Tokens per measured step (their mean, where batches differed in size)."""
        sizes = [s.tokens for s in self.steps if not s.warmup and s.tokens]
        return self.tokens_per_step or (statistics.fmean(sizes) if sizes else 0.0)

    def add_round(self, again: RunResult) -> None:
        """Keep `again` (the same configuration measured once more) as a round; the figures become the rounds'."""
        steps_ms = again.timing_rounds()[0]
        if not steps_ms:  # it measured no step: there is nothing to pair
            self.notes.append("a repeat measured no step and is left out")
            return
        self.rounds.append(Round(step_ms=steps_ms, per_s_wall=again.tokens_per_s_wall))
        self.load = busiest(self.load, again.load)
        if self.tokens_per_step:
            self.tokens_per_s = self.tokens_per_step / (self.median_step_ms / 1e3)
        walls = [w for w in [self.tokens_per_s_wall, *(r.per_s_wall for r in self.rounds)] if w]
        self.tokens_per_s_wall = geometric_mean(walls) if walls else None

    @property
    def busy_note(self) -> str:
        return self.load.note if self.load is not None else ""

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

    @property
    def flags(self) -> list[str]:
        """Marks a table shows beside the status: what makes an "ok" row not what its label says ("compile no-op":
        compile was on and captured no graph, so the row measured eager code)."""
        return compile_flags(self.graphs_compiled)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["flags"] = self.flags
        d["median_step_ms"] = self.median_step_ms
        d["steps_per_batch"] = self.steps_per_batch
        d["busy"] = bool(self.busy_note)
        return d

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the full result as JSON, atomically (a temporary file, fsynced, renamed)."""
        write_results_json(path, self.to_dict())

    def summary_row(self) -> dict[str, Any]:
        s = self.all_steps_ms
        return {
            "run": self.label,
            "status": self.status,
            "flags": ", ".join(self.flags),
            "step_ms": self.median_step_ms,
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
            "threads": self.threads,
            "sdpa": backends_said(self.sdpa_backends),
            "note": self.error or "; ".join([*self.notes, *([self.busy_note] if self.busy_note else [])]),
        }


def speedup_over(base: RunResult, r: RunResult, statistic=statistics.median) -> tuple[Interval | None, str]:
    """`r`'s speed-up over `base` per token, with its interval, and a note: how the two were made comparable,
    or why they are not (then the interval is None).  `statistic`: each run's median step (the default), or
    its mean (throughput over the wall clock, for pipelines whose steps differ by design)."""
    if not (base.finished and r.finished):
        return None, ""
    why = not_like_for_like(base, r)
    if why:
        return None, why
    interval = speedup_interval(base.timing_rounds(), r.timing_rounds(), statistic=statistic,
                                busy=any_busy(base.load, r.load))
    if interval is None:
        return None, too_few_steps(base.timing_rounds(), r.timing_rounds())
    if base.work_per_step == r.work_per_step:
        return interval, ""
    scaled = interval.scaled(r.work_per_step / base.work_per_step)  # per token: time per step ÷ tokens per step
    return scaled, f"per token: {r.work_per_step:,.0f} against {base.work_per_step:,.0f} tokens per step"


def compare(results: list[RunResult]):
    """A pandas DataFrame, one row per run, with speed-up (per token, with its 95% interval and verdict:
    faster, slower or within noise) and memory ratio against the first run that measured."""
    import pandas as pd

    rows = [r.summary_row() for r in results]
    df = pd.DataFrame(rows)
    if rows:
        base = next((r for r in results if r.finished), results[0])
        _speedup_columns(df, [(None, "") if r is base else speedup_over(base, r) for r in results],
                         [r is base and r.finished for r in results])
        df["mem_ratio"] = [_ratio(r["peak_mem_mb"], base.summary_row()["peak_mem_mb"]) for r in rows]
    cols = ["run", "status", "flags", "step_ms", "step_ms_iqr", "tokens_per_s", "speedup", "speedup_low", "speedup_high",
            "verdict", "tokens_per_s_wall", "data_wait_ms", "data_wait_frac", "steps_per_batch", "peak_mem_mb",
            "mem_ratio", "mfu", "final_loss", "compile_s", "threads", "sdpa", "note"]
    if any(r.heldout_loss_before is not None or (r.trainable_share or 1) < 1 for r in results):
        # fine-tuning: what trains, and what it learned on the held-out part of the new data
        df["trainable_params"] = [r.trainable_params for r in results]
        df["trainable_%"] = [100 * r.trainable_share if r.trainable_share is not None else None for r in results]
        df["heldout_before"] = [r.heldout_loss_before for r in results]
        df["heldout_after"] = [r.heldout_loss_after for r in results]
        cols[cols.index("final_loss") + 1:cols.index("final_loss") + 1] = [
            "trainable_params", "trainable_%", "heldout_before", "heldout_after"]
    return df.reindex(columns=cols)


def _speedup_columns(df, found: list[tuple[Interval | None, str]], is_base: list[bool]) -> None:
    """speedup, its interval and the verdict (the base row: 'baseline'); a normalisation or refusal goes to note."""
    df["speedup"] = [1.0 if base else iv.estimate if iv else None for (iv, _), base in zip(found, is_base, strict=True)]
    df["speedup_low"] = [iv.low if iv else None for iv, _ in found]
    df["speedup_high"] = [iv.high if iv else None for iv, _ in found]
    df["verdict"] = ["baseline" if base else verdict(iv) for (iv, _), base in zip(found, is_base, strict=True)]
    df["note"] = ["; ".join(n for n in (why, note) if n) for (_, why), note in zip(found, df["note"], strict=True)]


def _ratio(num, den):
    if num is None or den is None or not den or (isinstance(num, float) and math.isnan(num)):
        return None
    return num / den


