"""KV caches for the built-in GPT (and any model written to its convention): keep each layer's keys and values so a decode step reads one new token.

Without a cache, generating token t runs the whole sequence of t tokens through the model again; with one,
each step computes the keys and values of the new token only and attends to the ones kept from before.

- `DynamicKVCache` appends each step's keys and values (`torch.cat`): memory follows the sequence, but the
  shapes change at every step (a compiled step sees a new shape each time).
- `StaticKVCache` is preallocated to the longest sequence and written in place at the positions passed in
  as a tensor (`index_copy_`), as Llama 3's reference code and gpt-fast do: every decode step has the same
  shapes, so a compiled decode step is one graph, whatever the position.

- `static-int8` and `dynamic-int8`: the same two, with keys and values stored as int8 and one fp32 scale per
  (row, head, position): symmetric rounding of each head's vector at each position to 127 levels.  A position
  is quantized once, when it is written, and never again (a scale shared by a block of several positions
  would have to re-round the block's earlier entries as it fills); attention reads them dequantized.  Bytes
  per position and layer: 2 × heads × (head_dim + 4) instead of 2 × heads × head_dim × 4 in fp32.

Every cache can be cut back to a length (`crop`): speculative decoding writes draft tokens it may reject.
A dynamic cache drops the rejected positions; a static one needs nothing, since attention masks every key
after the query's position and the next write overwrites them.

Both are filled by `GPT.forward(idx, cache=..., input_pos=...)`; `input_pos` holds the absolute positions
of the tokens in `idx` (shape (T,)).  The convention, for a model of your own: layer i calls
`cache.layers[i].update(k, v, input_pos)` with its keys and values (B, heads, T, head_dim) and attends over
what it returns; `cache.key_positions(T, device)` are the positions of those keys (mask the ones after each
query's position: a static cache's unwritten slots are among them).
"""

from __future__ import annotations

import torch

CACHE_KINDS = ("dynamic", "static", "static-int8", "dynamic-int8")
INT8_KINDS = ("static-int8", "dynamic-int8")


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, nh, T, hs) as int8 and one fp32 scale per (B, nh, T): symmetric, round to nearest, 127 levels."""
    scale = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-8) / 127.0  # (B, nh, T, 1)
    q = torch.round(x.float() / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


class DynamicLayer:
    """One layer's keys and values, grown by concatenation."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # (B, nh, length, hs)
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor):
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v) if t is not None]

    def crop(self, length: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]


class StaticLayer:
    """One layer's keys and values in buffers of the maximum length, written in place."""

    def __init__(self, max_len: int, device) -> None:
        self.max_len, self.device = max_len, device
        # allocated at the first update, in the shape (batch, heads, max_len, head_dim) and dtype of the keys
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor):
        if self.k is None:
            B, nh, _, hs = k.shape
            self.k = torch.zeros((B, nh, self.max_len, hs), dtype=k.dtype, device=self.device)
            self.v = torch.zeros((B, nh, self.max_len, v.shape[-1]), dtype=v.dtype, device=self.device)
        self.k.index_copy_(2, input_pos, k.to(self.k.dtype))  # (B, nh, T, hs) written at positions input_pos
        self.v.index_copy_(2, input_pos, v.to(self.v.dtype))
        return self.k, self.v

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v) if t is not None]

    def crop(self, length: int) -> None:
        """Nothing to do: keys after a query's position are masked, and the next write overwrites them."""


