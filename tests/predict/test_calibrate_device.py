"""calibrate(device="cuda"): what does not need the GPU is checked here on the CPU (the timing helper with a
synchronize injected, the part built from measured figures, the names that map to datasheet parts, the refusals);
the measurement itself in a gpu-marked test."""

from __future__ import annotations

import pytest

from scalekit import RunConfig
from scalekit.errors import ConfigError
from scalekit.predict import PARTS, PUBLISHED, calibrate, gpus, part, predict, register
from scalekit.predict.calibrate import Figures, gpu_part, measured_figures
from scalekit.predict.collectives import FACTORS
from scalekit.predict.microbench import _median_time, bus_bandwidths, matmul_batch
from scalekit.predict.parts import datasheet_part


def test_every_clock_reading_waits_for_the_device_and_the_median_is_per_call():
    events, now = [], [0.0]

    def fn():  # one call takes 2 ms
        events.append("call")
        now[0] += 0.002

    def clock():
        events.append("clock")
        return now[0]

    t = _median_time(fn, repeats=3, window_s=0.01, clock=clock, sync=lambda: events.append("sync"))
    assert t == pytest.approx(0.002)
    reads = [i for i, e in enumerate(events) if e == "clock"]
    assert len(reads) == 2 + 2 * 3 and all(events[i - 1] == "sync" for i in reads)  # the queued work done first
    assert events[0] == "call" and events.count("call") == 2 + 3 * 5  # a warm-up, one call to size, 5 per window


