"""LoRA and DoRA adapters on a model's linear layers, through peft: the machinery the lora, dora and
quantized_base toggles share (peft imported only when adapters are added)."""

from __future__ import annotations

import importlib.util
import warnings

import torch

from ..errors import ConfigError, ToggleUnavailable
from ..optional import quiet_import
from .blocks import block_linears, is_conv1d, own_model_on_meta


def peft_available() -> tuple[bool, str]:
    if importlib.util.find_spec("peft") is None:
        return False, "LoRA and DoRA need peft, which is not installed (pip install 'scalekit[hf]')"
    return True, ""


def adapter_targets(model: torch.nn.Module, names=None) -> list[str]:
    """The linear layers adapters go on: every nn.Linear (or transformers' Conv1D, as in GPT-2) inside the
    model's repeated blocks (one rule, scalekit.models.blocks), or those whose own name is in `names`
    (RunConfig.adapter_targets)."""
    targets = block_linears(model, names, conv1d=True)
    if not targets:
        what = f"named {list(names)}" if names else "at all"
        raise ToggleUnavailable(f"adapters need linear layers inside the model's repeated blocks, and "
                                f"{type(model).__name__}'s blocks have none {what}; RunConfig.adapter_targets names "
                                f"the layers to use")
    return targets


def _in_out(layer: torch.nn.Module) -> tuple[int, int]:
    """A linear layer's (in, out) features: nn.Linear and bitsandbytes' layers say them (a packed 4-bit weight's
    shape does not); transformers' Conv1D keeps its weight as (in, out)."""
    if hasattr(layer, "in_features"):
        return layer.in_features, layer.out_features
    return tuple(layer.weight.shape)


def check_rank(rank: int, toggle: str, layers: dict[str, torch.nn.Module], model: str) -> None:
    """Refuse a rank above a layer's width: a rank-r update B·A of a layer with min(in, out) < r is not
    low-rank any more, it only adds parameters (r · (in + out) of them).  `model` is the model's class name."""
    shapes = {name: _in_out(layer) for name, layer in layers.items()}
    too_narrow = [name for name, shape in shapes.items() if rank > min(shape)]
    if too_narrow:
        name, (n_in, n_out) = too_narrow[0], shapes[too_narrow[0]]
        limit = min(min(shape) for shape in shapes.values())
        raise ConfigError(f"RunConfig.toggles[{toggle!r}]={rank}: the rank is above the width of {model}'s layer "
                          f"{name!r} ({n_in} in, {n_out} out): at most {limit} for the layers adapted here (a low-rank "
                          f"update needs r ≤ min(in, out); 8 to 64 is usual)")


def add_adapters(model: torch.nn.Module, rank: int, use_dora: bool, names=None) -> tuple[torch.nn.Module, str]:
    """peft's LoRA (or DoRA) layers on the targets, everything else frozen: (the PeftModel, a note saying what
    trains).  peft puts its layers into `model` in place and wraps it."""
    peft = quiet_import("peft")
    targets = adapter_targets(model, names)
    modules = dict(model.named_modules())
    check_rank(rank, "dora" if use_dora else "lora", {t: modules[t] for t in targets}, type(model).__name__)
    # Conv1D stores its weight (in, out): peft must know, or its update would be transposed
    fan_in_fan_out = all(is_conv1d(modules[t]) for t in targets)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets,
                             use_dora=use_dora, init_lora_weights=True, fan_in_fan_out=fan_in_fan_out)
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing: not ours to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        wrapped = peft.get_peft_model(model, config)
    kind = "DoRA" if use_dora else "LoRA"
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    return wrapped, f"{kind} rank {rank} on {len(targets)} linear layers; {trainable:,} trainable parameters"


def own_model_targets(source) -> tuple[list[str] | None, str]:
    """For exported code: the full names of the layers scalekit adapts in your own nn.Module `source` (RunConfig.model,
    built on the meta device), and a note when they could not be found.  None for a Transformers model, whose output
    layer peft's "all-linear" leaves out as scalekit does, and for the built-in GPT."""
    model, why = own_model_on_meta(source)
    if model is None:
        return None, (f"{why}, to find the layers scalekit adapts; peft's 'all-linear' adapts every linear layer, the "
                      f"output layer too: set RunConfig.adapter_targets to name the layers") if why else ""
    try:
        return adapter_targets(model), ""
    except ToggleUnavailable as exc:
        return None, str(exc)


def peft_code(rank: int, use_dora: bool, cfg) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(imports, lines, notes) that build in exported code the same adapters `add_adapters` builds, on `model`, for
    RunConfig `cfg`: its adapter_targets, or, for your own model, the layers scalekit adapts in it."""
    names, note = (cfg.adapter_targets, "") if cfg.adapter_targets else own_model_targets(getattr(cfg, "model", None))
    targets = repr(list(names)) if names else '"all-linear"'  # the blocks' linear layers
    imports = ("from peft import LoraConfig, get_peft_model", "from transformers.pytorch_utils import Conv1D")
    lines = (f"adapters = LoraConfig(r={rank}, lora_alpha={2 * rank}, lora_dropout=0.0, target_modules={targets}, "
             f"use_dora={use_dora},",
             "                      fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()))  "
             "# Conv1D stores (in, out)",
             f"model = get_peft_model(model, adapters)  # {'dora' if use_dora else 'lora'}={rank}")
    return imports, lines, (note,) if note else ()
