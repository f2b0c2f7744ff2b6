"""The cost model of one training step per GPU: a roofline for compute and memory traffic, the α-β collectives
each parallel mode issues (collectives.py), overlap rules stated as rules, and the pipeline bubble.

    compute_s  = Σ matmuls max(FLOPs / (peak × EFFICIENCY.matmul),          (each matmul on its own roofline)
                               bytes / (bandwidth × EFFICIENCY.memory))
                 + fused attention FLOPs / (peak × EFFICIENCY.attention)
                 + other ops' bytes / (bandwidth × EFFICIENCY.memory)       (everything else is memory-bound)
                 + ops × EFFICIENCY.op_overhead_s                           (where dispatch is not hidden)
                 + the DTensor wrappers' host work (host_work.py)             (where it is not hidden)
    step_s     = compute_s + Σ exposed communication + bubble

The roofline is taken per matmul and per class of the other operators, and the terms are added (they run one
after another).  A matmul's bytes are its inputs and its output at their dtypes (traffic.py counts them): a large
square matmul is bound by its FLOPs, attention's batched ones (QKᵀ and AV, K = the head size) by their bytes on a
GPU, whose ridge point (peak over bandwidth: 153 FLOP per byte for an A100 in bf16) is far above their arithmetic
intensity.  The element-wise, normalisation, softmax and optimizer kernels move bytes and do little arithmetic.  The efficiency factors are few, named and in one place
(`Efficiency`); each says where its value comes from.  `PUBLISHED` holds figures from public microbenchmarks for
the GPU parts; `scalekit.calibrate()` measures them on the machine in hand (the "this-cpu" part).  Nothing here is
tuned to the runs it is checked against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .collectives import ALGORITHMS, Collective, algorithm_times, link_for, nodes_spanned, tree_latency_steps

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # its first bucket (torch's dist._DEFAULT_FIRST_BUCKET_BYTES)


@dataclass(frozen=True)
class Efficiency:
    """The achievable fractions the model multiplies peaks by, and two fixed costs."""

    matmul: float  # of the dense peak, for the model's matmuls
    memory: float  # of the memory bandwidth, for a streaming copy
    link: float  # of a link's one-way bandwidth, for a large ring collective (nccl-tests' busbw / link)
    latency_s: float  # α: per ring step of a collective
    op_overhead_s: float  # per operator dispatched, where the host's dispatch is not hidden (a CPU runs it inline)
    matmul_curve: tuple[tuple[int, float], ...] = ()  # (size, FLOP/s) measured by calibrate(): read at the width
    attention: float = 0.0  # of the dense peak, for a fused attention kernel's FLOPs (0: as the matmuls)
    overlaps_communication: bool = True  # whether a rank computes while its collectives run (False on a CPU)
    algorithms: tuple[str, ...] = ALGORITHMS  # what an all-reduce may run as: NCCL's ring or tree; gloo's ring only
    sources: dict[str, str] = field(default_factory=dict)
    # a curve per compute dtype where calibrate() measured several (a GPU: fp32, tf32, bf16); matmul_curve otherwise
    matmul_curves: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    # the host queues kernels ahead of the device (a GPU): dispatch costs only what exceeds the kernels' time
    queued_dispatch: bool = False
    # the host work of the wrappers built on DTensor, where the host runs it inline (host_work.py; 0: hidden)
    fsdp_call_s: float = 0.0  # FSDP2's hooks per all-gather or reduce-scatter call
    fsdp_host_bandwidth: float = math.inf  # bytes/s of those calls' host work per byte gathered or reduced
    dtensor_param_s: float = 0.0  # AdamW's step per DTensor parameter, beyond a plain one's
    tp_linear_s: float = 0.0  # a tensor-parallel linear's forward and backward, beyond a plain one's
    tp_host_bandwidth: float = math.inf  # bytes/s of that work per byte of the linear's full-width activation

    def matmul_at(self, size: int, peak: float, dtype: str | None = None) -> float:
        """The achieved FLOP/s for the model's matmuls: the calibrated curve (`dtype`'s where one was measured) read
        at `size` (log-linear between measured sizes, the end values beyond them), else peak × matmul."""
        curve = self.matmul_curves.get(dtype) or self.matmul_curve
        if not curve:
            return peak * self.matmul
        pts = sorted(curve)
        if size <= pts[0][0]:
            return pts[0][1]
        for (s0, f0), (s1, f1) in zip(pts, pts[1:], strict=False):
            if size <= s1:
                w = math.log(size / s0) / math.log(s1 / s0)
                return f0 + w * (f1 - f0)
        return pts[-1][1]


PUBLISHED = Efficiency(
    matmul=0.80, memory=0.85, link=0.80, latency_s=10e-6, op_overhead_s=0.0, attention=0.35,
    sources={
        "matmul": "0.80: maximum achievable bf16 matmul FLOP/s over the dense peak, ml-engineering's MAMF table "
                  "(github.com/stas00/ml-engineering, compute/accelerator): H100 SXM 792.1/989 = 80.1%, A100 SXM "
                  "267.9/312 = 85.9%; the H100's figure is used for every GPU part",
        "attention": "0.35: FlashAttention-2 (what PyTorch's SDPA runs on these GPUs) reaches about 35% of the H100's "
                     "dense peak, forward and backward (Shah et al. 2024, FlashAttention-3, abstract); the FlashAttention-2 "
                     "paper (Dao 2023) reports 50-73% of the A100's for its forward pass and less for its backward; the "
                     "H100's figure is used for every GPU part",
        "memory": "0.85: a streaming copy's share of HBM peak bandwidth, as STREAM/BabelStream-style copy kernels "
                  "report on A100/H100 (typically 0.85-0.92); a round figure, not measured here",
        "link": "0.80: nccl-tests all-reduce bus bandwidth over the one-way NVLink figure for large messages "
                "(e.g. about 230-240 GB/s of 300 GB/s on DGX A100); a round figure",
        "latency_s": "10 µs per ring step: the order of NCCL's small-message time per hop",
        "algorithms": "NCCL runs an all-reduce as a ring or a tree, whichever its tuning model predicts faster "
                      "(src/graph/tuning.cc); the other collectives as rings",
        "op_overhead_s": "0: on a GPU kernels are queued asynchronously and the host's dispatch is taken as hidden "
                         "(wrong for small models in eager mode: the missing term there)",
    })


@dataclass(frozen=True)
class Layout:
    """How a step is spread: data-parallel ranks and their sharding, tensor-parallel degree, pipeline stages."""

    world: int
    dp: int
    tp: int = 1
    pp: int = 1
    sharding: str = "none"  # none, ddp, fsdp, zero1, zero2
    schedule: str | None = None  # gpipe, 1f1b
    micro_batches: int = 1  # pipeline micro-batches (or gradient accumulation's)
    dtype: str = "fp32"  # what the matmuls compute in: fp32, tf32, bf16, fp16
    checkpointing: object = None  # None, 'selective', or every k-th block (1: every block)
    flash_attention: bool = False  # SDPA's fused kernel: no T×T scores kept or moved
    cp: int = 1  # context parallel: each rank holds 1/cp of every sequence; K/V blocks travel around a ring

    @property
    def grad_ranks(self) -> int:
        """The ranks that hold the same weights and share their gradients: data parallel × context parallel (the
        context-parallel ranks of one sequence reduce and shard as data-parallel ones do, as torchtitan's mesh)."""
        return self.dp * self.cp

    @property
    def act_bytes(self) -> int:
        return 2 if self.dtype in ("bf16", "fp16") else 4


def bubble_fraction(stages: int, micro_batches: int, schedule: str | None) -> float:
    """GPipe and 1F1B idle (p−1)/(m+p−1) of a step with equal stages (Narayanan et al. 2021, section 2.2; the same
    formula as scalekit.models.pipeline.bubble)."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / (micro_batches + stages - 1)


def unit_bytes(shape, world: int, bytes_per: int, tp: int = 1, pp: int = 1) -> list[int]:
    """Bytes FSDP moves per unit (root first, then each block this rank's stage holds), parameters padded to the
    ranks as fully_shard pads them; a tensor-parallel rank holds 1/tp of each block."""
    from .shapes import padded_elements

    root = padded_elements(shape.root, world) * bytes_per
    block = padded_elements(shape.block, world) * bytes_per // tp
    return [root] + [block] * (shape.n_layer // pp)


def ddp_buckets(grad_bytes: int) -> int:
    """How many buckets DDP fills: a 1 MiB first bucket, then 25 MiB ones (parameters are never split)."""
    if grad_bytes <= DDP_FIRST_BUCKET_BYTES:
        return 1
    return 1 + math.ceil((grad_bytes - DDP_FIRST_BUCKET_BYTES) / DDP_BUCKET_BYTES)


def step_collectives(shape, lay: Layout, micro_batch_rows: int, seq: int) -> list[Collective]:
    """What one rank sends in one step, per kind, for the layout: the bytes are what the ranks' calls carry (the
    check in tests/distributed/test_predict_collective_bytes.py counts them)."""
    out = data_parallel_collectives(shape, lay)
    activation = micro_batch_rows * seq * shape.d * lay.act_bytes
    if lay.tp > 1:  # Megatron: attention's and the MLP's row-split outputs all-reduced forward; their inputs' grads back
        blocks = shape.n_layer // lay.pp
        out.append(Collective("activation all-reduce (tensor parallel, 2 per block forward, 2 backward)",
                              "all_reduce", 4 * blocks * activation * lay.micro_batches,
                              4 * blocks * lay.micro_batches, lay.tp, overlap_rule="TP_CRITICAL"))
    if lay.cp > 1:
        out.append(ring_attention_sends(shape, lay, micro_batch_rows, seq))
    if lay.pp > 1:
        # a stage sends its output forward and the gradient of its input backward, one micro-batch at a time: a middle
        # stage both, the first and the last one each (what each rank sends; it receives as much)
        sends = (2 if lay.pp > 2 else 1) * lay.micro_batches
        out.append(Collective("activations forward, their gradients backward (pipeline sends, per micro-batch)",
                              "send_recv", sends * activation, sends, 2, overlap_rule="P2P_EXPOSED"))
        if shape.head_tied:  # the embedding on the first stage and the head on the last: their gradients summed
            out.append(Collective("tied embedding and head gradients, first and last stage (pipeline)", "all_reduce",
                                  4 * shape.vocab * shape.d, 1, 2, overlap_rule="EXPOSED"))
        out.append(Collective("the loss broadcast from the last stage (pipeline)", "broadcast", 4, 1, lay.pp,
                              overlap_rule="EXPOSED"))
    return out


def data_parallel_collectives(shape, lay: Layout) -> list[Collective]:
    """What the ranks that share weights (data × context parallel) send: DDP's and ZeRO-1's gradient all-reduce and
    broadcasts, FSDP's and ZeRO-2's gathers and reduce-scatters."""
    out: list[Collective] = []
    trainable = shape.n_params // (lay.tp * lay.pp)
    grads = 4 * trainable  # gradients are fp32 (autocast keeps fp32 weights; FSDP reduces in fp32)
    param_bytes = lay.act_bytes if lay.sharding in ("fsdp", "zero2") and lay.act_bytes == 2 else 4
    forwards = lay.micro_batches
    if lay.grad_ranks > 1 and lay.sharding in ("ddp", "zero1"):
        out.append(Collective("gradient all-reduce (DDP buckets)", "all_reduce", grads, ddp_buckets(grads),
                              lay.grad_ranks, overlap_rule="DDP_OVERLAP"))
        if shape.buffer_bytes:
            out.append(Collective("buffers broadcast from rank 0 before each forward (DDP broadcast_buffers)",
                                  "broadcast", shape.buffer_bytes * forwards, forwards, lay.grad_ranks,
                                  overlap_rule="EXPOSED"))
        if lay.sharding == "zero1":
            # ZeroRedundancyOptimizer broadcasts each parameter from the rank that stepped it
            tensors = (len(shape.root) + shape.n_layer * len(shape.block)) // (lay.tp * lay.pp)
            out.append(Collective("updated weights from each rank's optimizer shard (ZeRO-1)", "broadcast",
                                  4 * trainable, tensors, lay.grad_ranks, overlap_rule="EXPOSED"))
    if lay.grad_ranks > 1 and lay.sharding in ("fsdp", "zero2"):
        gathered = unit_bytes(shape, lay.grad_ranks, param_bytes, lay.tp, lay.pp)
        out.append(Collective("weights all-gather in forward (FSDP, per unit)", "all_gather", sum(gathered) * forwards,
                              len(gathered) * forwards, lay.grad_ranks, overlap_rule="FSDP_PREFETCH"))
        if lay.sharding == "fsdp":  # ZeRO-3 frees each unit after forward: backward gathers every unit again
            out.append(Collective("weights all-gather in backward (FSDP, per unit)", "all_gather",
                                  sum(gathered) * forwards, len(gathered) * forwards, lay.grad_ranks,
                                  overlap_rule="FSDP_PREFETCH"))
        reduced = unit_bytes(shape, lay.grad_ranks, 4, lay.tp, lay.pp)
        out.append(Collective("gradient reduce-scatter (FSDP, per unit, fp32)", "reduce_scatter", sum(reduced),
                              len(reduced), lay.grad_ranks, overlap_rule="FSDP_PREFETCH"))
    return out


def ring_attention_sends(shape, lay: Layout, micro_batch_rows: int, seq: int) -> Collective:
    """Context parallel's ring: each rank passes its K/V shard cp−1 times forward; backward, K/V and their
    gradients."""
    kv = 2 * micro_batch_rows * (seq // lay.cp) * shape.n_kv_head * (shape.d // shape.n_head) * lay.act_bytes
    hops = (lay.cp - 1) * shape.n_layer // lay.pp * lay.micro_batches
    return Collective("K/V blocks around the ring (context parallel: forward K/V, backward K/V and their gradients)",
                      "send_recv", 3 * hops * kv // lay.tp, 3 * hops, lay.cp, overlap_rule="RING_OVERLAP")


OVERLAP_RULES = {
    "DDP_OVERLAP": "DDP all-reduces each bucket while the rest of backward runs: all but the last bucket hide behind "
                   "backward (2/3 of the compute); exposed = the last bucket + whatever of the rest exceeds backward",
    "FSDP_PREFETCH": "FSDP gathers the next unit during this one's compute and reduce-scatters gradients during "
                     "backward: exposed = the first unit's share + whatever of the rest exceeds the compute",
    "RING_OVERLAP": "ring attention sends the next K/V block while it computes on this one: exposed = whatever "
                    "of the ring's time exceeds the attention's compute",
    "TP_CRITICAL": "tensor-parallel all-reduces sit on the critical path: fully exposed (no async TP)",
    "P2P_EXPOSED": "pipeline sends and receives are counted as exposed (an upper bound: schedules overlap some)",
    "EXPOSED": "runs between compute phases: fully exposed",
    "NO_OVERLAP_HERE": "this part's ranks compute and communicate on the same cores: nothing overlaps",
}


def time_collectives(colls: list[Collective], cluster, eff: Efficiency, compute_s: float, lay: Layout,
                     attention_s: float = 0.0) -> None:
    """Fill each collective's time (α-β on its group's link: a ring, or for an all-reduce the faster of ring and tree
    where `eff.algorithms` has a tree) and its exposed share (its overlap rule); `attention_s`: the attention's share
    of the compute (what ring attention's sends hide behind)."""
    spans = {"all_reduce": 1, "all_gather": 1, "reduce_scatter": 1, "broadcast": 1}
    backward_s = compute_s * 2 / 3
    for c in colls:
        # data-parallel groups stride over tp (consecutive ranks split a block: torchtitan's layout)
        # (the gradient group, data × context parallel ranks, and the context-parallel ring both stride over tp)
        stride = lay.tp if c.overlap_rule in ("DDP_OVERLAP", "FSDP_PREFETCH", "RING_OVERLAP") or c.op == "broadcast" \
            else 1
        stride = stride if spans.get(c.op) or c.overlap_rule == "RING_OVERLAP" else 1
        c.link, bandwidth = link_for(cluster, c.ranks, stride)
        nodes = nodes_spanned(cluster, c.ranks, stride)
        times = algorithm_times(c.op, c.bytes, c.calls, c.ranks, nodes, bandwidth * eff.link, eff.latency_s,
                                eff.algorithms)
        c.algorithm = min(times, key=times.get)
        c.time_s = times[c.algorithm]
        c.algorithm_note = algorithm_note(c, times, nodes)
        rule = c.overlap_rule if eff.overlaps_communication else "NO_OVERLAP_HERE"
        per_call = c.time_s / max(1, c.calls)
        if rule == "DDP_OVERLAP":
            c.exposed_s = per_call + max(0.0, c.time_s - per_call - backward_s)
        elif rule == "FSDP_PREFETCH":
            hide = backward_s if c.op == "reduce_scatter" else compute_s / 3 if "forward" in c.name else backward_s
            c.exposed_s = per_call + max(0.0, c.time_s - per_call - hide)
        elif rule == "RING_OVERLAP":
            c.exposed_s = max(0.0, c.time_s - attention_s)
        else:
            c.exposed_s = c.time_s
        c.overlap_rule = rule


def algorithm_note(c: Collective, times: dict[str, float], nodes: int) -> str:
    """Why `c` runs as it does, where it had a choice: its time against the other algorithm's, and the latency
    steps per call behind them."""
    if len(times) < 2 or c.ranks <= 1:
        return ""
    other = next(a for a in times if a != c.algorithm)
    steps = {"ring": 2 * (c.ranks - 1), "tree": tree_latency_steps(c.ranks, nodes)}
    return (f"{c.algorithm}, {_figure(times[c.algorithm] * 1e3)} ms against the {other}'s "
            f"{_figure(times[other] * 1e3)} ms ({c.ranks} ranks over {nodes} node{'s' if nodes > 1 else ''}, "
            f"{_figure(c.bytes / max(1, c.calls) / 2**20)} MiB a call: {steps[c.algorithm]} latency steps a call "
            f"against {steps[other]})")


def _figure(x: float) -> str:
    """Three significant figures, without an exponent: 0.0123, 1.23, 1,234."""
    if x <= 0:
        return "0"
    return f"{x:,.{max(0, 2 - math.floor(math.log10(x)))}f}"


def collectives_assumption(eff: Efficiency) -> str:
    """The assumptions line for the collectives: the link, α, and which algorithm each collective runs as."""
    if "tree" in eff.algorithms:
        rule = ("an all-reduce as the faster of a ring (2(n−1)/n·S/B + 2(n−1)·α) and NCCL's tree (2·S/(0.92·B) + "
                "2(g−1 + ⌊log2 N⌋)·α: a chain through the g ranks in each node, a double binary tree over the N "
                "nodes; fewer latency steps, more bytes: it wins at small messages over many nodes, never inside "
                "one node) for the collective's mean call size, the other collectives as rings (NCCL has no tree "
                "for them)")
    else:
        rule = f"every collective as a ring ({eff.sources.get('algorithms', 'no tree on this part')})"
    return (f"collectives: α-β on the group's slowest link at {eff.link:.2f} of its bandwidth, α "
            f"{eff.latency_s * 1e6:.0f} µs ({eff.sources.get('link', '')}); {rule}")
