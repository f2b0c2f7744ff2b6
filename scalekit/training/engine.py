"""The measured training loop: build a run fresh from its config, apply the toggles, measure the steps.

Read `run` top to bottom: check the plan fits the machine, build (`scalekit.training.build.build`: toggles
applied phase by phase, in the order scalekit.toggles fixes), warm up, measure, probe memory, summarise.  Timing brackets each step; the loss is read only every
`log_every` steps, because reading it waits for the device.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import plan
from ..data import load_tokens
from ..data.files import is_data_path
from ..data.loaders import FINETUNE_HELDOUT
from ..distributed import runtime
from ..hf.tokenizer_of import tokenized_data
from ..machine import hardware
from ..measure import flops, memory
from ..measure.attention_backend import AttentionWatch, backends_note
from ..measure.compiled import CompileWatch
from ..measure.interrupts import remembered_ctrl_c
from ..measure.session import measured_run
from ..measure.summary import summarise_steps
from ..measure.timing import Spread, step_timer, synchronize
from ..models.pretrained import heldout_loss
from ..toggles import BuildContext, needs_process_group
from . import build
from .config import RunConfig
from .results import RunResult, StepRecord

StepCallback = Callable[[StepRecord], None]
StatusCallback = Callable[[str], None]


def run(config: RunConfig, on_step: StepCallback | None = None, on_status: StatusCallback | None = None,
        stop: Any = None, hw: hardware.Hardware | None = None, catch_errors: bool = False) -> RunResult:
    """Build `config` fresh, run warm-up then measured steps, and return what was measured.

    on_step receives each StepRecord (at sync points); on_status short progress messages; `stop` is
    anything with is_set() (a threading.Event), checked between steps.  With catch_errors, a failure
    during the run comes back as a result with status "failed" and the error in plain words.
    """
    hw = hw or hardware.detect(runtime.rank_device(config.device))
    cfg = config.resolve(hw)
    cfg.check_available(hw)
    unchecked = plan.check_fits(cfg, hw) if cfg.check_memory else None  # refused here, before allocating
    status = on_status or (lambda message: None)
    result = RunResult(label=cfg.label, config=cfg.to_dict(), device=hw.device_name,
                       torch_version=torch.__version__, tokens_per_step=build.tokens_per_step(cfg))
    if unchecked:
        result.notes.append(unchecked)
    if stop is not None and stop.is_set():  # stopped before it began (a time budget ran out): build nothing
        result.status = "stopped"
        result.notes.append("stopped before it started: nothing was measured")
        return result
    group = None
    # a rank that carried on after a failure would wait forever for the others: it ends the launch
    with measured_run(result, hw.device_type, catch_errors, must_raise=lambda: group is not None,
                      threads=cfg.threads) as stack:
        # first on the stack, so destroyed last: after the toggles released their DDP/FSDP models
        if needs_process_group(cfg.toggles):
            group = runtime.setup(hw, stack, cfg.batch_size)
            cfg.check_ranks(runtime.world_size())  # in each rank too, however it was launched: replicas kept in step
        result = _build_and_measure(cfg, hw, stack, group, result, on_step, stop, status)
    status(f"{cfg.label}: {result.status}")
    return result


def _build_and_measure(cfg: RunConfig, hw, stack, group, result: RunResult, on_step, stop, status) -> RunResult:
    """Build the run, measure its steps and memory; with ranks, every rank's figures gathered."""
    t_build = time.perf_counter()
    status(f"building {cfg.label} ({cfg.preset if not cfg.custom_model else 'your model'})")
    ctx = build.build(cfg, hw, stack)
    result.notes.extend(ctx.notes)
    result.flops_per_step = build.flops_per_step(ctx)
    if group is not None:
        runtime.adopt(group, ctx, result)  # this rank's share of tokens and FLOPs
    result.build_s = time.perf_counter() - t_build
    for key, value in memory.parameter_counts(ctx.base_model).items():
        setattr(result, key, value)
    grads = memory.GradBytesAtStep(ctx.optimizer)  # reads gradient bytes once, at the first step
    heldout = heldout_tokens(cfg)
    if heldout is not None:
        status("held-out loss before training")
        result.heldout_loss_before = heldout_loss(ctx.base_model, heldout, cfg.seq_len)
    try:
        _measure(ctx, result, on_step, stop, status)
    finally:
        _summarise(ctx, result)  # what was measured is kept, also when a step failed
    if heldout is not None and result.status in ("ok", "stopped"):
        result.heldout_loss_after = heldout_loss(ctx.base_model, heldout, cfg.seq_len)
    if cfg.measure_memory and ctx.device.type == "cpu" and result.status == "ok":
        status("counting live tensor memory on one extra step")
        _probe_cpu_memory(ctx, result, runtime.LocalTensorBytes if group else memory.LiveTensorBytes)
    _memory_breakdown(ctx, result, grads.grads_bytes)
    if group is not None:
        result = runtime.aggregate(group, result, ctx.data_parallel)  # every rank's figures, gathered
    return result  # ctx goes with this frame: the toggles' teardown (LIFO) then frees the wrapped model


