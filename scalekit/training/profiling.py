"""Look inside a step before optimizing it: a torch.profiler view of training steps, the kernels
torch.compile generates, and small, honest timers for single operations.

`profile_steps` builds a run exactly as `scalekit.run` does, takes a few unprofiled warm-up steps, then
profiles whole steps (data, forward, backward, optimizer) and saves a Chrome trace that Perfetto
(ui.perfetto.dev) or chrome://tracing opens.  Time is attributed by *self* time, so every microsecond
is counted once: on a GPU the kernel time an op launched, on the CPU the op's own time.

An op's category comes from where it ran before what it is: the optimizer, the data, then the model's
attention modules (any module whose class name says Attention: the built-in GPT's, GPT-2's, Llama's ...).
Their forward runs inside a profiler range (module hooks), and a backward op is traced to the forward op that
made its autograd node by the sequence number both carry, so attention's QK^T and AV products (`aten::bmm`),
its softmax and SDPA count as attention in the forward and the backward.  Its projections (the attention
module's children that hold weights) stay matmuls.  A model without such modules, or a compiled one (hooks
added after compilation would make it compile again), is categorised by the op's name alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ..machine.hardware import detect
from ..measure.load import LoadMeter
from ..measure.memory import LiveTensorBytes
from ..measure.reliability import judged_sentence
from ..measure.session import pin_threads
from ..measure.stats import Interval, sentence, speedup_interval, too_few_steps
from ..measure.timing import Spread, step_timer, synchronize
from .build import build, train_step
from .config import RunConfig

STEP_RANGE = "scalekit.step"
DATA_RANGE = "scalekit.data"
ATTENTION_RANGE = "scalekit.module: attention"  # an attention module's forward
PROJECTION_RANGE = "scalekit.module: projection"  # a child of it that holds weights (q, k, v, output projections)
MODULE_RANGES = (ATTENTION_RANGE, PROJECTION_RANGE)
ATTENTION_MODULE = re.compile(r"attention", re.IGNORECASE)  # on the module's class name
BACKWARD_NODE = "autograd::engine::evaluate_function: "

# (category, pattern on the op name), first match wins; ancestry (optimizer, data) is checked before these
CATEGORIES = (
    ("compiled kernels", r"CompiledFxGraph|CompiledFunction|Torch-Compiled|cpp_fused|triton_"),
    ("matmul", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear)\b"),
    ("loss", r"cross_entropy|log_softmax|nll_loss"),  # before attention: log_softmax is not attention's softmax
    ("attention", r"softmax|scaled_dot_product|flash_attention|efficient_attention|masked_fill"),
    ("layer norm", r"layer_norm|rms_norm"),
    ("embedding", r"embedding"),
    ("copies and memory", r"aten::(copy_|clone|contiguous|empty|empty_like|zeros|zero_|fill_|cat|to|_to_copy"
                          r"|as_strided|view|reshape|transpose|t|split|permute|expand|slice|select)\b"),
    ("elementwise", r"aten::(add|sub|mul|div|gelu|tanh|pow|sum|mean|where|neg|exp|sqrt|rsqrt|threshold|relu)"),
)


@dataclass
class StepProfile:
    """What the profiler saw over `steps` training steps; times are milliseconds per step."""

    label: str
    steps: int
    device_type: str
    time_source: str  # "device (kernel) time" on a GPU, "CPU time" on the CPU
    ops: Any  # DataFrame: op, calls, self_ms, total_ms, share, category (per step, sorted by self_ms)
    step_ms: float  # wall time per profiled step, device work included (and the profiler's overhead)
    host_step_ms: float  # time the host spent inside each step's range (on a GPU, launching the work)
    trace_path: Path | None
    events: Any = None  # torch's EventList (key_averages), for .table()

    def top_ops(self, n: int = 10):
        return self.ops.head(n).reset_index(drop=True)

    def by_category(self):
        """Self time per category, largest first: where a step's time goes."""
        df = self.ops.groupby("category", as_index=False)[["self_ms"]].sum()
        df["share"] = df["self_ms"] / df["self_ms"].sum()
        return df.sort_values("self_ms", ascending=False).reset_index(drop=True)

    def table(self, n: int = 10) -> str:
        """torch's own top-ops table (sorted by the self time that matters on this device)."""
        key = "self_device_time_total" if self.device_type == "cuda" else "self_cpu_time_total"
        return self.events.table(sort_by=key, row_limit=n)


def _category(event, ancestors: list, scope_of_sequence: dict[int, str] | None = None) -> str:
    """The category of `event`, given its enclosing events (`ancestors`, nearest first, the event itself first) and
    the module scope of each forward op's autograd sequence number (for a backward op)."""
    names = [a.name for a in ancestors]
    if any(n.startswith("Optimizer.step") for n in names):
        return "optimizer step"
    if any(n.startswith("Optimizer.zero_grad") for n in names):
        return "zero_grad"
    if DATA_RANGE in names:
        return "data loading"
    if event.name in MODULE_RANGES:
        return "other (Python, framework)"  # the Python between a module's ops
    if _scope(ancestors, scope_of_sequence or {}) == ATTENTION_RANGE:
        return "attention"
    for name, pattern in CATEGORIES:
        if re.search(pattern, event.name):
            return name
    return "other (Python, framework)"


