"""The training loop: build a run fresh from its config, apply the toggles, measure the steps.

Read `run` top to bottom: build (toggles applied phase by phase, in the order scalekit.toggles fixes),
warm up, measure, probe memory, summarise.  Timing brackets each step; the loss is read only every
`log_every` steps, because reading it waits for the device.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import distributed, hardware
from .config import RunConfig
from .data import shakespeare_batches, synthetic_batches
from .measure import flops as flops_mod
from .measure import memory
from .measure.results import RunResult, StepRecord
from .measure.timing import Spread, step_timer, synchronize
from .models import GPT, PRESETS
from .models.blocks import find_blocks
from .toggles import PHASES, BuildContext, OptimizerStep, apply_toggles, needs_process_group

StepCallback = Callable[[StepRecord], None]
StatusCallback = Callable[[str], None]


def gpt_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return model(x, y)[1]


def build(cfg: RunConfig, hw: hardware.Hardware, stack: contextlib.ExitStack) -> BuildContext:
    """Everything a run needs, built fresh, phase by phase (PHASES): after each phase's toggles, what that
    phase is for is built (BUILDERS): the batches, the model, the optimizer and its stepper."""
    torch.manual_seed(cfg.seed)
    ctx = BuildContext(config=cfg, hw=hw, device=hw.device, stack=stack,
                       world_size=distributed.world_size() if needs_process_group(cfg.toggles) else 1,
                       gpt_config=None if cfg.custom_model else PRESETS[cfg.preset].gpt_config(cfg.seq_len))
    for phase in PHASES:
        apply_toggles(ctx, phase, cfg.toggles)
        if phase in BUILDERS:
            BUILDERS[phase](ctx)
    return ctx


def build_batches(ctx: BuildContext) -> None:
    cfg = ctx.config
    batches = make_batches(cfg, ctx.device, ctx.loader_kwargs)
    # in a run spread over ranks, each rank keeps its own slice of every global batch
    ctx.batches = distributed.shard_batches(batches, cfg.batch_size) if ctx.world_size > 1 else batches


def build_model(ctx: BuildContext) -> None:
    cfg = ctx.config
    if cfg.custom_model:
        model = cfg.model() if not isinstance(cfg.model, torch.nn.Module) else copy.deepcopy(cfg.model)
        ctx.loss_fn = cfg.loss_fn
    else:
        model = GPT(ctx.gpt_config)
        ctx.loss_fn = gpt_loss
    if any(t.device != ctx.device for t in itertools.chain(model.parameters(), model.buffers())):
        model = model.to(ctx.device)  # (only when needed: the planner's fake tensors cannot be moved in place)
    ctx.base_model = model  # unwrapped: for FLOPs, memory and checkpoints
    ctx.model = ctx.base_model
    ctx.blocks = find_blocks(ctx.base_model)


def build_optimizer(ctx: BuildContext) -> None:
    if ctx.optimizer_factory is not None:
        ctx.optimizer = ctx.optimizer_factory(ctx.model.parameters())
    else:
        ctx.optimizer = torch.optim.AdamW(ctx.model.parameters(), lr=ctx.config.lr, **ctx.optimizer_kwargs)
    ctx.stepper = OptimizerStep(ctx.optimizer, ctx.grad_scaler)


# What the engine builds after the toggles of a phase (phases without an entry build nothing themselves).
BUILDERS = {"data": build_batches, "model_config": build_model, "optimizer": build_optimizer}


def make_batches(cfg: RunConfig, device: torch.device, loader_kwargs: dict) -> Iterator:
    if cfg.custom_model:
        return (cfg.batch_fn(cfg.batch_size, device) for _ in iter(int, 1))
    if cfg.data == "synthetic":
        vocab = PRESETS[cfg.preset].vocab_size
        return synthetic_batches(vocab, cfg.seq_len, cfg.batch_size, cfg.seed, device)
    batches = shakespeare_batches(cfg.seq_len, cfg.batch_size, cfg.seed, **loader_kwargs)
    return ((x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in batches)


def split_batch(batch, parts: int) -> list:
    """Split every tensor in `batch` into `parts` equal micro-batches along dim 0."""
    if parts == 1:
        return [batch]
    leaves, spec = tree_flatten(batch)
    chunks = [leaf.chunk(parts) if isinstance(leaf, torch.Tensor) else [leaf] * parts for leaf in leaves]
    return [tree_unflatten([c[k] for c in chunks], spec) for k in range(parts)]


def train_step(ctx: BuildContext, batch) -> torch.Tensor:
    """One optimizer step: forward and backward per micro-batch under the step contexts, update, clear grads."""
    micro_batches = split_batch(batch, ctx.grad_accum_steps)
    losses = []
    for k, micro in enumerate(micro_batches):
        last = k == len(micro_batches) - 1
        # gradients are averaged over micro-batches: the same as one step on the whole batch
        sync = contextlib.nullcontext() if last or ctx.no_sync is None else ctx.no_sync()
        autocast = (torch.autocast(ctx.device.type, dtype=ctx.compute_dtype) if ctx.compute_dtype
                    else contextlib.nullcontext())
        with sync:
            with autocast:
                loss = ctx.loss_fn(ctx.model, micro) / len(micro_batches)
            ctx.stepper.backward(loss, boundary=last)
        losses.append(loss.detach())
    ctx.stepper.step()  # the update, and the gradients cleared (set to None)
    return losses[0] if len(losses) == 1 else torch.stack(losses).sum()


def tokens_per_step(cfg: RunConfig) -> int:
    if cfg.custom_model:
        return cfg.batch_size * cfg.tokens_per_sample
    return cfg.batch_size * cfg.seq_len


def flops_per_step(ctx: BuildContext) -> float | None:
    cfg = ctx.config
    if not cfg.custom_model:
        g = ctx.gpt_config
        per_token = flops_mod.gpt_train_flops_per_token(ctx.base_model.num_params(), g.n_layer, g.n_embd, cfg.seq_len)
        return per_token * tokens_per_step(cfg)
    # a user's model: count one forward/backward of the unwrapped model, leaving RNG and gradients as they were
    with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []):
        batch = cfg.batch_fn(cfg.batch_size, ctx.device)
        counted = flops_mod.counted_train_flops(lambda: ctx.loss_fn(ctx.base_model, batch))
    ctx.base_model.zero_grad(set_to_none=True)
    return counted or None


def mfu_dtype(ctx: BuildContext) -> str:
    """The dtype whose dense peak MFU is measured against: what the run's matmuls compute in."""
    if ctx.compute_dtype is not None:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(ctx.compute_dtype, "fp32")
    return "tf32" if ctx.tf32_matmuls else "fp32"


