"""A nanoGPT-style GPT: small enough to read in one sitting, shaped like GPT-2 at full size.

The attention implementation is a switch (`attention="manual"` or `"sdpa"`) so the SDPA toggle can swap
it, and the vocabulary can be padded (`padded_vocab_size`) so the nice-numbers toggle can round it up to a
multiple of 64 without changing what the model computes: padded logits are set to -inf, so they never
receive probability mass in the loss or in sampling.

For generation, `forward` also takes a KV cache (`scalekit.models.kv_cache`): the absolute positions of the
new tokens (`input_pos`, a tensor) and, for a batch of prompts of different lengths, how many padding
tokens each row starts with (`pad`, left padding: a row never attends to its padding, and its positions
count from its first real token).  Without them the forward is the training forward, unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .chunked_loss import head_loss

ATTENTION_IMPLS = ("manual", "sdpa")


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence the position table holds
    vocab_size: int = 50257  # real vocabulary (token ids are < vocab_size)
    padded_vocab_size: int | None = None  # rows in the embedding/lm_head; None means vocab_size
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    attention: str = "manual"  # "manual" (explicit softmax(QK^T)V) or "sdpa" (F.scaled_dot_product_attention)
    bias: bool = True
    # the training loss's head: None computes the (B, T, vocab) logits at once; a count computes the head and the
    # loss in that many chunks of tokens, 'liger' through Liger-Kernel's fused kernel (models.chunked_loss)
    loss_chunks: int | str | None = None

    @property
    def embedding_rows(self) -> int:
        return self.padded_vocab_size or self.vocab_size


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scale_init = True
        self.n_head = cfg.n_head
        self.attention = cfg.attention
        if cfg.attention == "manual":
            mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
            self.register_buffer("causal_mask", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def forward(self, x: torch.Tensor, cache=None, input_pos: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        # (under tensor_parallel a rank holds n_head/ranks heads: the widths come from the tensors)
        q, k, v = self.c_attn(x).chunk(3, dim=2)
        hs = q.shape[-1] // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if cache is not None:
            k, v = cache.update(k, v, input_pos)  # (B, nh, L, hs): the keys and values kept, these included
        # mask: None is causal over these T tokens (training); else (B or 1, 1, T, L), True where attended
        if self.attention == "sdpa":
            # fused kernel where the device has one
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, L)
            keep = self.causal_mask[:, :, :T, :T] if mask is None else mask
            att = att.masked_fill(~keep, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scale_init = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache=None, input_pos: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, input_pos, mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.attention not in ATTENTION_IMPLS:
            raise ValueError(f"GPTConfig.attention must be one of {ATTENTION_IMPLS}, got {cfg.attention!r}")
        if cfg.embedding_rows < cfg.vocab_size:
            raise ValueError("GPTConfig.padded_vocab_size must be >= vocab_size")
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.embedding_rows, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.embedding_rows, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying (GPT-2)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2 init; residual projections scaled by 1/sqrt(2 * n_layer)
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_scale_init", False):
                std *= (2 * self.config.n_layer) ** -0.5
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once (tied weights once); without the position table and padded vocab rows."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
            n -= (self.config.embedding_rows - self.config.vocab_size) * self.config.n_embd
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, cache=None,
                input_pos: torch.Tensor | None = None, pad: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        if cache is None and pad is None:  # training, and generation without a cache or padding
            mask, pos = None, torch.arange(T, device=idx.device)
        else:
            mask, pos, input_pos = self._generation_mask(T, idx.device, cache, input_pos, pad)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            # training calls block(x) alone: activation checkpointing wraps exactly that call
            x = block(x) if mask is None else block(x, None if cache is None else cache.layers[i], input_pos, mask)
        x = self.transformer.ln_f(x)
        V = self.config.vocab_size
        if targets is not None and self.config.loss_chunks and cache is None:
            # the logits are never made whole: the head and the loss run chunk by chunk (no logits returned)
            return None, head_loss(x, self.lm_head.weight, targets, self.config.loss_chunks, valid_vocab=V)
        logits = self.lm_head(x)  # (B, T, embedding_rows)
        if logits.size(-1) > V:
            # padded rows are not tokens: -inf gives them zero probability and zero gradient.
            # (in place is safe: the matmul's backward needs its inputs, not its output)
            logits[..., V:] = float("-inf")
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits[..., :V], loss

    def _generation_mask(self, T: int, device, cache, input_pos, pad):
        """The attention mask (B or 1, 1, T, L), the position ids and the positions (T,) of T new tokens."""
        if input_pos is None:
            if cache is not None and cache.static:
                raise ValueError("a static KV cache is written at the positions given: pass input_pos")
            start = 0 if cache is None else cache.length
            input_pos = torch.arange(start, start + T, device=device)
        keys = torch.arange(T, device=device) if cache is None else cache.key_positions(T, device)  # (L,)
        mask = (keys[None, :] <= input_pos[:, None])[None]  # (1, T, L): causal by position, unwritten slots out
        pos = input_pos
        if pad is not None:
            # a row never attends to its left padding; a padding position sees itself (a row of nothing but
            # -inf would give NaN), and real tokens count their positions from the row's first real one
            real = (keys[None, None, :] >= pad[:, None, None]) | (keys[None, None, :] == input_pos[None, :, None])
            mask = mask & real  # (B, T, L)
            pos = (input_pos[None, :] - pad[:, None]).clamp_min(0)  # (B, T)
        return mask.unsqueeze(1), pos, input_pos  # mask (B or 1, 1, T, L): the same for every head

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample tokens autoregressively (no KV cache: each step re-reads the whole context)."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size:]
            logits, _ = self(ctx)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = float("-inf")
            probs = F.softmax(logits.float(), dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
