"""The machine's load while a run measures, and the number of threads a run computes on.

A shared CPU lies: with one other busy process on a 2-core machine, torch's default of one intra-op thread
per core swung step times 3–60×.  So a run pins torch's threads (RunConfig.threads / GenerateConfig.threads;
None: the cores other processes are not already using, at least one, decided once per process so that
every row of a comparison computes on the same number), and records how much CPU other processes used
while it ran: above BUSY_SHARE of the machine the result says its timings are unreliable.

Other processes' CPU is the machine's busy CPU time (psutil, from /proc/stat) minus this process's and its
children's (data-loader workers are ours), over the run's wall time.  On a GPU, NVML (nvidia-ml-py, the
driver's own binding, module `pynvml`) says how busy other processes kept the device over the run (their share
of the time its SMs computed) and how much memory they held: a process that only holds memory is no load, and
one that computes is, whether or not it shows in the list of processes holding the device.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from dataclasses import dataclass

import psutil

BUSY_SHARE = 0.25  # other processes using more than this share of the cores (and half a core at least): busy
GPU_BUSY_PERCENT = 10.0  # other processes computing on the GPU more than this share of the run's time: busy
MIN_WALL_S = 0.2  # below this, /proc/stat's 10 ms ticks are too coarse to say anything about the load
SAMPLE_S = 0.25  # how long the automatic thread count watches the machine before deciding


@dataclass(frozen=True)
class MachineLoad:
    """What else ran on the machine while a run measured."""

    other_cpu_cores: float | None  # cores' worth of CPU other processes used, on average (None: too short to tell)
    cores: int  # the cores this process may run on
    wall_s: float  # over how long
    gpu_other_processes: int | None = None  # other processes holding the GPU (NVML; None: not known)
    # the share of the run's time other processes kept the GPU's SMs computing, in percent, summed over them
    # (NVML; None: not known)
    gpu_other_percent: float | None = None
    gpu_other_bytes: int | None = None  # device memory other processes held at the end (NVML; None: not known)

    @property
    def cpu_busy(self) -> bool:
        return self.other_cpu_cores is not None and self.other_cpu_cores > max(0.5, BUSY_SHARE * self.cores)

    @property
    def gpu_busy(self) -> bool:
        if self.gpu_other_percent is not None:
            return self.gpu_other_percent > GPU_BUSY_PERCENT
        return bool(self.gpu_other_processes)  # held by others, how busy not known: counted as busy

    @property
    def busy(self) -> bool:
        return self.cpu_busy or self.gpu_busy

    @property
    def note(self) -> str:
        """'the machine was busy: ... timings unreliable', or '' when it was not."""
        if not self.busy:
            return ""
        what = [f"other processes used {self.other_cpu_cores:.1f} of {self.cores} cores"] if self.cpu_busy else []
        if self.gpu_busy:
            what.append(self._gpu_words())
        return f"the machine was busy ({', '.join(what)}): timings unreliable"

    def _gpu_words(self) -> str:
        who = f"{self.gpu_other_processes} other process(es)" if self.gpu_other_processes else "other processes"
        how = f"computed {self.gpu_other_percent:.0f}% of the time" if self.gpu_other_percent is not None \
            else "how busy not known"
        held = f", holding {self.gpu_other_bytes / 2**30:.1f} GiB" if self.gpu_other_bytes else ""
        return f"{who} on the GPU ({how}{held})"


def busiest(a: MachineLoad | None, b: MachineLoad | None) -> MachineLoad | None:
    """The busier of two loads (a row measured in several rounds keeps its worst)."""
    if a is None or b is None:
        return a or b
    return max(a, b, key=lambda x: (x.busy, x.other_cpu_cores or 0.0))


def any_busy(*loads: MachineLoad | None) -> bool:
    """The machine was busy during any of these runs (a comparison's two sides): one run each cannot then be
    given a verdict (measure.stats.verdict)."""
    return any(load is not None and load.busy for load in loads)


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
        self._start_us = int(time.time() * 1e6)  # NVML stamps its samples in microseconds since the epoch

    def other_cpu_cores(self) -> tuple[float, float]:
        """(cores' worth of CPU other processes used since the start, seconds since the start)."""
        wall = time.perf_counter() - self._t0
        return max(0.0, (_busy_cpu_s() - self._busy0) - (_our_cpu_s() - self._ours0)) / max(wall, 1e-9), wall

    def read(self) -> MachineLoad:
        others, wall = self.other_cpu_cores()
        gpu = gpu_others(self._start_us) if self.device_type == "cuda" else GpuOthers()
        return MachineLoad(other_cpu_cores=others if wall >= MIN_WALL_S else None, cores=cores(), wall_s=wall,
                           gpu_other_processes=gpu.processes, gpu_other_percent=gpu.percent,
                           gpu_other_bytes=gpu.memory_bytes)


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


# -- the GPU, asked of NVML --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuOthers:
    """What other processes did on this process's GPU during a run (None: not known)."""

    processes: int | None = None  # how many held the device
    percent: float | None = None  # the share of the time their kernels ran, in percent, summed over them
    memory_bytes: int | None = None  # the device memory they held


def gpu_others(since_us: int) -> GpuOthers:
    """Other processes' use of this process's GPU since `since_us` (microseconds since the epoch), asked of NVML.
    Not known, never an error, where nvidia-ml-py is missing, there is no driver (nvmlInit raises on a CPU
    machine) or NVML refuses a call (no permission, a GPU that does not sample per process)."""
    try:
        import pynvml
    except ImportError:
        return GpuOthers()
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver or no library: NVML's own error types, or ctypes' OSError
        return GpuOthers()
    try:
        return _read_others(pynvml, _nvml_handle(pynvml), since_us)
    except Exception:  # no handle for the device (CUDA unusable here), an NVML that changed its calls
        return GpuOthers()
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_handle(pynvml):
    """NVML's handle of the device this process computes on: by its UUID (NVML numbers every GPU, CUDA only
    those CUDA_VISIBLE_DEVICES shows), else by CUDA's index."""
    import torch

    index = torch.cuda.current_device()
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
    except Exception:  # a torch without the UUID, a MIG slice (whose UUID is not a GPU's)
        return pynvml.nvmlDeviceGetHandleByIndex(index)


def _read_others(pynvml, handle, since_us: int) -> GpuOthers:
    ours = _our_pids()
    try:
        holding = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except pynvml.NVMLError:
        holding = None
    if holding and not ours & holding.keys():
        # NVML lists the host's pids and this process (in a container) knows only its own: one of those listed
        # is this process, which one cannot be told, nor whose the samples of use are
        return GpuOthers(processes=len(holding) - 1, percent=0.0 if len(holding) == 1 else None)
    others = {pid: used for pid, used in (holding or {}).items() if pid not in ours}
    percent = _others_percent(pynvml, handle, since_us, ours)
    if percent is None and others:
        percent = _idle_device_percent(pynvml, handle)
    memory = sum(others.values()) if holding is not None and None not in others.values() else None
    return GpuOthers(len(others) if holding is not None else None, percent, memory)


def _others_percent(pynvml, handle, since_us: int, ours: set[int]) -> float | None:
    """Other processes' share of the time since `since_us` that the SMs computed their kernels: each one's mean
    over NVML's samples, summed (None: this GPU or driver does not sample per process)."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except pynvml.NVMLError as err:
        # no sample since the start ('not found', or success with nothing to return): nobody computed enough
        nothing = (getattr(pynvml, "NVML_SUCCESS", 0), getattr(pynvml, "NVML_ERROR_NOT_FOUND", 6))
        return 0.0 if getattr(err, "value", None) in nothing else None
    by_pid: dict[int, list[float]] = {}
    for sample in samples:
        if sample.pid not in ours:
            by_pid.setdefault(sample.pid, []).append(float(sample.smUtil))
    return sum(statistics.fmean(shares) for shares in by_pid.values())


def _idle_device_percent(pynvml, handle) -> float | None:
    """The whole device's busy share of late, ours included: a bound on the others' that can only say they
    were not busy (None when it is too high to say that)."""
    try:
        device_percent = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:
        return None
    return device_percent if device_percent <= GPU_BUSY_PERCENT else None


def _our_pids() -> set[int]:
    """This process and its children (data-loader workers, ranks it started): their use is the run's own."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids |= {child.pid for child in me.children(recursive=True)}
    return pids


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