class StepLog:
    """What the measured loop keeps between sync points: step times, tokens and losses not yet read.

    Losses stay on the device until a sync point, where they are read all at once (one wait for the
    device, as reading the last one alone would be): each step's loss is checked, so a run that diverges
    is stopped at the sync point with the exact step that went non-finite.
    """

    def __init__(self, ctx: BuildContext, result: RunResult, on_step):
        self.ctx, self.result, self.on_step = ctx, result, on_step
        self.timer = step_timer(ctx.device)
        self.first = 0  # index of the first step not yet reported
        self.tokens: list[int] = []  # tokens of each step not yet reported
        self.losses: list[torch.Tensor] = []
        self.wall_t0: float | None = None
        self.measured_tokens = 0

    def begin_measuring(self) -> None:
        """The warm-up is over: the device's queue drained, peak memory reset, the wall clock started."""
        synchronize(self.ctx.device)
        memory.cuda_memory_reset(self.ctx.device)
        self.wall_t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, tokens: int) -> None:
        self.losses.append(loss.detach())
        self.tokens.append(tokens)

    def sync(self, i: int) -> bool:
        """Report the steps up to `i`; False if a loss among them is not finite (the run diverged)."""
        values = torch.stack(self.losses).float().tolist()  # waits for the device: only at sync points
        mem = memory.current_bytes(self.ctx.device)
        self._report(values, mem)
        bad = next((k for k, v in enumerate(values) if not math.isfinite(v)), None)
        self.losses = []
        # every rank stops at the same sync point, or the others would wait for it in a collective
        if bad is not None or (self.ctx.world_size > 1 and runtime.any_rank(False)):
            self._diverged(None if bad is None else (i - len(values) + 1 + bad, values[bad]))
            return False
        self.result.losses.append((i, values[-1]))
        return True

    def _diverged(self, where: tuple[int, float] | None) -> None:
        if self.ctx.world_size > 1 and where is not None:
            runtime.any_rank(True)
        self.result.status = "diverged"
        if where is None:
            self.result.error = "the loss became non-finite on another rank; every rank ended there"
            return
        step, value = where
        self.result.diverged_at_step = step
        self.result.error = (f"the loss became {value} at step {step} (counting warm-up steps from 0); the run "
                             f"ended there, its measurements so far are kept — try a lower lr, bf16 instead of "
                             f"fp16, or gradient clipping")

    def _report(self, values: list[float] | None, mem) -> None:
        warmup = self.ctx.config.warmup_steps
        times, waits = self.timer.collect_with_waits()
        for k, ms in enumerate(times):
            j = self.first + k
            last = k == len(times) - 1 and values is not None
            record = StepRecord(step=j, warmup=j < warmup, step_ms=ms, tokens_per_s=self.tokens[k] / (ms / 1e3),
                                loss=values[-1] if last else None, mem_bytes=mem if last else None,
                                tokens=self.tokens[k], data_wait_ms=waits[k])
            self.result.steps.append(record)
            if j >= warmup:
                self.measured_tokens += self.tokens[k]
            if self.on_step is not None:
                self.on_step(record)
        self.first += len(times)
        self.tokens = self.tokens[len(times):]

    def finish(self) -> None:
        """Steps timed but not yet reported (a stop or failure between sync points) still count."""
        self._report(None, None)
        synchronize(self.ctx.device)
        if self.wall_t0 is not None:
            self.result.measured_wall_s = time.perf_counter() - self.wall_t0
            self.result.tokens_per_s_wall = self.measured_tokens / self.result.measured_wall_s
        if self.ctx.batch_counter is not None:  # before the memory probe's extra step
            self.result.batches_fetched = self.ctx.batch_counter.count


