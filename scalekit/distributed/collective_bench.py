"""What communication costs, measured inside ranks: the four collectives timed against message size, the α-β line
fitted through them, rings written from point-to-point sends (their bytes counted, their results held against
torch's own collectives), and the collectives a training step issues, recorded and replayed alone.

Sizes follow nccl-tests: S is the whole buffer (an all-reduce's tensor, an all-gather's output, a reduce-scatter's
input, an all-to-all's input on each rank).  On n ranks a ring sends, per rank,
  all-reduce      2(n−1)/n · S   (a reduce-scatter, then an all-gather)
  all-gather      (n−1)/n · S
  reduce-scatter  (n−1)/n · S
  all-to-all      (n−1)/n · S    (each rank keeps its own 1/n and sends the rest once)
and "bus bandwidth" is those bytes over the time: a link's figure, the same at any n when the ring holds
(nccl-tests, doc/PERFORMANCE.md).  scalekit.predict.collectives holds the same factors for the collectives a mode
issues; this module adds all-to-all.  Everything here runs inside a rank whose process group is up (started by
scalekit.launch from a cell); nothing here starts processes.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
RING_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


def bytes_sent_per_rank(op: str, nbytes: float, ranks: int) -> float:
    """Bytes each rank sends for one `op` of `nbytes` (S) over `ranks` ranks, as a ring (all-to-all: pairwise)."""
    return RING_FACTORS[op](ranks) * nbytes


# -- the α-β fit ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlphaBetaFit:
    """time = α + bytes / β through measured (bytes, seconds) points; `residuals` are each point's measured
    time over the line's, minus 1 (relative: the points span decades)."""

    op: str
    alpha_s: float  # the latency: seconds of a message of no bytes
    beta: float  # bytes of S per second (algorithm bandwidth); math.inf when the points show no slope
    points: tuple[tuple[float, float], ...]
    residuals: tuple[float, ...]

    def time_s(self, nbytes: float) -> float:
        return self.alpha_s + (nbytes / self.beta if math.isfinite(self.beta) else 0.0)

    def bus_bandwidth(self, ranks: int) -> float:
        """β times the ring's factor: the bytes each rank sends per second."""
        return RING_FACTORS[self.op](ranks) * self.beta if self.op in RING_FACTORS else self.beta

    @property
    def worst_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)


def fit_alpha_beta(points, op: str = "") -> AlphaBetaFit:
    """Least squares of time = α + bytes/β through `points` [(bytes, seconds), ...], each point's error taken
    relative to its time (a 4 MiB message's milliseconds do not drown a 1 KiB message's microseconds), with
    α ≥ 0 and β > 0 (a negative one is set to 0 or ∞ and the other refitted)."""
    pts = tuple((float(b), float(t)) for b, t in points)
    if len(pts) < 2 or any(t <= 0 for _, t in pts):
        raise ValueError(f"fit_alpha_beta needs at least two points with positive times, got {pts}")
    # rows (1/t, x/t) · (α, u) ≈ 1, u = 1/β: the relative error, a linear least squares in (α, u)
    a = [(1 / t, b / t) for b, t in pts]
    s11, s12, s22 = (sum(p * q for p, q in ((r[i], r[j]) for r in a)) for i, j in ((0, 0), (0, 1), (1, 1)))
    y1, y2 = sum(r[0] for r in a), sum(r[1] for r in a)
    det = s11 * s22 - s12 * s12
    alpha, u = ((s22 * y1 - s12 * y2) / det, (s11 * y2 - s12 * y1) / det) if det > 0 else (-1.0, -1.0)
    if alpha < 0 or u <= 0:  # the constrained optimum lies on an edge: try both, keep the better
        edges = [(0.0, y2 / s22), (y1 / s11, 0.0)]
        alpha, u = min(edges, key=lambda e: sum((1 - e[0] * p - e[1] * q) ** 2 for p, q in a))
    beta = 1 / u if u > 0 else math.inf
    fit = AlphaBetaFit(op, alpha, beta, pts, ())
    return AlphaBetaFit(op, alpha, beta, pts, tuple(t / fit.time_s(b) - 1 for b, t in pts))


