"""An all-reduce's two algorithms in the cost model: the ring and NCCL's tree (a chain inside each node, a double
binary tree over the nodes), each against its formula worked by hand; the faster one chosen by message size and
node count and named in what predict and plan_for print; a part without a tree (gloo's) keeps every all-reduce a
ring."""

from __future__ import annotations

import dataclasses

import pytest

from scalekit.predict import PARTS, gpus, plan_for, predict
from scalekit.predict.collectives import Collective, nodes_spanned, ring_time, tree_latency_steps, tree_time
from scalekit.predict.cost import PUBLISHED, Layout, collectives_assumption, time_collectives

MIB, GIB = 2**20, 2**30
H100 = PARTS["H100-SXM"]
INFINIBAND = H100.inter_bandwidth * PUBLISHED.link  # the NIC per GPU at the published link efficiency
NVLINK = H100.intra_bandwidth * PUBLISHED.link
ALPHA = PUBLISHED.latency_s


def _timed(spec: str, nbytes: int, op: str = "all_reduce", eff=PUBLISHED) -> Collective:
    """One collective of `nbytes` over every GPU of `spec`, timed as predict times it."""
    cluster = gpus(spec)
    c = Collective("gradient all-reduce", op, nbytes, 1, cluster.count, overlap_rule="EXPOSED")
    time_collectives([c], cluster, eff, compute_s=1.0, lay=Layout(world=cluster.count, dp=cluster.count))
    return c


def test_the_tree_time_follows_its_formula_worked_by_hand():
    # 512 GPUs in 64 nodes of 8: up and back down a chain of 8 (7 hops) and a tree over 64 nodes (log2 64 = 6 levels)
    assert tree_latency_steps(512, 64) == 2 * (7 + 6) == 26
    # 1 MiB at 40 GB/s, α = 10 µs: 2 × 1,048,576 B / (0.92 × 40e9 B/s) = 56.99 µs of bytes, 26 × 10 µs of latency
    assert tree_time(MIB, 1, 512, 64, 40e9, 10e-6) == pytest.approx(316.99e-6, rel=1e-4)
    # each call pays the latency again; the bytes are the calls' sum
    assert tree_time(4 * MIB, 4, 512, 64, 40e9, 10e-6) - tree_time(4 * MIB, 1, 512, 64, 40e9, 10e-6) == \
        pytest.approx(3 * 26 * 10e-6)
    # one node: a chain with the ring's 2(n−1) steps; one GPU a node: the tree alone; ⌊log2⌋ of 3 nodes, as NCCL's
    assert tree_latency_steps(8, 1) == 2 * (8 - 1) and tree_latency_steps(8, 8) == 2 * 3
    assert tree_latency_steps(12, 3) == 2 * (3 + 1)
    assert tree_time(MIB, 1, 1, 1, 40e9, 10e-6) == 0.0
    # what a rank sends: S up and S back down in a tree, 2(n−1)/n · S in a ring
    assert Collective("x", "all_reduce", 1000, 1, 8, algorithm="tree").wire_bytes() == 2000
    assert Collective("x", "all_reduce", 1000, 1, 8).wire_bytes() == 1750
    # the nodes a group spans: 64 data-parallel ranks 8 apart in 512 GPUs span 64 nodes, 8 adjacent ranks one
    cluster = gpus("512xH100-SXM")
    assert nodes_spanned(cluster, 64, 8) == 64 and nodes_spanned(cluster, 8) == 1 and nodes_spanned(cluster, 16) == 2


def test_a_small_all_reduce_over_64_nodes_runs_as_a_tree_and_beats_the_ring():
    c = _timed("512xH100-SXM", MIB)
    assert c.algorithm == "tree" and c.link.startswith("InfiniBand")
    ring = ring_time("all_reduce", MIB, 1, 512, INFINIBAND, ALPHA)
    assert ring == pytest.approx(2 * 511 / 512 * MIB / INFINIBAND + 1022 * ALPHA)  # 1,022 latency steps
    assert c.time_s == pytest.approx(2 * MIB / (0.92 * INFINIBAND) + 26 * ALPHA)
    assert c.time_s < ring / 10 and c.wire_bytes() == 2 * MIB
    assert c.algorithm_note.startswith("tree, ") and "against the ring's" in c.algorithm_note
    assert "512 ranks over 64 nodes" in c.algorithm_note and "26 latency steps a call against 1022" in c.algorithm_note


def test_a_large_all_reduce_inside_a_node_runs_as_a_ring():
    c = _timed("8xH100-SXM", GIB)
    assert c.algorithm == "ring" and c.link == H100.intra_link
    assert c.time_s == pytest.approx(2 * 7 / 8 * GIB / NVLINK + 14 * ALPHA)
    assert c.time_s < tree_time(GIB, 1, 8, 1, NVLINK, ALPHA) and c.wire_bytes() == 2 * 7 / 8 * GIB
    assert "14 latency steps a call against 14" in c.algorithm_note
    # inside one node the chain never wins: the ring's steps and more bytes, even at 1 KiB
    assert _timed("8xH100-SXM", 1024).algorithm == "ring"


def test_across_two_nodes_the_message_size_decides():
    # 16 GPUs in 2 nodes of 8: the tree's 16 steps against the ring's 30 win at 1 MiB, its bytes lose at 1 GiB
    assert _timed("16xH100-SXM", MIB).algorithm == "tree"
    assert _timed("16xH100-SXM", GIB).algorithm == "ring"


def test_the_other_collectives_and_a_part_without_a_tree_stay_rings():
    for op in ("all_gather", "reduce_scatter", "broadcast"):
        c = _timed("512xH100-SXM", MIB, op=op)
        assert c.algorithm == "ring" and not c.algorithm_note, op
    gloo = dataclasses.replace(PUBLISHED, algorithms=("ring",), sources={"algorithms": "gloo's all-reduce is a ring"})
    c = _timed("512xH100-SXM", MIB, eff=gloo)
    assert c.algorithm == "ring" and c.time_s == pytest.approx(ring_time("all_reduce", MIB, 1, 512, INFINIBAND, ALPHA))
    assert not c.algorithm_note and "every collective as a ring (gloo's" in collectives_assumption(gloo)
    assert "NCCL's tree" in collectives_assumption(PUBLISHED)


def test_predict_and_plan_for_name_the_algorithm_they_chose():
    p = predict("gpt2-124m", "512xH100-SXM", toggles=["ddp", "bf16"], batch_size=512)
    grads = next(c for c in p.collectives if c.name.startswith("gradient all-reduce"))
    assert grads.algorithm == "tree" and f"tree on {H100.inter_link}" in p.table()
    assert any(a.startswith("algorithm of the gradient all-reduce (DDP buckets): tree, ") for a in p.assumptions)
    one_node = predict("gpt2-124m", "8xH100-SXM", toggles=["ddp", "bf16"], batch_size=8)
    assert f"ring on {H100.intra_link}" in one_node.table()
    assert any(a.startswith("algorithm of the gradient all-reduce (DDP buckets): ring, ") for a in one_node.assumptions)
    best = plan_for("gpt2-124m", "512xH100-SXM", batch_size=512, toggles=["ddp", "bf16"]).best.prediction
    assert best.layout.grad_ranks >= 64  # the gradients' group spans nodes whatever tensor degree won
    assert "all_reduce over" in best.table() and f"tree on {H100.inter_link}" in best.table()
