"""KV cache: keep every layer's keys and values, so each decode step runs the new token only."""

from __future__ import annotations

from ..errors import ToggleUnavailable, toggle_why
from ..models.kv_cache import CACHE_KINDS
from .base import BuildContext, Toggle, Tune


class KVCache(Toggle):
    name = "kv_cache"
    summary = "keep keys and values across decode steps: each new token is one token of work, not the whole prefix"
    cost = ("memory for 2 × layers × batch × length × width values; 'static' preallocates the longest length; "
            "the int8 kinds round keys and values (a quarter of fp32's bytes, plus scales)")
    helps_when = "generating more than a few tokens: without it step t re-reads all t tokens (quadratic in total)"
    group = "inference"
    kind = "both"
    # a "model_config" toggle: it decides how the model's attention runs in generation (the decode loop reads
    # ctx.kv_cache and asks the model's family for a cache of that kind); compile, after it, wraps whichever
    # forward that is
    phase = "model_config"
    loops = ("generate",)
    # "dynamic" (appended with torch.cat), "static" (preallocated, written in place), and both with int8 keys and
    # values ("static-int8", "dynamic-int8": a scale per row, head and position)
    choices = CACHE_KINDS
    tuning = (Tune("dynamic", rank=20, loop="generate"), Tune("static", rank=30, loop="generate"),
              Tune("static-int8", rank=85, loop="generate", label="int8 KV cache"))
    plan_note = "kv_cache applies to the evaluation's sample (eval_every), not to a training step"

    def applies_to(self, adapter) -> tuple[bool, str]:
        # the built-in GPT's convention, gpt-fast's setup_caches, transformers' own caches: the family says
        return adapter.kv_cache_support()

    def choice_applies(self, adapter, value) -> tuple[bool, str]:
        return adapter.kv_cache_support(value)

    def apply(self, ctx: BuildContext, value: str) -> None:
        family = ctx.model_adapter  # None: the built-in GPT in a training run's evaluation
        if family is not None:
            ok, why = family.kv_cache_support(value)
            if not ok:
                raise ToggleUnavailable(toggle_why("kv_cache", why))
        # the decode loop asks the family for a fresh cache of this kind for each generation
        ctx.kv_cache = value


TOGGLE = KVCache()
