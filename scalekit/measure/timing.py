"""Step timing that measures the device's work, not the host's kernel launches.

On a GPU, work is asynchronous: a step's Python returns long before its kernels finish.  Each step is
bracketed by CUDA events recorded on the stream, and the elapsed times are read only at sync points
(`collect`), so timing adds no synchronisation of its own.  On the CPU, ops run synchronously and a
monotonic clock around the step is exact.

`data_ready()`, called once the step has its batch, splits the step in two: the wait for data (from the
step's start to that mark) and the rest.  On a GPU the mark is one more event on the stream, so the wait
is what the device spent without work while the host fetched the batch, plus the copy to the device:
time the host spent fetching while the device still ran the previous step overlapped compute, and does
not count.  Recording an event does not wait for anything.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


class CPUStepTimer:
    def __init__(self) -> None:
        self._t0 = 0.0
        self._t_data: float | None = None
        self._pending: list[tuple[float, float | None]] = []  # (step ms, data-wait ms or None)

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._t_data = None

    def data_ready(self) -> None:
        """The step has its batch: the time since start() was spent waiting for data."""
        self._t_data = time.perf_counter()

    def stop(self) -> None:
        wait = None if self._t_data is None else (self._t_data - self._t0) * 1e3
        self._pending.append(((time.perf_counter() - self._t0) * 1e3, wait))

    def discard(self) -> None:
        """Forget a step that was started and will not be stopped (it was interrupted)."""

    def collect(self) -> list[float]:
        """Milliseconds of the steps stopped since the last collect."""
        return self.collect_with_waits()[0]

    def collect_with_waits(self) -> tuple[list[float], list[float | None]]:
        """(step ms, data-wait ms) of the steps stopped since the last collect; a wait is None for a step
        that never called data_ready()."""
        out, self._pending = self._pending, []
        return [ms for ms, _ in out], [wait for _, wait in out]


class CUDAStepTimer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: list[tuple] = []  # (start, data-ready or None, end) events per step
        self._start: torch.cuda.Event | None = None
        self._data: torch.cuda.Event | None = None

    def start(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()
        self._data = None

    def data_ready(self) -> None:
        """The step has its batch on the device (its copy is queued on the stream before this event)."""
        self._data = torch.cuda.Event(enable_timing=True)
        self._data.record()

    def stop(self) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((self._start, self._data, end))

    def discard(self) -> None:
        self._start = None

    def collect(self) -> list[float]:
        return self.collect_with_waits()[0]

    def collect_with_waits(self) -> tuple[list[float], list[float | None]]:
        if not self._pending:
            return [], []
        self._pending[-1][2].synchronize()  # the one wait: every earlier event has completed too
        steps = [start.elapsed_time(end) for start, _, end in self._pending]
        waits = [None if data is None else start.elapsed_time(data) for start, data, _ in self._pending]
        self._pending = []
        return steps, waits


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
