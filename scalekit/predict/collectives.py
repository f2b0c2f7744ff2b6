"""Collectives: what each parallel mode sends in one training step, and how long a ring takes to send it.

α-β model, ring algorithm, n ranks, S bytes (the whole buffer: an all-reduce's tensor, an all-gather's output, a
reduce-scatter's input, as nccl-tests counts "size"), link bandwidth B one way, latency α per step:
  all-reduce      2(n−1)/n · S/B + 2(n−1)·α     (reduce-scatter then all-gather)
  all-gather      (n−1)/n · S/B + (n−1)·α
  reduce-scatter  (n−1)/n · S/B + (n−1)·α
  broadcast       S/B + (n−1)·α  (pipelined ring: each rank forwards S once)
  send/recv       S/B + α
nccl-tests' "bus bandwidth" uses the same (n−1)/n factors, so a published busbw plugs in as B × link efficiency.
The link is the group's slowest: NVLink (or PCIe) when every rank of the group sits in one node, the NIC per GPU
when the group spans nodes (a ring across nodes runs at its slowest hop).
"""

from __future__ import annotations

from dataclasses import dataclass

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}
LATENCY_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
                 "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: n - 1, "send_recv": lambda n: 1}


@dataclass
class Collective:
    """One kind of collective a rank issues in a step: `calls` of them, `bytes` in all (S summed over the calls),
    over `ranks` ranks, on `link`; `time_s` as the α-β ring says, `exposed_s` what the overlap rule leaves on the
    step's critical path."""

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

    def wire_bytes(self) -> float:
        """Bytes each rank sends on the link: S times the ring's factor."""
        return self.bytes * FACTORS[self.op](self.ranks)


def ring_time(op: str, nbytes: float, calls: int, ranks: int, bandwidth: float, latency_s: float) -> float:
    """Seconds for `calls` collectives of `op` moving `nbytes` in all over `ranks` ranks on a link of `bandwidth`
    bytes/s one way (already times the link efficiency)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return FACTORS[op](ranks) * nbytes / bandwidth + calls * LATENCY_STEPS[op](ranks) * latency_s


def link_for(cluster, group_ranks: int, stride: int = 1) -> tuple[str, float]:
    """(link words, bandwidth one way) of a group of `group_ranks` ranks `stride` apart: inside one node it is the
    part's intra-node link, across nodes the NIC per GPU."""
    part = cluster.part
    if group_ranks * stride <= cluster.per_node:
        return part.intra_link, part.intra_bandwidth
    return part.inter_link, part.inter_bandwidth