def _scope(ancestors: list, scope_of_sequence: dict[int, str]) -> str:
    """The nearest module range around a forward op, or, in the backward, the one around the forward op whose
    autograd node this op runs in (matched by sequence number); '' outside any."""
    for a in ancestors:
        if a.name in MODULE_RANGES:
            return a.name
        if a.name.startswith(BACKWARD_NODE):
            return scope_of_sequence.get(a.sequence_nr, "")
    return ""


def _forward_scopes(events) -> dict[int, str]:
    """Autograd sequence number -> the module range the forward op that took it ran in."""
    scopes: dict[int, str] = {}
    for ev in events:
        if ev.sequence_nr < 0 or ev.name.startswith(BACKWARD_NODE) or ev.name in MODULE_RANGES:
            continue
        for a in _ancestors(ev):
            if a.name.startswith(BACKWARD_NODE):
                break  # an op run by the backward: its number is not a forward op's
            if a.name in MODULE_RANGES:
                scopes.setdefault(ev.sequence_nr, a.name)
                break
    return scopes


def _ancestors(event) -> list:
    """The event and the events around it, nearest first."""
    out = [event]
    parent = event.cpu_parent
    while parent is not None:
        out.append(parent)
        parent = parent.cpu_parent
    return out


@contextlib.contextmanager
def module_ranges(model: torch.nn.Module | None):
    """Profiler ranges around the forward of each attention module of `model` (ATTENTION_RANGE) and of its
    children that hold weights (PROJECTION_RANGE), through forward hooks removed at the end."""
    handles = []
    for module in _attention_modules(model):
        handles += _hook(module, ATTENTION_RANGE)
        for child in module.modules():
            if child is not module and any(True for _ in child.parameters(recurse=False)):
                handles += _hook(child, PROJECTION_RANGE)
    try:
        yield len(handles) // 2
    finally:
        for handle in handles:
            handle.remove()


def _attention_modules(model) -> list[torch.nn.Module]:
    """The modules whose class name says attention, outermost only (an attention inside one is covered by it)."""
    if model is None:
        return []
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if ATTENTION_MODULE.search(type(module).__name__):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def _hook(module: torch.nn.Module, name: str) -> list:
    open_ranges: list = []

    def enter(_module, _args):
        open_ranges.append(record_function(name).__enter__())

    def leave(_module, _args, _output):
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]


def profile_steps(config: RunConfig, steps: int = 3, warmup_steps: int = 2, trace_path: str | Path | None = None,
                  hw=None) -> StepProfile:
    """Build `config` fresh, run `warmup_steps`, then profile `steps` whole training steps."""
    hw = hw or detect(config.device)
    cfg = config.resolve(hw)
    cfg.check_available(hw)
    on_gpu = hw.device_type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with contextlib.ExitStack() as stack:
        pin_threads(stack, cfg.threads)  # the threads a measured run of this config computes on
        ctx = build(cfg, hw, stack)
        for _ in range(warmup_steps):  # compile, allocator and caches warm up outside the profile
            train_step(ctx, next(ctx.batches))
        synchronize(ctx.device)
        prof = profile(activities=activities)
        # hooks added to a compiled model would make it compile again inside the profile
        stack.enter_context(module_ranges(None if ctx.compiled else ctx.base_model))
        with without_kineto_banner():
            prof.start()
        try:
            t0 = time.perf_counter()
            for _ in range(steps):
                with record_function(STEP_RANGE):
                    with record_function(DATA_RANGE):
                        batch = next(ctx.batches)
                    train_step(ctx, batch)
            synchronize(ctx.device)  # a GPU may still be working after the host has queued the last step
            wall_s = time.perf_counter() - t0
        finally:
            with without_kineto_banner():
                prof.stop()
    if trace_path is not None:
        trace_path = Path(trace_path)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))

    ops, step_us = op_table(prof, steps, on_gpu)
    return StepProfile(label=cfg.label, steps=steps, device_type=hw.device_type,
                       time_source="device (kernel) time" if on_gpu else "CPU time", ops=ops,
                       step_ms=wall_s / steps * 1e3, host_step_ms=sum(step_us) / len(step_us) / 1e3,
                       trace_path=trace_path,
                       events=prof.key_averages())


