"""Collectives: what each parallel mode sends in one training step, and how long a ring, or for an all-reduce NCCL's
tree, takes to send it.

α-β model, n ranks, S bytes (the whole buffer: an all-reduce's tensor, an all-gather's output, a
reduce-scatter's input, as nccl-tests counts "size"), link bandwidth B one way, latency α per step.

Ring, every collective:
  all-reduce      2(n−1)/n · S/B + 2(n−1)·α     (reduce-scatter then all-gather)
  all-gather      (n−1)/n · S/B + (n−1)·α
  reduce-scatter  (n−1)/n · S/B + (n−1)·α
  broadcast       S/B + (n−1)·α  (pipelined ring: each rank forwards S once)
  send/recv       S/B + α
Tree, all-reduce only, the group spread over N nodes with g = n/N of its ranks in each:
  all-reduce      2 · S/(0.92·B) + 2(g−1 + ⌊log2 N⌋)·α
Inside a node NCCL's "tree" is a chain through the node's g GPUs; across nodes it is a double binary tree over the N
nodes.  The sum is reduced up the chain and the tree, then broadcast back down: each rank sends about 2S (a chain
link S up and S down; in the double binary tree each tree carries half of S, and a rank is an inner node of one,
sending its half up and to two children, and a leaf of the other, sending that half up), and NCCL's model runs a
tree's links at 0.92 of a ring's: the bandwidth term is 2 · S/(0.92·B), more than the ring's 2(n−1)/n · S/B.  The
latency steps are up and back down: g−1 hops of the chain and ⌊log2 N⌋ levels of the tree each way, against the
ring's 2(n−1).  So the tree wins where latency dominates: small messages over many nodes (512 GPUs in 64 nodes of 8:
26 steps against the ring's 1,022), and the ring where bandwidth does: large messages over few nodes.  Inside one
node (N = 1) the chain has as many steps as the ring and sends more, so the ring always wins there.

An all-reduce takes the faster of the two (`algorithm_times`; compared on a collective's summed calls, which is
the comparison at its mean call size), as NCCL picks by its model's time per call.  All-gather, reduce-scatter and
broadcast stay rings: NCCL has no tree for them.  A part whose efficiency lists only "ring" (`Efficiency.algorithms`:
calibrate()'s gloo ranks, whose all-reduce is a ring) prices every all-reduce as a ring, so the bytes and times
predicted on this machine are the ring's that its ranks send.
nccl-tests' "bus bandwidth" uses the ring's (n−1)/n factors, so a published busbw plugs in as B × link efficiency.
The link is the group's slowest: NVLink (or PCIe) when every rank of the group sits in one node, the NIC per GPU
when the group spans nodes (a ring or tree across nodes runs at its slowest hop).

Where each figure comes from:
- the ring's factors: nccl-tests doc/PERFORMANCE.md (busbw = algbw × 2(n−1)/n for all-reduce, × (n−1)/n for
  all-gather and reduce-scatter, × 1 for broadcast);
- the tree's factor and steps: NCCL's tuning model, src/graph/tuning.cc (ncclTopoTuneModel, NCCL 2.20): a tree's
  algorithm bandwidth is half its bus bandwidth (a ring's is n/(2(n−1)) of it) and that bus bandwidth 0.92 of the
  link's (`busBw*.92`); its latency 2·((nRanks/nNodes − 1)·intra-node latency + log2i(nNodes)·network latency)
  against the ring's 2(n−1) steps; the all-reduce is the only collective it prices as a tree (broadcast and reduce:
  ring only; all-gather and reduce-scatter: ring, NVLS or CollNet, which this model does not have).  Each
  algorithm's time is latency + bytes/bandwidth (ncclTopoGetAlgoTime) and NCCL runs the least (a maintainer's
  answer in github.com/NVIDIA/nccl-tests/issues/215: "an internal model which compares the performance");
- the chain inside a node: NCCL's maintainer in github.com/NVIDIA/nccl/issues/672 ("the tree structure is only
  inter-node. Intra-node it's always a chain") and issues/919 (a chain keeps full bandwidth: a GPU receiving from
  two peers runs at half speed); the double binary tree: src/graph/trees.cc (ncclGetDtree), NCCL 2.4 on;
- gloo: torch's ProcessGroupGloo calls gloo::allreduce without naming an algorithm, and gloo/allreduce.cc runs an
  unspecified one as its ring.
Left out: NCCL's per-size correction table for trees and its cap on a tree channel's bandwidth, its protocols (LL,
LL128, Simple), and separate latencies inside and across nodes (one α for every step, for the tree as for the ring).
"""

