"""Chunked cross-entropy: the output head and the loss computed a chunk of tokens at a time, never the whole logits."""

from __future__ import annotations

import importlib.util
from typing import Any

from ..errors import ConfigError
from .base import BuildContext, Toggle, Tune
from .counted import as_count

LIGER = "liger"


class ChunkedCrossEntropy(Toggle):
    name = "chunked_cross_entropy"
    summary = "the lm head and the loss chunk by chunk: the (batch × seq × vocab) logits never exist at once"
    cost = "the head's matmul runs again in backward (≈2·tokens·d·vocab more FLOPs); no logits to read back"
    helps_when = "the vocabulary is large against the width: GPT-2's 50,304 × 1,024 tokens × batch in fp32"
    group = "memory"
    kind = "memory"
    phase = "model_config"
    choices = (8, 2, 4, 16, LIGER)  # chunks of tokens, or Liger-Kernel's fused kernel; any count works
    tuning = (Tune((LIGER, 8), rank=125, label="chunked cross-entropy (to fit)", memory_only=True),)
    gpt_only = True  # the built-in GPT's head, or a model family's (Hugging Face: base model + output embeddings)

    def applies_to(self, adapter) -> tuple[bool, str]:
        return adapter.loss_chunking_support()

    def choice_available(self, hw, value: Any = True) -> tuple[bool, str]:
        if value != LIGER:
            return True, ""
        if hw.device_type != "cuda":
            return False, ("'liger' is Liger-Kernel's fused linear cross-entropy, Triton kernels for NVIDIA GPUs; "
                           "this run is on the CPU: use a chunk count (e.g. 8)")
        if not liger_installed():
            return False, "'liger' needs liger-kernel, which is not installed (pip install liger-kernel)"
        return True, ""

    def validate(self, value: Any, owner: str = "RunConfig") -> int | str:
        if value is True:
            return self.choices[0]
        if value == LIGER:
            return LIGER
        count = as_count(value)
        if count is None:
            raise ConfigError(f"{owner}.toggles['chunked_cross_entropy'] must be True (= {self.choices[0]} chunks), "
                              f"a positive whole number of chunks of tokens, or 'liger'; got {value!r}")
        return count

    def changes_nothing(self, cfg) -> str | None:
        if cfg.loss_fn is not None:
            return ("chunked_cross_entropy changes nothing for your loss_fn: it computes the loss from the model's "
                    "whole logits; leave loss_fn unset to use the model's own loss")
        return None

    def apply(self, ctx: BuildContext, value: int | str) -> None:
        # whether 'liger' runs here was asked before the build (choice_available, through check_available)
        if ctx.gpt_config is not None:
            ctx.gpt_config.loss_chunks = value  # the built-in GPT's forward with targets computes its loss so
        else:  # a model family's: Hugging Face runs the base model, then the output embeddings chunk by chunk
            ctx.model_adapter.chunk_loss(value)
        ctx.notes.append("loss head through Liger-Kernel's fused linear cross-entropy" if value == LIGER else
                         f"loss head in {value} chunks of tokens: the whole logits are never made")

    def traced(self, value) -> bool:
        return value != LIGER  # Triton kernels cannot run on fake tensors


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


TOGGLE = ChunkedCrossEntropy()
