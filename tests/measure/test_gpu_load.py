"""The GPU side of the load meter, on a CPU machine: a fake NVML module (`pynvml`) in sys.modules stands in for
the driver, so what other processes did on the device (how busy they kept it, the memory they held, how many
held it) is read and judged as on a GPU workstation, and NVML absent or failing is never an error."""

from __future__ import annotations

import os
import sys
import time
import types

import pytest
import torch

from scalekit.measure import load
from scalekit.measure.load import GpuOthers, LoadMeter, MachineLoad, gpu_others

OTHER_PID = 999_999  # not this process nor a child of it
GIB = 2**30


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(holding=None, samples=None, device_percent=95, init_error=False, calls=None):
    """A module with NVML's calls: `holding` {pid: bytes} the compute processes, `samples` [(pid, sm %)] the
    per-process utilisation (an int: that NVML error instead), `device_percent` the whole device's."""
    calls = [] if calls is None else calls
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError, nvml.NVML_SUCCESS, nvml.NVML_ERROR_NOT_FOUND = NVMLError, 0, 6

    def init():
        if init_error:
            raise NVMLError(12)  # NVML_ERROR_LIBRARY_NOT_FOUND: no driver on this machine
        calls.append("init")

    def utilisation(handle, since_us):
        calls.append(("since_us", since_us))
        if isinstance(samples, int):
            raise NVMLError(samples)
        return [types.SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, timeStamp=since_us + 1) for pid, sm in samples]

    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: calls.append("shutdown")
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: calls.append(("uuid", uuid)) or "handle"
    nvml.nvmlDeviceGetHandleByIndex = lambda index: calls.append(("index", index)) or "handle"
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in (holding or {}).items()]
    nvml.nvmlDeviceGetProcessUtilization = utilisation
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=device_percent, memory=0)
    return nvml


