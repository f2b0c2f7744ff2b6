"""Ring attention by hand (scalekit.distributed.ring_attention) on 2 gloo ranks computes what one process's
scaled_dot_product_attention computes, for both layouts, causal or not; and the layouts' bookkeeping."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from scalekit.distributed.ring_attention import (
    LAYOUTS,
    causal_pairs,
    ring_attention,
    shard,
    shard_positions,
    unshard,
)
from scalekit.launch import launch
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

FP32_TOL = 1e-5


def _every_case():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 16, generator=g) for _ in range(3))
    gaps, stats = {}, {}
    for layout in LAYOUTS:
        for is_causal in (False, True):
            out, st = ring_attention(*(shard(x, world, rank, layout) for x in (q, k, v)), is_causal=is_causal,
                                     layout=layout, overlap=is_causal)
            parts = [torch.empty_like(out) for _ in range(world)]
            dist.all_gather(parts, out)
            expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
            gaps[layout, is_causal] = (unshard(parts, layout) - expected).abs().max().item()
            stats[layout, is_causal] = (st.bytes_sent, st.tiles_computed, st.tiles_skipped)
    dist.destroy_process_group()
    return gaps, stats


def test_ring_attention_on_two_ranks_equals_one_process():
    block_bytes = 2 * 2 * 2 * 32 * 16 * 4  # keys and values, B=2, 2 heads, 32 tokens, head size 16, fp32
    for rank, (gaps, stats) in enumerate(launch(_every_case, nprocs=2, timeout_s=120)):
        assert max(gaps.values()) < FP32_TOL, gaps
        assert {s[0] for s in stats.values()} == {block_bytes}  # one block passed on, by every rank
        assert stats["contiguous", False] == (block_bytes, 2, 0)
        assert stats["contiguous", True] == (block_bytes, 1 + rank, 1 - rank)  # rank 0 skips rank 1's future keys
        assert stats["zigzag", True] == (block_bytes, 5, 3)  # the same work on both ranks: 2 diagonal tiles, 3 whole
        assert stats["zigzag", False] == (block_bytes, 8, 0)


def test_layouts_cover_the_sequence_once_and_zigzag_balances_causal_work():
    for layout in LAYOUTS:
        held = torch.cat([shard_positions(16, 4, r, layout) for r in range(4)])
        assert sorted(held.tolist()) == list(range(16))
        x = torch.arange(2 * 16).reshape(2, 16, 1)
        assert torch.equal(unshard([shard(x, 4, r, layout) for r in range(4)], layout), x)
    assert causal_pairs(8, 2, "contiguous") == [10, 26]  # 1+2+3+4, 5+6+7+8
    assert causal_pairs(8, 2, "zigzag") == [18, 18]  # 1+2+7+8, 3+4+5+6
    with pytest.raises(ValueError, match="does not split into 4 equal chunks"):
        shard_positions(6, 2, 0, "zigzag")
