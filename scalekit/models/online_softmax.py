"""Attention one block of keys at a time: the online softmax behind FlashAttention, written in plain torch.

softmax(s)·V over all keys needs every score of a row before the first probability is known.  The online
softmax keeps, per query row, a running maximum m, a running sum l of exp(s − m) and an unnormalised output
acc = Σ exp(s − m)·v.  A new block of keys with a larger maximum m' rescales what was kept by exp(m − m'), so
the T×T score matrix never exists: only one tile of it at a time (Milakov & Gimelshein, 2018;
Dao et al., "FlashAttention", 2022).  The result is exact, up to floating-point summation order.

The same state merges two partial attentions over disjoint sets of keys through their log-sum-exp
lse = m + log l (`merge`): ring attention (scalekit.distributed.ring_attention) merges the blocks other ranks
send it that way.
"""

from __future__ import annotations

import torch


def key_block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                        allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `q` over one block of keys, with its log-sum-exp: (out (..., Tq, hd), lse (..., Tq)).

    `allowed` (Tq, Tk) bool, True where a query may see a key.  A row that sees no key gets out 0 and lse −inf,
    so that `merge` gives it no weight."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., Tq, Tk): one tile, never Tq × T
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (..., Tq)
    seen = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(seen, lse, 0.0).unsqueeze(-1))
    return probs @ v, lse


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
          lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attentions of the same queries over disjoint keys, as one: each weighted by its share of the total
    exp(lse).  Rows that saw no key on either side stay 0 with lse −inf."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, 0.0)
    weight_a = torch.exp(lse_a - safe).unsqueeze(-1)  # exp(−inf) = 0 for a side that saw nothing
    weight_b = torch.exp(lse_b - safe).unsqueeze(-1)
    return out_a * weight_a + out_b * weight_b, lse


def causal_allowed(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """(Tq, Tk) bool: a query at position i sees the keys at positions ≤ i."""
    return k_positions.unsqueeze(0) <= q_positions.unsqueeze(1)


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_size: int = 64,
                    is_causal: bool = False, return_lse: bool = False):
    """softmax(q·kᵀ/√d)·v computed tile by tile with the online softmax: what
    F.scaled_dot_product_attention(q, k, v, is_causal=is_causal) computes, holding one (block × block) tile of
    scores at a time.  Queries go in blocks of `block_size`, and for each, the keys in blocks of `block_size`
    (FlashAttention's two loops).  With is_causal, query i sees keys 0..i (queries and keys start at position 0):
    a key block wholly in a query block's future is never computed, one across the diagonal is masked."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    outs, lses = [], []
    for q_start in range(0, q.size(-2), block_size):
        out, lse = _query_block(q[..., q_start:q_start + block_size, :], k, v, q_start, block_size, is_causal)
        outs.append(out)
        lses.append(lse)
    out = torch.cat(outs, dim=-2)
    return (out, torch.cat(lses, dim=-1)) if return_lse else out


def _query_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, block_size: int,
                 is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of queries (at positions q_start...) against every key block it may see: the online softmax."""
    scale = q.size(-1) ** -0.5
    q_positions = torch.arange(q_start, q_start + q.size(-2), device=q.device)
    running_max = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)  # m, (..., block)
    running_sum = torch.zeros_like(running_max)  # l = Σ exp(s − m)
    acc = torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype, device=q.device)  # Σ exp(s − m)·v
    last_key = int(q_positions[-1]) if is_causal else k.size(-2) - 1
    for start in range(0, last_key + 1, block_size):  # key blocks wholly in these queries' future: never computed
        stop = min(start + block_size, k.size(-2))
        scores = (q @ k[..., start:stop, :].transpose(-2, -1)) * scale  # (..., block, block): one tile
        if is_causal and stop - 1 > q_start:  # the tile crosses the diagonal
            allowed = causal_allowed(q_positions, torch.arange(start, stop, device=q.device))
            scores = scores.masked_fill(~allowed, float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        safe_max = torch.where(torch.isfinite(new_max), new_max, 0.0)  # a row with nothing seen yet
        rescale = torch.exp(running_max - safe_max)  # what was kept, brought to the new maximum
        probs = torch.exp(scores - safe_max.unsqueeze(-1))
        running_sum = running_sum * rescale + probs.sum(dim=-1)
        acc = acc * rescale.unsqueeze(-1) + probs @ v[..., start:stop, :]
        running_max = new_max
    return acc / running_sum.unsqueeze(-1), running_max + torch.log(running_sum)
