"""The operator count the cost model runs on fake tensors (scalekit/predict/traffic.py): its FLOPs equal the
weights' formula, its bytes equal what the operators read and write, and the step prediction uses it."""

from __future__ import annotations

import math

import pytest
import torch

from scalekit.predict import traffic
from scalekit.predict.shapes import llama_shape, shape_of


def _matrices(shape) -> int:
    return sum(math.prod(s) for s in shape.block if len(s) == 2)


def test_a_gpt_block_counts_two_flops_per_weight_per_token_and_the_causal_half_of_attention():
    shape = shape_of("gpt2-124m")
    seq = 64
    counted = traffic.model_traffic(shape, seq, True, False)
    assert counted.block.matmul_flops == 2 * seq * _matrices(shape)
    # causal SDPA: QKᵀ and AV, 2·T·T·d each, half of them under the diagonal
    assert counted.block.attention_flops == 4 * seq * seq * shape.d / 2
    # the head: one matmul of the tied embedding per token
    assert counted.root.matmul_flops == 2 * seq * shape.vocab * shape.d
    written_out = traffic.model_traffic(shape, seq, False, False)
    assert written_out.block.attention_flops == 0  # the scores are batched matmuls there, and T×T bytes
    assert written_out.block.matmul_flops == counted.block.matmul_flops + 4 * seq * seq * shape.d
    assert written_out.block.other_bytes > counted.block.other_bytes + 4 * shape.n_head * seq * seq


def test_a_llama_block_counts_its_gqa_and_swiglu_matrices_and_its_parameters_are_transformers():
    shape = llama_shape("small-llama", 2, 256, 8, 2, 688, 1000, qkv_bias=True)
    seq = 32
    counted = traffic.model_traffic(shape, seq, True, False)
    assert "torchtitan" in counted.code
    assert counted.block.matmul_flops == 2 * seq * _matrices(shape)
    assert counted.root.matmul_flops == 2 * seq * shape.vocab * shape.d  # an untied head
    assert counted.block.attention_flops == 4 * seq * seq * shape.d / 2
    # the counted code holds the same tensors as transformers' Qwen2 (q, k, v biases) of the same numbers
    transformers = pytest.importorskip("transformers")
    from scalekit.predict.llama_layout import LlamaLayout

    with torch.device("meta"):
        ours = LlamaLayout(shape, shape.n_layer, True)
        theirs = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            num_hidden_layers=2, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=688, vocab_size=1000, tie_word_embeddings=False))
    assert sorted(p.shape for p in ours.parameters()) == sorted(p.shape for p in theirs.parameters())
    assert sum(p.numel() for p in ours.parameters()) == shape.n_params


def test_bytes_are_what_each_operator_reads_and_writes():
    from scalekit.predict.traffic import _counter

    count = _counter()
    x = torch.randn(8, 16)
    w = torch.randn(16)
    rows, table = torch.tensor([1, 2]), torch.randn(100, 16)
    with count:
        y = x * w  # reads 8·16 and 16 floats, writes 8·16
        y.t()  # a view: moves nothing
        torch.nn.functional.embedding(rows, table)  # gathers 2 rows, not the table
    t = count.traffic
    assert t.other_bytes == (128 + 16 + 128) * 4 + (2 * 2 * 16 * 4 + 2 * 8)
    assert t.ops == 2


def test_compile_and_checkpointing_move_the_predicted_step_the_right_way():
    from scalekit.predict import predict

    base = dict(gpus="1xA100-80GB-SXM", batch_size=8, seq_len=512)
    eager = predict("gpt2-124m", toggles={"bf16": True}, **base)
    compiled = predict("gpt2-124m", toggles={"bf16": True, "compile": True}, **base)
    recompute = predict("gpt2-124m", toggles={"bf16": True, "checkpointing": 1}, **base)
    assert compiled.compute_parts["memory traffic"] < eager.compute_parts["memory traffic"]
    assert recompute.compute_parts["matmul"] > eager.compute_parts["matmul"]
    assert compiled.compute_parts["matmul"] == eager.compute_parts["matmul"]
