"""TrainingArguments in and out: what each Hugging Face training argument is in scalekit, field by field.

`run_config_fields(args)` reads a transformers.TrainingArguments (or the dict of its keyword arguments) into
RunConfig fields and notes; `training_arguments(cfg)` writes a RunConfig back as TrainingArguments keyword
arguments.  RunConfig.from_training_arguments / to_training_arguments call these.  A field that is not mapped
is listed in a note, never dropped without a word; a toggle TrainingArguments has no field for is named in a
warning (the exported code in scalekit.hf.export carries it as model-side code).

Two scalekit spellings export to one TrainingArguments value and come back as the first: the baseline
optimizer and optim='adamw_torch' (both torch's AdamW: it comes back as the baseline), fused_adamw and
optim='adamw_torch_fused' (it comes back as optim).  Two have no TrainingArguments name and export to the
nearest one, said in the warning: adamw_torch_foreach → adamw_torch (torch's default: foreach on a GPU),
adam_bnb_8bit → adamw_bnb_8bit (AdamW8bit with weight_decay=0 is Adam8bit).

This module imports neither transformers nor RunConfig: it runs on dicts and on the config it is given.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..errors import ConfigError
from ..toggles import TOGGLES
from ..toggles.compile import COMPILE_MODES

# TrainingArguments' defaults for the fields mapped here (tests/test_hf_arguments.py checks them against the
# installed transformers): a dict of keyword arguments leaves the others at these.
DEFAULTS = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "activation_checkpointing": None,
    "activation_checkpointing_kwargs": None, "gradient_checkpointing": None, "gradient_checkpointing_kwargs": None,
    "bf16": False, "fp16": False, "tf32": None, "optim": "adamw_torch_fused", "dataloader_num_workers": 0,
    "dataloader_pin_memory": True, "dataloader_drop_last": False, "torch_empty_cache_steps": None,
    "torch_compile": False, "torch_compile_mode": None, "torch_compile_backend": None, "learning_rate": 5e-5,
    "seed": 42, "use_cpu": False, "fsdp": None, "fsdp_config": None, "deepspeed": None,
}
MAPPED = tuple(DEFAULTS)

# optim: TrainingArguments name -> scalekit's optim toggle value (None: the baseline, torch AdamW)
OPTIM_IN = {"adamw_torch": None, "adamw_torch_fused": "adamw_torch_fused", "adamw_bnb_8bit": "adamw_bnb_8bit",
            "adamw_8bit": "adamw_bnb_8bit", "paged_adamw_8bit": "paged_adamw_8bit", "lion_8bit": "lion_8bit",
            "adafactor": "adafactor"}
# scalekit's optim toggle value -> TrainingArguments name, with what is approximate about it
OPTIM_OUT = {"adamw_torch": ("adamw_torch", ""), "adamw_torch_fused": ("adamw_torch_fused", ""),
             "adamw_bnb_8bit": ("adamw_bnb_8bit", ""), "paged_adamw_8bit": ("paged_adamw_8bit", ""),
             "lion_8bit": ("lion_8bit", ""),
             "adafactor": ("adafactor", "TrainingArguments' adafactor is transformers' Adafactor; scalekit's is "
                                        "torch.optim.Adafactor"),
             "adamw_torch_foreach": ("adamw_torch", "TrainingArguments has no foreach switch: adamw_torch is torch's "
                                                    "AdamW, foreach by default on a GPU"),
             "adam_bnb_8bit": ("adamw_bnb_8bit", "TrainingArguments has no Adam8bit: AdamW8bit with weight_decay=0 "
                                                 "is the same update")}
# torch's default weight decay for each optimizer scalekit builds (TrainingArguments' default is 0.0)
WEIGHT_DECAY = {"adamw_torch": 0.01, "adamw_torch_fused": 0.01, "adamw_torch_foreach": 0.01,
                "adamw_bnb_8bit": 0.01, "paged_adamw_8bit": 0.01, "adam_bnb_8bit": 0.0, "lion_8bit": 0.0,
                "adafactor": 0.0}

# Data-loader arguments: TrainingArguments field -> (scalekit toggle, the field's value when the toggle is off).
# A toggle scalekit does not have (yet) is listed as "not mapped yet"; once it exists in TOGGLES it maps.
DATA_TOGGLES = {
    "dataloader_num_workers": ("dataloader_num_workers", 0),
    "dataloader_pin_memory": ("dataloader_pin_memory", False),
    "dataloader_drop_last": ("drop_last", False),
}
SPREAD = ("ddp", "fsdp", "deepspeed")  # toggles that run the step in several processes


# -- in: TrainingArguments -> RunConfig fields ----------------------------------------------------------------
def run_config_fields(args: Any, world_size: int | None = None) -> tuple[dict, list[str]]:
    """RunConfig keyword arguments for `args` (TrainingArguments or its dict), and notes on what is not mapped."""
    given, all_fields = _read(args)
    if world_size is None:
        world_size = int(getattr(args, "world_size", 1) or 1) if not isinstance(args, dict) else 1
    g = {**DEFAULTS, **{k: v for k, v in given.items() if k in DEFAULTS}}
    toggles: dict[str, Any] = {}
    notes: list[str] = []
    _precision_and_steps_in(g, toggles, notes)
    _checkpointing_in(g, toggles, notes)
    _optim_in(g, toggles, notes)
    _data_in(g, given, toggles, notes)
    _compile_in(g, toggles, notes)
    _spread_in(g, toggles, notes, world_size)
    k = toggles.get("grad_accum", 1)
    fields = dict(batch_size=int(g["per_device_train_batch_size"]) * k * (world_size if _spread(toggles) else 1),
                  lr=float(g["learning_rate"]), seed=int(g["seed"]), toggles=toggles)
    if g["use_cpu"]:
        fields["device"] = "cpu"
    notes.extend(_unmapped_notes(given, all_fields))
    return fields, notes


def _read(args: Any) -> tuple[dict, bool]:
    """(field -> value, whether every field of TrainingArguments is in it)."""
    if isinstance(args, dict):
        return dict(args), False
    import dataclasses

    if not dataclasses.is_dataclass(args):
        raise ConfigError(f"RunConfig.from_training_arguments takes a transformers.TrainingArguments or a dict of "
                          f"its keyword arguments, got {type(args).__name__}")
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    values["optim"] = getattr(values.get("optim"), "value", values.get("optim"))
    return values, True


def _precision_and_steps_in(g: dict, toggles: dict, notes: list) -> None:
    for name in ("bf16", "fp16", "tf32"):
        if g[name]:
            toggles[name] = True
    if int(g["gradient_accumulation_steps"] or 1) > 1:
        toggles["grad_accum"] = int(g["gradient_accumulation_steps"])
    if g["torch_empty_cache_steps"]:
        toggles["empty_cache_steps"] = int(g["torch_empty_cache_steps"])
        notes.append("torch_empty_cache_steps: the Trainer empties the cache in every micro-batch of each N-th "
                     "step; scalekit's empty_cache_steps after each N-th step")


def _checkpointing_in(g: dict, toggles: dict, notes: list) -> None:
    on = g["activation_checkpointing"] if g["activation_checkpointing"] is not None else g["gradient_checkpointing"]
    kwargs = dict(g["activation_checkpointing_kwargs"] or g["gradient_checkpointing_kwargs"] or {})
    if not on:
        return
    toggles["checkpointing"] = int(kwargs.pop("every_n_layers", 1))
    if kwargs.pop("use_reentrant", False):
        notes.append("checkpointing: use_reentrant=True not mapped: scalekit checkpoints with use_reentrant=False")
    if kwargs:
        notes.append(f"activation_checkpointing_kwargs not mapped: {kwargs}")


def _optim_in(g: dict, toggles: dict, notes: list) -> None:
    name = str(getattr(g["optim"], "value", g["optim"]))
    if name not in OPTIM_IN:
        notes.append(f"optim={name!r} not mapped: scalekit has no such optimizer (it trains with torch AdamW); "
                     f"mapped: {', '.join(OPTIM_IN)}")
        return
    if OPTIM_IN[name] is not None:
        toggles["optim"] = OPTIM_IN[name]
    if name == "adafactor":
        notes.append(OPTIM_OUT["adafactor"][1])


def _data_in(g: dict, given: dict, toggles: dict, notes: list) -> None:
    for field, (toggle, off) in DATA_TOGGLES.items():
        if toggle not in TOGGLES:
            if field in given:
                notes.append(f"{field}={given[field]!r} not mapped yet: scalekit has no {toggle!r} toggle")
            continue
        value = g[field]
        if field == "dataloader_pin_memory" and value and (g["use_cpu"] or not torch.cuda.is_available()):
            # the Trainer pins only where there is a GPU to copy batches to (torch's DataLoader does nothing
            # on a CPU); scalekit's toggle is refused there, so it is said, not switched on
            notes.append("dataloader_pin_memory=True: the Trainer pins batches only on a GPU, and this run has "
                         "none; on a GPU it maps to the dataloader_pin_memory toggle")
            continue
        if value not in (None, off, False, 0):
            toggles[toggle] = True if value is True else value


def _compile_in(g: dict, toggles: dict, notes: list) -> None:
    mode, backend = g["torch_compile_mode"], g["torch_compile_backend"]
    if not (g["torch_compile"] or mode or backend):
        return
    if mode is not None and mode not in COMPILE_MODES:
        raise ConfigError(f"TrainingArguments.torch_compile_mode={mode!r} is not a mode scalekit's compile toggle "
                          f"takes; allowed: {', '.join(COMPILE_MODES)}")
    toggles["compile"] = mode or "default"
    if backend not in (None, "inductor"):
        notes.append(f"torch_compile_backend={backend!r} not mapped: scalekit compiles with inductor")


def _spread_in(g: dict, toggles: dict, notes: list, world_size: int) -> None:
    if g["fsdp"]:
        toggles["fsdp"] = True
        config = g["fsdp_config"] if isinstance(g["fsdp_config"], dict) else {}
        items = g["fsdp"].split() if isinstance(g["fsdp"], str) else g["fsdp"] if isinstance(g["fsdp"], list) else []
        if config.get("cpu_offload") or "offload" in items:
            toggles["cpu_offload"] = True
        if int(config.get("version", 2)) != 2:
            notes.append("fsdp_config version 1 (FullyShardedDataParallel): scalekit's fsdp is FSDP2 (fully_shard)")
    elif g["deepspeed"]:
        toggles["deepspeed"] = _deepspeed_mode(g["deepspeed"], notes)
        if toggles["deepspeed"] is None:
            del toggles["deepspeed"]
    elif world_size > 1:
        toggles["ddp"] = True  # the Trainer runs DistributedDataParallel when launched in several processes


def _deepspeed_mode(config: Any, notes: list) -> str | None:
    zero = config.get("zero_optimization", {}) if isinstance(config, dict) else None
    if not zero or zero.get("stage") not in (1, 2, 3):
        notes.append("deepspeed not mapped: give a dict config with zero_optimization.stage 1, 2 or 3 (a path "
                     "to a JSON file is not read)")
        return None
    offload = "offload_optimizer" in zero or "offload_param" in zero
    return f"zero{zero['stage']}" + ("-offload" if offload else "")


def _unmapped_notes(given: dict, all_fields: bool) -> list[str]:
    """The fields not mapped: those set away from TrainingArguments' defaults with their values, then the rest."""
    rest = {k: v for k, v in given.items() if k not in MAPPED and k not in DATA_TOGGLES}
    if not rest:
        return []
    defaults = _training_arguments_defaults() if all_fields else {}
    changed = {k: v for k, v in rest.items() if k not in defaults or defaults[k] != v}
    unchanged = [k for k in rest if k not in changed]
    notes = []
    if changed:
        notes.append("TrainingArguments fields not mapped (set): " + ", ".join(f"{k}={v!r}" for k, v in changed.items()))
    if unchanged:
        notes.append("TrainingArguments fields not mapped (at their defaults): " + ", ".join(unchanged))
    return notes


