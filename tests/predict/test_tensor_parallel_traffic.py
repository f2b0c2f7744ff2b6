"""What a tensor-parallel rank computes, as the cost model counts it: the blocks' attention and MLP split over the
ranks, and whole on every rank the rest (the norms and residual adds between them, the embeddings, the head and the
loss), as scalekit's tensor-parallel plan leaves them."""

from __future__ import annotations

import pytest

from scalekit.predict import PARTS, predict, traffic
from scalekit.predict.cost import PUBLISHED
from scalekit.predict.shapes import shape_of


def test_a_gpt_blocks_unsplit_bytes_are_its_two_layer_norms_and_two_residual_adds_worked_by_hand():
    shape, seq = shape_of("small"), 128
    counted = traffic.model_traffic(shape, seq, False, False)
    d, t = shape.d, seq
    # fp32, one row: a layer norm reads x, its weight and bias and writes its output, mean and rstd (8dT + 8d + 8T
    # bytes); a residual add reads two and writes one (12dT); two of each
    assert counted.block.other_bytes - counted.block.split_bytes == 2 * (8 * d * t + 8 * d + 8 * t) + 2 * 12 * d * t
    assert 0 < counted.block.split_bytes < counted.block.other_bytes
    assert counted.root.split_bytes == 0  # embeddings, final norm, head, loss: nothing split
    # one rank of 2 moves the split half and the rest whole
    b = counted.block
    assert b.per_rank_bytes(2) == pytest.approx((b.split_bytes + b.attention_bytes) / 2 + b.other_bytes - b.split_bytes)
    assert b.per_rank_bytes(1) == pytest.approx(b.other_bytes + b.attention_bytes)


def test_the_llama_layouts_split_modules_hold_its_swiglu():
    counted = traffic.model_traffic(shape_of("llama3-8b"), 256, False, False)
    # the SwiGLU's silu and product (ffn wide) are split; the RMSNorms and residual adds (d wide) are not
    shape, t = shape_of("llama3-8b"), 256
    assert counted.block.split_bytes >= 3 * 4 * shape.ffn * t  # silu's write, the product's two reads at least
    assert counted.block.other_bytes - counted.block.split_bytes < counted.block.split_bytes


def test_a_tensor_parallel_rank_runs_the_head_whole():
    one = predict("gpt2-124m", "1xH100-SXM", batch_size=8)
    two = predict("gpt2-124m", "2xH100-SXM", toggles={"tensor_parallel": 2}, batch_size=8)
    # GPT-2's head (768 × 50,257, 8 × 1,024 tokens, forward and backward) is compute-bound at fp32's matmul rate: a
    # rank of 2 runs half of everything else and the whole head, half a head more than half the step's matmuls
    h100 = PARTS["H100-SXM"]
    head_s = 3 * 2 * 768 * 50257 * 1024 * 8 / (h100.peak("fp32") * PUBLISHED.matmul)
    assert two.compute_parts["matmul"] - one.compute_parts["matmul"] / 2 == pytest.approx(head_s / 2, rel=0.01)
