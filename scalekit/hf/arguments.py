"""TrainingArguments in and out, by what each toggle says of itself; and the walk over a config's toggles that both
directions and the exporters (scalekit.hf.export) share.

`run_config_fields(args)` reads a transformers.TrainingArguments (or the dict of its keyword arguments) into RunConfig
fields and notes; `training_arguments(cfg)` writes a RunConfig back as TrainingArguments keyword arguments.
RunConfig.from_training_arguments / to_training_arguments call these.  Each toggle declares the fields it reads and
what it writes (Toggle.training_fields, from_training_arguments, spelling, off_spelling): this module puts that
together in ORDER and names no toggle.  A field that is not mapped is listed in a note, never dropped without a word;
a toggle TrainingArguments has no field for is named in a warning, with why (the code scalekit.hf.export writes
carries the model-side ones).

Two scalekit spellings export to one TrainingArguments value and come back as the first: the baseline
optimizer and optim='adamw_torch' (both torch's AdamW: it comes back as the baseline), fused_adamw and
optim='adamw_torch_fused' (it comes back as optim).  Two have no TrainingArguments name and export to the
nearest one, said in the warning: adamw_torch_foreach → adamw_torch (torch's default: foreach on a GPU),
adam_bnb_8bit → adamw_bnb_8bit (AdamW8bit with weight_decay=0 is Adam8bit).

This module imports neither transformers nor RunConfig: it runs on dicts and on the config it is given.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from ..checks import BATCH_SIZE_RANGE, LR_RANGE, SEED_RANGE, check_bool, int_in, real_in
from ..distributed.sharding import mesh_shape
from ..errors import ConfigError
from ..models.blocks import from_transformers, is_own_model
from ..models.conventions import built_class
from ..optional import quiet_import
from ..toggles import ORDER, TOGGLES, mesh_dims, needs_process_group, plan_facts
from ..toggles.base import Spelling

# TrainingArguments fields read for RunConfig's own fields (not toggles), with their defaults there
RUN_FIELDS = {"per_device_train_batch_size": 8, "learning_rate": 5e-5, "seed": 42, "use_cpu": False}


def training_defaults() -> dict:
    """TrainingArguments' defaults for every field mapped (tests/hf/test_hf_arguments.py checks them against the installed
    transformers): RunConfig's own, then each toggle's training_fields.  A dict of keyword arguments leaves the others
    at these."""
    defaults = dict(RUN_FIELDS)
    for toggle in ORDER:
        defaults.update(toggle.training_fields)
    return defaults


def __getattr__(name: str) -> Any:
    # DEFAULTS and MAPPED are read from the toggles registered when asked (register() adds to them)
    if name == "DEFAULTS":
        return training_defaults()
    if name == "MAPPED":
        return tuple(training_defaults())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def label(name: str, value: Any) -> str:
    """A toggle as a config says it: its name when on, else name=value (the value's repr)."""
    return name if value is True else f"{name}={value!r}"


# -- in: TrainingArguments -> RunConfig fields ----------------------------------------------------------------
def run_config_fields(args: Any, world_size: int | None = None) -> tuple[dict, list[str]]:
    """RunConfig keyword arguments for `args` (TrainingArguments or its dict), and notes on what is not mapped.  A
    value a field cannot take is refused with a ConfigError naming the field and what it allows."""
    given, all_fields = _read(args)
    if world_size is None:
        world_size = getattr(args, "world_size", 1) or 1 if not isinstance(args, dict) else 1
    int_in("from_training_arguments", "world_size", world_size, 1, 2**20)
    defaults = training_defaults()
    fields = {**defaults, **{k: v for k, v in given.items() if k in defaults}, "world_size": world_size}
    notes: list[str] = []
    toggles = _toggles_in(fields, notes)
    world = world_size if needs_process_group(toggles) else 1
    per_device = int_in("TrainingArguments", "per_device_train_batch_size", fields["per_device_train_batch_size"],
                        *BATCH_SIZE_RANGE)
    batch = per_device * plan_facts(toggles, world).micro_batches * world
    if batch > BATCH_SIZE_RANGE[1]:
        raise ConfigError(f"TrainingArguments.per_device_train_batch_size × gradient_accumulation_steps × processes is "
                          f"{batch:,} sequences a step; scalekit takes at most {BATCH_SIZE_RANGE[1]:,}")
    out = dict(batch_size=batch, lr=real_in("TrainingArguments", "learning_rate", fields["learning_rate"], *LR_RANGE),
               seed=int_in("TrainingArguments", "seed", fields["seed"], *SEED_RANGE), toggles=toggles)
    check_bool("TrainingArguments", "use_cpu", fields["use_cpu"])
    if fields["use_cpu"]:
        out["device"] = "cpu"
    notes.extend(_unmapped_notes(given, all_fields))
    return out, notes


def _read(args: Any) -> tuple[dict, bool]:
    """(field -> value, whether every field of TrainingArguments is in it)."""
    if isinstance(args, dict):
        return dict(args), False
    if not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise ConfigError(f"RunConfig.from_training_arguments takes a transformers.TrainingArguments or a dict of "
                          f"its keyword arguments, got {type(args).__name__}")
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}, True


