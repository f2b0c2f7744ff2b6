"""ScalekitCallback: scalekit's measurements of a Hugging Face Trainer run, from inside the Trainer.

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ScalekitCallback()])
    trainer.train()
    callback.result            # a RunResult: step time (median, spread), tokens/s, MFU, peak memory, loss

It measures as scalekit's own loop does:
- each optimizer step is timed from the Trainer's on_step_begin to its on_step_end (the forward and backward of
  every micro-batch, clipping, the update), with CUDA events on a GPU, read only at sync points: the Trainer's
  logging steps, where it has just read the loss (`.item()`) itself.  The batches for a step are fetched before
  on_step_begin, so loading them is not in step_ms; tokens_per_s_wall (tokens over the wall time of the
  measured steps) includes it and everything else the Trainer does between steps;
- the first `warmup_steps` steps are not measured;
- the loss is the value the Trainer logs at its logging steps (its mean since the last log): the callback adds
  no sync of its own between measured steps (one at the end of the warm-up, one after the last step);
- tokens are counted from the input_ids the model is called with (a forward pre-hook: a shape, not a value);
- FLOPs for MFU are counted by torch's FlopCounterMode over the first warm-up step (a compiled model is
  counted as torch sees it; pass flops_per_step to set them), and on a CPU the peak memory is the live tensor
  bytes over the second warm-up step (weights, optimizer state and what the step allocates), as scalekit
  probes its own runs; on a GPU the allocator's max_memory_allocated over the measured steps.
Only warm-up steps carry the FLOP count and the memory probe, so the measured steps run untouched.

torch's intra-op threads are pinned for the run as scalekit.run pins its own (`threads`; None: the cores not
already busy, never more than torch was set to), restored when the Trainer ends, and recorded with the machine's
load: a Trainer run and a scalekit run beside it are then measured on the same number of threads.  (On a busy
2-core machine, torch's default two threads made a Trainer step 50× slower than the same step on one.)
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..errors import ConfigError
from ..machine.hardware import detect
from ..measure import memory
from ..measure.flops import mfu_dtype
from ..measure.load import LoadMeter
from ..measure.session import pin_threads
from ..measure.summary import summarise_steps
from ..measure.timing import step_timer, synchronize
from ..optional import quiet_import
from ..toggles import PHASES, BuildContext, apply_toggles
from ..training.results import RunResult, StepRecord
from .arguments import run_config_fields, training_defaults

# through scalekit's quiet import: it pulls in peft and bitsandbytes, which must not reach for the Hub
TrainerCallback = quiet_import("transformers.trainer_callback").TrainerCallback


class QuietFlopCounter(FlopCounterMode):
    """FlopCounterMode without torch's warning that a compiled module's global hooks fire twice.  The mode's module
    tracker hooks every module for its step, and the Trainer calls the compiled wrapper (torch_compile=True): the
    extra firing moves only the per-module attribution, while the total the callback reads is counted from the
    ops dispatched (the same as the eager model's: test_hf_callback.py)."""

    def __enter__(self):
        self._quiet = warnings.catch_warnings()
        self._quiet.__enter__()
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                                category=UserWarning)
        try:
            return super().__enter__()
        except BaseException:
            self._quiet.__exit__(None, None, None)  # no filter left behind when the mode cannot start
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._quiet.__exit__(*exc)