HELDOUT_WINDOWS = 32  # windows of the held-out part read before and after a fine-tuning run


def heldout_tokens(cfg: RunConfig):
    """The held-out text of a fine-tuning data source or of your data file (its last 10% of tokens); None for the
    other sources and your own dataset or batch_fn."""
    if is_data_path(cfg.data):
        tokens = tokenized_data(cfg).part("heldout")[0]
    elif cfg.custom_model or cfg.data not in FINETUNE_HELDOUT:
        return None
    else:
        tokens = load_tokens(FINETUNE_HELDOUT[cfg.data])
    windows = min(HELDOUT_WINDOWS, (len(tokens) - 1) // cfg.seq_len)
    return tokens[: windows * cfg.seq_len + 1] if windows else None


def _measure(ctx: BuildContext, result: RunResult, on_step, stop, status) -> None:
    log = StepLog(ctx, result, on_step)
    watch = CompileWatch() if ctx.compiled else None
    attention = AttentionWatch(enabled=not ctx.compiled)  # which SDPA kernel each measured step's attention ran
    interrupted = False
    if ctx.compiled:
        status("compiling: the first step includes compilation and can take a while")
    try:
        with remembered_ctrl_c() as ctrl_c:
            _steps(ctx, result, log, watch, attention, ctrl_c, stop, status)
    except KeyboardInterrupt:
        if ctx.world_size > 1:
            raise  # every rank is being interrupted: the launcher ends them all
        log.timer.discard()  # the interrupted step did not finish: it is not a measurement
        result.status = "stopped"
        interrupted = True
    finally:
        log.finish()
        if result.status == "stopped":
            _note_stop(result, interrupted)
        _record_watches(watch, attention, result)
    if ctx.device.type == "cuda" and log.wall_t0 is not None:
        result.peak_mem_bytes, result.peak_mem_reserved_bytes = memory.cuda_peak(ctx.device)
        result.mem_source = "CUDA allocator: max_memory_allocated over the measured steps"


def _steps(ctx: BuildContext, result: RunResult, log: StepLog, watch, attention, ctrl_c, stop, status) -> None:
    """The warm-up and measured steps; a stop between steps (the Lab's Stop, a time budget, a Ctrl-C whose
    KeyboardInterrupt a finalizer swallowed) ends them."""
    cfg = ctx.config
    total = cfg.warmup_steps + cfg.steps
    for i in range(total):
        ctrl_c.raise_if_seen()
        if stop is not None and stop.is_set():
            result.status = "stopped"
            break
        if i == cfg.warmup_steps:
            status(f"measuring {cfg.steps} steps")
            log.begin_measuring()
        log.timer.start()
        batch = next(ctx.batches)
        log.timer.data_ready()  # the wait for data is timed apart; the step's time still includes it
        tokens = build.batch_tokens(ctx, batch)
        with _watched(watch, attention, i, cfg.warmup_steps):
            loss = build.train_step(ctx, batch)
        for hook in ctx.after_step:
            hook(i)
        log.timer.stop()
        log.add(loss, tokens)
        if ctx.evaluator is not None:  # between steps: outside their times, inside the wall time
            ctx.evaluator.maybe_run(i, result)
        warm = i < cfg.warmup_steps
        if warm or (i + 1 - cfg.warmup_steps) % cfg.log_every == 0 or i == total - 1:
            if not log.sync(i):
                break
            if warm:
                status(f"warm-up step {i + 1}/{cfg.warmup_steps}: {result.steps[-1].step_ms:.0f} ms")


def _note_stop(result: RunResult, interrupted: bool) -> None:
    """Why a stopped run has the steps it has; said also when it has none (its row would read a bare "stopped")."""
    if not any(not step.warmup for step in result.steps):
        result.notes.insert(0, "stopped (Ctrl-C, Stop or a termination signal) before its first measured step: "
                               "nothing measured")
    elif interrupted:
        result.notes.append("interrupted (Ctrl-C): the steps measured so far are kept")


@contextlib.contextmanager
def _watched(watch: CompileWatch | None, attention: AttentionWatch, i: int, warmup_steps: int):
    """Step i's watches: compile's graphs counted from the second step (the first compiles), SDPA's kernels over
    the measured steps."""
    compiled = watch.step(measured=i >= max(1, warmup_steps)) if watch is not None else contextlib.nullcontext()
    with compiled, attention.step(measured=i >= warmup_steps):
        yield


def _record_watches(watch: CompileWatch | None, attention: AttentionWatch, result: RunResult) -> None:
    """What the watches saw, into the result: compile's capture (when compile is on), SDPA's kernels."""
    if watch is not None:
        _record_capture(watch, result)
    result.sdpa_backends = dict(attention.calls)
    if attention.calls:
        result.notes.append(backends_note(attention.calls))


def _record_capture(watch: CompileWatch, result: RunResult) -> None:
    """What compile captured over the steps, said in the notes when it was not the whole model in one go."""
    captured = watch.captured()
    result.graphs_compiled, result.graph_breaks = captured.graphs, captured.graph_breaks
    result.recompiles_measured = watch.graphs_in_measured_steps
    # said only of a model that ran: a run stopped while its first step compiled made no graph, and ran nothing
    result.compile_note = captured.note() if result.steps else ""
    if result.compile_note:
        result.notes.append(result.compile_note)
    if watch.graphs_in_measured_steps:
        result.notes.append(f"compile made {watch.graphs_in_measured_steps} graph(s) during the measured steps "
                            f"(recompiles: a shape or guard changed), and their compile time is inside those steps")


def _summarise(ctx: BuildContext, result: RunResult) -> None:
    cfg = ctx.config
    peak, why = (cfg.peak_tflops, "peak_tflops given in the config") if cfg.peak_tflops is not None else \
        ctx.hw.peak_tflops(flops.mfu_dtype(ctx.compute_dtype, ctx.tf32_matmuls))
    if summarise_steps(result, peak, why) and ctx.compiled:
        result.compile_s = max(0.0, (result.first_step_ms - result.step_ms.median) / 1e3)
    if result.losses:
        result.final_loss = result.losses[-1][1]
    if result.eval_s is not None and result.measured_wall_s:
        result.eval_share = result.eval_s / result.measured_wall_s
    _summarise_data_wait(result)


def _summarise_data_wait(result: RunResult) -> None:
    """The wait for data over the measured steps: its median and spread, and its share of the step time."""
    steps = [s for s in result.steps if not s.warmup and s.data_wait_ms is not None]
    if not steps:
        return
    result.data_wait_ms = Spread.of([s.data_wait_ms for s in steps])
    # total wait over total time, not a median of shares: with data_echo most steps wait for nothing
    result.data_wait_frac = sum(s.data_wait_ms for s in steps) / sum(s.step_ms for s in steps)


def _probe_cpu_memory(ctx: BuildContext, result: RunResult, tracker_cls=memory.LiveTensorBytes) -> None:
    """Peak live tensor bytes over one extra (untimed) step, starting from weights and optimizer state."""
    result.peak_mem_bytes = build.probe_step_memory(ctx, build.step_tracker(ctx, tracker_cls))
    result.mem_source = "live tensor bytes over one extra step (CPU has no allocator statistics)"
    if ctx.compiled:
        result.mem_source += "; compiled runs are probed eagerly"


def _memory_breakdown(ctx: BuildContext, result: RunResult, grads_bytes: int | None) -> None:
    """Split the measured peak: weights, gradients, optimizer state, and the rest (activations, temporaries)."""
    if result.peak_mem_bytes is None or grads_bytes is None:
        return
    result.params_bytes = memory.storage_bytes([*ctx.base_model.parameters(), *ctx.base_model.buffers()])
    result.grads_bytes = grads_bytes
    result.optimizer_state_bytes = memory.storage_bytes(memory.optimizer_state_tensors(ctx.optimizer))
    rest = result.params_bytes + result.grads_bytes + result.optimizer_state_bytes
    result.activations_bytes = max(0, result.peak_mem_bytes - rest)
