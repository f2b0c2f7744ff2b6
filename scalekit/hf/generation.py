"""Generation on Hugging Face causal LMs the Transformers way: its own cache classes, positions and masks.

A decode step is the model's forward with a `DynamicCache` (grown by concatenation) or a `StaticCache`
(preallocated, written in place: transformers' compile path), the absolute positions of the new tokens as
`position_ids` (and `cache_position` where the installed transformers still takes it), and, for prompts
of different lengths, a 2-D `attention_mask` that is 0 on each row's left padding.  Logits come out of the
`ModelOutput` (`.logits`); the prefill asks for the last position's only (`logits_to_keep=1`), as
`generate()` does.  Nothing here names a model family: what a class supports is read from the class.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
from typing import Any

import torch

from ..optional import quiet_import


@functools.lru_cache(maxsize=64)
def _forward_parameters(cls: type) -> frozenset:
    return frozenset(inspect.signature(cls.forward).parameters)


def kv_cache_support(cls: type, kind: str | None, config=None) -> tuple[bool, str]:
    """Whether transformers keeps a KV cache of `kind` for models of `cls` (of transformers config `config`, where
    known), and why not."""
    if getattr(cls, "_is_stateful", False):
        return False, f"needs a KV cache, and {cls.__name__} keeps a recurrent state instead"
    if kind == "static" and not getattr(cls, "_can_compile_fullgraph", False):
        return False, f"='static' needs transformers' StaticCache, which {cls.__name__} does not support"
    if kind == "static-int8":
        return False, (f"='static-int8': transformers' quantized cache (QuantizedCache), the one {cls.__name__} can "
                       f"keep, grows with the sequence; use kv_cache='dynamic-int8' on a Hugging Face model")
    if kind == "dynamic-int8" and importlib.util.find_spec("hqq") is None:
        return False, ("='dynamic-int8' needs transformers' QuantizedCache with its hqq backend, and hqq is not "
                       "installed (pip install 'scalekit[quant]')")
    if kind == "dynamic-int8" and config is not None:
        return quantized_cache_support(cls, config)
    return True, ""


# values per HQQ group in the int8 cache: at most KV_GROUP_VALUES, and a divisor of each position's keys (kv heads ×
# head dim), so that any batch × positions quantizes in whole groups; below KV_MIN_GROUP_VALUES the group's scale and
# zero (2 bytes each) would cost more than half the int8 codes they describe
KV_GROUP_VALUES = 64
KV_MIN_GROUP_VALUES = 8


def kv_group_values(config) -> int:
    """The HQQ group size for `config`'s int8 cache: the largest divisor of KV_GROUP_VALUES that divides each
    position's keys (KV_GROUP_VALUES where the config does not say its head shape)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kv_heads, head_dim = kv_head_shape(text)
    return math.gcd(KV_GROUP_VALUES, kv_heads * head_dim) if kv_heads and head_dim else KV_GROUP_VALUES