@pytest.fixture
def cuda_device(monkeypatch):
    """This process computes on CUDA device 0 (whose UUID torch reports), as far as the load meter asks."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="5e1f-0"))


def read_with(monkeypatch, nvml) -> MachineLoad:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return LoadMeter("cuda").read()


def test_another_process_that_computes_on_the_gpu_makes_it_busy(monkeypatch, cuda_device):
    calls = []
    before_us = time.time() * 1e6
    seen = read_with(monkeypatch, fake_nvml(holding={os.getpid(): 2 * GIB, OTHER_PID: 3 * GIB},
                                            samples=[(os.getpid(), 90), (OTHER_PID, 50), (OTHER_PID, 70)],
                                            calls=calls))
    assert (seen.gpu_other_processes, seen.gpu_other_percent, seen.gpu_other_bytes) == (1, 60.0, 3 * GIB)
    assert seen.busy and "1 other process(es) on the GPU (computed 60% of the time, holding 3.0 GiB)" in seen.note
    assert ("uuid", "GPU-5e1f-0") in calls and calls[-1] == "shutdown"  # the device by its UUID; NVML closed
    since_us = next(c[1] for c in calls if c[0] == "since_us")
    assert before_us <= since_us <= time.time() * 1e6  # samples since the run began, not before


def test_a_process_that_only_holds_memory_is_no_load(monkeypatch, cuda_device):
    seen = read_with(monkeypatch, fake_nvml(holding={os.getpid(): GIB, OTHER_PID: 5 * GIB},
                                            samples=[(os.getpid(), 95), (OTHER_PID, 0)]))
    assert (seen.gpu_other_processes, seen.gpu_other_percent, seen.gpu_other_bytes) == (1, 0.0, 5 * GIB)
    assert not seen.gpu_busy
    nobody_sampled = read_with(monkeypatch, fake_nvml(holding={OTHER_PID: GIB, os.getpid(): GIB}, samples=6))
    assert nobody_sampled.gpu_other_percent == 0.0 and not nobody_sampled.gpu_busy  # NVML: 'not found'


def test_a_process_computing_without_being_listed_still_counts(monkeypatch, cuda_device):
    # graphics work, or a process that started and ended within the run: in the samples, not in the list
    seen = read_with(monkeypatch, fake_nvml(holding={os.getpid(): GIB}, samples=[(OTHER_PID, 40)]))
    assert seen.gpu_other_processes == 0 and seen.gpu_other_percent == 40.0 and seen.gpu_busy
    assert "other processes on the GPU (computed 40% of the time)" in seen.note


def test_without_per_process_samples_the_whole_device_bounds_the_others(monkeypatch, cuda_device):
    holding = {os.getpid(): GIB, OTHER_PID: GIB}
    busy_device = read_with(monkeypatch, fake_nvml(holding=holding, samples=3, device_percent=95))  # not supported
    assert busy_device.gpu_other_percent is None and busy_device.gpu_busy  # held by another, how busy not known
    assert "how busy not known" in busy_device.note
    idle_device = read_with(monkeypatch, fake_nvml(holding=holding, samples=3, device_percent=4))
    assert idle_device.gpu_other_percent == 4.0 and not idle_device.gpu_busy


def test_in_a_container_nvml_lists_host_pids_and_only_the_count_is_read(monkeypatch, cuda_device):
    # none of the listed pids is this process's: one of them is this process under its host pid
    alone = read_with(monkeypatch, fake_nvml(holding={4242: GIB}, samples=[(4242, 90)]))
    assert alone.gpu_other_processes == 0 and not alone.gpu_busy
    shared = read_with(monkeypatch, fake_nvml(holding={4242: GIB, 4343: GIB}, samples=[(4242, 90), (4343, 1)]))
    assert shared.gpu_other_processes == 1 and shared.gpu_other_percent is None and shared.gpu_busy


def test_nvml_absent_or_failing_is_not_known_and_never_raises(monkeypatch, cuda_device):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: the import fails
    assert gpu_others(0) == GpuOthers()
    assert read_with(monkeypatch, fake_nvml(init_error=True)).gpu_other_processes is None  # no driver
    broken = fake_nvml(holding={OTHER_PID: GIB})
    broken.nvmlDeviceGetHandleByUUID = broken.nvmlDeviceGetHandleByIndex = lambda key: 1 / 0
    seen = read_with(monkeypatch, broken)
    assert (seen.gpu_other_processes, seen.gpu_other_percent, seen.gpu_other_bytes) == (None, None, None)
    assert not seen.gpu_busy  # a GPU whose load is not known is not called busy
    index = []
    no_uuid = fake_nvml(holding={os.getpid(): GIB}, samples=[], calls=index)
    no_uuid.nvmlDeviceGetHandleByUUID = lambda uuid: 1 / 0  # a MIG slice: not a GPU's UUID
    assert read_with(monkeypatch, no_uuid).gpu_other_processes == 0 and ("index", 0) in index


def test_the_real_binding_without_a_driver_says_nothing():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is a dependency, but this environment lacks it")
    from scalekit.machine.hardware import cuda_gpu_present

    if cuda_gpu_present():
        pytest.skip("a GPU and its driver are here: NVML answers")
    assert gpu_others(int(time.time() * 1e6)) == GpuOthers()


def test_the_gpu_is_busy_by_how_much_others_compute_not_by_how_many_hold_it():
    assert not MachineLoad(0.0, 2, 1.0, gpu_other_processes=3, gpu_other_percent=load.GPU_BUSY_PERCENT).busy
    assert MachineLoad(0.0, 2, 1.0, gpu_other_processes=1, gpu_other_percent=35.0).busy
    assert MachineLoad(0.0, 2, 1.0, gpu_other_processes=1).busy  # held, how busy not known: counted busy
    assert not MachineLoad(0.0, 2, 1.0).busy and MachineLoad(0.0, 2, 1.0).note == ""
