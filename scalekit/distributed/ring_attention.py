"""Ring attention: context parallelism by hand, on torch.distributed's point-to-point sends.

Each of N ranks holds 1/N of the sequence: its queries, keys and values.  Attention needs every key for every
query, so the key/value blocks travel round a ring: at each of N steps a rank computes its queries against the
block it holds (scalekit.models.online_softmax.key_block_attention, tile by tile), merges that partial result into its
running one by log-sum-exp, and passes the block to the next rank while receiving the previous rank's (Liu et
al., "Ring Attention with Blockwise Transformers", 2023).  No rank ever holds the whole sequence's keys or the
T×T scores; each sends (N−1) key/value blocks per attention call.

With a causal mask, a query sees only earlier keys.  Cut the sequence into N contiguous slices and rank 0's
queries see only its own block while the last rank's see every block: the work per rank grows with the rank,
and every step waits for the slowest.  The zig-zag layout cuts the sequence into 2N chunks and gives rank r
chunks r and 2N−1−r, one early and one late: every rank then has the same number of (query, key) pairs
(`causal_pairs`), and skipping the tiles wholly in a query's future makes that
balance real work saved.  This is the load balancing torch's context_parallel does by default (its head-tail
balancer), and Llama 3's training (Dubey et al., 2024).
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from scalekit.models.online_softmax import causal_allowed, key_block_attention, merge

LAYOUTS = ("contiguous", "zigzag")


def shard_positions(seq_len: int, world_size: int, rank: int, layout: str = "contiguous") -> torch.Tensor:
    """The positions (in the whole sequence) of the tokens rank `rank` holds, in the order it holds them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    chunks = world_size if layout == "contiguous" else 2 * world_size
    if seq_len % chunks:
        raise ValueError(f"a sequence of {seq_len} tokens does not split into {chunks} equal chunks "
                         f"({layout} layout on {world_size} ranks)")
    size = seq_len // chunks
    mine = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in mine])


def shard(x: torch.Tensor, world_size: int, rank: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """Rank `rank`'s slice of `x` along the sequence dimension `dim`."""
    positions = shard_positions(x.size(dim), world_size, rank, layout).to(x.device)
    return x.index_select(dim, positions)


def unshard(parts: list[torch.Tensor], layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """Every rank's slice (in rank order) put back in sequence order: the inverse of `shard`."""
    world_size = len(parts)
    seq_len = sum(p.size(dim) for p in parts)
    positions = torch.cat([shard_positions(seq_len, world_size, r, layout) for r in range(world_size)])
    whole = torch.cat(parts, dim=dim)
    return whole.index_select(dim, torch.argsort(positions).to(whole.device))


def causal_pairs(seq_len: int, world_size: int, layout: str = "contiguous") -> list[int]:
    """Per rank, the (query, key) pairs a causal mask lets its queries see: its share of the attention's work."""
    return [int((shard_positions(seq_len, world_size, r, layout) + 1).sum()) for r in range(world_size)]


@dataclasses.dataclass
class RingStats:
    """What one rank did in one ring attention call."""

    bytes_sent: int  # key/value bytes this rank sent to the next one
    compute_s: float  # seconds of attention math (blocks and merges)
    wait_s: float  # seconds waiting for the next block after the math (communication not hidden by it)
    tiles_computed: int  # (chunk of queries, chunk of keys) tiles computed: a chunk is a layout's contiguous run
    tiles_skipped: int  # tiles entirely in their queries' future (causal only), never computed


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   layout: str = "contiguous", overlap: bool = True,
                   group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, RingStats]:
    """This rank's attention output for its slice of the sequence, (B, heads, T/N, hd), and what it cost.

    q, k, v: this rank's slices (`shard(x, N, rank, layout)`), (B, heads, T/N, hd).  overlap: post the send of
    the current block and the receive of the next before computing on the current one (as ring attention does
    on GPUs), rather than after."""
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    seq_len = q.size(-2) * world_size
    q_positions = shard_positions(seq_len, world_size, rank, layout).to(q.device)
    nxt, prev = (dist.get_global_rank(group, r) if group is not None else r
                 for r in ((rank + 1) % world_size, (rank - 1) % world_size))
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    block = torch.stack((k, v)).contiguous()  # one message per step: keys and values together
    stats = RingStats(bytes_sent=0, compute_s=0.0, wait_s=0.0, tiles_computed=0, tiles_skipped=0)
    chunk = seq_len // (world_size if layout == "contiguous" else 2 * world_size)  # tokens of one contiguous run
    for step in range(world_size):
        source = (rank - step) % world_size  # whose keys this block is
        pending, incoming = [], None
        if step < world_size - 1:
            incoming = torch.empty_like(block)
            if overlap:
                pending = _pass_on(block, incoming, nxt, prev, group)
            stats.bytes_sent += block.numel() * block.element_size()
        started = time.perf_counter()
        k_positions = shard_positions(seq_len, world_size, source, layout).to(q.device)
        part, part_lse = _attend_by_chunks(q, block[0], block[1], q_positions, k_positions, chunk, is_causal, stats)
        out, lse = merge(out, lse, part, part_lse)
        computed = time.perf_counter()
        stats.compute_s += computed - started
        if incoming is not None:
            if not overlap:
                pending = _pass_on(block, incoming, nxt, prev, group)
            for request in pending:
                request.wait()
            stats.wait_s += time.perf_counter() - computed
            block = incoming
    return out, stats


def _attend_by_chunks(q, k, v, q_positions, k_positions, chunk: int, is_causal: bool, stats: RingStats):
    """This rank's queries against one block of keys, tile by tile: a layout's chunks are contiguous runs of
    positions, so under a causal mask a tile is wholly visible (no mask), wholly in the future (skipped) or on the
    diagonal (masked).  Skipping whole tiles is what makes the zig-zag layout's balance real work saved."""
    outs, lses = [], []
    for q_chunk, q_pos in zip(q.split(chunk, -2), q_positions.split(chunk), strict=True):
        out = torch.zeros_like(q_chunk)
        lse = torch.full(q_chunk.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for k_chunk, v_chunk, k_pos in zip(k.split(chunk, -2), v.split(chunk, -2), k_positions.split(chunk),
                                           strict=True):
            if is_causal and k_pos[0] > q_pos[-1]:
                stats.tiles_skipped += 1  # every key in every query's future
                continue
            allowed = causal_allowed(q_pos, k_pos) if is_causal and k_pos[-1] > q_pos[0] else None
            out, lse = merge(out, lse, *key_block_attention(q_chunk, k_chunk, v_chunk, allowed=allowed))
            stats.tiles_computed += 1
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def _pass_on(block: torch.Tensor, incoming: torch.Tensor, nxt: int, prev: int,
             group: dist.ProcessGroup | None) -> list:
    """Send `block` to the next rank and receive the previous rank's into `incoming`, without waiting."""
    ops = [dist.P2POp(dist.isend, block, nxt, group), dist.P2POp(dist.irecv, incoming, prev, group)]
    return dist.batch_isend_irecv(ops)