def run(config: RunConfig, on_step: StepCallback | None = None, on_status: StatusCallback | None = None,
        stop: Any = None, hw: hardware.Hardware | None = None, catch_errors: bool = False) -> RunResult:
    """Build `config` fresh, run warm-up then measured steps, and return what was measured.

    on_step receives each StepRecord (at sync points); on_status short progress messages; `stop` is
    anything with is_set() (a threading.Event), checked between steps.  With catch_errors, a failure
    during the run comes back as a result with status "failed" and the error in plain words.
    """
    hw = hw or hardware.detect(distributed.rank_device(config.device))
    cfg = config.resolve(hw)
    cfg.check_available(hw)
    status = on_status or (lambda message: None)
    result = RunResult(label=cfg.label, config=cfg.to_dict(), device=hw.device_name,
                       torch_version=torch.__version__, tokens_per_step=tokens_per_step(cfg))
    group = None
    try:
        with contextlib.ExitStack() as stack:
            # first on the stack, so destroyed last: after the toggles released their DDP/FSDP models
            if needs_process_group(cfg.toggles):
                group = distributed.setup(hw, stack, cfg.batch_size)
            result = _build_and_measure(cfg, hw, stack, group, result, on_step, stop, status)
    except Exception as exc:
        # a rank that carried on would wait forever for the others: let the failure end the launch
        if not catch_errors or group is not None:
            raise
        result.status = "failed"
        result.error = plain_error(exc)
    finally:
        gc.collect()
        if hw.device_type == "cuda":
            torch.cuda.empty_cache()
    status(f"{cfg.label}: {result.status}")
    return result


