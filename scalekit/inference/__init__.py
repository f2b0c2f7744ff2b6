"""Generation: scalekit.generate(...) measures autoregressive decoding of the built-in GPT (or your model)
under the inference toggles — inference_mode, kv_cache, compile, sdpa, bf16, quantize.

The public names load on first use, so that the quantize toggle can import `inference.quantization`
while the toggles are being imported, without pulling in the generation engine (which imports them).
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "GenerateConfig": "config",
    "generate": "engine",
    "GenerateResult": "results",
    "TokenRecord": "results",
    "compare_generations": "results",
    "inference_ladder": "ladder",
    "INFERENCE_LADDER": "ladder",
    "weight_bytes": "weights",
}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
