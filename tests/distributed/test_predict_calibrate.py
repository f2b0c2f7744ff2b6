"""calibrate() measures this machine (matmul by size, copy bandwidth, per-operator cost, gloo collectives by
message size over ranks it starts) and registers the part "this-cpu" that predict then uses."""

from __future__ import annotations

import time

import pytest

from scalekit.predict import PARTS, calibrate, predict
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here


def test_calibrate_registers_this_cpu_with_measured_factors_and_predict_uses_them():
    start = time.perf_counter()
    part = calibrate(ranks=2, matmul_sizes=(32, 64), copy_mbytes=4, message_sizes=(2**12, 2**16), repeats=2,
                     threads=1)
    assert time.perf_counter() - start < 20
    try:
        eff = part.efficiency
        assert PARTS["this-cpu"] is part and part.peak("fp32") == max(f for _, f in eff.matmul_curve)
        assert [n for n, _ in eff.matmul_curve] == [32, 64] and all(f > 0 for _, f in eff.matmul_curve)
        assert part.memory_bandwidth > 0 and part.intra_bandwidth > 0 and eff.latency_s > 0
        assert 0 < eff.op_overhead_s < 1e-3 and not eff.overlaps_communication
        assert all(k in eff.sources for k in ("matmul", "memory", "link", "latency_s", "op_overhead_s"))
        # the memory factor: a transformer block's element-wise operators against the copy, measured (not 1.0)
        assert 0 < eff.memory < 5 and eff.memory != 1.0 and "element-wise" in eff.sources["memory"]
        p = predict("tiny", "2xthis-cpu", toggles=["ddp"])
        assert p.compute_parts["per-op overhead"] > 0  # the operators of one step, counted, at the measured cost
        reduce = next(c for c in p.collectives if c.op == "all_reduce")
        assert reduce.link.startswith("loopback") and reduce.exposed_s == reduce.time_s > 0  # nothing overlaps here
        assert any("NO_OVERLAP_HERE" in a for a in p.assumptions)
        # gloo's all-reduce is a ring: this part has no tree, and its prediction says so
        assert eff.algorithms == ("ring",) and "gloo" in eff.sources["algorithms"]
        assert reduce.algorithm == "ring" and not reduce.algorithm_note
        assert any("every collective as a ring (gloo's all-reduce is a ring" in a for a in p.assumptions)
        # the DTensor wrappers' host work, measured in the same ranks, and paid by the modes built on them
        assert 0 < eff.fsdp_call_s < 0.1 and 0 < eff.dtensor_param_s < 0.1 and 0 < eff.tp_linear_s < 0.1
        for rate, field in (("fsdp_host_bandwidth", "fsdp_call_s"), ("tp_host_bandwidth", "tp_linear_s")):
            # a per-byte cost is measured, or (noise larger than it, three tries over, on a busy machine) said
            # to be unresolved and taken as none, in its source's words
            resolved = getattr(eff, rate) < float("inf")
            assert getattr(eff, rate) > 0 and resolved == ("not resolved" not in eff.sources[field])
        assert all("gloo ranks" in eff.sources[k] for k in ("fsdp_call_s", "dtensor_param_s", "tp_linear_s"))
        assert "host work (DTensor, FSDP2 hooks)" not in p.compute_parts  # DDP: no DTensor
        for toggles in (["fsdp"], {"tensor_parallel": 2}):
            assert predict("tiny", "2xthis-cpu", toggles=toggles).compute_parts["host work (DTensor, FSDP2 hooks)"] > 0
    finally:
        PARTS.pop("this-cpu", None)


@pytest.mark.multi_gpu
def test_calibrate_on_gpus_measures_nccl_collectives_over_them_before_touching_cuda():
    import torch

    from scalekit.machine.hardware import gpu_count_without_cuda_init

    ranks = min(2, gpu_count_without_cuda_init())
    part = calibrate(device="cuda", ranks=ranks, matmul_sizes=(1024,), copy_mbytes=256, repeats=3)
    try:
        eff = part.efficiency
        assert part.intra_link == f"measured (NCCL over {ranks} GPUs)" and part.intra_bandwidth > 1e9
        assert 0 < eff.latency_s < 1e-3 and eff.link == 1.0 and "NCCL" in eff.sources["link"]
        assert torch.cuda.is_initialized()  # after the ranks: the collectives forked first
        p = predict("small", f"{ranks}xthis-gpu", toggles=["ddp", "bf16"])
        assert next(c for c in p.collectives if c.op == "all_reduce").link.startswith("measured (NCCL")
    finally:
        PARTS.pop("this-gpu", None)
