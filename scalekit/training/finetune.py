"""Fine-tuning the shipped model on plays it never saw: the standard configuration and its ladder.

`finetune_config()` is the shipped `shakespeare-char` GPT, started from its pretrained weights, trained on
the first 80% of the held-out tail of the corpus ("new-plays"), its loss on the rest measured before and
after.  `finetune_ladder` measures full fine-tuning, then each cheaper method alone (they are
alternatives, not a cumulative ladder): head only, LoRA, DoRA, QLoRA, and QLoRA with activation
checkpointing and an 8-bit optimizer.  Adapters (and a head alone: the toggles that declare
`trains_few_weights`) train at `ADAPTER_LR`, the full model at `LR`: each method at a rate that suits it.
`heldout_curve` trains one configuration and reads the held-out loss every few steps, with the engine's one
definition of it (`scalekit.training.engine.heldout_tokens`).
"""

from __future__ import annotations

import contextlib
import dataclasses

from ..comparison.repeats import check_repeats, repeat_rows, timing_only
from ..data.files import is_data_path
from ..errors import ToggleUnavailable
from ..machine.hardware import cuda_gpu_present, detect
from ..measure.session import pin_threads
from ..models.pretrained import heldout_loss
from ..toggles import TOGGLES
from .build import build, train_step
from .config import RunConfig
from .engine import heldout_tokens, run
from .results import RunResult

PRESET = "shakespeare-char"
LR = 3e-4  # full fine-tuning's rate: a tenth of the pretraining peak (3e-3)
# Adapters are few values and B starts at zero, so their update begins small: at LR they barely move in a short
# run (chapter 09 measures it); ten times the full model's rate suits them, and a head alone too.
ADAPTER_LR = 3e-3
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


def method_lr(toggles: dict, lr: float, adapter_lr: float | None) -> float:
    """The learning rate of a method: `adapter_lr` for runs that train adapters or a head alone (a toggle that
    declares `trains_few_weights` is on; when given), `lr` for the rest."""
    if adapter_lr is not None and any(TOGGLES[name].trains_few_weights for name, value in toggles.items()
                                      if value is not False and value is not None):
        return adapter_lr
    return lr


def finetune_ladder(base: RunConfig | None = None, rungs=FINETUNE_RUNGS, on_status=None, on_result=None,
                    stop=None, repeats: int = 1, adapter_lr: float | None = None) -> list[RunResult]:
    """Each fine-tuning method on the same model, data and steps; a rung this machine cannot run is skipped
    with the reason.  `base` (e.g. from the command line) gives steps, batch and the like; its preset, data
    and starting weights are the fine-tuning ones unless it names its own.  `repeats`: each row measured that
    many times, the order alternating (scalekit.comparison.repeats).  `adapter_lr`: the rate of the rows that train
    adapters or a head alone (None: base.lr for every row)."""
    check_repeats("finetune_ladder(repeats=)", repeats)
    base = _finetune_base(base)
    hw = detect(base.device)
    results, configs = [], []
    for label, toggles in rungs:
        if stop is not None and stop.is_set():
            break
        both = {**base.toggles, **toggles}
        cfg = dataclasses.replace(base, toggles=both, label=label, lr=method_lr(both, base.lr, adapter_lr))
        why = unavailable_here(cfg, hw)
        if why is not None:
            cfg = None
            result = RunResult(label=label, config={}, status="skipped", error=why, device=hw.device_name)
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


def unavailable_here(cfg: RunConfig, hw) -> str | None:
    """Why `cfg` cannot run on `hw` (the first of its toggles or modes that cannot, named, with the reason
    check_available gives), or None when it can."""
    try:
        cfg.check_available(hw)
    except ToggleUnavailable as exc:
        return str(exc)
    return None


def _finetune_base(base: RunConfig | None) -> RunConfig:
    if base is None:
        return finetune_config()
    if base.preset == "auto" and not base.custom_model:  # the command line's default: the fine-tuning model
        return finetune_config(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                                  if f.name not in ("preset", "init", "lr", "seq_len")
                                  and (f.name != "data" or is_data_path(base.data))
                                  and getattr(base, f.name) != f.default
                                  and f.default_factory is dataclasses.MISSING},
                               **({"seq_len": base.seq_len} if base.seq_len else {}))
    return base


def heldout_curve(config: RunConfig, every: int, hw=None) -> list[tuple[int, float]]:
    """Train `config` for config.steps steps (its warm-up steps included in none of them) and read the held-out
    loss before the first step and after every `every` steps: [(step, nats per token), ...].  The held-out
    text is the engine's, as a run's heldout_loss_before/after reads it (the first windows of the data's
    held-out part), so a curve's ends and a run's before/after are the same measurement.  Untimed."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"heldout_curve(every=...) must be a positive number of steps, got {every!r}")
    hw = hw or detect(config.device)
    cfg = config.resolve(hw)
    tokens = heldout_tokens(cfg)
    if tokens is None:
        raise ValueError(f"heldout_curve: RunConfig.data={cfg.data!r} has no held-out part (fine-tuning data such "
                         f"as 'new-plays' has)")
    cfg.check_available(hw)  # refused before building, as a run is
    with contextlib.ExitStack() as stack:
        pin_threads(stack, cfg.threads)
        ctx = build(cfg, hw, stack)
        points = [(0, heldout_loss(ctx.base_model, tokens, cfg.seq_len))]
        for step in range(1, cfg.steps + 1):
            train_step(ctx, next(ctx.batches))
            if step % every == 0 or step == cfg.steps:
                points.append((step, heldout_loss(ctx.base_model, tokens, cfg.seq_len)))
        del ctx
    return points
