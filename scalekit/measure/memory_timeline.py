"""A training step's memory over time, split by what holds it: parameters, gradients, optimizer state,
activations and temporaries (and, under FSDP, the parameters gathered from the other ranks).

`record_step(step, model, optimizer)` runs `step()` (one training step of any nn.Module, a Hugging Face model
included) under a dispatch mode that counts live tensor storages as `memory.LiveTensorBytes` does: storages
alive when it starts (the model's parameters and buffers, the optimizer's state) are the baseline, every op's
new output storage is added until it is freed.  After every op it writes down the bytes alive, so the
timeline has one point per op.  What each storage *was* is decided once the step is over, from what it turned
out to be:

* parameters: the model's parameters and buffers (under FSDP, this rank's shards);
* gathered parameters: storages that held a parameter while a module ran but are not the model's own (FSDP's
  all-gathered weights);
* gradients: storages that were a parameter's `.grad` (read after each gradient is accumulated, when the
  optimizer step begins, and at the end of the step);
* optimizer state: the optimizer's state tensors (also the ones its first step creates);
* activations: made during a forward and still alive when the backward after it began, i.e. what forward
  kept for backward (with checkpointing: the blocks' inputs);
* temporaries: everything else (a forward's intermediates it did not keep, backward's working tensors and
  recomputed activations, the optimizer's scratch, communication buffers).

The phase of every point (forward, backward, optimizer) comes from autograd's current graph task (the
backward's, recomputation under checkpointing included) and from the optimizer's step hooks.  FSDP2 frees a
gathered weight with `storage.resize_(0)`, which no op reports: a storage that first appears as the output
of an op that wrote into it (out= or in place) was allocated where the mode could not see, and its size is
read again at every op.  Recording costs Python work on every op: the recorded step is slower than a plain
one (`Timeline.recorded_ms`; the chapters measure the ratio), so it runs on its own, untimed step.

On a GPU, `record_cuda_step` runs the same recorder on CUDA tensors together with the caching allocator's own
history (`torch.cuda.memory._record_memory_history`), whose trace gives the allocator's bytes after each of
its events (`Timeline.allocator_bytes`, its peak `allocator_peak_bytes`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .memory import optimizer_params, optimizer_state_tensors, storage_key

CATEGORIES = ("parameters", "gathered parameters", "gradients", "optimizer state", "activations", "temporaries")
PHASES = ("forward", "backward", "optimizer")


def _local(t):
    return getattr(t, "_local_tensor", t)  # a DTensor (FSDP2) holds this rank's shard in a local tensor


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward now (checkpointing's recomputation included).  The
    graph task id is not public API: where it is missing, grad mode off outside the optimizer reads as
    backward (a recomputed forward then reads as forward)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task() != -1 if task is not None else not torch.is_grad_enabled()


@dataclasses.dataclass
class Timeline:
    """One point per op: its name, the step's phase, milliseconds since the step began, and the bytes alive
    after it in each category (`bytes[category][i]`).  Plain lists, so a rank can send it back."""

    ops: list[str]
    phases: list[str]
    elapsed_ms: list[float]
    bytes: dict[str, list[int]]
    total_bytes: list[int]  # the bytes alive after each op, counted apart from their categories
    # after each op: bytes freed by resizing a storage (FSDP2's gathered weights) that a count which reads a
    # storage's size once (memory.LiveTensorBytes, the engine's CPU peak) still holds
    resized_away_bytes: list[int]
    recorded_ms: float  # the recorded step's wall time, recording included
    plain_ms: float | None = None  # an unrecorded step's, where one was timed beside it (training.timeline)
    load: object | None = None  # measure.load.MachineLoad while they were timed: busy makes the ratio unreliable
    allocator_bytes: list[int] | None = None  # GPU: the caching allocator's bytes after each of its events
    allocator_peak_bytes: int | None = None

    @property
    def overhead(self) -> float | None:
        """How many times longer the recorded step took than a plain one beside it (None if none was timed)."""
        return self.recorded_ms / self.plain_ms if self.plain_ms else None

    def overhead_sentence(self) -> str:
        """What recording cost, in words, with the machine's load where it makes the figure unreliable."""
        if self.overhead is None:
            return f"the recorded step took {self.recorded_ms:.0f} ms (no plain step was timed beside it)"
        text = (f"recording every op made the step {self.overhead:.2f}× as long as a plain one beside it "
                f"({self.recorded_ms:.0f} against {self.plain_ms:.0f} ms)")
        note = getattr(self.load, "note", "")
        return f"{text}; {note}" if note else text

    @property
    def categories(self) -> list[str]:
        """The categories that hold any bytes, in CATEGORIES' order."""
        return [c for c in CATEGORIES if any(self.bytes[c])]

    def category_sums(self) -> list[int]:
        """The categories' bytes added up at each point: `total_bytes` again, if every byte has one category."""
        return [sum(values) for values in zip(*(self.bytes[c] for c in CATEGORIES), strict=True)]

    @property
    def peak_index(self) -> int:
        return max(range(len(self.total_bytes)), key=self.total_bytes.__getitem__)

    @property
    def peak_bytes(self) -> int:
        return self.total_bytes[self.peak_index]

    @property
    def peak_blind_to_resizes(self) -> int:
        """The peak a count that reads each storage's size once reports (memory.LiveTensorBytes, so the engine's
        CPU peak): it holds FSDP2's gathered weights from their first gather to the end of the step."""
        return max(t + r for t, r in zip(self.total_bytes, self.resized_away_bytes, strict=True))

    def at(self, i: int) -> dict[str, int]:
        return {c: self.bytes[c][i] for c in CATEGORIES}

    def at_peak(self) -> dict[str, int]:
        return self.at(self.peak_index)

    def most(self, category: str, phase: str | None = None) -> int:
        """The most bytes `category` held at any point (of `phase`, if given)."""
        return max((b for b, p in zip(self.bytes[category], self.phases, strict=True) if phase in (None, p)),
                   default=0)

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """(phase, first point, last point) for each stretch of one phase, in order."""
        spans = []
        for i, phase in enumerate(self.phases):
            if spans and spans[-1][0] == phase:
                spans[-1] = (phase, spans[-1][1], i)
            else:
                spans.append((phase, i, i))
        return spans

    def frame(self):
        """A pandas DataFrame, one row per point: op, phase, elapsed_ms and the bytes of each category."""
        import pandas as pd

        return pd.DataFrame({"op": self.ops, "phase": self.phases, "elapsed_ms": self.elapsed_ms,
                             **{c: self.bytes[c] for c in CATEGORIES}, "total": self.total_bytes})