def _build_and_measure(cfg: RunConfig, hw, stack, group, result: RunResult, on_step, stop, status) -> RunResult:
    """Build the run, measure its steps and memory; with ranks, every rank's figures gathered."""
    t_build = time.perf_counter()
    status(f"building {cfg.label} ({cfg.preset if not cfg.custom_model else 'your model'})")
    ctx = build(cfg, hw, stack)
    result.notes.extend(ctx.notes)
    result.flops_per_step = flops_per_step(ctx)
    if group is not None:
        distributed.adopt(group, ctx, result)  # this rank's share of tokens and FLOPs
    result.build_s = time.perf_counter() - t_build
    grads = memory.GradBytesAtStep(ctx.optimizer)  # reads gradient bytes once, at the first step
    _measure(ctx, result, on_step, stop, status)
    _summarise(ctx, result)
    if cfg.measure_memory and ctx.device.type == "cpu" and result.status == "ok":
        status("counting live tensor memory on one extra step")
        _probe_cpu_memory(ctx, result, distributed.LocalTensorBytes if group else memory.LiveTensorBytes)
    _memory_breakdown(ctx, result, grads.grads_bytes)
    if group is not None:
        result = distributed.aggregate(group, result)  # every rank's figures, gathered
    return result  # ctx goes with this frame: the toggles' teardown (LIFO) then frees the wrapped model


def _measure(ctx: BuildContext, result: RunResult, on_step, stop, status) -> None:
    cfg = ctx.config
    timer = step_timer(ctx.device)
    total = cfg.warmup_steps + cfg.steps
    tokens = result.tokens_per_step
    pending_first = 0  # index of the first step not yet reported
    wall_t0 = None
    if ctx.compiled:
        status("compiling: the first step includes compilation and can take a while")
    for i in range(total):
        if stop is not None and stop.is_set():
            result.status = "stopped"
            break
        if i == cfg.warmup_steps:
            synchronize(ctx.device)
            memory.cuda_memory_reset(ctx.device)
            status(f"measuring {cfg.steps} steps")
            wall_t0 = time.perf_counter()
        timer.start()
        loss = train_step(ctx, next(ctx.batches))
        for hook in ctx.after_step:
            hook(i)
        timer.stop()
        warm = i < cfg.warmup_steps
        if warm or (i + 1 - cfg.warmup_steps) % cfg.log_every == 0 or i == total - 1:
            loss_value = loss.item()  # waits for the device: only at these sync points
            mem = memory.current_bytes(ctx.device)
            for j, ms in enumerate(timer.collect(), start=pending_first):
                last = j == i
                record = StepRecord(step=j, warmup=j < cfg.warmup_steps, step_ms=ms, tokens_per_s=tokens / (ms / 1e3),
                                    loss=loss_value if last else None, mem_bytes=mem if last else None)
                result.steps.append(record)
                if on_step is not None:
                    on_step(record)
            pending_first = i + 1
            result.losses.append((i, loss_value))
            if warm:
                status(f"warm-up step {i + 1}/{cfg.warmup_steps}: {result.steps[-1].step_ms:.0f} ms")
    # steps timed but not yet collected (a stop between sync points) still count
    for j, ms in enumerate(timer.collect(), start=pending_first):
        result.steps.append(StepRecord(j, j < cfg.warmup_steps, ms, tokens / (ms / 1e3), None, None))
    synchronize(ctx.device)
    if wall_t0 is not None:
        measured = [s for s in result.steps if not s.warmup]
        result.tokens_per_s_wall = len(measured) * tokens / (time.perf_counter() - wall_t0)
    if ctx.device.type == "cuda" and wall_t0 is not None:
        result.peak_mem_bytes, result.peak_mem_reserved_bytes = memory.cuda_peak(ctx.device)
        result.mem_source = "CUDA allocator: max_memory_allocated over the measured steps"