def quantized_cache_support(cls: type, config) -> tuple[bool, str]:
    """Whether transformers' QuantizedCache (hqq backend) can hold the keys and values of a model of `config`:
    every layer full attention (it keeps no sliding window), and each position's keys a whole number of groups of
    at least KV_MIN_GROUP_VALUES values (hqq quantizes a (batch, kv heads, positions, head dim) tensor in groups
    and stops on one whose size does not divide)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    others = sorted(set(attention_layer_types(text)) - {"full_attention"})
    if others:
        return False, (f"='dynamic-int8': transformers' QuantizedCache keeps full-attention layers only, and "
                       f"{cls.__name__} has {', '.join(others)} layers: use kv_cache='dynamic'")
    group = kv_group_values(config)
    if group < KV_MIN_GROUP_VALUES:
        kv_heads, head_dim = kv_head_shape(text)
        return False, (f"='dynamic-int8': transformers' QuantizedCache quantizes keys in groups (hqq) that must divide "
                       f"each position's keys, and {cls.__name__} keeps {kv_heads} kv head(s) × head dim {head_dim} = "
                       f"{kv_heads * head_dim} values per position: groups of {group} would hold more scale than "
                       f"codes; use kv_cache='dynamic'")
    return True, ""


def attention_layer_types(config) -> list[str]:
    """Each layer's attention kind as transformers' caches read it: `layer_types` where the config lists them, else
    every layer 'sliding_attention' where a sliding window is set (and not switched off by use_sliding_window),
    'chunked_attention' where an attention chunk size is, 'full_attention' otherwise."""
    listed = getattr(config, "layer_types", None)
    if listed:
        return list(listed)
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True) is not False:
        kind = "sliding_attention"
    elif getattr(config, "attention_chunk_size", None) is not None:
        kind = "chunked_attention"
    else:
        kind = "full_attention"
    return [kind] * int(getattr(config, "num_hidden_layers", 1) or 1)


def kv_head_shape(config) -> tuple[int | None, int | None]:
    """(key/value heads, head dim) of a transformers config: num_key_value_heads (Falcon's multi-query says 1),
    else as many as the attention heads; head_dim, else the width over the heads.  None where the config says
    neither."""
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    hidden = getattr(config, "hidden_size", None)
    if not head_dim and heads and hidden:
        head_dim = hidden // heads
    return kv_heads, head_dim


def new_cache(model, kind: str, max_len: int):
    """A fresh transformers cache: DynamicCache, or a StaticCache of `max_len` positions."""
    transformers = quiet_import("transformers")

    if kind == "static":
        return transformers.StaticCache(config=model.config, max_cache_len=max_len)
    if kind == "dynamic-int8":
        # HQQ's 8-bit groups along the channels; transformers keeps its default window of recent positions
        # (residual_length) in full precision and quantizes them all together when it fills
        return transformers.QuantizedCache(backend="hqq", config=model.config, nbits=8,
                                           q_group_size=kv_group_values(model.config))
    return transformers.DynamicCache(config=model.config)


def cache_bytes(cache: Any) -> int:
    """Bytes of every tensor the cache's layers hold: keys, values, and a quantized cache's codes and scales."""
    tensors = []
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values", "_quantized_keys", "_quantized_values"):
            tensors.extend(_tensors_in(getattr(layer, name, None)))
    return sum(t.numel() * t.element_size() for t in tensors)


def _tensors_in(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    return []


def rollback(cache, length: int) -> None:
    """Keep the first `length` positions of a transformers cache (speculative decoding's rejected drafts)."""
    transformers = quiet_import("transformers")

    if isinstance(cache, transformers.StaticCache):
        raise NotImplementedError("transformers' StaticCache counts the positions written itself and cannot be cut "
                                  "back; use kv_cache='dynamic'")
    if isinstance(cache, transformers.QuantizedCache):
        raise NotImplementedError("transformers' QuantizedCache cannot be cut back to a shorter length")
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # a negative count removes that many positions, in transformers 4 and 5 alike


def logits(model, ids: torch.Tensor, cache=None, input_pos=None, pad=None, last_only: bool = False):
    """(B, T or 1, vocab) logits of `ids` at positions `input_pos` (None: 0..T-1), through the model's cache."""
    params = _forward_parameters(type(model._orig_mod if hasattr(model, "_orig_mod") else model))
    T = ids.shape[1]
    pos = input_pos if input_pos is not None else torch.arange(T, device=ids.device)
    kwargs: dict[str, Any] = {"use_cache": cache is not None}
    if cache is not None:
        kwargs["cache" if "cache" in params else "past_key_values"] = cache
    if "cache_position" in params:
        kwargs["cache_position"] = pos
    if pad is None:
        kwargs["position_ids"] = pos[None]
    else:  # each row's positions count from its first real token; its padding is never attended to
        kwargs["position_ids"] = (pos[None, :] - pad[:, None]).clamp_min(0)
        length = T if cache is None else int(pos[-1]) + 1  # keys so far, these included
        keys = torch.arange(length, device=ids.device)
        kwargs["attention_mask"] = (keys[None, :] >= pad[:, None]).long()
    if last_only and "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    return model(input_ids=ids, **kwargs).logits