def _training_arguments_defaults() -> dict:
    import dataclasses

    from transformers import TrainingArguments

    return {f.name: f.default for f in dataclasses.fields(TrainingArguments)
            if f.init and f.default is not dataclasses.MISSING}


# -- out: RunConfig -> TrainingArguments keyword arguments ----------------------------------------------------
def training_arguments(cfg: Any, world_size: int = 1) -> dict:
    """TrainingArguments keyword arguments for `cfg`; toggles they cannot carry are named in one warning."""
    kwargs, outside = training_arguments_and_notes(cfg, world_size)
    if outside:
        warnings.warn("to_training_arguments: " + "; ".join(outside), stacklevel=3)
    return kwargs


def training_arguments_and_notes(cfg: Any, world_size: int = 1) -> tuple[dict, list[str]]:
    """(TrainingArguments keyword arguments for `cfg`, what they do not carry exactly, in words)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"to_training_arguments: world_size must be a positive integer (processes), got {world_size!r}")
    t = dict(cfg.toggles)
    world = world_size if _spread(t) else 1
    kwargs: dict[str, Any] = {}
    outside = _batch_out(cfg, t, world, kwargs)
    kwargs.update(learning_rate=cfg.lr, seed=cfg.seed)
    outside += _optim_out(t, kwargs)
    outside += _checkpointing_out(t, kwargs)
    for name in ("bf16", "fp16", "tf32"):
        if name in t:
            kwargs[name] = True
    if cfg.device == "cpu":
        kwargs["use_cpu"] = True
    _data_out(t, kwargs)
    _compile_out(t, kwargs)
    _spread_out(t, kwargs)
    if "empty_cache_steps" in t:
        kwargs["torch_empty_cache_steps"] = t["empty_cache_steps"]
    outside += [f"{n}: model-side in Transformers ({MODEL_SIDE[n]})" for n in t if n in MODEL_SIDE]
    return kwargs, outside


# toggles that are a change to the model, not a training argument, and the Transformers code for them
MODEL_SIDE = {"sdpa": 'from_config(config, attn_implementation="sdpa")',
              "nice_numbers": "model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)"}


def _spread(toggles) -> bool:
    return any(n in toggles for n in SPREAD)


def per_device_batch(cfg: Any, world: int) -> int | None:
    """The micro-batch one process takes: batch_size / (grad_accum × world); None when batch_size is not set."""
    k = cfg.toggles.get("grad_accum", 1)
    if cfg.batch_size is None:
        return None
    if cfg.batch_size % (k * world):
        raise ConfigError(f"export: RunConfig.batch_size={cfg.batch_size} must be divisible by grad_accum × "
                          f"world_size = {k} × {world}: the per-device batch is a whole number")
    return cfg.batch_size // (k * world)


def _batch_out(cfg: Any, t: dict, world: int, kwargs: dict) -> list[str]:
    kwargs["gradient_accumulation_steps"] = t.get("grad_accum", 1)
    per_device = per_device_batch(cfg, world)
    if per_device is None:
        return ["batch_size not set: per_device_train_batch_size left to TrainingArguments' default"]
    kwargs["per_device_train_batch_size"] = per_device
    return []


def _optim_out(t: dict, kwargs: dict) -> list[str]:
    value = t.get("optim", "adamw_torch_fused" if "fused_adamw" in t else "adamw_torch")
    name, caveat = OPTIM_OUT[value]
    kwargs["optim"] = name
    kwargs["weight_decay"] = WEIGHT_DECAY[value]  # scalekit builds torch's defaults; TrainingArguments' is 0.0
    return [f"optim={value!r} → {name!r}: {caveat}"] if caveat else []


def _checkpointing_out(t: dict, kwargs: dict) -> list[str]:
    if "checkpointing" not in t:
        return []
    every = t["checkpointing"]
    if every == "sequential":
        return ["checkpointing='sequential' has no TrainingArguments field (torch's checkpoint_sequential)"]
    name = checkpointing_field()
    kwargs[name] = True
    kwargs[f"{name}_kwargs"] = {"use_reentrant": False, **({"every_n_layers": every} if every != 1 else {})}
    return []


def checkpointing_field() -> str:
    """'activation_checkpointing' where the installed transformers has it (5.x), else 'gradient_checkpointing'."""
    try:
        import dataclasses

        from transformers import TrainingArguments
    except ImportError:
        return "gradient_checkpointing"
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def _data_out(t: dict, kwargs: dict) -> None:
    for field, (toggle, off) in DATA_TOGGLES.items():
        if toggle in TOGGLES:
            kwargs[field] = t[toggle] if toggle in t else off


def _compile_out(t: dict, kwargs: dict) -> None:
    if "compile" in t:
        kwargs["torch_compile"] = True
        kwargs["torch_compile_backend"] = "inductor"
        if t["compile"] != "default":
            kwargs["torch_compile_mode"] = t["compile"]


def _spread_out(t: dict, kwargs: dict) -> None:
    if "fsdp" in t:
        kwargs["fsdp"] = True
        kwargs["fsdp_config"] = {"version": 2, "reshard_after_forward": True,
                                 **({"cpu_offload": True} if "cpu_offload" in t else {})}
    if "deepspeed" in t:
        mode = t["deepspeed"]
        zero: dict = {"stage": int(mode[4])}
        if mode.endswith("-offload"):
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
            if zero["stage"] == 3:
                zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        kwargs["deepspeed"] = {"zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
                               "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
