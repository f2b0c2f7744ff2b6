"""The operator count the cost model runs on fake tensors (scalekit/predict/traffic.py): its FLOPs equal the
weights' formula, its bytes equal what the operators read and write, and the step prediction uses it."""

from __future__ import annotations

import contextlib
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


def _policy_snippet(device: str):
    """Attention written out, a layer norm, an MLP, an RMS norm and the fp32 loss: the operator kinds the counted
    models run, in forms fake CUDA tensors can run in a torch without CUDA (no indexing, no scalar fills, no
    autocast weight cache: each of those asks for a CUDA device guard there)."""
    import torch.nn.functional as F

    x = torch.randn(2, 16, 32, device=device)  # (B, T, C) fp32, the residual stream
    w_q, w_fc, b_fc = (torch.randn(32, 32, device=device), torch.randn(64, 32, device=device),
                       torch.randn(64, device=device))
    h = F.layer_norm(x, (32,), torch.ones(32, device=device), torch.zeros(32, device=device))
    q = F.linear(h, w_q)  # (B, T, C) bf16
    att = torch.bmm(q, q.transpose(1, 2)) * 0.125 + torch.randn(16, 16, device=device)  # scores and a mask's bias
    y = x + torch.bmm(F.softmax(att, dim=-1), q)
    logits = F.linear(F.gelu(y, approximate="tanh"), w_fc, b_fc)
    F.cross_entropy(logits.float().view(-1, 64), torch.zeros(32, dtype=torch.long, device=device))
    torch.rsqrt(logits.pow(2).mean(-1)).sum()
    torch.exp(att).sum(-1)


def _counted_snippet(device: str):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scalekit.predict.traffic import _counter, cuda_autocast

    seen = []

    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if str(func) not in traffic.MOVES_NOTHING and not getattr(func, "is_view", False):  # what moves bytes
                outs = out if isinstance(out, (tuple, list)) else (out,)
                seen.append((str(func), tuple(str(t.dtype) for t in traffic._tensors(args)),
                             tuple(str(t.dtype) for t in traffic._tensors(outs))))
            return out

    count = _counter()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        if device == "cuda":  # torch's own CUDA autocast: torch.autocast("cuda") would switch itself off here
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", torch.bfloat16)
            policy = contextlib.nullcontext()
        else:
            policy = cuda_autocast()
        try:
            with count, Seen(), policy:
                _policy_snippet(device)
        finally:
            torch.set_autocast_enabled("cuda", False)
            torch.clear_autocast_cache()
    return count.traffic, sorted(seen)


def test_the_gpu_policy_casts_as_torchs_own_cuda_autocast_does():
    """cuda_autocast on CPU fake tensors against torch's AutocastCUDA kernels on fake CUDA tensors: the same
    operators with the same dtypes, and the same bytes counted (the casts included)."""
    ours, our_ops = _counted_snippet("cpu")
    torchs, torch_ops = _counted_snippet("cuda")
    assert our_ops == torch_ops
    assert any(op == "aten._softmax.default" and dtypes == ("torch.float32",) for op, dtypes, _ in our_ops)
    assert ours.other_bytes == torchs.other_bytes and ours.matmul_flops == torchs.matmul_flops
    assert sorted(m.bytes for m in ours.matmuls) == sorted(m.bytes for m in torchs.matmuls)


def test_the_gpu_policy_counts_the_scores_softmax_and_the_loss_in_fp32_and_the_cpu_policy_is_kept():
    shape = shape_of("tiny")
    seq, h, vocab, d = 64, shape.n_head, shape.vocab, shape.d
    gpu = traffic.model_traffic(shape, seq, False, True, 4, "cuda")
    cpu = traffic.model_traffic(shape, seq, False, True, 4, "cpu")
    assert "CUDA policy" in gpu.code and "CPU policy" in cpu.code
    scores = h * seq * seq  # one row's T×T scores, every head
    # CPU autocast: softmax reads and writes bf16 (2 + 2 bytes an element).  CUDA's: the scores cast to fp32 (2 + 4),
    # softmax in fp32 (4 + 4, of which B·H·T·T·4 written), cast back to bf16 for AV (4 + 2): 16 bytes more an element
    assert gpu.block.other_bytes - cpu.block.other_bytes == 16 * scores
    assert gpu.block.matmuls == cpu.block.matmuls
    # the root by hand: positions, two gathers, their sum, the final norm, its output and the head's weight cast to
    # bf16, the logits cast to fp32, log_softmax in fp32 (T·V·4 read and written) and nll_loss's read of it
    root = (seq * 8 + 2 * (2 * seq * d * 4 + seq * 8) + 3 * seq * d * 4
            + (seq * d * 4 + 2 * d * 4) + (seq * d * 4 + 2 * seq * 4)
            + seq * d * (4 + 2) + vocab * d * (4 + 2)
            + seq * vocab * (2 + 4) + seq * vocab * 4 * 2 + (seq * vocab * 4 + seq * 8 + 2 * 4))
    assert gpu.root.other_bytes == root
    assert cpu.root.other_bytes == root  # the loss is fp32 under both: the logits are cast first, as runs do


def test_each_matmul_on_its_own_roofline_on_an_a100():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scalekit.predict import PUBLISHED
    from scalekit.predict.parts import part
    from scalekit.predict.traffic import _counter

    a100 = part("A100-80GB-SXM")
    peak, bandwidth = a100.peak("bf16"), a100.memory_bandwidth * PUBLISHED.memory
    count = _counter()
    with FakeTensorMode(), count:
        q = torch.empty(16 * 12, 1024, 64, dtype=torch.bfloat16)  # GPT-2's QKᵀ at B=16, T=1024: K = 64
        torch.bmm(q, q.transpose(1, 2))
        a = torch.empty(8192, 8192, dtype=torch.bfloat16)
        torch.mm(a, a)
    scores, square = count.traffic.matmuls
    assert scores.bytes == (2 * 192 * 1024 * 64 + 192 * 1024 * 1024) * 2
    assert square.bytes == 3 * 8192 * 8192 * 2 and square.fixed_bytes == 8192 * 8192 * 2

    def rate(size):
        return PUBLISHED.matmul_at(size, peak)

    assert traffic.matmul_seconds([scores], rate, bandwidth) == scores.bytes / bandwidth
    assert scores.bytes / bandwidth > 2 * scores.flops / rate(64)  # far below the ridge point: memory-bound
    assert traffic.matmul_seconds([square], rate, bandwidth) == square.flops / rate(8192)
    # at more rows, a weight is still read once
    assert traffic.scaled([square], 2)[0].bytes == square.bytes + 8192 * 8192 * 2 * 2
