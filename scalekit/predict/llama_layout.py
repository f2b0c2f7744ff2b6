"""A Llama decoder in plain PyTorch, written the way torchtitan's Llama 3 is (RMSNorm in fp32, rotary embedding
as complex multiplication, grouped-query attention by repeating K and V, SwiGLU): the code the cost model runs on
fake tensors to count a Llama-layout model's operators (traffic.py).  It is never trained: its numbers are
shapes.  Built from a ModelShape, so Llama 3, Llama 2, Qwen2 (with its q/k/v biases) and Mistral share it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rotary(x, freqs):
    """x (b, t, h, hd) turned by the complex rotation `freqs` (t, hd/2)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs.view(1, freqs.shape[0], 1, freqs.shape[1])).flatten(3)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, n_kv: int, bias: bool):
        super().__init__()
        self.n_head, self.n_kv, self.hd = n_head, n_kv, d // n_head
        self.wq = nn.Linear(d, d, bias=bias)
        self.wk = nn.Linear(d, n_kv * self.hd, bias=bias)
        self.wv = nn.Linear(d, n_kv * self.hd, bias=bias)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x, freqs, fused: bool):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_head, self.hd)
        k = self.wk(x).view(b, t, self.n_kv, self.hd)
        v = self.wv(x).view(b, t, self.n_kv, self.hd)
        q, k = rotary(q, freqs), rotary(k, freqs)
        repeat = self.n_head // self.n_kv
        if repeat > 1:  # grouped-query attention: each K/V head serves `repeat` query heads
            k = k[:, :, :, None, :].expand(b, t, self.n_kv, repeat, self.hd).reshape(b, t, self.n_head, self.hd)
            v = v[:, :, :, None, :].expand(b, t, self.n_kv, repeat, self.hd).reshape(b, t, self.n_head, self.hd)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # written out: the T×T scores in memory
            att = (q @ k.transpose(-2, -1)) * self.hd ** -0.5
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) · w3(x)), torchtitan's `feed_forward`."""

    def __init__(self, d: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(d, ffn, bias=False)
        self.w3 = nn.Linear(d, ffn, bias=False)
        self.w2 = nn.Linear(ffn, d, bias=False)

    def forward(self, h):
        return self.w2(F.silu(self.w1(h)) * self.w3(h))


class Block(nn.Module):
    def __init__(self, shape, bias: bool):
        super().__init__()
        d = shape.d
        self.attention_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)
        self.attention = Attention(d, shape.n_head, shape.n_kv_head, bias)
        self.feed_forward = FeedForward(d, shape.ffn)

    def forward(self, x, freqs, fused: bool):
        x = x + self.attention(self.attention_norm(x), freqs, fused)
        return x + self.feed_forward(self.ffn_norm(x))


class LlamaLayout(nn.Module):
    """Token embedding, `n_layer` blocks, the final norm and the head (tied or not) of a Llama-layout shape."""

    def __init__(self, shape, n_layer: int, fused_attention: bool):
        super().__init__()
        bias = len(shape.block) > 9  # llama_shape adds Qwen2's q, k, v biases to the block's nine tensors
        self.fused = fused_attention
        self.hd = shape.d // shape.n_head
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.d)
        self.layers = nn.ModuleList(Block(shape, bias) for _ in range(n_layer))
        self.norm = RMSNorm(shape.d)
        self.output = None if shape.head_tied else nn.Linear(shape.d, shape.vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        inv = 1.0 / (500000.0 ** (torch.arange(0, self.hd, 2, device=ids.device).float() / self.hd))
        angles = torch.outer(torch.arange(t, device=ids.device).float(), inv)
        freqs = torch.polar(torch.ones_like(angles), angles)
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, freqs, self.fused)
        x = self.norm(x)
        return self.output(x) if self.output is not None else x @ self.tok_embeddings.weight.t()
