"""Step timing that measures the device's work, not the host's kernel launches.

On a GPU, work is asynchronous: a step's Python returns long before its kernels finish.  Each step is
bracketed by CUDA events recorded on the stream, and the elapsed times are read only at sync points
(`collect`), so timing adds no synchronisation of its own.  On the CPU, ops run synchronously and a
monotonic clock around the step is exact.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


class CPUStepTimer:
    def __init__(self) -> None:
        self._t0 = 0.0
        self._pending: list[float] = []

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self._pending.append((time.perf_counter() - self._t0) * 1e3)

    def discard(self) -> None:
        """Forget a step that was started and will not be stopped (it was interrupted)."""

    def collect(self) -> list[float]:
        """Milliseconds of the steps stopped since the last collect."""
        out, self._pending = self._pending, []
        return out


class CUDAStepTimer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._start: torch.cuda.Event | None = None

    def start(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def stop(self) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((self._start, end))

    def discard(self) -> None:
        self._start = None

    def collect(self) -> list[float]:
        if not self._pending:
            return []
        self._pending[-1][1].synchronize()
        out = [start.elapsed_time(end) for start, end in self._pending]
        self._pending = []
        return out


def step_timer(device: torch.device):
    return CUDAStepTimer(device) if device.type == "cuda" else CPUStepTimer()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work; a no-op on the CPU (and never a CUDA call there)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Spread:
    median: float
    p25: float
    p75: float
    min: float
    max: float
    n: int

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            nan = float("nan")
            return cls(nan, nan, nan, nan, nan, 0)
        if len(values) == 1:
            v = values[0]
            return cls(v, v, v, v, v, 1)
        q = statistics.quantiles(values, n=4, method="inclusive")
        return cls(statistics.median(values), q[0], q[2], min(values), max(values), len(values))
