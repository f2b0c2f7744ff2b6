"""Expert parallelism: a MoE layer's experts split over the ranks, tokens sent to them and back with all-to-all.

Each of W ranks keeps the router (a copy, trained as data parallelism trains it: its gradient all-reduced) and
E/W of the experts (rank r: experts r*E/W ... (r+1)*E/W - 1). Each rank routes its own tokens (capacity counted
over them, as Switch Transformer does per device), then:

  dispatch  all_to_all_single: each kept (token, expert) row goes to the rank holding the expert
  experts   each rank runs its experts on the rows it received
  combine   all_to_all_single back: each row returns to the rank of its token, is weighted by its gate and summed

Both all-to-alls carry `split sizes` (rows per destination) that change every step, so the ranks first exchange
their counts (one small all-to-all of W integers) and the experts' ids. Backward runs the same two all-to-alls in
reverse (torch.distributed.nn's differentiable all_to_all_single), so each rank sends per step
2 * (rows it dispatched to other ranks + rows it returned to other ranks) * d_model * element size of activations:
`expected_bytes` computes that from the routings alone, `count_sends` counts what the ranks did send.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.nn.functional import all_to_all_single

from ..models.moe import MoE, Routing, capacity_of, route, run_experts, with_aux_gradient


class ExpertParallelMoE(nn.Module):
    """This rank's part of `moe` (built the same on every rank): the router and its E/W experts. Takes this rank's
    tokens (..., d_model) and returns their outputs, as `moe` would on them alone."""

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        E = moe.num_experts
        if E % self.world:
            raise ValueError(f"{E} experts do not split evenly over {self.world} ranks")
        self.per_rank = E // self.world
        self.first = self.rank * self.per_rank
        self.router = moe.router
        self.experts = nn.ModuleList(moe.experts[self.first:self.first + self.per_rank])
        self.num_experts, self.top_k = E, moe.top_k
        self.capacity_factor, self.aux_weight = moe.capacity_factor, moe.aux_weight
        self.last: Routing | None = None

    def _exchange(self, counts: torch.Tensor, ids: torch.Tensor) -> tuple[list[int], list[int], torch.Tensor]:
        """Send rows-per-destination and each row's expert id; returns (sent, received) split sizes and the ids of
        the rows this rank will receive."""
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        send, recv = counts.tolist(), received.tolist()
        their_ids = ids.new_empty(sum(recv))
        dist.all_to_all_single(their_ids, ids, recv, send, group=self.group)
        return send, recv, their_ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        r = self.last = route(self.router(x), self.top_k,
                              capacity_of(len(x), self.num_experts, self.top_k, self.capacity_factor))
        keep = r.kept.nonzero().squeeze(1)
        order = keep[torch.argsort(r.expert[keep], stable=True)]  # kept rows grouped by expert, so by rank
        token, expert, gate = r.token[order], r.expert[order], r.gate[order]
        counts = torch.bincount(expert // self.per_rank, minlength=self.world)
        send, recv, their_expert = self._exchange(counts, expert)
        rows = all_to_all_single(x.new_empty(sum(recv), x.shape[1]), x[token], recv, send, group=self.group)
        done = run_experts(self.experts, rows, their_expert, self.first)
        back = all_to_all_single(x.new_empty(len(token), x.shape[1]), done, send, recv, group=self.group)
        out = x.new_zeros(x.shape).index_add(0, token, back * gate[:, None])
        return with_aux_gradient(out, r.aux_loss, self.aux_weight).reshape(shape)


def owner(expert: torch.Tensor, experts: int, world: int) -> torch.Tensor:
    """The rank that holds each expert."""
    return expert // (experts // world)


def expected_bytes(routings: list[Routing], experts: int, d_model: int, element_bytes: int = 4) -> list[int]:
    """Activation bytes each rank sends to the other ranks in one training step (forward and backward), from the
    routing of every rank's tokens (routings[r]: rank r's): rows dispatched away and rows returned, twice."""
    world = len(routings)
    flows = torch.zeros(world, world, dtype=torch.long)  # flows[src, dst]: kept rows src's tokens send to dst
    for src, r in enumerate(routings):
        flows[src] += torch.bincount(owner(r.expert[r.kept], experts, world), minlength=world)
    away = flows.sum(dim=1) - flows.diagonal()  # dispatched to other ranks
    returned = flows.sum(dim=0) - flows.diagonal()  # outputs sent back to other ranks
    return [int(2 * (a + b) * d_model * element_bytes) for a, b in zip(away, returned, strict=True)]


def uniform_bytes(tokens: int, top_k: int, world: int, d_model: int, element_bytes: int = 4) -> float:
    """`expected_bytes` when the router spreads every rank's tokens evenly and drops none: each of a rank's
    tokens*k rows goes elsewhere with chance (W-1)/W, as many come back, and backward repeats both."""
    return 4 * tokens * top_k * (world - 1) / world * d_model * element_bytes


@contextlib.contextmanager
def count_sends(group=None):
    """Wraps torch.distributed.all_to_all_single in this process: yields a Counter of the bytes this rank sent to
    other ranks, by dtype (float rows; int64 counts and ids)."""
    sent: Counter = Counter()
    original = dist.all_to_all_single
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def counted(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        splits = input_split_sizes or [len(input) // world] * world
        row = input[0].numel() * input.element_size() if len(input) else 0
        sent[str(input.dtype).removeprefix("torch.")] += (sum(splits) - splits[rank]) * row
        return original(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    dist.all_to_all_single = counted
    try:
        yield sent
    finally:
        dist.all_to_all_single = original