# -- timing inside the ranks --------------------------------------------------------------------------------
def collective_call(op: str, nbytes: int, ranks: int):
    """(a function making one `op` of about `nbytes` fp32 bytes, the exact bytes S): buffers made once."""
    elements = max(ranks, nbytes // 4 // ranks * ranks)
    full, shard = torch.ones(elements), torch.ones(elements // ranks)
    calls = {"all_reduce": lambda: dist.all_reduce(full),
             "all_gather": lambda: dist.all_gather_single(full, shard),
             "reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
             "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full)}
    return calls[op], elements * 4


def time_collectives(sizes, repeats: int = 5, ops=OPS) -> list[dict]:
    """Each of `ops` at each of `sizes` (bytes), timed `repeats` times after one warm-up call, the ops in a
    rotating order so drift on a shared machine falls on all of them; a timing starts after a barrier and is
    the slowest rank's.  Rows {op, bytes, seconds (the median), best_s (the fastest: other processes can only
    slow a timing down, so on a shared machine it is the closest to the collective's own cost), all_s}, the same on
    every rank (call it on every rank, in a live process group)."""
    n = dist.get_world_size()
    mine: dict[tuple[str, int], list[float]] = {}
    for size in sizes:
        fns = {op: collective_call(op, size, n) for op in ops}
        for fn, _ in fns.values():
            fn()
        for k in range(repeats):
            for op in ops[k % len(ops):] + ops[:k % len(ops)]:
                fn, nbytes = fns[op]
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                mine.setdefault((op, nbytes), []).append(time.perf_counter() - t0)
    every: list = [None] * n
    dist.all_gather_object(every, mine)
    rows = []
    for (op, nbytes) in mine:
        slowest = [max(times) for times in zip(*(rank[(op, nbytes)] for rank in every), strict=True)]
        rows.append({"op": op, "bytes": nbytes, "seconds": statistics.median(slowest), "best_s": min(slowest),
                     "all_s": slowest})
    return rows


# -- rings from point-to-point sends ------------------------------------------------------------------------
@contextlib.contextmanager
def counting_sends():
    """Count the bytes this rank sends through dist.isend and dist.send inside the block: {'bytes', 'sends'}."""
    counted = {"bytes": 0, "sends": 0}
    originals = {name: getattr(dist, name) for name in ("isend", "send")}

    def wrap(fn):
        def counted_send(tensor, *args, **kwargs):
            counted["bytes"] += tensor.numel() * tensor.element_size()
            counted["sends"] += 1
            return fn(tensor, *args, **kwargs)
        return counted_send

    try:
        for name, fn in originals.items():
            setattr(dist, name, wrap(fn))
        yield counted
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _exchange(send: torch.Tensor, to: int, recv: torch.Tensor, frm: int) -> None:
    work = dist.isend(send.contiguous(), to)
    dist.recv(recv, frm)
    work.wait()


def ring_reduce_scatter(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """Sum `inp` over the ranks and keep this rank's 1/n of it in `out`: n−1 steps, each sending one chunk to the
    next rank and adding the chunk the previous one sent."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in inp.chunk(n)]
    incoming = torch.empty_like(chunks[0])
    for step in range(n - 1):  # at step s rank r passes on chunk r−s−1 and adds into chunk r−s−2
        _exchange(chunks[(r - step - 1) % n], (r + 1) % n, incoming, (r - 1) % n)
        chunks[(r - step - 2) % n] += incoming
    out.copy_(chunks[r])
    return out


def ring_all_gather(out: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """Every rank's `shard`, in rank order, in `out`: n−1 steps, each passing on the shard received last."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = list(out.chunk(n))
    chunks[r].copy_(shard)
    for step in range(n - 1):  # at step s rank r passes on shard r−s and receives shard r−s−1
        _exchange(chunks[(r - step) % n], (r + 1) % n, chunks[(r - step - 1) % n], (r - 1) % n)
    return out


def ring_all_reduce(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks, in place: a ring reduce-scatter, then a ring all-gather of the sums."""
    shard = torch.empty_like(t.chunk(dist.get_world_size())[0])
    ring_reduce_scatter(shard, t)
    return ring_all_gather(t, shard)


def pairwise_all_to_all(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """Chunk j of `inp` goes to rank j, which keeps it as its chunk r: n−1 steps, at step s sending to rank r+s
    and receiving from rank r−s."""
    n, r = dist.get_world_size(), dist.get_rank()
    ins, outs = inp.chunk(n), out.chunk(n)
    outs[r].copy_(ins[r])
    for step in range(1, n):
        _exchange(ins[(r + step) % n], (r + step) % n, outs[(r - step) % n], (r - step) % n)
    return out


# -- a training step's collectives ---------------------------------------------------------------------------
def _functional():
    import torch.distributed._functional_collectives as funcol  # DTensor's tensor parallelism calls its all_reduce

    return funcol


# the calls a training step makes, with the op they are and the argument holding S (as the tests that count
# predict's bytes wrap them): torch.distributed's (FSDP2 calls the *_single forms) and the functional all-reduce
WRAPPED = {"all_reduce": ("all_reduce", "tensor"), "all_gather_into_tensor": ("all_gather", "output_tensor"),
           "all_gather_single": ("all_gather", "output_tensor"), "reduce_scatter_tensor": ("reduce_scatter", "input"),
           "reduce_scatter_single": ("reduce_scatter", "input"), "all_to_all_single": ("all_to_all", "input"),
           "broadcast": ("broadcast", "tensor")}


@contextlib.contextmanager
def recording():
    """Record the collectives this rank calls inside the block, as [(op, bytes S), ...] (DDP's reducer calls the
    process group from C++: register torch's default `allreduce_hook` on the model to see its buckets here)."""
    calls: list[tuple[str, int]] = []
    depth = [0]  # a deprecated spelling calls the new one: count the outer call only
    targets = [(dist, name, kind) for name, kind in WRAPPED.items() if hasattr(dist, name)]
    targets.append((_functional(), "all_reduce", ("all_reduce", "self")))
    if hasattr(dist, "_broadcast_coalesced"):  # DDP's buffers each forward: (group, tensors, buffer size, source)
        targets.append((dist, "_broadcast_coalesced", ("broadcast", None)))
    originals = [(module, name, getattr(module, name)) for module, name, _ in targets]

    def wrap(fn, op, arg):
        signature = inspect.signature(fn) if arg else None

        def recorded(*args, **kwargs):
            if not depth[0]:
                tensors = [signature.bind_partial(*args, **kwargs).arguments[arg]] if arg else args[1]
                calls.append((op, sum(t.numel() * t.element_size() for t in tensors)))
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
        return recorded

    try:
        for (module, name, (op, arg)), (_, _, fn) in zip(targets, originals, strict=True):
            setattr(module, name, wrap(fn, op, arg))
        yield calls
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


def replay(calls, repeats: int = 5) -> float:
    """Seconds to make the recorded `calls` [(op, bytes), ...] again, back to back, alone (the median of
    `repeats`, the slowest rank's; call it on every rank with the same calls)."""
    n = dist.get_world_size()
    fns = [collective_call(op, nbytes, n)[0] if op in OPS else _broadcast(nbytes) for op, nbytes in calls]
    for fn in fns:
        fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for fn in fns:
            fn()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(took.item())
    return statistics.median(times)


def _broadcast(nbytes: int):
    t = torch.ones(max(1, nbytes // 4))
    return lambda: dist.broadcast(t, 0)


def by_op(calls) -> dict[str, int]:
    """The recorded calls' bytes S summed per op."""
    out: dict[str, int] = {}
    for op, nbytes in calls:
        out[op] = out.get(op, 0) + nbytes
    return out