class _Storage:
    """What the recorder knows of one storage while it lives: its current allocation's id and size."""

    __slots__ = ("alloc", "nbytes", "first")

    def __init__(self, alloc: int, nbytes: int) -> None:
        self.alloc, self.nbytes, self.first = alloc, nbytes, nbytes  # first: its size when first seen


class TimelineRecorder(TorchDispatchMode):
    """The dispatch mode behind `record_step`: allocations and frees, a point after every op, and what each
    allocation was.  `peak_bytes` is the most bytes alive, as LiveTensorBytes reports it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 devices: tuple[str, ...] = ("cpu",)) -> None:
        super().__init__()
        self.model, self.optimizer, self.devices = model, optimizer, devices
        self._live: dict[int, _Storage] = {}
        self._watched: dict[int, weakref.ref] = {}  # storages resized behind the dispatcher's back (FSDP2)
        self._events: list[tuple[int, int]] = []  # (allocation id, +bytes or -bytes)
        self._points: list[int] = []  # after each op: how many events had happened
        self._totals: list[int] = []  # after each op: the bytes alive
        self._resized_away: list[int] = []  # after each op: Timeline.resized_away_bytes
        self.ops: list[str] = []
        self.phases: list[str] = []
        self.elapsed_ms: list[float] = []
        self._alloc_phase: list[tuple[str, int]] = []  # per allocation id: (phase, phase stretch) it was made in
        self._category: dict[int, str] = {}  # allocation id -> a category known for sure
        self._stretch, self._phase = 0, "forward"
        self._stretch_ends: dict[int, int] = {}  # phase stretch -> events before the next stretch began
        self.current_bytes = self.peak_bytes = 0
        self._optimizer_running = False
        self._handles: list = []
        self._t0 = 0.0
        for t in [*model.parameters(), *model.buffers()]:
            self._baseline(t, "parameters")
        for t in optimizer_state_tensors(optimizer) if optimizer is not None else ():
            self._baseline(t, "optimizer state")
        self._baseline_events = len(self._events)  # the events before the first op: what was alive already

    # what is alive
    def _baseline(self, t: torch.Tensor, category: str) -> None:
        t = _local(t)
        if isinstance(t, torch.Tensor) and t.device.type in self.devices:
            alloc = self._track(t.untyped_storage())
            if alloc is not None:
                self._category.setdefault(alloc, category)

    def _track(self, storage: torch.UntypedStorage, watch: bool = False) -> int | None:
        key, n = storage_key(storage), storage.nbytes()
        if key in self._live:
            return self._live[key].alloc
        if n == 0:
            return None
        entry = self._live[key] = _Storage(self._new_alloc(n), n)
        weakref.finalize(storage, self._release, key, entry)
        if watch:
            self._watched[key] = weakref.ref(storage)
        return entry.alloc

    def _new_alloc(self, n: int) -> int:
        alloc = len(self._alloc_phase)
        self._alloc_phase.append((self._phase, self._stretch))
        self._add(alloc, n)
        return alloc

    def _add(self, alloc: int, n: int) -> None:
        self._events.append((alloc, n))
        self.current_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _release(self, key: int, entry: _Storage) -> None:
        if self._live.get(key) is entry:
            del self._live[key]
            self._watched.pop(key, None)
            if entry.nbytes:
                self._add(entry.alloc, -entry.nbytes)

    def _check_resized(self) -> int:
        """Follow the watched storages' sizes; returns the bytes they have shrunk by since first seen."""
        shrunk = 0
        for key, ref in list(self._watched.items()):
            storage, entry = ref(), self._live.get(key)
            if storage is None or entry is None:
                continue
            shrunk += max(0, entry.first - storage.nbytes())
            if storage.nbytes() == entry.nbytes:
                continue
            if entry.nbytes:
                self._add(entry.alloc, -entry.nbytes)
            entry.nbytes = storage.nbytes()
            if entry.nbytes:
                category = self._category.get(entry.alloc)
                entry.alloc = self._new_alloc(entry.nbytes)
                if category == "gathered parameters":  # the same weight gathered again
                    self._category[entry.alloc] = category
        return shrunk

    def _mark(self, tensors: Iterable, category: str) -> None:
        """Note that the storages behind `tensors` are `category` (their current allocation)."""
        for t in tensors:
            t = _local(t)
            if isinstance(t, torch.Tensor) and t.device.type in self.devices:
                entry = self._live.get(storage_key(t.untyped_storage()))
                if entry is not None and entry.nbytes:
                    self._category.setdefault(entry.alloc, category)

    # the phases
    def _set_phase(self, phase: str) -> None:
        if phase != self._phase:
            self._stretch_ends[self._stretch] = len(self._events)
            self._stretch += 1
            self._phase = phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._set_phase("optimizer" if self._optimizer_running else "backward" if _in_backward() else "forward")
        out = func(*args, **(kwargs or {}))
        inputs = None
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type in self.devices:
                storage = _local(t).untyped_storage()
                if storage_key(storage) not in self._live:
                    if inputs is None:  # an op that wrote into a storage the mode never saw made (out=, in place)
                        inputs = {storage_key(_local(a).untyped_storage()) for a in tree_flatten((args, kwargs))[0]
                                  if isinstance(a, torch.Tensor) and a.device.type != "meta"}
                    self._track(storage, watch=storage_key(storage) in inputs)
        self._resized_away.append(self._check_resized())
        self._points.append(len(self._events))
        self._totals.append(self.current_bytes)
        self.ops.append(func.__name__ if hasattr(func, "__name__") else str(func))
        self.phases.append(self._phase)
        self.elapsed_ms.append((time.perf_counter() - self._t0) * 1e3)
        return out

    # hooks that say what a storage is
    def _hooks(self) -> list:
        handles = []
        for module in self.model.modules():  # after FSDP's own pre-forward hook: the weights it gathered
            handles.append(module.register_forward_pre_hook(
                lambda m, args: self._mark(m.parameters(recurse=False), "gathered parameters")))
        for p in self.model.parameters():
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                handles.append(p.register_post_accumulate_grad_hook(lambda p: self._mark([p.grad], "gradients")))
        if self.optimizer is not None:
            handles.append(self.optimizer.register_step_pre_hook(self._optimizer_begins))
            handles.append(self.optimizer.register_step_post_hook(self._optimizer_ends))
        return handles

    def _optimizer_begins(self, optimizer, args, kwargs) -> None:
        self._mark([p.grad for p in optimizer_params(optimizer)], "gradients")
        self._optimizer_running = True

    def _optimizer_ends(self, optimizer, args, kwargs) -> None:
        self._mark(optimizer_state_tensors(optimizer), "optimizer state")
        self._optimizer_running = False

    def __enter__(self):
        self._handles = self._hooks()
        self._t0 = time.perf_counter()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for handle in self._handles:
                handle.remove()
            self._mark([p.grad for p in self.model.parameters()], "gradients")
            if self.optimizer is not None:
                self._mark(optimizer_state_tensors(self.optimizer), "optimizer state")
            self._stretch_ends[self._stretch] = len(self._events)

    # what it saw
    def _categories(self) -> list[str]:
        """The category of every allocation: known for sure, else activations or temporaries."""
        freed_at = {}
        for i, (alloc, n) in enumerate(self._events):
            if n < 0:
                freed_at[alloc] = i
        kinds = []
        for alloc, (phase, stretch) in enumerate(self._alloc_phase):
            known = self._category.get(alloc)
            if known is None:
                kept = phase == "forward" and freed_at.get(alloc, len(self._events)) >= self._stretch_ends[stretch]
                known = "activations" if kept else "temporaries"
            kinds.append(known)
        return kinds

    def bytes_kept(self, first: int, end: int, at: int) -> int:
        """Bytes of the storages that ops `first` to `end` − 1 (indices into `ops`) allocated and that are still
        alive after op `at`: what a stretch of ops (a block's forward, say) left behind at a later point."""
        lo, hi = (self._points[i - 1] if i else self._baseline_events for i in (first, end))
        made = {alloc for alloc, n in self._events[lo:hi] if n > 0}
        return sum(n for alloc, n in self._events[lo:self._points[at]] if alloc in made)

    def made_in(self, stretches) -> list[int]:
        """After each op, the bytes of activations and temporaries alive that ops in `stretches` ((first, end)
        pairs of indices into `ops`) allocated: what a part of the model (its blocks, say) holds at each point."""
        bounds = [(self._points[a - 1] if a else self._baseline_events, self._points[b - 1] if b else 0)
                  for a, b in stretches]
        kinds = self._categories()
        made = {alloc for lo, hi in bounds for alloc, n in self._events[lo:hi]
                if n > 0 and kinds[alloc] in ("activations", "temporaries")}
        series, now, done = [], 0, 0
        for point in self._points:
            now += sum(n for alloc, n in self._events[done:point] if alloc in made)
            done = point
            series.append(now)
        return series

    def timeline(self, recorded_ms: float) -> Timeline:
        kinds = self._categories()
        now = dict.fromkeys(CATEGORIES, 0)
        series = {c: [] for c in CATEGORIES}
        done = 0
        for point in self._points:
            for alloc, n in self._events[done:point]:
                now[kinds[alloc]] += n
            done = point
            for c in CATEGORIES:
                series[c].append(now[c])
        return Timeline(self.ops, self.phases, self.elapsed_ms, series, self._totals, self._resized_away, recorded_ms)


