"""`scalekit.calibrate()`: the efficiency factors of the machine in hand, measured by microbenchmarks, and the
"this-cpu" part built from them.

- matmul FLOP/s by size (square fp32 matmuls): the curve the cost model reads at a model's width, its best
  value taken as this part's "peak" (a CPU has no datasheet figure to hold it against);
- copy bandwidth (a large tensor copied: bytes read + written per second), and the share of it a transformer
  block's element-wise operators achieve (the memory factor: on a CPU tanh and exp make them slower than a copy);
- per-operator overhead (a chain of tiny element-wise operators, forward and backward with autograd, over the
  operators it dispatched);
- all-reduce / all-gather / reduce-scatter bandwidth by message size over `ranks` gloo ranks started with
  scalekit.launch, reported as nccl-tests does ("bus bandwidth": the ring's (n−1)/n factors applied), and the
  latency α from the smallest message.
Each figure is the median of `repeats` timings.  The default run takes a few seconds; sizes are arguments.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from .collectives import FACTORS
from .cost import Efficiency
from .parts import GB, Part, register

_MEASURED: dict[str, object] = {}


# an all-reduce on these ranks is always a ring: no tree for the cost model to choose
GLOO_ALGORITHMS = ("gloo's all-reduce is a ring: torch's gloo process group names no algorithm and gloo runs an "
                   "unspecified one as its ring (gloo/allreduce.cc)")

WINDOW_S = 0.05  # each timing spans at least this long: as long as a small step, so that a machine shared with other
# processes slows the microbenchmark as much as it slows the run (a 1 ms timing fits in one scheduler slice)


def _median_time(fn, repeats: int, window_s: float = WINDOW_S, clock=time.perf_counter) -> float:
    """Seconds per call of `fn`: the median over `repeats` timings, each of as many calls as fill `window_s`, read
    on `clock` (wall time; time.thread_time counts only this thread's CPU time, what other processes take left out)."""
    t0 = clock()
    fn()  # warm-up, and the length of one call
    calls = max(1, int(window_s / max(clock() - t0, 1e-9)))
    times = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - t0) / calls)
    return statistics.median(times)


def matmul_curve(sizes=(32, 64, 128, 256, 512), repeats: int = 5, clock=time.perf_counter) -> tuple[tuple[int, float], ...]:
    import torch

    out = []
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        t = _median_time(lambda a=a, b=b: a @ b, repeats, clock=clock)
        out.append((n, 2 * n**3 / t))
    return tuple(out)


