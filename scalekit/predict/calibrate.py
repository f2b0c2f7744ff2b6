"""`scalekit.calibrate()`: the efficiency factors of the machine in hand, measured by microbenchmarks (microbench.py),
and the part built from them: "this-cpu" (the default), or "this-gpu" with `device="cuda"`.

- matmul FLOP/s by size: the curve the cost model reads at a model's width, its best value taken as this part's
  peak.  On the CPU square fp32 matmuls (a CPU has no datasheet figure to hold it against); on a GPU bf16, fp32 and
  TF32 curves, each size timed as a batch of matmuls that fills the device (one small matmul alone would time its
  kernel launch, which the per-operator overhead counts apart), and the best held against the datasheet's dense
  peak where the GPU's name is a part of the table (`parts.datasheet_part`);
- copy bandwidth (a large tensor copied on the device: bytes read + written per second), and the share of it a
  transformer block's element-wise operators achieve (the memory factor: on a CPU tanh and exp make them slower
  than a copy);
- per-operator overhead (a chain of tiny element-wise operators, forward and backward with autograd, over the
  operators it dispatched: on a GPU the host's dispatch and kernel launch);
- all-reduce / all-gather / reduce-scatter bandwidth by message size over `ranks` ranks started with
  scalekit.launch (gloo on the CPU, NCCL with one rank per GPU, only where there are 2 GPUs or more), reported as
  nccl-tests does ("bus bandwidth": the ring's (n−1)/n factors applied), and the latency α from the smallest
  message.  They are measured first: a forked rank needs a parent that has not touched CUDA yet;
- in the same gloo ranks, the host work of the wrappers built on DTensor (host_work.py): FSDP2's per call and per
  byte, AdamW's step per DTensor parameter, a tensor-parallel linear's per call and per byte of its activation.
Each figure is the median of `repeats` timings (the smallest message's collectives: the mean of 30 single calls,
what a step's calls add up to where their time has two modes, as gloo's has here), on a GPU with torch.cuda.synchronize()
before each clock reading.
The default run takes a few seconds; sizes are arguments.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from ..errors import ConfigError
from . import host_work
from .collectives import ALGORITHMS
from .cost import PUBLISHED, Efficiency
from .microbench import (
    LATENCY_CALLS,
    collective_bandwidth,
    copy_bandwidth,
    elementwise_bandwidth,
    matmul_curve,
    op_overhead,
)
from .parts import GB, Part, datasheet_part, register

_MEASURED: dict[str, object] = {}


# an all-reduce on these ranks is always a ring: no tree for the cost model to choose
GLOO_ALGORITHMS = ("gloo's all-reduce is a ring: torch's gloo process group names no algorithm and gloo runs an "
                   "unspecified one as its ring (gloo/allreduce.cc)")

# the sizes each device is measured at unless told: a GPU's matmuls up to where its rate levels off, its copy far
# beyond its caches (50 MB of L2 on an H100), its messages up to where NCCL's bus bandwidth levels off
SIZES = {"cpu": dict(matmul_sizes=(32, 64, 128, 256, 512), copy_mbytes=64, message_sizes=(2**12, 2**20, 2**23)),
         "cuda": dict(matmul_sizes=(64, 128, 256, 512, 1024, 2048, 4096, 8192), copy_mbytes=1024,
                      message_sizes=(2**16, 2**20, 2**24, 2**27))}
GPU_DTYPES = ("bf16", "fp32", "tf32")  # the ladder's matmul dtypes; bf16 first: the part's default curve
@dataclass(frozen=True)
class Figures:
    """What calibrate() measured on one device, before it becomes a part (gpu_part / cpu_part)."""

    device_name: str
    memory_bytes: float  # the device's memory (a CPU: the machine's memory limit)
    curves: dict[str, tuple[tuple[int, float], ...]]  # dtype -> (size, FLOP/s)
    copy_bandwidth: float  # bytes/s, read + write
    elementwise_bandwidth: float  # bytes/s of a block's element-wise operators
    op_overhead_s: float
    copy_mbytes: int
    ranks: int  # the ranks the collectives ran on (0: none)
    collectives: dict = field(default_factory=dict)  # collective_bandwidth's result
    collectives_why: str = ""  # why none were measured


def calibrate(ranks: int = 2, matmul_sizes=None, copy_mbytes: int | None = None, message_sizes=None,
              repeats: int = 5, threads: int | None = None, clock=time.perf_counter, name: str | None = None,
              device: str = "cpu") -> Part:
    """Measure this machine and register it as the part 'this-cpu' (returned; its `efficiency` holds the factors),
    or with `device='cuda'` (or 'cuda:N') the GPU as 'this-gpu', which predict then takes as gpus='1xthis-gpu'.
    `ranks` ranks measure the collectives (gloo on the CPU; NCCL on a GPU, at most one per GPU, none with fewer
    than 2 GPUs; 0 or 1: none, the link taken as the copy bandwidth on the CPU and as the datasheet's on a GPU).
    Sizes left out are SIZES' for the device.  `threads` pins torch's intra-op threads while measuring (default:
    as they are).  `clock`: time.perf_counter (wall time, what a run's step time is), or time.thread_time to
    measure CPU time on a machine other processes share (the collectives stay on wall time); `name` the part it
    registers."""
    import torch

    kind = _device_kind(device)
    sizes = SIZES[kind]
    matmul_sizes, copy_mbytes = matmul_sizes or sizes["matmul_sizes"], copy_mbytes or sizes["copy_mbytes"]
    colls, why, ranks = _collectives(kind, ranks, message_sizes or sizes["message_sizes"], repeats)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        figures = _measure(device, kind, matmul_sizes, copy_mbytes, repeats, clock)
    finally:
        torch.set_num_threads(before)
    figures = dataclasses.replace(figures, ranks=ranks, collectives=colls, collectives_why=why)
    part = gpu_part(name or "this-gpu", figures) if kind == "cuda" else cpu_part(name or "this-cpu", figures)
    _MEASURED["collectives"] = colls
    _MEASURED[part.name] = figures
    return register(part)


def _device_kind(device) -> str:
    """'cpu' or 'cuda' for calibrate(device=...), asked without initialising CUDA (its ranks fork after)."""
    from ..machine.hardware import cuda_gpu_present

    kind = str(device).split(":")[0]
    if kind not in SIZES:
        raise ConfigError(f"calibrate(device={device!r}): give 'cpu', 'cuda' or 'cuda:N'")
    if kind == "cuda" and not cuda_gpu_present():
        import torch

        raise ConfigError(f"calibrate(device={device!r}): torch sees no CUDA GPU here (torch {torch.__version__}, "
                          f"{'CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'})")
    return kind


def _collectives(kind: str, ranks: int, sizes, repeats: int) -> tuple[dict, str, int]:
    """(the collectives measured, why none were, the ranks they ran on): gloo ranks on the CPU, NCCL ranks on
    the GPUs, one per GPU, where there are 2 or more."""
    from ..machine.hardware import gpu_count_without_cuda_init

    ranks = ranks or 0
    if kind == "cuda":
        gpus = gpu_count_without_cuda_init()
        if min(ranks, gpus) < 2:
            return {}, (f"not measured: NCCL's collectives need 2 GPUs, and {gpus} GPU{'s are' if gpus != 1 else ' is'}"
                        f" here" if gpus < 2 else f"not measured: calibrate(ranks={ranks})"), 0
        ranks = min(ranks, gpus)
        return collective_bandwidth(ranks, sizes, repeats, backend="nccl"), "", ranks
    if ranks < 2:
        return {}, f"not measured: calibrate(ranks={ranks})", 0
    return collective_bandwidth(ranks, sizes, repeats), "", ranks


def _measure(device, kind: str, matmul_sizes, copy_mbytes: int, repeats: int, clock) -> Figures:
    """Matmul curves, copy and element-wise bandwidth and the per-operator overhead on one device."""
    import torch

    from ..machine.hardware import detect
    from ..machine.memory_limit import machine_limit

    hw = detect(str(device) if kind == "cuda" else "cpu")
    dev = hw.device
    dtypes = GPU_DTYPES if kind == "cuda" else ("fp32",)
    curves = {dt: matmul_curve(matmul_sizes, repeats, clock, dev, dt) for dt in dtypes}
    ew = dict(rows=16384, width=1024) if kind == "cuda" else {}  # a GPU's kernels as large as a model's
    if kind == "cuda":
        memory = torch.cuda.get_device_properties(dev).total_memory
    else:
        limit = machine_limit(hw)
        memory = limit.limit_bytes if limit else 0
    return Figures(hw.device_name, memory, curves, copy_bandwidth(copy_mbytes, repeats, clock, dev),
                   elementwise_bandwidth(repeats=repeats, clock=clock, device=dev, **ew),
                   op_overhead(repeats=repeats, clock=clock, device=dev), copy_mbytes, 0)


def cpu_part(name: str, fig: Figures) -> Part:
    """The CPU's part from its figures: the fp32 curve's best as its peak, the link the gloo collectives' best bus
    bandwidth (the copy bandwidth where none ran), nothing overlapping."""
    curve, colls, bandwidth = fig.curves["fp32"], fig.collectives, fig.copy_bandwidth
    best = max(f for _, f in curve)
    link = max((bw for op in ("all_reduce", "all_gather", "reduce_scatter") for _, _, bw in colls.get(op, [])),
               default=bandwidth)
    latency = colls.get("latency_s", 0.0)
    host = colls.get("host_work", {})
    eff = Efficiency(matmul=1.0, memory=fig.elementwise_bandwidth / bandwidth, link=1.0, latency_s=latency,
                     op_overhead_s=fig.op_overhead_s, matmul_curve=curve, overlaps_communication=False,
                     algorithms=("ring",), **host, sources={
                         **host_work.sources(host, fig.ranks),
                         "matmul": "calibrate(): fp32 square matmuls on this CPU, " + _curve_text(curve),
                         **_memory_sources(fig, "this CPU"),
                         "link": f"calibrate(): best bus bandwidth of gloo collectives over {fig.ranks} ranks, "
                                 f"{link / GB:.2f} GB/s",
                         "latency_s": f"calibrate(): the smallest all-reduce (the mean of {LATENCY_CALLS} single "
                                      f"calls) per ring step, {latency * 1e6:.0f} µs",
                         "algorithms": GLOO_ALGORITHMS})
    return Part(name, {"fp32": best}, fig.memory_bytes, bandwidth, "loopback (gloo, shared memory)", link,
                "none (one machine)", link,
                {"flops": "calibrate(): the best fp32 matmul FLOP/s measured (a CPU has no dense-peak datasheet "
                          "figure here; MFU is against this)", "memory": "calibrate(): copy bandwidth and the "
                          "machine's memory limit"}, eff)


def _curve_text(curve) -> str:
    return ", ".join(f"{n}: {f / 1e9:,.1f} GFLOP/s" for n, f in curve)


def _memory_sources(fig: Figures, where: str) -> dict[str, str]:
    """The memory factor's and the per-operator overhead's sources, as any device measures them."""
    share = fig.elementwise_bandwidth / fig.copy_bandwidth
    return {"memory": f"calibrate(): a transformer block's element-wise operators (layer norm, tanh GELU, softmax, "
                      f"scale, add; forward and backward), {fig.elementwise_bandwidth / GB:.1f} GB/s of operator "
                      f"traffic against a {fig.copy_mbytes} MiB copy's {fig.copy_bandwidth / GB:.1f} GB/s read+write "
                      f"on {where}: {share:.2f} of it",
            "op_overhead_s": f"calibrate(): a chain of tiny operators with autograd, forward and backward, "
                             f"{fig.op_overhead_s * 1e6:.1f} µs per operator dispatched on {where}"}


def gpu_part(name: str, fig: Figures) -> Part:
    """The GPU's part from its figures: each dtype's best matmul rate as its peak (fp16 taken as bf16's where not
    measured), its copy bandwidth, its links as NCCL measured them, or where fewer than 2 GPUs ran them the
    datasheet part's at PUBLISHED's factors (none where the GPU's name is no part of the table)."""
    sheet = datasheet_part(fig.device_name)
    peaks = {dt: max(f for _, f in c) for dt, c in fig.curves.items()}
    if "bf16" in peaks:
        peaks.setdefault("fp16", peaks["bf16"])
    eff_links, links, link_sources = _gpu_links(fig, sheet)
    curve = fig.curves.get("bf16") or next(iter(fig.curves.values()))
    eff = Efficiency(matmul=1.0, memory=fig.elementwise_bandwidth / fig.copy_bandwidth, op_overhead_s=fig.op_overhead_s,
                     matmul_curve=curve, matmul_curves=dict(fig.curves), overlaps_communication=True,
                     queued_dispatch=True, **eff_links, sources={
                         "matmul": f"calibrate(): matmuls on {fig.device_name}, each size a batch that fills it; "
                                   + "; ".join(f"{dt} {_curve_text(c)}" for dt, c in fig.curves.items()),
                         **_memory_sources(fig, fig.device_name), **link_sources})
    return Part(name, peaks, fig.memory_bytes, fig.copy_bandwidth, *links,
                {"flops": peak_words(fig.device_name, {dt: peaks[dt] for dt in fig.curves}, sheet)
                          + ("; fp16 taken as bf16's (not measured)" if "fp16" not in fig.curves else ""),
                 "memory": f"calibrate(): {fig.device_name}'s memory and its copy bandwidth", **link_sources}, eff)


def _gpu_links(fig: Figures, sheet: Part | None) -> tuple[dict, tuple, dict]:
    """(Efficiency's link fields, the part's four link fields, their sources) for a calibrated GPU."""
    colls = fig.collectives
    if colls:
        best = max(bw for op in ("all_reduce", "all_gather", "reduce_scatter") for _, _, bw in colls[op])
        latency = colls["latency_s"]
        measured = f"calibrate(): best NCCL bus bandwidth over {fig.ranks} GPUs, {best / GB:.1f} GB/s"
        inter = (sheet.inter_link, sheet.inter_bandwidth * PUBLISHED.link) if sheet else ("not measured", 0.0)
        return (dict(link=1.0, latency_s=latency, algorithms=ALGORITHMS),
                (f"measured (NCCL over {fig.ranks} GPUs)", best, *inter),
                {"link": measured, "intra": measured,
                 "latency_s": f"calibrate(): the smallest NCCL all-reduce per ring step, {latency * 1e6:.1f} µs",
                 "inter": _sheet_link_words(sheet, "inter", "across nodes"),
                 "algorithms": PUBLISHED.sources["algorithms"]})
    words = f"{fig.collectives_why}; " + _sheet_link_words(sheet, "intra", "between GPUs")
    links = (sheet.intra_link, sheet.intra_bandwidth * PUBLISHED.link, sheet.inter_link,
             sheet.inter_bandwidth * PUBLISHED.link) if sheet else ("not measured", 0.0, "not measured", 0.0)
    return (dict(link=1.0, latency_s=PUBLISHED.latency_s, algorithms=ALGORITHMS), links,
            {"link": words, "intra": words, "inter": _sheet_link_words(sheet, "inter", "across nodes"),
             "latency_s": f"{fig.collectives_why}; PUBLISHED's: {PUBLISHED.sources['latency_s']}",
             "algorithms": PUBLISHED.sources["algorithms"]})


def _sheet_link_words(sheet: Part | None, which: str, where: str) -> str:
    if sheet is None:
        return f"no link {where}: calibrate() did not measure it and this GPU's name is no part of the table"
    return (f"the datasheet part {sheet.name}'s ({sheet.sources.get(which, '')}) at PUBLISHED's {PUBLISHED.link:.2f} "
            f"of it, not measured here")


def peak_words(device_name: str, peaks: dict[str, float], sheet: Part | None) -> str:
    """The calibrated peaks, and their share of the datasheet's dense peaks where the GPU is a part of the table."""
    measured = ", ".join(f"{dt} {f / 1e12:,.1f}" for dt, f in peaks.items())
    if sheet is None:
        return (f"calibrate(): the best matmul TFLOP/s measured on {device_name} ({measured}); its name is no part "
                f"of the table, so no datasheet peak to hold them against")
    shares = ", ".join(f"{dt} {f / sheet.peak_flops[dt]:.2f}" for dt, f in peaks.items() if dt in sheet.peak_flops)
    return (f"calibrate(): the best matmul TFLOP/s measured on {device_name} ({measured}); of {sheet.name}'s dense "
            f"datasheet peaks: {shares} (MFU is against the measured peaks)")


def this_cpu() -> Part:
    """The calibrated 'this-cpu' part, measured now if calibrate() has not run in this process."""
    from .parts import PARTS

    return PARTS["this-cpu"] if "this-cpu" in PARTS else calibrate()


def measured_collectives() -> dict:
    return dict(_MEASURED.get("collectives", {}))


def measured_figures(name: str) -> Figures | None:
    """What calibrate() measured for the part `name` in this process (None: it has not run)."""
    fig = _MEASURED.get(name)
    return fig if isinstance(fig, Figures) else None


__all__ = ["calibrate", "this_cpu", "matmul_curve", "copy_bandwidth", "op_overhead", "collective_bandwidth",
           "Figures", "cpu_part", "gpu_part", "measured_figures"]