# what kineto (torch.profiler's C++ side) writes to the process's stderr each time a profile starts and stops,
# e.g. "USDT:2026-12-02 07:52:29 13227:13227 SyncActivityProfilerHandler.cpp:52] profiler_start"
KINETO_BANNER = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def without_kineto_banner():
    """Keep kineto's profiler_start/profiler_stop lines off stderr (a notebook shows them under the cell).

    They are written by C++ straight to file descriptor 2, below anything Python can redirect, and
    KINETO_LOG_LEVEL only counts if set before the process's first profile (and then silences kineto's
    errors too).  So fd 2 goes to a file for the block, and every other line is written back to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not KINETO_BANNER.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def op_table(prof, steps: int, on_gpu: bool):
    """Per-op rows (calls, self and total ms per step, share, category) from a profile, and each step's host us."""
    import pandas as pd

    self_attr = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    rows: dict[tuple[str, str], dict] = {}  # by op and category: attention's aten::bmm apart from others'
    step_us = []
    events = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CPU]
    # (kernels are counted as the self device time of the op that launched them)
    scopes = _forward_scopes(events)
    for ev in events:
        if ev.name == STEP_RANGE:
            step_us.append(ev.cpu_time_total)
        category = _category(ev, _ancestors(ev), scopes)
        row = rows.setdefault((ev.name, category), {"op": ev.name, "calls": 0, "self_us": 0.0, "total_us": 0.0,
                                                    "category": category})
        row["calls"] += 1
        row["self_us"] += getattr(ev, self_attr)
        row["total_us"] += ev.device_time_total if on_gpu else ev.cpu_time_total
    ops = pd.DataFrame(list(rows.values()))
    ops["calls"] = ops["calls"] / steps
    ops["self_ms"] = ops.pop("self_us") / steps / 1e3
    ops["total_ms"] = ops.pop("total_us") / steps / 1e3
    ops = ops[ops["self_ms"] > 0].sort_values("self_ms", ascending=False).reset_index(drop=True)
    ops["share"] = ops["self_ms"] / ops["self_ms"].sum()
    ops = ops[["op", "calls", "self_ms", "total_ms", "share", "category"]]
    return ops, step_us


def compiled_kernels(fn, *args, **kwargs) -> tuple[Any, list[str]]:
    """Run torch.compile(fn) once and return (its output, the names of the kernels Inductor generated)."""
    from torch._inductor.utils import run_and_get_code

    out, sources = run_and_get_code(torch.compile(fn), *args, **kwargs)
    names = [m for src in sources for m in re.findall(r"^(\w+) = async_compile\.\w+\(", src, flags=re.M)]
    return out, names


def time_ms(fn, device: torch.device | str = "cpu", reps: int = 10, warmup: int = 2) -> Spread:
    """Milliseconds per call of `fn()` over `reps` calls after `warmup` calls, timed on the device."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    timer = step_timer(device)
    for _ in range(reps):
        timer.start()
        fn()
        timer.stop()
    return Spread.of(timer.collect())


def call_finding(subject: str, fn, other: str, base_fn, device: torch.device | str = "cpu", reps: int = 15,
                 warmup: int = 2) -> tuple[str, Interval | None]:
    """Whether `fn()` is faster than `base_fn()`, in the words its 95% interval and the machine's load allow
    (scalekit.measure.reliability.judged_sentence, the rule behind the chapters' `finding`): '<subject> is faster
    than <other>: 1.8× (1.6–2.0× at 95%, calls alternating)', '... slower ...', '... within noise of ...', or
    '<subject> against <other>: unreliable (interval too wide), ...', and the interval.

    The two calls alternate, `reps` times each after `warmup` each, the order turning every pair (base, fn, fn,
    base, ...), so a machine that slows down meanwhile slows both.  The load meter reads other processes' CPU (and
    GPU) over the whole alternation, one load for both sides.  Alternation sees the same load on both sides, as
    paired rounds do, so the rule is theirs: a busy machine keeps the verdict and the sentence says the machine was
    busy, naming the load; an interval whose ends differ by more than WIDE_RATIO reads 'unreliable (interval too
    wide)' always."""
    device = torch.device(device)
    for _ in range(warmup):
        base_fn()
        fn()
    synchronize(device)
    meter = LoadMeter(device.type)
    timers = step_timer(device), step_timer(device)
    pairs = tuple(zip(timers, (base_fn, fn), strict=True))
    for rep in range(reps):
        for timer, call in pairs if rep % 2 == 0 else pairs[::-1]:
            timer.start()
            call()
            timer.stop()
    base_ms, ms = (t.collect() for t in timers)
    load = meter.read()
    interval = speedup_interval([base_ms], [ms], busy=load.busy, alternated=True)
    if interval is None:
        why = too_few_steps([base_ms], [ms])
        return sentence(subject, None, other) + (f" ({why})" if why else ""), None
    return judged_sentence(subject, interval, other, load, load), interval


def peak_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Peak bytes of tensors created while `fn()` runs, above what was already allocated."""
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    tracker = LiveTensorBytes()
    with tracker:
        fn()
    return tracker.peak_bytes
