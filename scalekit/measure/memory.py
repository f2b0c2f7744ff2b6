"""Peak memory: from the CUDA caching allocator on a GPU, from live-tensor accounting on the CPU.

The CPU has no allocator statistics, and the process's RSS mixes in Python, libraries and freed-but-kept
pages.  `LiveTensorBytes` counts the bytes of tensor storages alive at each moment: storages that exist
when it starts are counted as a baseline, and every op's output storage that is new is added until it is
freed (a weak reference tells us when).  Views and in-place results share storages and are not counted
twice.  It runs on one extra, untimed step: accounting every op would distort the step times.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def storage_key(storage: torch.UntypedStorage) -> int:
    """One number per storage while it is alive: its C++ object's address.  (Not its data pointer: every
    fake tensor's is 0, and the planner counts fake tensors the same way.)"""
    return storage._cdata


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by the distinct storages behind `tensors` (shared/tied storages counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        t = getattr(t, "_local_tensor", t)  # a DTensor (FSDP2) holds its shard in a local tensor
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            seen[storage_key(s)] = s.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class GradBytesAtStep:
    """Bytes of the gradients when the optimizer step begins, the moment all of them exist.

    Gradients live only inside a step (they are set to None after it), so they are read from an optimizer
    step pre-hook, once: the hook removes itself after its first reading.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.grads_bytes: int | None = None
        self._handle = optimizer.register_step_pre_hook(self._read)

    def _read(self, optimizer, args, kwargs) -> None:
        self.grads_bytes = storage_bytes(p.grad for p in optimizer_params(optimizer) if p.grad is not None)
        self.remove()

    def remove(self) -> None:
        self._handle.remove()


class LiveTensorBytes(TorchDispatchMode):
    """Tracks live tensor-storage bytes while active; `peak_bytes` includes the baseline passed in."""

    def __init__(self, baseline: Iterable[torch.Tensor] = (), devices: tuple[str, ...] = ("cpu",)) -> None:
        super().__init__()
        self.devices = devices  # device types whose tensors are counted (the planner counts fake CUDA ones too)
        self._live: dict[int, int] = {}
        self.baseline_bytes = 0
        for t in baseline:  # (a tensor on the meta device, as a pipeline rank's other stages' weights, holds none)
            if t.device.type in devices:
                self._track(t.untyped_storage(), baseline=True)
        self.current_bytes = self.baseline_bytes
        self.peak_bytes = self.current_bytes

    def _track(self, storage: torch.UntypedStorage, baseline: bool = False) -> None:
        key = storage_key(storage)
        if key in self._live or storage.nbytes() == 0:
            return
        n = storage.nbytes()
        self._live[key] = n
        if baseline:
            self.baseline_bytes += n
        else:
            self.current_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(storage, self._release, key, n)

    def _release(self, key: int, n: int) -> None:
        if self._live.get(key) == n:
            del self._live[key]
            self.current_bytes -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type in self.devices:
                self._track(t.untyped_storage())
        return out


def cuda_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peak(device: torch.device) -> tuple[int, int]:
    """(max allocated, max reserved) bytes since the last reset."""
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def current_bytes(device: torch.device) -> int | None:
    """Memory in use now: allocator bytes on a GPU, the process's RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        return None


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable and total parameters (as values: a bitsandbytes 4-bit weight counts its unpacked shape) and
    the bytes of each kind, tied parameters once."""
    counts = {"trainable_params": 0, "total_params": 0, "trainable_weight_bytes": 0, "frozen_weight_bytes": 0}
    for p in model.parameters():  # parameters() yields a tied weight once
        state = getattr(p, "quant_state", None)
        values = math.prod(state.shape) if state is not None and hasattr(state, "shape") else p.numel()
        nbytes = storage_bytes([p]) + (quant_state_bytes(state) if state is not None else 0)
        scale = getattr(p, "SCB", None)  # bitsandbytes int8 weights: a scale per row beside the int8 values
        nbytes += scale.numel() * scale.element_size() if isinstance(scale, torch.Tensor) else 0
        counts["total_params"] += values
        if p.requires_grad:
            counts["trainable_params"] += values
            counts["trainable_weight_bytes"] += nbytes
        else:
            counts["frozen_weight_bytes"] += nbytes
    return counts


def quant_state_bytes(state) -> int:
    """The tensors a bitsandbytes QuantState keeps beside the packed weight (absmax per block, code book)."""
    tensors = [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
    nested = getattr(state, "state2", None)
    return storage_bytes(tensors) + (quant_state_bytes(nested) if nested is not None else 0)
