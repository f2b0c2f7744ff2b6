"""The online softmax by hand (scalekit.models.online_softmax) computes what torch's
scaled_dot_product_attention computes, block by block, causal or not, within fp32 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalekit.models.online_softmax import key_block_attention, merge, tiled_attention

FP32_TOL = 1e-5  # summation order differs from SDPA's; fp32 keeps ~7 digits, the outputs are O(1)


@pytest.mark.parametrize("shape, block_size", [((2, 3, 100, 16), 32), ((1, 2, 64, 8), 64), ((2, 2, 37, 16), 5),
                                               ((1, 1, 7, 4), 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_attention_equals_sdpa(shape, block_size, is_causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    out, lse = tiled_attention(q, k, v, block_size=block_size, is_causal=is_causal, return_lse=True)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, expected, atol=FP32_TOL, rtol=FP32_TOL)
    scores = (q @ k.transpose(-2, -1)) * shape[-1] ** -0.5
    if is_causal:
        scores = scores.masked_fill(~torch.ones(shape[-2], shape[-2], dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=FP32_TOL, rtol=FP32_TOL)


def test_two_halves_merged_by_log_sum_exp_equal_the_whole():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 24, 8, generator=g) for _ in range(3))
    left = key_block_attention(q, k[..., :10, :], v[..., :10, :])
    right = key_block_attention(q, k[..., 10:, :], v[..., 10:, :])
    out, _ = merge(*left, *right)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=FP32_TOL, rtol=FP32_TOL)


def test_a_block_a_row_cannot_see_gets_no_weight():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    nothing = torch.zeros(4, 4, dtype=torch.bool)
    hidden_out, hidden_lse = key_block_attention(q, k, v, allowed=nothing)
    assert torch.equal(hidden_out, torch.zeros_like(q)) and torch.isneginf(hidden_lse).all()
    out, _ = merge(*key_block_attention(q, k, v), hidden_out, hidden_lse)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=FP32_TOL, rtol=FP32_TOL)


def test_block_size_must_be_positive():
    q = torch.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        tiled_attention(q, q, q, block_size=0)
