"""Models of your own in generation: the two written-down conventions scalekit keeps a KV cache for.

- scalekit's (the built-in GPT's): `forward(idx, cache=..., input_pos=...)`, and optionally `pad=...` for
  left-padded prompts of different lengths.  scalekit makes the cache (models/kv_cache.py, dynamic or
  static) and passes it in; layer i calls `cache.layers[i].update(k, v, input_pos)`.
- gpt-fast's and Llama 3's reference code's: `setup_caches(max_batch_size, max_seq_length)` allocates a
  static cache inside each attention layer, and `forward(idx, input_pos)` writes the new keys and values at
  `input_pos` and attends over the cache.  Such a model has no forward without its cache: without the
  kv_cache toggle, every step runs the whole sequence again at positions 0..T-1 (the same work as no cache).

Anything else is a plain language model: forward(idx) -> logits, and no cache (the kv_cache toggle says
which conventions would give it one).  The family is read from the model's class, never from its name.
A forward may return the last position's logits alone (nanoGPT's without targets: (B, 1, vocab)): decoding
reads only that one, so such a model generates; what needs every position (held-out perplexity, speculative
verification) finds out from one short forward and says so in one line (scalekit.inference.loop.probe_positions).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import inspect
import weakref
from typing import Any

import torch

from ..errors import ConfigError
from .blocks import block_list
from .family import CACHE_CONVENTIONS, ModelAdapter, logits_of
from .gpt import GPT
from .kv_cache import CACHE_KINDS, make_cache


class OwnModel(ModelAdapter):
    """A model of your own (an nn.Module, or a function building one): forward(idx) -> logits, no cache."""

    def __init__(self, source: Any, cls: type | None = None):
        self.source = source
        self.cls = cls or (type(source) if isinstance(source, torch.nn.Module) else None)

    @property
    def family(self) -> str:
        return f"your model ({self.cls.__name__})" if self.cls is not None else "your model"

    def build(self) -> torch.nn.Module:
        model = copy.deepcopy(self.source) if isinstance(self.source, torch.nn.Module) else self.source()
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"GenerateConfig.model() returned {type(model).__name__}, not an nn.Module")
        return model

    def _config_value(self, *names: str) -> int | None:
        """A size read from the model's `config` (as nanoGPT-style and gpt-fast-style models keep one)."""
        config = getattr(self.source, "config", None)
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def logits(self, model, ids, cache=None, input_pos=None, pad=None, last_only=False):
        return self.forward(model, ids)

    def forward(self, model, ids, *args, **kwargs) -> torch.Tensor:
        """The model's logits for token ids, or a one-line refusal naming the family when it is not a language
        model (a ConvNet's forward does not take (B, T) token ids)."""
        try:
            return logits_of(model(ids, *args, **kwargs))
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise ConfigError(f"{self.family} cannot generate: its forward, given token ids (batch, length), raised "
                              f"{type(exc).__name__}: {first}; generation needs a language model whose forward "
                              f"returns logits (batch, length, vocab)") from exc

    @property
    def context_len(self) -> int | None:
        return self._config_value("block_size", "max_seq_len", "max_position_embeddings")

    @property
    def vocab_size(self) -> int | None:
        """config.vocab_size, else the rows of the model's first embedding (its token table), else None."""
        size = self._config_value("vocab_size")
        if size is None and isinstance(self.source, torch.nn.Module):
            table = next((m for m in self.source.modules() if isinstance(m, torch.nn.Embedding)), None)
            size = None if table is None else table.num_embeddings
        return size


class ScalekitCacheLM(OwnModel):
    """The built-in GPT's convention: forward(idx, cache=..., input_pos=..., [pad=...]); scalekit makes the cache."""

    @property
    def family(self) -> str:
        return "the built-in GPT" if self.source is None or isinstance(self.source, GPT) else super().family

    def kv_cache_support(self, kind: str | None = None) -> tuple[bool, str]:
        return True, ""

    def new_cache(self, model, kind, batch, max_len, device):
        return make_cache(kind, len(block_list(model)), max_len, device)

    def pads_prompts(self) -> bool:
        return self.cls is None or "pad" in inspect.signature(self.cls.forward).parameters

    def logits(self, model, ids, cache=None, input_pos=None, pad=None, last_only=False):
        kwargs = {} if cache is None else {"cache": cache, "input_pos": input_pos}
        if pad is not None:
            kwargs["pad"] = pad
        return self.forward(model, ids, **kwargs)