class ScalekitCallback(TrainerCallback):
    """Step time, tokens/s, MFU, memory and loss of a Trainer run, measured the way scalekit measures (above)."""

    def __init__(self, warmup_steps: int = 3, label: str = "HF Trainer", on_step: Callable | None = None,
                 on_result: Callable | None = None, peak_tflops: float | None = None,
                 flops_per_step: float | None = None, measure_memory: bool = True, threads: int | None = None):
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ConfigError(f"ScalekitCallback.warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"ScalekitCallback.threads must be a whole number >= 1 (torch's intra-op threads for "
                              f"the run) or None (the cores not already busy), got {threads!r}")
        self.threads = threads
        self.warmup_steps, self.label = warmup_steps, label
        self.on_step, self.on_result = on_step, on_result  # each StepRecord at the Trainer's logging steps; the end
        self.peak_tflops, self.flops_per_step, self.measure_memory = peak_tflops, flops_per_step, measure_memory
        self.result: RunResult | None = None
        self.own_s = 0.0  # time spent in this callback's own code (benchmarks/hf_callback_overhead.py reads it)

    # -- the Trainer's events --------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        t0 = time.perf_counter()
        self.device = torch.device(args.device)
        self.hw = detect(str(self.device))
        self.timer = step_timer(self.device)
        self.model, self.optimizer = model, getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
        self.tokens_seen, self.step_tokens, self.first = 0, [], 0
        self.first_global = state.global_step  # a resumed run starts above 0
        self.wall_t0 = self.wall_end = time.perf_counter() if self.warmup_steps == 0 else None
        self.probe: Any = None
        self.counted_flops: float | None = self.flops_per_step
        self.hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        self.result = RunResult(label=self.label, config=_args_summary(args, getattr(model, "tp_size", None) or 1),
                                device=self.hw.device_name,
                                torch_version=torch.__version__)
        self.meter = LoadMeter(self.device.type)
        self.restore = contextlib.ExitStack()  # torch's threads as they were, put back when the Trainer ends
        pin_threads(self.restore, self.threads)
        self.result.threads = torch.get_num_threads()
        # the toggles these arguments are in scalekit: MFU is read against the peak of the dtype they compute in
        self.toggles = run_config_fields(args, args.world_size)[0]["toggles"]
        self.own_s += time.perf_counter() - t0

    def _count_tokens(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            self.tokens_seen += ids.numel()

    def on_step_begin(self, args, state, control, **kwargs):
        t0 = time.perf_counter()
        step = state.global_step - self.first_global
        self.tokens_at_begin = self.tokens_seen
        self._start_probe(step)
        self.own_s += time.perf_counter() - t0
        self.timer.start()

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.stop()
        t0 = time.perf_counter()
        self._end_probe()
        self.step_tokens.append(self.tokens_seen - self.tokens_at_begin)
        done = len(self.step_tokens)
        if done == self.warmup_steps or done == state.max_steps - self.first_global:
            synchronize(self.device)  # the warm-up's end, or the last step's: once each, never in between
        if done == self.warmup_steps:
            memory.cuda_memory_reset(self.device)
            self.wall_t0 = time.perf_counter()
        self.wall_end = time.perf_counter()
        self.own_s += time.perf_counter() - t0

    def on_log(self, args, state, control, logs=None, **kwargs):
        t0 = time.perf_counter()
        loss = (logs or {}).get("loss")
        if loss is not None:  # a training log: the Trainer has just waited for the device to read it
            self._report(float(loss))
        self.own_s += time.perf_counter() - t0

    def on_train_end(self, args, state, control, **kwargs):
        self._report(None)
        synchronize(self.device)
        self.hook.remove()
        self.restore.close()
        self.result.load = self.meter.read()
        _summarise(self, self.result)
        if self.on_result is not None:
            self.on_result(self.result)

    # -- helpers -------------------------------------------------------------------------------------------
    def _start_probe(self, step: int) -> None:
        """FLOPs on the first warm-up step; live tensor bytes on the second (CPU): never on a measured step."""
        if step == 0 and self.counted_flops is None and self.warmup_steps >= 1:
            self.probe = QuietFlopCounter(display=False)
        elif step == 1 and self.device.type == "cpu" and self.measure_memory and self.warmup_steps >= 2:
            baseline = [*self.model.parameters(), *self.model.buffers(),
                        *memory.optimizer_state_tensors(self.optimizer)]
            self.probe = memory.LiveTensorBytes(baseline, devices=("cpu",))
            self.grads = memory.GradBytesAtStep(self.optimizer)
        else:
            return
        self.probe.__enter__()

    def _end_probe(self) -> None:
        if self.probe is None:
            return
        probe, self.probe = self.probe, None
        probe.__exit__(None, None, None)
        if isinstance(probe, FlopCounterMode):
            self.counted_flops = float(probe.get_total_flops()) or None
        else:
            self._memory_breakdown(probe.peak_bytes)

    def _memory_breakdown(self, peak: int) -> None:
        r = self.result
        r.peak_mem_bytes = peak
        r.mem_source = "live tensor bytes over the second warm-up step (CPU has no allocator statistics)"
        r.params_bytes = memory.storage_bytes([*self.model.parameters(), *self.model.buffers()])
        r.grads_bytes = self.grads.grads_bytes
        r.optimizer_state_bytes = memory.storage_bytes(memory.optimizer_state_tensors(self.optimizer))
        if r.grads_bytes is not None:
            r.activations_bytes = max(0, peak - r.params_bytes - r.grads_bytes - r.optimizer_state_bytes)

    def _report(self, loss: float | None) -> None:
        """Turn the steps timed since the last sync point into StepRecords (the last one carries the loss)."""
        times = self.timer.collect()
        mem = memory.current_bytes(self.device)
        for k, ms in enumerate(times):
            j = self.first + k
            tokens = self.step_tokens[j]
            last = k == len(times) - 1 and loss is not None
            record = StepRecord(step=j, warmup=j < self.warmup_steps, step_ms=ms, tokens_per_s=tokens / (ms / 1e3),
                                loss=loss if last else None, mem_bytes=mem if last else None, tokens=tokens)
            self.result.steps.append(record)
            if self.on_step is not None:
                self.on_step(record)
        if times and loss is not None:
            self.result.losses.append((self.first + len(times) - 1, loss))
        self.first += len(times)


def _args_summary(args, tp_size: int = 1) -> dict:
    """The TrainingArguments that decide what a step does, for the result's config (`tp_size`: the model's
    tensor-parallel degree, whose ranks the Trainer gives the same rows)."""
    keys = (*training_defaults(), "max_steps")  # every field scalekit maps (the toggles', batch, lr, seed); the length
    summary = {k: _plain(getattr(args, k, None)) for k in keys}
    # sequences per optimizer step over every data-parallel process, as RunConfig.batch_size counts them
    summary["batch_size"] = (args.per_device_train_batch_size * args.gradient_accumulation_steps
                             * max(1, args.world_size // tp_size))
    return summary


def _plain(value):
    """A TrainingArguments value as JSON takes it (its enums, such as optim, by their value)."""
    return getattr(value, "value", value)


def mfu_dtype_of(toggles: dict, device: torch.device) -> str:
    """The dtype MFU is read against for a Trainer run whose arguments map to `toggles`, decided as a run decides
    it: from the precision fields its process and precision toggles set."""
    with contextlib.ExitStack() as stack:  # the process-wide flags a toggle sets are undone here
        ctx = BuildContext(config=None, hw=None, device=device, stack=stack)
        for phase in PHASES[:PHASES.index("precision") + 1]:
            apply_toggles(ctx, phase, toggles)
        return mfu_dtype(ctx.compute_dtype, ctx.tf32_matmuls)


def _summarise(cb: ScalekitCallback, r: RunResult) -> None:
    r.flops_per_step = cb.counted_flops
    peak, why = (cb.peak_tflops, "peak_tflops given") if cb.peak_tflops else \
        cb.hw.peak_tflops(mfu_dtype_of(cb.toggles, cb.device))
    measured = summarise_steps(r, peak, why)
    if not measured:
        r.notes.append(f"no measured steps: the run had {len(r.steps)} steps, warmup_steps={cb.warmup_steps}")
        return
    if cb.wall_t0 is not None and cb.wall_end > cb.wall_t0:
        r.tokens_per_s_wall = sum(s.tokens for s in measured) / (cb.wall_end - cb.wall_t0)
    if cb.device.type == "cuda":
        r.peak_mem_bytes, r.peak_mem_reserved_bytes = memory.cuda_peak(cb.device)
        r.mem_source = "CUDA allocator: max_memory_allocated over the measured steps"
    if r.losses:
        r.final_loss = r.losses[-1][1]
