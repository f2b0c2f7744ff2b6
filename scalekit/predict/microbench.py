"""The microbenchmarks `scalekit.calibrate()` is made of: a timing helper (median over repeats, synchronised on a
GPU), matmul FLOP/s by size, copy and element-wise bandwidth, per-operator overhead, and the collectives' bus
bandwidth and latency over ranks started with scalekit.launch (and, in gloo's ranks, host_work.py's figures).  calibrate.py turns their figures into a part."""

from __future__ import annotations

import contextlib
import os
import statistics
import time

from .collectives import FACTORS

WINDOW_S = 0.05  # each timing spans at least this long: as long as a small step, so that a machine shared with other
# processes slows the microbenchmark as much as it slows the run (a 1 ms timing fits in one scheduler slice)

LATENCY_CALLS = 30  # single calls of the smallest message timed for α (their mean)
BATCH_FILL = 4096  # on a GPU, a size-n matmul is timed as (BATCH_FILL / n)³ of them at once (as much work as one
MAX_ELEMENTS = 2**28  # of BATCH_FILL), at most MAX_ELEMENTS elements per operand (1 GiB in fp32)


def _median_time(fn, repeats: int, window_s: float = WINDOW_S, clock=time.perf_counter, sync=None,
                 stat=statistics.median) -> float:
    """Seconds per call of `fn`: the median over `repeats` timings, each of as many calls as fill `window_s`, read
    on `clock` (wall time; time.thread_time counts only this thread's CPU time, what other processes take left out).
    `sync` (torch.cuda.synchronize on a GPU) runs before every clock reading: the device's queued work is done."""
    sync = sync or (lambda: None)
    fn()  # warm-up: a GPU's first call also loads its kernel and library handles
    sync()
    t0 = clock()
    fn()  # the length of one call
    sync()
    calls = max(1, int(window_s / max(clock() - t0, 1e-9)))
    times = []
    for _ in range(repeats):
        sync()
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        times.append((clock() - t0) / calls)
    return stat(times)


def _sync_for(device):
    """torch.cuda.synchronize for a CUDA device (what a timing on it must wait for), else None."""
    import torch

    device = torch.device(device)
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