def test_gpu_names_map_to_the_datasheet_parts_they_are_and_no_other():
    assert datasheet_part("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert datasheet_part("NVIDIA H100 PCIe").name == "H100-PCIe"
    assert datasheet_part("NVIDIA H100 NVL").name == "H100-NVL"
    assert datasheet_part("NVIDIA H200").name == "H200"
    assert datasheet_part("NVIDIA A100-SXM4-80GB").name == "A100-80GB-SXM"
    assert datasheet_part("NVIDIA GeForce RTX 4090").name == "RTX-4090"
    for other in ("NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA A100 80GB PCIe", "NVIDIA H100 96GB HBM3", "Tesla T4",
                  "Intel(R) Xeon(R) CPU"):  # other clocks, memory or links: no guess
        assert datasheet_part(other) is None, other


def test_a_gpu_is_timed_as_batches_that_fill_it_and_a_cpu_one_matmul_at_a_time():
    assert matmul_batch(64, cuda=False) == 1 == matmul_batch(8192, cuda=True)
    assert matmul_batch(1024, cuda=True) == 64  # (4096 / 1024)³: as much work as one 4096³ matmul
    assert matmul_batch(64, cuda=True) * 64 * 64 == 2**28  # capped at 2^28 elements per operand


def _figures(name: str, collectives=None, ranks: int = 0) -> Figures:
    curve = ((256, 100e12), (1024, 600e12), (4096, 791.5e12))
    return Figures(name, 80e9, {"bf16": curve, "fp32": tuple((n, f / 16) for n, f in curve),
                                "tf32": tuple((n, f / 2) for n, f in curve)},
                   copy_bandwidth=2.8e12, elementwise_bandwidth=2.1e12, op_overhead_s=6e-6, copy_mbytes=1024,
                   ranks=ranks, collectives=collectives or {},
                   collectives_why="" if collectives else "not measured: NCCL's collectives need 2 GPUs, and 1 GPU is here")


def test_a_gpu_part_from_its_figures_holds_the_measured_peaks_against_the_datasheet():
    p = gpu_part("test-gpu", _figures("NVIDIA H100 80GB HBM3"))
    eff = p.efficiency
    assert p.peak("bf16") == 791.5e12 == p.peak("fp16") and p.peak("fp32") == 791.5e12 / 16
    assert "bf16 0.80" in p.sources["flops"] and "H100-SXM" in p.sources["flops"]  # 791.5 of 989.4 dense
    assert eff.memory == pytest.approx(0.75) and p.memory_bandwidth == 2.8e12 and eff.queued_dispatch
    assert eff.overlaps_communication and eff.algorithms == ("ring", "tree")
    # each dtype reads its own curve: fp32 at 1/16 of bf16's rate at every size
    assert eff.matmul_at(1024, 0.0, "fp32") == pytest.approx(eff.matmul_at(1024, 0.0, "bf16") / 16)
    assert eff.matmul_at(1024, 0.0, "fp16") == eff.matmul_at(1024, 0.0)  # no fp16 curve: the part's, bf16's
    # one GPU measured no link: the datasheet part's, at PUBLISHED's factor, and the sources say so
    sheet = PARTS["H100-SXM"]
    assert p.intra_bandwidth == pytest.approx(sheet.intra_bandwidth * PUBLISHED.link)
    assert "need 2 GPUs" in p.sources["intra"] and "H100-SXM" in p.sources["intra"]


def test_a_gpu_the_table_does_not_know_predicts_on_one_gpu_and_refuses_more_naming_why():
    p = register(gpu_part("test-gpu", _figures("Some Future GPU")))
    try:
        assert "no part of the table" in p.sources["flops"]
        assert gpus("1xtest-gpu").count == 1
        with pytest.raises(ConfigError, match="no intra-node link figure .*need 2 GPUs.*predict it on one GPU"):
            gpus("2xtest-gpu")
    finally:
        del PARTS["test-gpu"]


def test_collectives_measured_over_gpus_set_the_link_and_its_latency():
    rows = [(op, nbytes, t) for nbytes, t in ((2**16, 20e-6), (2**27, 1e-3))
            for op in ("all_reduce", "all_gather", "reduce_scatter")]
    colls = bus_bandwidths(rows, 2)
    assert colls["all_gather"][1][2] == pytest.approx(FACTORS["all_gather"](2) * 2**27 / 1e-3)
    assert colls["latency_s"] == pytest.approx(20e-6 / 2)  # the smallest all-reduce over its 2(n−1) ring steps
    p = gpu_part("test-gpu", _figures("NVIDIA H100 80GB HBM3", colls, ranks=2))
    best = max(bw for op in ("all_reduce", "all_gather", "reduce_scatter") for _, _, bw in colls[op])
    assert p.intra_bandwidth == best and p.efficiency.link == 1.0 and p.efficiency.latency_s == 10e-6
    assert p.intra_link == "measured (NCCL over 2 GPUs)" and "InfiniBand" in p.inter_link


def test_dispatch_queued_ahead_of_a_gpus_kernels_shows_only_where_it_outlasts_them():
    import dataclasses

    eff = gpu_part("test-gpu", _figures("NVIDIA H100 80GB HBM3")).efficiency
    cfg = RunConfig(preset="tiny", batch_size=4, device="cpu", data="synthetic")

    def predicted(**change):
        return predict(cfg, "1xH100-SXM", efficiency=dataclasses.replace(eff, **change))

    hidden = predicted(op_overhead_s=1e-12)  # dispatch far faster than the kernels: none of it shows
    assert hidden.compute_parts["per-op overhead"] == 0.0
    host, inline = predicted(op_overhead_s=1e-3), predicted(op_overhead_s=1e-3, queued_dispatch=False)
    device_s = host.compute_parts["matmul"] + host.compute_parts["memory traffic"]
    # the host is the bound: the step is its dispatch alone, where a CPU (inline) adds the kernels' time to it
    assert host.compute_s == pytest.approx(inline.compute_parts["per-op overhead"])
    assert inline.compute_s - host.compute_s == pytest.approx(device_s)
    assert any("only the dispatch that exceeds" in a for a in host.assumptions)


def test_every_rung_of_the_ladder_is_predicted_on_a_calibrated_gpu_at_the_run_configs_own_context():
    register(gpu_part("test-gpu", _figures("NVIDIA H100 80GB HBM3")))
    try:  # tf32 cannot run on this CPU, where the operators are counted: counted without it, not refused
        rungs = {"tf32": True, "bf16": True, "compile": True, "sdpa": True}
        p = predict(RunConfig(preset="tiny", batch_size=8, toggles=rungs, device="cpu"), "1xtest-gpu")
    finally:
        del PARTS["test-gpu"]
    assert p.seq_len == 64 and p.batch_size == 8 and p.step_s > 0  # tiny's context, not 1024
    assert p.compute_parts["per-op overhead"] > 0  # tiny's few small kernels: the host's dispatch is the bound


def test_calibrating_a_gpu_that_is_not_here_or_a_device_that_does_not_exist_is_refused():
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no CUDA GPU here"):
            calibrate(device="cuda")
    with pytest.raises(ConfigError, match="give 'cpu', 'cuda' or 'cuda:N'"):
        calibrate(device="tpu")
    if "this-gpu" not in PARTS:
        with pytest.raises(ConfigError, match=r"calibrate\(device='cuda'\)"):
            part("this-gpu")


@pytest.mark.gpu
def test_calibrate_on_a_gpu_measures_it_and_predict_takes_it_as_this_gpu():
    import torch

    p = calibrate(device="cuda", ranks=0, matmul_sizes=(256, 2048), copy_mbytes=256, repeats=3)
    try:
        eff, fig = p.efficiency, measured_figures("this-gpu")
        assert PARTS["this-gpu"] is p and fig.device_name == torch.cuda.get_device_name()
        assert set(eff.matmul_curves) == {"bf16", "fp32", "tf32"} and p.peak("bf16") > p.peak("fp32") > 0
        assert p.memory_bandwidth > 100e9 and 0 < eff.memory < 2 and 0 < eff.op_overhead_s < 1e-3
        sheet = datasheet_part(fig.device_name)
        if sheet is not None:  # the measured peak is a share of the datasheet's dense one, never far above it
            assert 0.2 < p.peak("bf16") / sheet.peak("bf16") < 1.1
        pred = predict(RunConfig(preset="small", toggles={"bf16": True}, device="cuda"), "1xthis-gpu")
        assert pred.step_s > 0 and any("bf16 curve" in a for a in pred.assumptions)
    finally:
        PARTS.pop("this-gpu", None)
