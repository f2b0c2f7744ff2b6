"""The machine's load while a run measures, and the number of threads a run computes on.

A shared CPU lies: with one other busy process on a 2-core machine, torch's default of one intra-op thread
per core swung step times 3–60×.  So a run pins torch's threads (RunConfig.threads / GenerateConfig.threads;
None: the cores other processes are not already using, at least one, decided once per process so that
every row of a comparison computes on the same number), and records how much CPU other processes used
while it ran: above BUSY_SHARE of the machine the result says its timings are unreliable.

Other processes' CPU is the machine's busy CPU time (psutil, from /proc/stat) minus this process's and its
children's (data-loader workers are ours), over the run's wall time.  On a GPU, NVML (when pynvml is
installed) says how many other processes hold the device.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import psutil

BUSY_SHARE = 0.25  # other processes using more than this share of the cores (and half a core at least): busy
MIN_WALL_S = 0.2  # below this, /proc/stat's 10 ms ticks are too coarse to say anything about the load
SAMPLE_S = 0.25  # how long the automatic thread count watches the machine before deciding


@dataclass(frozen=True)
class MachineLoad:
    """What else ran on the machine while a run measured."""

    other_cpu_cores: float | None  # cores' worth of CPU other processes used, on average (None: too short to tell)
    cores: int  # the cores this process may run on
    wall_s: float  # over how long
    gpu_other_processes: int | None = None  # other processes holding the GPU (NVML; None: not known)

    @property
    def busy(self) -> bool:
        cpu = self.other_cpu_cores is not None and self.other_cpu_cores > max(0.5, BUSY_SHARE * self.cores)
        return cpu or bool(self.gpu_other_processes)

    @property
    def note(self) -> str:
        """'the machine was busy: ... timings unreliable', or '' when it was not."""
        if not self.busy:
            return ""
        what = []
        if self.other_cpu_cores is not None and self.other_cpu_cores > max(0.5, BUSY_SHARE * self.cores):
            what.append(f"other processes used {self.other_cpu_cores:.1f} of {self.cores} cores")
        if self.gpu_other_processes:
            what.append(f"{self.gpu_other_processes} other process(es) used the GPU")
        return f"the machine was busy ({', '.join(what)}): timings unreliable"


def busiest(a: MachineLoad | None, b: MachineLoad | None) -> MachineLoad | None:
    """The busier of two loads (a row measured in several rounds keeps its worst)."""
    if a is None or b is None:
        return a or b
    return max(a, b, key=lambda x: (x.busy, x.other_cpu_cores or 0.0))


def cores() -> int:
    """The cores this process may run on (its affinity, where the OS says it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LoadMeter:
    """Started before a run and read after it: the CPU other processes used meanwhile."""

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._t0, self._busy0, self._ours0 = time.perf_counter(), _busy_cpu_s(), _our_cpu_s()

    def other_cpu_cores(self) -> tuple[float, float]:
        """(cores' worth of CPU other processes used since the start, seconds since the start)."""
        wall = time.perf_counter() - self._t0
        return max(0.0, (_busy_cpu_s() - self._busy0) - (_our_cpu_s() - self._ours0)) / max(wall, 1e-9), wall

    def read(self) -> MachineLoad:
        others, wall = self.other_cpu_cores()
        gpu = _gpu_other_processes() if self.device_type == "cuda" else None
        return MachineLoad(other_cpu_cores=others if wall >= MIN_WALL_S else None, cores=cores(), wall_s=wall,
                           gpu_other_processes=gpu)


def _busy_cpu_s() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def _our_cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live ones (data-loader workers, ranks)."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:  # it ended between the listing and the reading
            pass
    return total


def _gpu_other_processes() -> int | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        import torch

        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return len(pids - {os.getpid()})
    except Exception:  # NVML missing a driver call, or no permission: not known
        return None


def in_launched_rank() -> bool:
    """One of several processes of a launch or torchrun: they share the cores as the launcher decided."""
    return "SCALEKIT_LAUNCHED_RANK" in os.environ or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


@functools.lru_cache(maxsize=1)
def auto_threads() -> int:
    """The cores other processes are not already using (a core counts as used from half its time), at least one.
    Decided once per process, so that the rows of a comparison compute on the same number."""
    meter = LoadMeter()
    time.sleep(SAMPLE_S)
    others, _ = meter.other_cpu_cores()
    return max(1, cores() - int(others + 0.5))
