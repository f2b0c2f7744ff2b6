"""Expert parallelism on 2 gloo ranks (scalekit.distributed.expert_parallel): each rank holds half of the experts,
its tokens go to them and back by all-to-all; outputs, the inputs' gradients, the router's gradient (all-reduced) and
every expert's gradient equal one process running each rank's tokens through the whole layer, and the bytes the ranks send are
the bytes `expected_bytes` computes from the routings."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from scalekit.distributed.expert_parallel import ExpertParallelMoE, count_sends, expected_bytes, uniform_bytes
from scalekit.launch import launch
from scalekit.models.moe import MoE, capacity_of, route
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

D, TOKENS, EXPERTS = 16, 24, 4
CASES = [(1, 1.0, "gelu"), (2, 1.25, "swiglu"), (2, None, "gelu")]


def _loss(y, target):
    return (y - target).square().mean()


def _one_case(top_k, capacity_factor, activation):
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same layer, tokens and targets on every rank
    moe = MoE(D, 2 * D, EXPERTS, top_k, capacity_factor, activation, aux_weight=0.01)
    x, target = torch.randn(world, TOKENS, D, requires_grad=True), torch.randn(world, TOKENS, D)
    whole = copy.deepcopy(moe)  # one process: every rank's tokens through the whole layer, losses summed
    outs = [whole(x[r]) for r in range(world)]
    expected = expected_bytes([whole.routing(x[r]) for r in range(world)], EXPERTS, D)
    sum(_loss(o, t) for o, t in zip(outs, target, strict=True)).backward()
    ep = ExpertParallelMoE(moe)
    mine_x = x[rank].detach().requires_grad_()  # this rank's tokens, as the layer below would hand them over
    with count_sends() as sent:
        y = ep(mine_x)
        _loss(y, target[rank]).backward()
    dist.all_reduce(ep.router.weight.grad)  # the router is replicated: data parallelism's all-reduce
    mine = whole.experts[ep.first:ep.first + ep.per_rank]
    return {"out": (y - outs[rank]).abs().max().item(), "input": (mine_x.grad - x.grad[rank]).abs().max().item(),
            "router": (ep.router.weight.grad - whole.router.weight.grad).abs().max().item(),
            "experts": max((a.grad - b.grad).abs().max().item()
                           for a, b in zip(ep.experts.parameters(), mine.parameters(), strict=True)),
            "sent": sent["float32"], "expected": expected[rank], "dropped": ep.last.dropped}


def _every_case():
    dist.init_process_group("gloo")
    out = [_one_case(*case) for case in CASES]
    dist.destroy_process_group()
    return out


def test_expert_parallel_equals_one_process_forward_backward_and_bytes():
    ranks = launch(_every_case, nprocs=2, timeout_s=120)
    for case, per_rank in zip(CASES, zip(*ranks, strict=True), strict=True):
        for rank, got in enumerate(per_rank):
            assert got["out"] < 1e-6 and got["input"] < 1e-6 and got["router"] < 1e-6 and got["experts"] < 1e-6, (case, rank, got)
            assert got["sent"] == got["expected"] > 0, (case, rank, got)
    assert sum(r[0]["dropped"] for r in ranks) > 0  # capacity factor 1.0 dropped some: the check covered drops
    assert sum(r[2]["dropped"] for r in ranks) == 0


def test_experts_that_do_not_split_evenly_are_refused():
    def refuse():
        dist.init_process_group("gloo")
        try:
            ExpertParallelMoE(MoE(D, D, experts=3))
        except ValueError as exc:
            return str(exc)
        finally:
            dist.destroy_process_group()

    assert launch(refuse, nprocs=2, timeout_s=60) == ["3 experts do not split evenly over 2 ranks"] * 2


def test_expected_bytes_counts_only_rows_that_cross_ranks():
    # rank 0's 3 tokens pick experts 0, 2, 3 (1 stays, 2 go to rank 1); rank 1's 2 tokens pick 0 and 1 (both go)
    logits = [torch.eye(4)[[0, 2, 3]] * 9, torch.eye(4)[[0, 1]] * 9]
    routings = [route(lg, 1, capacity_of(len(lg), 4, 1, None)) for lg in logits]
    # rank 0 sends 2 rows away and returns 2; rank 1 sends 2 away and returns 2; twice (backward), 4 floats each
    assert expected_bytes(routings, 4, d_model=4) == [2 * (2 + 2) * 16, 2 * (2 + 2) * 16]
    even = [route(torch.eye(4) * 9, 1, 4)] * 2  # each rank's 4 tokens, one per expert: half of them cross
    assert expected_bytes(even, 4, d_model=4) == [uniform_bytes(4, 1, 2, d_model=4)] * 2
