"""GPU paths: CUDA-event timing, allocator memory, MFU from the peak table. Skipped on machines without CUDA."""

from __future__ import annotations

import pytest
import torch

from scalekit import RunConfig, detect, run
from scalekit.measure.timing import CUDAStepTimer

pytestmark = pytest.mark.gpu


def test_cuda_event_timer_measures_device_time():
    timer = CUDAStepTimer(torch.device("cuda"))
    a = torch.randn(4096, 4096, device="cuda")
    timer.start()
    for _ in range(20):
        a = a @ a / 4096
    timer.stop()
    (ms,) = timer.collect()
    assert ms > 0.1  # twenty 4k matmuls take device time, even though the launches returned at once


def test_gpu_run_reports_allocator_memory_and_mfu():
    hw = detect("cuda")
    result = run(RunConfig(preset="small", device="cuda", steps=10, toggles=["bf16"] if hw.bf16_supported else []))
    assert result.status == "ok"
    assert "CUDA allocator" in result.mem_source and result.peak_mem_bytes > 0
    assert result.peak_mem_reserved_bytes >= result.peak_mem_bytes
    peak, _ = hw.peak_tflops("bf16" if hw.bf16_supported else "fp32")
    assert (result.mfu is not None) == (peak is not None)


def test_gpu_ladder_toggles_learn():
    result = run(RunConfig(preset="small", device="cuda", steps=30, warmup_steps=2,
                           toggles=["tf32", "bf16", "compile", "sdpa", "nice_numbers", "fused_adamw"]))
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < losses[0] - 0.3