def _toggles_in(fields: dict, notes: list[str]) -> dict:
    """Each toggle's value as it reads itself from `fields`, checked as RunConfig will check it."""
    toggles = {}
    for toggle in ORDER:
        value = toggle.from_training_arguments(fields, notes)
        if value is None:
            continue
        try:
            toggles[toggle.name] = toggle.validate(value, "TrainingArguments")
        except ConfigError as exc:  # a value the fields gave that the toggle does not take: said by its fields
            raise ConfigError(f"TrainingArguments {', '.join(toggle.training_fields)}: {exc}") from None
    return toggles


def _unmapped_notes(given: dict, all_fields: bool) -> list[str]:
    """The fields not mapped: those set away from TrainingArguments' defaults with their values, then the rest."""
    mapped = training_defaults()
    rest = {k: v for k, v in given.items() if k not in mapped}
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
    TrainingArguments = quiet_import("transformers.training_args").TrainingArguments  # noqa: N806 (a class)

    return {f.name: f.default for f in dataclasses.fields(TrainingArguments)
            if f.init and f.default is not dataclasses.MISSING}


# -- out: the toggles' spellings, put together ----------------------------------------------------------------
def own_module(cfg: Any) -> str | None:
    """The name of `cfg`'s model when it is your own nn.Module rather than a Transformers model (None otherwise): its
    exported code trains that model with your loss_fn, and carries no toggle spelled for Transformers models."""
    model = getattr(cfg, "model", None)
    if not is_own_model(model) or (not isinstance(model, torch.nn.Module) and from_transformers_class(model)):
        return None  # a function returning a Transformers model is one: the code builds it from `config`
    name = getattr(model, "__name__", None) or type(model).__name__
    return name if name.isidentifier() else "model"  # a lambda's "<lambda>" names nothing


def from_transformers_class(factory: Any) -> bool:
    """`factory` (RunConfig.model given as a function) builds a Transformers model (read on the meta device, once)."""
    cls = built_class(factory)
    return cls is not None and from_transformers(cls)


def assemble(cfg: Any, target: str, here: bool = False) -> tuple[Spelling, list[str]]:
    """Every toggle of `cfg` spelled for `target` and put together (Spelling's rules): what the toggles that are off
    write, then those on, in ORDER; and, for each toggle on that `target` cannot carry, "label: why".  `here`: for
    code run on this machine, which leaves out what the framework refuses where there is no GPU, if it has none."""
    total, missing = Spelling(), []
    own = own_module(cfg)
    for toggle in ORDER:
        if toggle.name not in cfg.toggles and not (own and toggle.spelled_for_transformers_models):
            total = total.then(toggle.off_spelling(target, cfg))
    for name, value in cfg.toggles.items():
        if own and TOGGLES[name].spelled_for_transformers_models:
            missing.append(f"{label(name, value)}: its code acts on a Transformers model, and your {own} is a plain "
                           f"nn.Module (scalekit applied it to your model its own way: do the same there by hand)")
            continue
        spelled = TOGGLES[name].spelling(target, value, cfg)
        if not spelled.missing and spelled.gpu_only and here and not torch.cuda.is_available():
            written = ", ".join(f"{k}={v!r}" for k, v in spelled.kwargs.items()) or "it"
            spelled = Spelling(missing=f"refused where there is no GPU, and this machine, which the code was exported "
                                       f"to run on, has none: add {written} back to train on one")
        if spelled.missing:
            missing.append(f"{label(name, value)}: {spelled.missing}")
        else:
            total = total.then(spelled)
    return total, missing


