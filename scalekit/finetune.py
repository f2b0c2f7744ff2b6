"""Fine-tuning the shipped model on plays it never saw: the standard configuration and its ladder.

`finetune_config()` is the shipped `shakespeare-char` GPT, started from its pretrained weights, trained on
the first 80% of the held-out tail of the corpus ("new-plays"), its loss on the rest measured before and
after.  `finetune_ladder` measures full fine-tuning, then each cheaper method alone (they are
alternatives, not a cumulative ladder): head only, LoRA, DoRA, QLoRA, and QLoRA with activation
checkpointing and an 8-bit optimizer.
"""

from __future__ import annotations

import dataclasses

from .config import RunConfig
from .engine import run
from .hardware import cuda_gpu_present, detect
from .measure.results import RunResult
from .rounds import check_repeats, repeat_rows, timing_only
from .toggles import TOGGLES

PRESET = "shakespeare-char"
LR = 3e-4  # a fine-tuning rate: a tenth of the pretraining peak (3e-3)
CPU_SEQ_LEN = 128  # the model's context is 1024; a CPU fine-tunes shorter windows in reasonable time

FINETUNE_RUNGS: tuple[tuple[str, dict], ...] = (
    ("full fine-tuning", {}),
    ("head only", {"head_only": True}),
    ("LoRA r=8", {"lora": 8}),
    ("DoRA r=8", {"dora": 8}),
    ("QLoRA (nf4 base, LoRA r=8)", {"lora": 8, "quantized_base": "nf4"}),
    ("QLoRA + checkpointing + 8-bit AdamW", {"lora": 8, "quantized_base": "nf4", "checkpointing": 1,
                                            "optim": "adamw_bnb_8bit"}),
)


def finetune_config(**overrides) -> RunConfig:
    """The shipped model, pretrained weights, the new plays; any RunConfig field can be overridden."""
    fields = dict(preset=PRESET, init="pretrained", data="new-plays", lr=LR,
                  seq_len=None if cuda_gpu_present() else CPU_SEQ_LEN)
    fields.update(overrides)
    return RunConfig(**fields)


def finetune_ladder(base: RunConfig | None = None, rungs=FINETUNE_RUNGS, on_status=None, on_result=None,
                    stop=None, repeats: int = 1) -> list[RunResult]:
    """Each fine-tuning method on the same model, data and steps; a rung this machine cannot run is skipped
    with the reason.  `base` (e.g. from the command line) gives steps, batch and the like; its preset, data
    and starting weights are the fine-tuning ones unless it names its own.  `repeats`: each row measured that
    many times, the order alternating (scalekit.rounds)."""
    check_repeats("finetune_ladder(repeats=)", repeats)
    base = _finetune_base(base)
    hw = detect(base.device)
    results, configs = [], []
    for label, toggles in rungs:
        if stop is not None and stop.is_set():
            break
        why = next((w for n in toggles if not (w := TOGGLES[n].available(hw))[0]), None)
        cfg = None if why is not None else dataclasses.replace(base, toggles={**base.toggles, **toggles}, label=label)
        if cfg is None:
            result = RunResult(label=label, config={}, status="skipped", error=why[1], device=hw.device_name)
        else:
            result = run(cfg, on_status=on_status, stop=stop, hw=hw, catch_errors=True)
        results.append(result)
        configs.append(cfg)
        if on_result:
            on_result(result)
        if result.status == "stopped":
            break
    repeat_rows(results, lambda i: run(timing_only(configs[i]), on_status=on_status, stop=stop, hw=hw,
                                           catch_errors=True),
                repeats, stop=stop, on_status=on_status)
    return results


def _finetune_base(base: RunConfig | None) -> RunConfig:
    if base is None:
        return finetune_config()
    if base.preset == "auto" and not base.custom_model:  # the command line's default: the fine-tuning model
        return finetune_config(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                                  if f.name not in ("preset", "init", "data", "lr", "seq_len")
                                  and getattr(base, f.name) != f.default
                                  and f.default_factory is dataclasses.MISSING},
                               **({"seq_len": base.seq_len} if base.seq_len else {}))
    return base