from __future__ import annotations

from dataclasses import dataclass

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}
LATENCY_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
                 "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: n - 1, "send_recv": lambda n: 1}
TREE_FACTOR = 2.0  # bytes a rank sends per byte of S in a tree all-reduce: reduced up, broadcast back down
TREE_LINK_SHARE = 0.92  # of the link a tree's transfers reach against a ring's (NCCL's tuning model: busBw*.92)
ALGORITHMS = ("ring", "tree")  # what NCCL may run an all-reduce as (the other collectives: ring only)


@dataclass
class Collective:
    """One kind of collective a rank issues in a step: `calls` of them, `bytes` in all (S summed over the calls),
    over `ranks` ranks, on `link`; `time_s` as the α-β model of its `algorithm` says (for an all-reduce the faster
    of ring and tree, `algorithm_note` saying by how much), `exposed_s` what the overlap rule leaves on the step's
    critical path."""

    name: str  # what it is for: "gradient all-reduce (DDP buckets)"
    op: str  # all_reduce, all_gather, reduce_scatter, broadcast, send_recv
    bytes: int
    calls: int
    ranks: int
    link: str = ""
    algorithm: str = "ring"
    time_s: float = 0.0
    exposed_s: float = 0.0
    overlap_rule: str = ""
    algorithm_note: str = ""  # why this algorithm: its time against the other's (empty where only a ring exists)

    def wire_bytes(self) -> float:
        """Bytes each rank sends on the link: S times the ring's factor, or the tree's 2 where it runs as a tree."""
        if self.algorithm == "tree":
            return self.bytes * TREE_FACTOR
        return self.bytes * FACTORS[self.op](self.ranks)


def ring_time(op: str, nbytes: float, calls: int, ranks: int, bandwidth: float, latency_s: float) -> float:
    """Seconds for `calls` collectives of `op` moving `nbytes` in all over `ranks` ranks on a link of `bandwidth`
    bytes/s one way (already times the link efficiency)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return FACTORS[op](ranks) * nbytes / bandwidth + calls * LATENCY_STEPS[op](ranks) * latency_s


def tree_latency_steps(ranks: int, nodes: int) -> int:
    """2(g−1 + ⌊log2 N⌋): up and back down the chain of the g = ranks/nodes ranks in each node and the double binary
    tree over the N nodes (⌊log2⌋ as NCCL's model counts its depth)."""
    nodes = max(1, nodes)
    per_node = max(1, ranks // nodes)
    return 2 * ((per_node - 1) + (nodes.bit_length() - 1))


def tree_time(nbytes: float, calls: int, ranks: int, nodes: int, bandwidth: float, latency_s: float) -> float:
    """Seconds for `calls` all-reduces moving `nbytes` in all over `ranks` ranks spread over `nodes` nodes, as NCCL's
    tree (a chain in each node, a double binary tree across): 2·S/(0.92·B) + calls · 2(g−1 + ⌊log2 N⌋)·α."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return TREE_FACTOR * nbytes / (TREE_LINK_SHARE * bandwidth) + calls * tree_latency_steps(ranks, nodes) * latency_s


def algorithm_times(op: str, nbytes: float, calls: int, ranks: int, nodes: int, bandwidth: float, latency_s: float,
                    algorithms=ALGORITHMS) -> dict[str, float]:
    """The time of each algorithm `op` can run as, ring first: a tree only for an all-reduce and only where
    `algorithms` has one.  The fastest is `min(times, key=times.get)` (the ring where they tie)."""
    times = {"ring": ring_time(op, nbytes, calls, ranks, bandwidth, latency_s)}
    if op == "all_reduce" and "tree" in algorithms:
        times["tree"] = tree_time(nbytes, calls, ranks, nodes, bandwidth, latency_s)
    return times


def nodes_spanned(cluster, group_ranks: int, stride: int = 1) -> int:
    """How many nodes a group of `group_ranks` ranks `stride` apart spans (one when it fits in a node, as link_for
    says; at most one node per rank)."""
    return max(1, min(group_ranks, -(-group_ranks * stride // cluster.per_node)))


def link_for(cluster, group_ranks: int, stride: int = 1) -> tuple[str, float]:
    """(link words, bandwidth one way) of a group of `group_ranks` ranks `stride` apart: inside one node it is the
    part's intra-node link, across nodes the NIC per GPU."""
    part = cluster.part
    if group_ranks * stride <= cluster.per_node:
        return part.intra_link, part.intra_bandwidth
    return part.inter_link, part.inter_bandwidth