def model_side(cfg: Any) -> dict[str, str]:
    """The toggles of `cfg` that Transformers carries in the model, not in TrainingArguments: name -> their code."""
    out = {}
    for name, value in cfg.toggles.items():
        if own_module(cfg) and TOGGLES[name].spelled_for_transformers_models:
            continue  # assemble names it as not carried
        spelled = TOGGLES[name].spelling("hf", value, cfg)
        if not spelled.missing and not spelled.kwargs and (spelled.model_kwargs or spelled.model):
            calls = [f"from_config(config, {k}={v})" for k, v in spelled.model_kwargs.items()]
            out[name] = "; ".join([*calls, *(line.strip() for line in spelled.model)])
    return out


def runs_on_cpu(cfg: Any, switch: str) -> tuple[bool, str]:
    """Whether exported code trains on the CPU: device='cpu', or 'auto' where this machine has no GPU (a framework that
    looks for a GPU it does not find refuses bf16: "Your setup doesn't support bf16/gpu"); with the note for the second,
    which names the framework's `switch`."""
    if cfg.device == "cpu":
        return True, ""
    if cfg.device == "auto" and not torch.cuda.is_available():
        return True, f"exported where there is no GPU: {switch} (leave it out to train on one)"
    return False, ""


def per_device_batch(cfg: Any, world: int) -> int | None:
    """The micro-batch one process takes: batch_size / (micro-batches × data-parallel ranks); None when batch_size
    is not set.  The ranks of a tensor-parallel group take the same rows (transformers' Trainer shards the data
    over world_size / tp_size), so only the data-parallel ranks divide the batch."""
    if cfg.batch_size is None:
        return None
    k = plan_facts(cfg.toggles, world).micro_batches
    dims = mesh_dims(cfg.toggles)
    dp = mesh_shape(dims, world)[1] if dims else world
    if cfg.batch_size % (k * dp):
        ranks = "world_size" if dp == world else "data-parallel ranks"
        raise ConfigError(f"export: RunConfig.batch_size={cfg.batch_size} must be divisible by grad_accum × "
                          f"{ranks} = {k} × {dp}: the per-device batch is a whole number")
    return cfg.batch_size // (k * dp)


# -- out: RunConfig -> TrainingArguments keyword arguments ----------------------------------------------------
def training_arguments(cfg: Any, world_size: int = 1) -> dict:
    """TrainingArguments keyword arguments for `cfg`; toggles they cannot carry are named in one warning."""
    kwargs, outside = training_arguments_and_notes(cfg, world_size)
    if outside:
        warnings.warn("to_training_arguments: " + "; ".join(outside), stacklevel=3)
    return kwargs


def training_arguments_and_notes(cfg: Any, world_size: int = 1, here: bool = False) -> tuple[dict, list[str]]:
    """(TrainingArguments keyword arguments for `cfg`, what they do not carry exactly, in words).  `here`: for code
    run on this machine, which trains on its CPU where it has no GPU (runs_on_cpu)."""
    kwargs, notes, missing = hf_arguments(cfg, world_size, here)
    notes += [f"not carried: {label(n, cfg.toggles[n])}: model-side in Transformers ({code})"
              for n, code in model_side(cfg).items()]
    return kwargs, notes + [f"not carried: {m}" for m in missing]


def hf_arguments(cfg: Any, world_size: int, here: bool = False) -> tuple[dict, list[str], list[str]]:
    """(TrainingArguments keyword arguments, notes, "label: why" of the toggles no Transformers code carries)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"to_training_arguments: world_size must be a positive integer (processes), got {world_size!r}")
    world = world_size if needs_process_group(cfg.toggles) else 1
    spelled, missing = assemble(cfg, "hf", here)
    kwargs: dict[str, Any] = {}
    notes = []
    per_device = per_device_batch(cfg, world)
    if per_device is None:
        notes.append("batch_size not set: per_device_train_batch_size left to TrainingArguments' default")
    else:
        kwargs["per_device_train_batch_size"] = per_device
    kwargs.update(learning_rate=cfg.lr, seed=cfg.seed)
    cpu, why = runs_on_cpu(cfg, "use_cpu=True") if here else (cfg.device == "cpu", "")
    if cpu:
        kwargs["use_cpu"] = True
    kwargs.update(spelled.kwargs)
    if own_module(cfg):  # the Trainer would drop the batch's fields your model's forward does not name
        kwargs["remove_unused_columns"] = False
    return kwargs, [*([why] if why else []), *spelled.notes], missing