def cache_buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(module, name, tensor) of each buffer a gpt-fast-style model keeps its keys or values in: a buffer whose name
    holds "cache" (gpt-fast's k_cache and v_cache, Llama 3's cache_k and cache_v)."""
    return [(module, name, buffer) for module in model.modules() for name, buffer in module._buffers.items()
            if buffer is not None and "cache" in name]


def key_dtype(model: torch.nn.Module, device_type: str) -> torch.dtype | None:
    """The dtype the model's forward makes keys and values in: the autocast dtype where autocast is on (bf16
    computes them in bfloat16), else its weights' (None: a model without floating-point weights)."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


class ModelCache:
    """A handle on the cache a gpt-fast-style model keeps in its own buffers (setup_caches)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for _, _, b in cache_buffers(self.model))

    def crop(self, length: int) -> None:
        """Nothing to drop: the model masks keys after each query's position and overwrites them next."""


class SetupCachesLM(OwnModel):
    """gpt-fast's / Llama 3 reference code's convention: setup_caches(max_batch_size, max_seq_length), then
    forward(idx, input_pos) over the model's own static cache."""

    def kv_cache_support(self, kind: str | None = None) -> tuple[bool, str]:
        if kind in (None, "static"):
            return True, ""
        return False, (f"={kind!r}: {self.family} keeps the static cache setup_caches allocates inside it; "
                       f"use kv_cache='static'")

    def prepare(self, model, batch, max_len):
        """The model's own setup_caches, then its cache buffers made to fit this forward: `batch` rows and the dtype
        its keys come in.  Such a model keeps caches it allocated for more rows or positions (setup_caches returns
        early), and a copy measured on 8 held-out windows then generating 1 prompt would attend over 8 rows; and it
        allocates them in its weights' dtype, where bf16 autocast writes bfloat16 keys.  Run it under the autocast
        the forward runs under (scalekit.inference.loop.prepare_caches)."""
        model.setup_caches(max_batch_size=batch, max_seq_length=max_len)
        for module, name, buffer in cache_buffers(model):
            if buffer.dim() == 0:
                continue
            keys = key_dtype(model, buffer.device.type) if buffer.is_floating_point() else None
            dtype = keys or buffer.dtype
            if buffer.shape[0] != batch or buffer.dtype != dtype:  # a cache's first dimension is its rows
                module._buffers[name] = torch.zeros((batch, *buffer.shape[1:]), dtype=dtype, device=buffer.device)

    def new_cache(self, model, kind, batch, max_len, device):
        return ModelCache(model)

    def logits(self, model, ids, cache=None, input_pos=None, pad=None, last_only=False):
        if cache is None:  # no forward without the cache: the whole sequence again, at positions 0..T-1
            input_pos = torch.arange(ids.shape[1], device=ids.device)
        return self.forward(model, ids, input_pos)


def module_family(source: Any) -> OwnModel:
    """The convention a model of your own follows (read from its class), as its generation family."""
    cls = type(source) if isinstance(source, torch.nn.Module) else built_class(source)
    if cls is None:
        return OwnModel(source)
    if callable(getattr(cls, "setup_caches", None)):
        return SetupCachesLM(source, cls)
    params = inspect.signature(cls.forward).parameters
    if "cache" in params and "input_pos" in params:
        return ScalekitCacheLM(source, cls)
    return OwnModel(source, cls)


def built_class(factory) -> type | None:
    """The class a function builds, read by building it once on the meta device (no memory, no init), the global
    random state left as it was; read once per function (configs and families ask again as a run is made)."""
    try:
        return _BUILT_CLASSES[factory]
    except (KeyError, TypeError):  # not read yet, or a callable that cannot be a weak key: read now
        pass
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            built = factory()
    except Exception:  # a factory that cannot run on meta tensors: its convention is found when it is built
        built = None
    # a function that returns no module: the build refuses it, naming GenerateConfig.model
    cls = type(built) if isinstance(built, torch.nn.Module) else None
    if cls is not None:  # the probe goes now, even a model in a reference cycle (a hook's closure holding it):
        probe = weakref.ref(built)  # a run freezes the heap older than it, so no later collection would free it
        del built
        if probe() is not None:
            gc.collect()
    with contextlib.suppress(TypeError):
        _BUILT_CLASSES[factory] = cls
    return cls


_BUILT_CLASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # factory -> the class it builds (or None)


BUILTIN = ScalekitCacheLM(None)  # the built-in GPT in generation (scalekit builds it from its GPTConfig)
__all__ = ["BUILTIN", "CACHE_CONVENTIONS", "CACHE_KINDS", "ModelCache", "OwnModel", "ScalekitCacheLM",
           "SetupCachesLM", "cache_buffers", "key_dtype", "module_family"]