def _summarise(ctx: BuildContext, result: RunResult) -> None:
    cfg = ctx.config
    measured = [s.step_ms for s in result.steps if not s.warmup]
    result.step_ms = Spread.of(measured)
    if result.steps:
        result.first_step_ms = result.steps[0].step_ms
    if measured:
        median_s = result.step_ms.median / 1e3
        result.tokens_per_s = result.tokens_per_step / median_s
        if ctx.compiled:
            result.compile_s = max(0.0, (result.first_step_ms - result.step_ms.median) / 1e3)
        if cfg.peak_tflops is not None:
            result.peak_tflops, why = cfg.peak_tflops, "peak_tflops given in the config"
        else:
            result.peak_tflops, why = ctx.hw.peak_tflops(mfu_dtype(ctx))
        result.mfu = flops_mod.mfu(result.flops_per_step, median_s, result.peak_tflops)
        result.mfu_note = why if result.mfu is not None else f"n/a: {why}"
    if result.losses:
        result.final_loss = result.losses[-1][1]


def _probe_cpu_memory(ctx: BuildContext, result: RunResult, tracker_cls=memory.LiveTensorBytes) -> None:
    """Peak live tensor bytes over one extra (untimed) step, starting from weights and optimizer state."""
    result.peak_mem_bytes = probe_step_memory(ctx, step_tracker(ctx, tracker_cls))
    result.mem_source = "live tensor bytes over one extra step (CPU has no allocator statistics)"
    if ctx.compiled:
        result.mem_source += "; compiled runs are probed eagerly"


def step_tracker(ctx: BuildContext, tracker_cls=memory.LiveTensorBytes, devices=("cpu",)):
    """A live-tensor counter that starts from the run's weights, buffers and optimizer state."""
    baseline = [*ctx.base_model.parameters(), *ctx.base_model.buffers(),
                *memory.optimizer_state_tensors(ctx.optimizer)]
    return tracker_cls(baseline, devices=devices)


def probe_step_memory(ctx: BuildContext, tracker) -> int:
    """The most live tensor bytes during one more step of `ctx`, counted by `tracker` (step_tracker); the
    planner runs this same count over fake tensors."""
    # a dispatch mode cannot see inside compiled kernels, and dynamo would mark the model's code as
    # "skip" for the rest of the process: probe the eager model instead
    model, ctx.model = ctx.model, (ctx.base_model if ctx.compiled else ctx.model)
    try:
        with tracker:
            train_step(ctx, next(ctx.batches))
    finally:
        ctx.model = model
    return tracker.peak_bytes


def _memory_breakdown(ctx: BuildContext, result: RunResult, grads_bytes: int | None) -> None:
    """Split the measured peak: weights, gradients, optimizer state, and the rest (activations, temporaries)."""
    if result.peak_mem_bytes is None or grads_bytes is None:
        return
    result.params_bytes = memory.storage_bytes([*ctx.base_model.parameters(), *ctx.base_model.buffers()])
    result.grads_bytes = grads_bytes
    result.optimizer_state_bytes = memory.storage_bytes(memory.optimizer_state_tensors(ctx.optimizer))
    rest = result.params_bytes + result.grads_bytes + result.optimizer_state_bytes
    result.activations_bytes = max(0, result.peak_mem_bytes - rest)


def plain_error(exc: BaseException) -> str:
    """A failure in words a user can act on, without the traceback."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return f"out of memory: {text[:300]} — try a smaller batch_size, bf16, or activation checkpointing"
    if type(exc).__module__.startswith("torch._dynamo") or "inductor" in type(exc).__module__:
        return f"torch.compile failed: {type(exc).__name__}: {text[:300]}"
    return f"{type(exc).__name__}: {text[:300]}"