def copy_bandwidth(mbytes: int = 64, repeats: int = 5, clock=time.perf_counter) -> float:
    import torch

    src = torch.ones(mbytes * 2**20 // 4)
    dst = torch.empty_like(src)
    t = _median_time(lambda: dst.copy_(src), repeats, clock=clock)
    return 2 * src.numel() * 4 / t  # read + write


def op_overhead(chain: int = 200, repeats: int = 5, clock=time.perf_counter) -> float:
    """Seconds per operator of a training-like chain of tiny operators: forward and backward through `chain`
    small element-wise steps with autograd on, divided by the operators dispatched (counted)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    w = torch.ones(8, requires_grad=True)

    def step():
        x = w
        for _ in range(chain):
            x = torch.tanh(x * 0.5 + 0.1)
        x.sum().backward()

    with Count():
        step()
    return _median_time(step, repeats, clock=clock) / Count.n


def _collective_rank(sizes, repeats):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    n = dist.get_world_size()
    rows = []
    try:
        for size in sizes:
            elements = max(n, size // 4 // n * n)
            full = torch.ones(elements)
            shard = torch.ones(elements // n)
            ops = {"all_reduce": lambda full=full: dist.all_reduce(full),
                   "all_gather": lambda full=full, shard=shard: dist.all_gather_into_tensor(full, shard),
                   "reduce_scatter": lambda full=full, shard=shard: dist.reduce_scatter_tensor(shard, full)}
            for op, fn in ops.items():
                dist.barrier()
                t = _median_time(fn, repeats, window_s=0.0)  # every rank must make the same calls
                rows.append((op, elements * 4, t))
    finally:
        dist.destroy_process_group()
    return rows


def collective_bandwidth(ranks: int = 2, sizes=(2**12, 2**20, 2**23), repeats: int = 5) -> dict:
    """{op: [(bytes, seconds, bus bandwidth bytes/s)]} over `ranks` gloo ranks; 'latency_s': the smallest
    message's all-reduce time over its 2(n−1) ring steps."""
    from ..launch import launch

    rows = launch(_collective_rank, list(sizes), repeats, nprocs=ranks)[0]
    out: dict = {}
    for op, nbytes, t in rows:
        out.setdefault(op, []).append((nbytes, t, FACTORS[op](ranks) * nbytes / t))
    smallest = min(out["all_reduce"])
    out["latency_s"] = smallest[1] / (2 * (ranks - 1))
    return out


def elementwise_bandwidth(rows: int = 2048, width: int = 256, repeats: int = 5, clock=time.perf_counter) -> float:
    """Bytes per second the element-wise operators of a transformer block achieve here (layer norm, tanh GELU,
    softmax, a scale and a residual add; forward and backward with autograd), counted as the cost model counts a
    model's (traffic.py: each operator's reads and writes in forward, 2× in backward).  On a GPU these run at
    the memory's bandwidth; on a CPU many are bound by their arithmetic (tanh, exp), so a copy overstates them."""
    import torch
    import torch.nn.functional as F

    from .traffic import BACKWARD_BYTES, _counter

    x = torch.randn(rows, width, requires_grad=True)

    def chain():
        h = F.layer_norm(x, (width,))
        h = F.gelu(h, approximate="tanh") * 0.5
        return (h.softmax(-1) + x).sum()

    count = _counter()
    with torch.no_grad(), count:
        chain()
    moved = (1 + BACKWARD_BYTES) * count.traffic.other_bytes
    t = _median_time(lambda: chain().backward(), repeats, clock=clock)
    return moved / t


def calibrate(ranks: int = 2, matmul_sizes=(32, 64, 128, 256, 512), copy_mbytes: int = 64,
              message_sizes=(2**12, 2**20, 2**23), repeats: int = 5, threads: int | None = None,
              clock=time.perf_counter, name: str = "this-cpu") -> Part:
    """Measure this machine and register it as the part 'this-cpu' (returned; its `efficiency` holds the factors).
    `ranks` gloo ranks measure the collectives (0 or 1: none, the link taken as the copy bandwidth).  `threads`
    pins torch's intra-op threads while measuring (default: as they are).  `clock`: time.perf_counter (wall
    time, what a run's step time is), or time.thread_time to measure CPU time on a machine other processes share
    (the collectives stay on wall time); `name` the part it registers."""
    import torch

    from ..machine.hardware import detect
    from ..machine.memory_limit import machine_limit

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        curve = matmul_curve(matmul_sizes, repeats, clock)
        bandwidth = copy_bandwidth(copy_mbytes, repeats, clock)
        elementwise = elementwise_bandwidth(repeats=repeats, clock=clock)
        overhead = op_overhead(repeats=repeats, clock=clock)
    finally:
        torch.set_num_threads(before)
    colls = collective_bandwidth(ranks, message_sizes, repeats) if ranks and ranks > 1 else {}
    best = max(f for _, f in curve)
    link = max((bw for op in ("all_reduce", "all_gather", "reduce_scatter") for _, _, bw in colls.get(op, [])),
               default=bandwidth)
    latency = colls.get("latency_s", 0.0)
    eff = Efficiency(matmul=1.0, memory=elementwise / bandwidth, link=1.0, latency_s=latency, op_overhead_s=overhead,
                     matmul_curve=curve, overlaps_communication=False, algorithms=("ring",), sources={
                         "matmul": "calibrate(): fp32 square matmuls on this CPU, "
                                   + ", ".join(f"{n}: {f / 1e9:.1f} GFLOP/s" for n, f in curve),
                         "memory": f"calibrate(): a transformer block's element-wise operators (layer norm, tanh "
                                   f"GELU, softmax, scale, add; forward and backward), {elementwise / GB:.1f} GB/s "
                                   f"of operator traffic against a {copy_mbytes} MiB copy's {bandwidth / GB:.1f} "
                                   f"GB/s read+write: {elementwise / bandwidth:.2f} of it",
                         "link": f"calibrate(): best bus bandwidth of gloo collectives over {ranks} ranks, "
                                 f"{link / GB:.2f} GB/s",
                         "latency_s": f"calibrate(): the smallest all-reduce per ring step, {latency * 1e6:.0f} µs",
                         "algorithms": GLOO_ALGORITHMS,
                         "op_overhead_s": f"calibrate(): a chain of tiny operators with autograd, forward and backward, {overhead * 1e6:.1f} µs per operator dispatched"})
    limit = machine_limit(detect("cpu"))
    memory = limit.limit_bytes if limit else 0
    part = Part(name, {"fp32": best}, memory, bandwidth, "loopback (gloo, shared memory)", link,
                "none (one machine)", link,
                {"flops": "calibrate(): the best fp32 matmul FLOP/s measured (a CPU has no dense-peak datasheet "
                          "figure here; MFU is against this)", "memory": "calibrate(): copy bandwidth and the "
                          "machine's memory limit"}, eff)
    _MEASURED["collectives"] = colls
    return register(part)


def this_cpu() -> Part:
    """The calibrated 'this-cpu' part, measured now if calibrate() has not run in this process."""
    from .parts import PARTS

    return PARTS["this-cpu"] if "this-cpu" in PARTS else calibrate()


def measured_collectives() -> dict:
    return dict(_MEASURED.get("collectives", {}))


__all__ = ["calibrate", "this_cpu", "matmul_curve", "copy_bandwidth", "op_overhead", "collective_bandwidth",
           "dataclasses"]