@contextlib.contextmanager
def _matmul_precision(device, dtype: str):
    """fp32 matmuls as fp32 and 'tf32' as TF32 on a GPU (torch's allow_tf32), restored after."""
    import torch

    if torch.device(device).type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def matmul_batch(n: int, cuda: bool) -> int:
    """How many size-n matmuls one timing runs at once: 1 on a CPU (a matmul runs on its cores alone), on a GPU as
    many as fill it (BATCH_FILL), at most MAX_ELEMENTS elements per operand."""
    return max(1, min((BATCH_FILL // n) ** 3, MAX_ELEMENTS // (n * n))) if cuda else 1


def matmul_curve(sizes=(32, 64, 128, 256, 512), repeats: int = 5, clock=time.perf_counter, device="cpu",
                 dtype: str = "fp32") -> tuple[tuple[int, float], ...]:
    """(size, FLOP/s) of n×n×n matmuls in `dtype` ('fp32', 'tf32', 'bf16', 'fp16') on `device`."""
    import torch

    device = torch.device(device)
    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    out = []
    with _matmul_precision(device, dtype):
        for n in sizes:
            batch = matmul_batch(n, device.type == "cuda")
            shape = (batch, n, n) if batch > 1 else (n, n)
            a, b = (torch.randn(shape, device=device, dtype=torch_dtype) for _ in range(2))
            t = _median_time(lambda a=a, b=b: a @ b, repeats, clock=clock, sync=_sync_for(device))
            out.append((n, 2 * batch * n**3 / t))
            del a, b
    return tuple(out)


def copy_bandwidth(mbytes: int = 64, repeats: int = 5, clock=time.perf_counter, device="cpu") -> float:
    import torch

    src = torch.ones(mbytes * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    t = _median_time(lambda: dst.copy_(src), repeats, clock=clock, sync=_sync_for(device))
    return 2 * src.numel() * 4 / t  # read + write


def op_overhead(chain: int = 200, repeats: int = 5, clock=time.perf_counter, device="cpu") -> float:
    """Seconds per operator of a training-like chain of tiny operators: forward and backward through `chain`
    small element-wise steps with autograd on, divided by the operators dispatched (counted).  On a GPU each is a
    kernel launch too, and the kernels are too small to hide it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    w = torch.ones(8, requires_grad=True, device=device)

    def step():
        x = w
        for _ in range(chain):
            x = torch.tanh(x * 0.5 + 0.1)
        x.sum().backward()

    with Count():
        step()
    return _median_time(step, repeats, clock=clock, sync=_sync_for(device)) / Count.n


def _collective_rank(sizes, repeats, backend: str = "gloo") -> tuple[list, dict]:
    """((op, bytes, seconds) per collective and size, host_work.py's figures: gloo's ranks only) in one rank."""
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if backend == "nccl":  # one rank per GPU, as a run's ranks are placed
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    n = dist.get_world_size()
    # the names torch 2.13 keeps (the *_tensor ones warn that they are deprecated), where this torch has them
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    rows, host = [], {}
    try:
        for size in sizes:
            elements = max(n, size // 4 // n * n)
            full = torch.ones(elements, device=device)
            shard = torch.ones(elements // n, device=device)
            ops = {"all_reduce": lambda full=full: dist.all_reduce(full),
                   "all_gather": lambda full=full, shard=shard: gather(full, shard),
                   "reduce_scatter": lambda full=full, shard=shard: scatter(shard, full)}
            for op, fn in ops.items():
                dist.barrier()
                # every rank must make the same calls: one per timing.  The smallest message is the latency α: the
                # mean of LATENCY_CALLS single calls, what a step's calls add up to.  On this 2-core virtual machine
                # a small gloo call takes either about 0.2 ms or about 2 ms (a rank that waited idle wakes late),
                # in shares that vary from run to run: the median of 5 flipped between the two, the fastest kept
                # only the first, and a step's FSDP, tensor-parallel and pipeline calls meet both
                smallest = size == min(sizes)
                t = _median_time(fn, max(repeats, LATENCY_CALLS) if smallest else repeats, window_s=0.0,
                                 sync=_sync_for(device), stat=statistics.mean if smallest else statistics.median)
                rows.append((op, elements * 4, t))
        if backend == "gloo":  # the host runs the DTensor wrappers' work inline (a GPU's host: hidden, not measured)
            from .host_work import measure

            host = measure(repeats)
    finally:
        dist.destroy_process_group()
    return rows, host


def collective_bandwidth(ranks: int = 2, sizes=(2**12, 2**20, 2**23), repeats: int = 5,
                         backend: str = "gloo") -> dict:
    """{op: [(bytes, seconds, bus bandwidth bytes/s)]} over `ranks` ranks of `backend` ('gloo', or 'nccl': one rank
    per GPU); 'latency_s': the smallest message's all-reduce time over its 2(n−1) ring steps."""
    from ..launch import launch

    rows, host = launch(_collective_rank, list(sizes), repeats, backend, nprocs=ranks)[0]
    return {**bus_bandwidths(rows, ranks), **({"host_work": host} if host else {})}


def bus_bandwidths(rows, ranks: int) -> dict:
    """(op, bytes, seconds) rows as nccl-tests reports them: {op: [(bytes, seconds, bus bytes/s)], 'latency_s'}."""
    out: dict = {}
    for op, nbytes, t in rows:
        out.setdefault(op, []).append((nbytes, t, FACTORS[op](ranks) * nbytes / t))
    smallest = min(out["all_reduce"])
    out["latency_s"] = smallest[1] / (2 * (ranks - 1))
    return out


def elementwise_bandwidth(rows: int = 2048, width: int = 256, repeats: int = 5, clock=time.perf_counter,
                          device="cpu") -> float:
    """Bytes per second the element-wise operators of a transformer block achieve here (layer norm, tanh GELU,
    softmax, a scale and a residual add; forward and backward with autograd), counted as the cost model counts a
    model's (traffic.py: each operator's reads and writes in forward, 2× in backward).  On a GPU these run at
    the memory's bandwidth; on a CPU many are bound by their arithmetic (tanh, exp), so a copy overstates them."""
    import torch
    import torch.nn.functional as F

    from .traffic import BACKWARD_BYTES, _counter

    x = torch.randn(rows, width, requires_grad=True, device=device)

    def chain():
        h = F.layer_norm(x, (width,))
        h = F.gelu(h, approximate="tanh") * 0.5
        return (h.softmax(-1) + x).sum()

    count = _counter()
    with torch.no_grad(), count:
        chain()
    moved = (1 + BACKWARD_BYTES) * count.traffic.other_bytes
    t = _median_time(lambda: chain().backward(), repeats, clock=clock, sync=_sync_for(device))
    return moved / t
