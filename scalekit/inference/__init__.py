"""Generation: scalekit.generate(...) measures autoregressive decoding of the built-in GPT (or your model)
under the inference toggles — inference_mode, kv_cache, compile, sdpa, bf16, quantize."""

from __future__ import annotations

from .config import GenerateConfig
from .engine import generate
from .ladder import INFERENCE_LADDER, inference_ladder
from .results import GenerateResult, TokenRecord, compare_generations
from .weights import weight_bytes

__all__ = ["GenerateConfig", "generate", "GenerateResult", "TokenRecord", "compare_generations", "inference_ladder",
           "INFERENCE_LADDER", "weight_bytes"]