class Int8DynamicLayer(DynamicLayer):
    """Keys and values appended as int8 with a scale per (row, head, position); returned dequantized."""

    def __init__(self) -> None:
        super().__init__()
        self.ks = self.vs = None  # (B, nh, length, 1) fp32 scales

    def update(self, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor):
        (kq, ks), (vq, vs) = quantize_int8(k), quantize_int8(v)
        if self.k is None:
            self.k, self.ks, self.v, self.vs = kq, ks, vq, vs
        else:
            self.k, self.ks = torch.cat([self.k, kq], dim=2), torch.cat([self.ks, ks], dim=2)
            self.v, self.vs = torch.cat([self.v, vq], dim=2), torch.cat([self.vs, vs], dim=2)
        return dequantize_int8(self.k, self.ks, k.dtype), dequantize_int8(self.v, self.vs, v.dtype)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.ks, self.v, self.vs) if t is not None]

    def crop(self, length: int) -> None:
        if self.k is not None:
            self.k, self.ks = self.k[:, :, :length], self.ks[:, :, :length]
            self.v, self.vs = self.v[:, :, :length], self.vs[:, :, :length]


class Int8StaticLayer(StaticLayer):
    """A static layer whose buffers are int8, with an fp32 scale per (row, head, position)."""

    def __init__(self, max_len: int, device) -> None:
        super().__init__(max_len, device)
        self.ks = self.vs = None

    def update(self, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor):
        if self.k is None:
            B, nh, _, hs = k.shape
            self.k = torch.zeros((B, nh, self.max_len, hs), dtype=torch.int8, device=self.device)
            self.v = torch.zeros((B, nh, self.max_len, v.shape[-1]), dtype=torch.int8, device=self.device)
            self.ks = torch.zeros((B, nh, self.max_len, 1), dtype=torch.float32, device=self.device)
            self.vs = torch.zeros((B, nh, self.max_len, 1), dtype=torch.float32, device=self.device)
        for buf, scales, x in ((self.k, self.ks, k), (self.v, self.vs, v)):
            q, scale = quantize_int8(x)
            buf.index_copy_(2, input_pos, q)
            scales.index_copy_(2, input_pos, scale)
        return dequantize_int8(self.k, self.ks, k.dtype), dequantize_int8(self.v, self.vs, v.dtype)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.ks, self.v, self.vs) if t is not None]


class DynamicKVCache:
    """Keys and values appended at every step: the cache is as long as the sequence so far."""

    static = False

    def __init__(self, n_layer: int, layer: type = DynamicLayer) -> None:
        self.layers = [layer() for _ in range(n_layer)]

    @property
    def length(self) -> int:
        k = self.layers[0].k
        return 0 if k is None else k.shape[2]

    def key_positions(self, new_tokens: int, device) -> torch.Tensor:
        """Positions of the keys attention will see once `new_tokens` more are added."""
        return torch.arange(self.length + new_tokens, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.tensors()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (rejected draft tokens are dropped)."""
        for layer in self.layers:
            layer.crop(length)


class StaticKVCache:
    """Keys and values preallocated to `max_len` positions: unwritten positions are masked out."""

    static = True

    def __init__(self, n_layer: int, max_len: int, device, layer: type = StaticLayer) -> None:
        self.max_len = max_len
        self.layers = [layer(max_len, device) for _ in range(n_layer)]
        self.positions = torch.arange(max_len, device=device)  # the keys' positions: one tensor, never remade

    def key_positions(self, new_tokens: int, device) -> torch.Tensor:
        return self.positions

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.tensors()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def crop(self, length: int) -> None:
        """Nothing to drop: keys after each query's position are masked, and overwritten by the next write."""


def make_cache(kind: str, n_layer: int, max_len: int, device):
    """A fresh cache of `kind` (one of CACHE_KINDS) for a model of `n_layer` attention layers."""
    if kind == "dynamic":
        return DynamicKVCache(n_layer)
    if kind == "static":
        return StaticKVCache(n_layer, max_len, device)
    if kind == "dynamic-int8":
        return DynamicKVCache(n_layer, Int8DynamicLayer)
    if kind == "static-int8":
        return StaticKVCache(n_layer, max_len, device, Int8StaticLayer)
    raise ValueError(f"KV cache kind must be one of {CACHE_KINDS}, got {kind!r}")
