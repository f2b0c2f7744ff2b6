"""The inference ladder: a baseline generation, then the inference optimizations switched on one by one.

baseline (no_grad, no cache) → inference_mode → KV cache → static cache + compile → bf16 → int8 → 4-bit.
Each rung keeps the ones below it; the 4-bit rung replaces int8 (one quantization at a time).  Which int8
and 4-bit method: the first of each preference list that runs here (torchao's weight-only int8 for the
gpt-fast route, then bitsandbytes; HQQ's 4-bit, which packs two values per byte on any device, then
bitsandbytes nf4).  A rung this machine cannot run is kept as skipped with the reason; a rung that fails
is left out of the rungs above it.
"""

from __future__ import annotations

import dataclasses

from ..comparison.repeats import check_repeats, repeat_rows, timing_only
from ..machine.hardware import detect
from ..models.quantization import INT4_METHODS, INT8_METHODS
from ..toggles import TOGGLES
from ..training.config import RunConfig
from .config import GenerateConfig
from .engine import generate
from .results import GenerateResult

# (label, the toggles this rung sets; None marks "the first quantization method of this list that runs here")
INFERENCE_LADDER: tuple[tuple[str, dict], ...] = (
    ("+ inference_mode", {"inference_mode": True}),
    ("+ kv_cache", {"kv_cache": "dynamic"}),
    ("+ static cache + compile", {"kv_cache": "static", "compile": "default"}),
    ("+ bf16", {"bf16": True}),
    ("+ int8", {"quantize": INT8_METHODS}),
    ("+ 4-bit", {"quantize": INT4_METHODS}),
    ("+ int8 KV cache", {"kv_cache": "static-int8"}),
    # speculative decoding runs eagerly (every verification length would compile a graph): compile comes off
    ("+ speculative (draft), no compile", {"speculative": "draft", "compile": False}),
    ("+ prompt lookup instead of the draft", {"speculative": "prompt_lookup", "compile": False}),
)


def first_available(methods: tuple[str, ...], hw) -> tuple[str | None, str]:
    """The first quantization method of `methods` that runs here, or (None, why none does)."""
    reasons = []
    for method in methods:
        ok, why = TOGGLES["quantize"].choice_available(hw, method)
        if ok:
            return method, ""
        reasons.append(why)
    return None, "; ".join(reasons)


def as_generate_config(base: GenerateConfig | RunConfig | None, hw) -> GenerateConfig:
    """The ladder's generation: a GenerateConfig as given, or one made from a RunConfig (`scalekit ladder
    inference`): its preset (auto: the shipped model), device, seed and batch size (copies of the prompt)."""
    if isinstance(base, GenerateConfig):
        return base
    if base is None:
        return GenerateConfig()
    model = "shakespeare-char" if base.preset == "auto" else base.preset
    return GenerateConfig(model=model, device=base.device, seed=base.seed, prompts=["ROMEO:"] * (base.batch_size or 1))


def inference_ladder(base: GenerateConfig | RunConfig | None = None, rungs=INFERENCE_LADDER, on_status=None,
                     on_result=None, stop=None, repeats: int = 1) -> list[GenerateResult]:
    """The baseline generation, then each rung cumulatively; `repeats`: each row generated that many times, the
    order alternating (scalekit.comparison.repeats)."""
    check_repeats("inference_ladder(repeats=)", repeats)
    base_cfg = as_generate_config(base, None)
    hw = detect(base_cfg.device, "GenerateConfig")
    on: dict = dict(base_cfg.toggles)
    results: list[GenerateResult] = []
    configs: list[GenerateConfig | None] = []

    def keep(result: GenerateResult, cfg: GenerateConfig | None) -> None:
        results.append(result)
        configs.append(cfg)
        if on_result:
            on_result(result)

    first = dataclasses.replace(base_cfg, toggles=dict(on), label="baseline")
    keep(generate(first, on_status=on_status, stop=stop, hw=hw, catch_errors=True), first)
    for label, change in rungs:
        if stop is not None and stop.is_set() or results[-1].status == "stopped":
            break
        toggles, why = _rung_toggles(change, hw, base_cfg.family() if base_cfg.custom_model else None)
        if why:
            keep(GenerateResult(label=label, config={}, status="skipped", error=why, device=hw.device_name), None)
            continue
        cfg = dataclasses.replace(base_cfg, toggles={**on, **toggles}, label=label)
        why = _not_for_this_config(cfg, toggles)
        if why:
            keep(GenerateResult(label=label, config={}, status="skipped", error=why, device=hw.device_name), None)
            continue
        result = generate(cfg, on_status=on_status, stop=stop, hw=hw, catch_errors=True)
        if result.status not in ("failed",):
            on.update(toggles)  # climbed: the rungs above keep it
        keep(result, cfg)
    repeat_rows(results, lambda i: generate(timing_only(configs[i]), on_status=on_status, stop=stop, hw=hw,
                                                catch_errors=True),
                repeats, stop=stop, on_status=on_status)
    return results


def _not_for_this_config(cfg: GenerateConfig, toggles: dict) -> str:
    """Why a rung's toggles cannot apply to this config, known before building (a draft of another tokenizer)."""
    for name, value in toggles.items():
        if value is not False:
            ok, why = TOGGLES[name].config_applies(cfg, value)
            if not ok:
                return why
    return ""


def _rung_toggles(change: dict, hw, family=None) -> tuple[dict, str]:
    """The concrete toggles of a rung, or ({}, why this machine, or the model's family, cannot run it)."""
    toggles = {}
    for name, value in change.items():
        if value is False:  # switched off from this rung on
            toggles[name] = False
            continue
        if isinstance(value, tuple):
            value, why = first_available(value, hw)
            if value is None:
                return {}, why
        toggle = TOGGLES[name]
        if family is not None:
            ok, why = toggle.choice_applies(family, value)
            if not ok:
                return {}, f"{name} {why}"
        ok, why = toggle.choice_available(hw, value)
        if not ok:
            return {}, why
        toggles[name] = value
    return toggles, ""
