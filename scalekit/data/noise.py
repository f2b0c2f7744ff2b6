"""Character noise: the raw data source's per-sample transform, and the same transform on a whole batch.

Each input token is replaced, with probability NOISE_RATE (≈5%), by a random token of the vocabulary; the
targets stay clean (a denoising objective).  The random numbers come from a counter-based hash of (seed,
draw, position), not from a generator's state, so a sample's noise is the same whichever process (a
DataLoader worker or the main one) transforms it, and whether it is transformed alone (`noise_sample`, a
Python loop over its tokens) or with its batch (`noise_batch`, tensor ops).  `draw` is the sample's place
in the stream of samples, so a window seen again in a later epoch gets fresh noise.

`rounds` is how many times the hash mixes each token's number: the knob for what the transform costs per
sample (its work grows linearly with it; 0 switches the transform off).  Every product below stays under
2**63, so Python ints and torch.int64 give the same bits.
"""

from __future__ import annotations

import torch

MASK = 0xFFFFFFFF  # the hash works on 32-bit words
MIX = 0x45D9F3B  # the multiplier of a well-known 32-bit integer hash
DRAW_MUL, POS_MUL = 0x2C1B3C6D, 0x297A2D39  # spread draw numbers and positions over the 32 bits (both < 2**31)
RATE_BITS = 10
NOISE_THRESHOLD = 51  # a token is replaced when the low RATE_BITS bits of its hash are below this: 51/1024 ≈ 5%
NOISE_RATE = NOISE_THRESHOLD / 2**RATE_BITS


def seed32(seed: int) -> int:
    """A run's seed folded into one 32-bit word."""
    return (seed ^ (seed >> 32)) & MASK


def noise_sample(ids: list[int], draw: int, seed: int, rounds: int, vocab_size: int) -> list[int]:
    """One sample's noise, token by token in Python (what a per-sample Dataset transform does)."""
    key = seed32(seed) ^ ((draw & MASK) * DRAW_MUL & MASK)
    out = list(ids)
    for pos in range(len(out)):
        h = key ^ (pos * POS_MUL & MASK)
        for _ in range(rounds):
            h = ((h >> 16) ^ h) * MIX & MASK
        h ^= h >> 16
        if h & (2**RATE_BITS - 1) < NOISE_THRESHOLD:
            out[pos] = (h >> RATE_BITS) % vocab_size
    return out


def noise_batch(x: torch.Tensor, draws: torch.Tensor, seed: int, rounds: int, vocab_size: int) -> torch.Tensor:
    """The same noise for a whole batch x (B, T) of int64 tokens at once, with tensor ops; draws is (B,)."""
    key = (seed32(seed) ^ ((draws & MASK) * DRAW_MUL & MASK))[:, None]  # (B, 1)
    positions = torch.arange(x.shape[1], dtype=torch.int64) * POS_MUL & MASK  # (T,)
    h = key ^ positions[None, :]  # (B, T)
    for _ in range(rounds):
        h = ((h >> 16) ^ h) * MIX & MASK
    h = h ^ (h >> 16)
    replace = (h & (2**RATE_BITS - 1)) < NOISE_THRESHOLD
    return torch.where(replace, (h >> RATE_BITS) % vocab_size, x)
