"""KV caches for the built-in GPT (and any model written to its convention): keep each layer's keys and values so a decode step reads one new token.

Without a cache, generating token t runs the whole sequence of t tokens through the model again; with one,
each step computes the keys and values of the new token only and attends to the ones kept from before.

- `DynamicKVCache` appends each step's keys and values (`torch.cat`): memory follows the sequence, but the
  shapes change at every step (a compiled step sees a new shape each time).
- `StaticKVCache` is preallocated to the longest sequence and written in place at the positions passed in
  as a tensor (`index_copy_`), as Llama 3's reference code and gpt-fast do: every decode step has the same
  shapes, so a compiled decode step is one graph, whatever the position.

Both are filled by `GPT.forward(idx, cache=..., input_pos=...)`; `input_pos` holds the absolute positions
of the tokens in `idx` (shape (T,)).  The convention, for a model of your own: layer i calls
`cache.layers[i].update(k, v, input_pos)` with its keys and values (B, heads, T, head_dim) and attends over
what it returns; `cache.key_positions(T, device)` are the positions of those keys (mask the ones after each
query's position: a static cache's unwritten slots are among them).
"""

from __future__ import annotations

import torch

CACHE_KINDS = ("dynamic", "static")


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


class DynamicKVCache:
    """Keys and values appended at every step: the cache is as long as the sequence so far."""

    static = False

    def __init__(self, n_layer: int) -> None:
        self.layers = [DynamicLayer() for _ in range(n_layer)]

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


class StaticKVCache:
    """Keys and values preallocated to `max_len` positions: unwritten positions are masked out."""

    static = True

    def __init__(self, n_layer: int, max_len: int, device) -> None:
        self.max_len = max_len
        self.layers = [StaticLayer(max_len, device) for _ in range(n_layer)]
        self.positions = torch.arange(max_len, device=device)  # the keys' positions: one tensor, never remade

    def key_positions(self, new_tokens: int, device) -> torch.Tensor:
        return self.positions

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.tensors()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def make_cache(kind: str, n_layer: int, max_len: int, device):
    """A fresh cache of `kind` ('dynamic' or 'static') for a model of `n_layer` attention layers."""
    if kind == "dynamic":
        return DynamicKVCache(n_layer)
    if kind == "static":
        return StaticKVCache(n_layer, max_len, device)
    raise ValueError(f"KV cache kind must be one of {CACHE_KINDS}, got {kind!r}")