def record_step(step: Callable[[], object], model: torch.nn.Module,
                optimizer: torch.optim.Optimizer | None = None, devices: tuple[str, ...] = ("cpu",)) -> Timeline:
    """The timeline of `step()`, one training step of `model` (forward, backward and, with `optimizer`, its
    update).  Run a step before it if the optimizer creates its state lazily: a first step's state then
    reads as made during the step (it is, and it is labelled optimizer state all the same)."""
    recorder = TimelineRecorder(model, optimizer, devices)
    start = time.perf_counter()
    with recorder:
        step()
    return recorder.timeline((time.perf_counter() - start) * 1e3)


def record_cuda_step(step: Callable[[], object], model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer | None = None, max_entries: int = 200_000) -> Timeline:
    """`record_step` on a GPU: the recorder on CUDA tensors, with the caching allocator's own history of the same
    step (`torch.cuda.memory._record_memory_history`), whose bytes over its events are `allocator_bytes`."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        timeline = record_step(lambda: (step(), torch.cuda.synchronize()), model, optimizer, devices=("cuda",))
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    timeline.allocator_bytes = allocator_curve(snapshot, torch.cuda.current_device())
    timeline.allocator_peak_bytes = max(timeline.allocator_bytes, default=0)
    return timeline


def allocator_curve(snapshot: dict, device: int) -> list[int]:
    """Bytes the caching allocator handed out, after each alloc or free of `snapshot`'s trace of `device`,
    counted from what was allocated when the history began (0: the curve is the step's own)."""
    curve, now = [], 0
    for entry in snapshot["device_traces"][device]:
        if entry["action"] == "alloc":
            now += entry["size"]
        elif entry["action"] == "free_requested":  # the tensor is gone; the block is reusable once the stream is
            now -= entry["size"]
        else:
            continue
        curve.append(now)
    return curve
