"""A configuration found in scalekit, as code for the framework you train with: Transformers' TrainingArguments
and Trainer, Accelerate's Accelerator and notebook_launcher, or Lightning's Trainer.

`export_code(cfg, "hf" | "accelerate" | "lightning", world_size=1)` returns Python source (`scalekit export
...` prints it).  What a framework has no switch for is written as the code that does it, with a comment; what
does not carry over exactly says so in a comment.  The code assumes `config` (a transformers config) and
`train_dataset` (batches of {"input_ids", "labels"}) are defined; nothing here imports the frameworks.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .arguments import (
    MODEL_SIDE,
    OPTIM_OUT,
    SPREAD,
    WEIGHT_DECAY,
    checkpointing_field,
    per_device_batch,
    training_arguments_and_notes,
)

TARGETS = ("hf", "accelerate", "lightning")


def export_code(cfg: Any, target: str = "hf", world_size: int = 1) -> str:
    """Python source that trains with `cfg`'s settings in `target` ('hf', 'accelerate' or 'lightning')."""
    if target not in TARGETS:
        raise ConfigError(f"export: unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"export: world_size must be a positive integer (processes), got {world_size!r}")
    world = world_size if any(n in cfg.toggles for n in SPREAD) else 1
    per_device_batch(cfg, world)  # refused here, for every target, when it is not a whole number
    return {"hf": _hf, "accelerate": _accelerate, "lightning": _lightning}[target](cfg, world)


def _call(name: str, kwargs: dict, indent: str = "") -> list[str]:
    """`name(` one keyword argument per line `)`."""
    return [f"{indent}{name}(", *[f"{indent}    {k}={v},"
                                  for k, v in kwargs.items()], f"{indent})"]


def _model_lines(cfg: Any, indent: str = "") -> list[str]:
    """The model built with scalekit's architecture toggles, the Transformers way."""
    impl = "sdpa" if "sdpa" in cfg.toggles else "eager"
    lines = [f'{indent}model = AutoModelForCausalLM.from_config(config, attn_implementation="{impl}")']
    if "nice_numbers" in cfg.toggles:
        lines.append(f"{indent}model.resize_token_embeddings(model.config.vocab_size, pad_to_multiple_of=64, "
                     f"mean_resizing=False)  # nice_numbers")
    return lines


def _header(cfg: Any, where: str) -> list[str]:
    label = cfg.label or cfg.describe()
    return [f"# scalekit configuration {label!r} in {where}.",
            "# Assumes `config` (a transformers config) and `train_dataset` (dicts of input_ids, labels)."]


def _launch_note(world: int) -> list[str]:
    return [f"# run it in {world} processes: torchrun --nproc-per-node {world} train.py"] if world > 1 else []


# -- Transformers -------------------------------------------------------------------------------------------
def _hf(cfg: Any, world: int) -> str:
    kwargs, notes = training_arguments_and_notes(cfg, world)
    lines = [*_header(cfg, "Transformers"), "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments",
             "", *_model_lines(cfg)]  # the model-side toggles (MODEL_SIDE) are these lines
    lines += [f"# note: {n}" for n in notes if n.split(":")[0] not in MODEL_SIDE]
    lines += ["args = " + "\n".join(_call("TrainingArguments", {k: repr(v) for k, v in kwargs.items()}))]
    lines += ["trainer = Trainer(model=model, args=args, train_dataset=train_dataset)", "trainer.train()",
              *_launch_note(world)]
    return "\n".join(lines) + "\n"


# -- Accelerate ----------------------------------------------------------------------------------------------
def _accelerator_kwargs(cfg: Any, world: int) -> tuple[dict, list[str]]:
    t = cfg.toggles
    kwargs: dict[str, str] = {}
    imports = []
    precision = "bf16" if "bf16" in t else "fp16" if "fp16" in t else None
    if precision:
        kwargs["mixed_precision"] = repr(precision)
    kwargs["gradient_accumulation_steps"] = repr(t.get("grad_accum", 1))
    if "compile" in t:
        kwargs["dynamo_plugin"] = f'TorchDynamoPlugin(backend="inductor", mode={t["compile"]!r})'
        imports.append("TorchDynamoPlugin")
    if "fsdp" in t:
        offload = ", cpu_offload=True" if "cpu_offload" in t else ""
        kwargs["fsdp_plugin"] = f"FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True{offload})"
        imports.append("FullyShardedDataParallelPlugin")
    if "deepspeed" in t:
        mode = t["deepspeed"]
        offload = ', offload_optimizer_device="cpu"' if mode.endswith("-offload") else ""
        if mode == "zero3-offload":
            offload += ', offload_param_device="cpu"'
        kwargs["deepspeed_plugin"] = f"DeepSpeedPlugin(zero_stage={int(mode[4])}{offload})"
        imports.append("DeepSpeedPlugin")
    if cfg.device == "cpu":
        kwargs["cpu"] = "True"
    return kwargs, imports


def _optimizer_line(cfg: Any, params: str) -> str:
    value = cfg.toggles.get("optim", "adamw_torch_fused" if "fused_adamw" in cfg.toggles else "adamw_torch")
    lr = repr(cfg.lr)
    if value in ("adamw_torch", "adamw_torch_foreach", "adamw_torch_fused"):
        extra = {"adamw_torch": "", "adamw_torch_foreach": ", foreach=True", "adamw_torch_fused": ", fused=True"}[value]
        return f"torch.optim.AdamW({params}, lr={lr}{extra})"
    if value == "adafactor":
        return f"torch.optim.Adafactor({params})  # its lr is relative: torch's default 1e-2"
    cls = {"adamw_bnb_8bit": "AdamW8bit", "adam_bnb_8bit": "Adam8bit", "paged_adamw_8bit": "PagedAdamW8bit",
           "lion_8bit": "Lion8bit"}[value]
    return f"bnb.optim.{cls}({params}, lr={lr})  # bitsandbytes; weight_decay={WEIGHT_DECAY[value]} by default"


def _checkpointing_line(cfg: Any, model: str) -> list[str]:
    every = cfg.toggles.get("checkpointing")
    if every is None:
        return []
    if every == "sequential":
        return ["# checkpointing='sequential' (torch's checkpoint_sequential) has no Transformers switch"]
    extra = f", every_n_layers={every}" if every != 1 else ""
    if checkpointing_field() == "activation_checkpointing":
        return [f'{model}.activation_checkpointing_enable(activation_checkpointing_kwargs={{"use_reentrant": False}}'
                f"{extra})"]
    return [f'{model}.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": False}})'
            + ("  # every layer: this transformers has no every_n_layers" if extra else "")]


def _tf32_lines(cfg: Any, indent: str) -> list[str]:
    if "tf32" not in cfg.toggles:
        return []
    return [f"{indent}torch.backends.cuda.matmul.allow_tf32 = True  # tf32", f"{indent}torch.backends.cudnn.allow_tf32 = True"]


def _loader_line(cfg: Any, world: int, indent: str) -> str:
    batch = per_device_batch(cfg, world) or 8  # batch_size not set: the frameworks' usual 8
    drop = ", drop_last=True" if "drop_last" in cfg.toggles else ""
    return f"{indent}train_dataloader = DataLoader(train_dataset, batch_size={batch}, shuffle=True{drop})"


def _accelerate(cfg: Any, world: int) -> str:
    kwargs, plugins = _accelerator_kwargs(cfg, world)
    t = cfg.toggles
    i = "    "
    lines = [*_header(cfg, "Accelerate"), "import torch", "from torch.utils.data import DataLoader",
             "from accelerate import Accelerator, notebook_launcher",
             *([f"from accelerate.utils import {', '.join(plugins)}"] if plugins else []),
             *(["import bitsandbytes as bnb"] if "bnb." in _optimizer_line(cfg, "p") else []),
             "from transformers import AutoModelForCausalLM", "", "", "def training_function():",
             *_tf32_lines(cfg, i), f"{i}accelerator = " + "\n".join(_call("Accelerator", kwargs, i)).lstrip(),
             *_model_lines(cfg, i), *[i + line for line in _checkpointing_line(cfg, "model")],
             f"{i}optimizer = {_optimizer_line(cfg, 'model.parameters()')}", _loader_line(cfg, world, i),
             f"{i}model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)",
             f"{i}model.train()", f"{i}for step, batch in enumerate(train_dataloader):",
             f"{i}    with accelerator.accumulate(model):", f"{i}        loss = model(**batch).loss",
             f"{i}        accelerator.backward(loss)", f"{i}        optimizer.step()",
             f"{i}        optimizer.zero_grad(set_to_none=True)"]
    if "empty_cache_steps" in t:
        n = t["empty_cache_steps"]
        lines += [f"{i}    if accelerator.sync_gradients and (step + 1) % ({n} * accelerator.gradient_accumulation_steps) == 0:",
                  f"{i}        torch.cuda.empty_cache()  # empty_cache_steps={n}"]
    lines += ["", "", f"notebook_launcher(training_function, num_processes={world})"]
    return "\n".join(lines) + "\n"


# -- Lightning ----------------------------------------------------------------------------------------------
def lightning_trainer_kwargs(cfg: Any, world: int) -> dict:
    """Keyword arguments (as source text) of lightning.Trainer for `cfg`."""
    t = cfg.toggles
    precision = "bf16-mixed" if "bf16" in t else "16-mixed" if "fp16" in t else "32-true"
    kwargs = {"precision": repr(precision), "accumulate_grad_batches": repr(t.get("grad_accum", 1))}
    if "ddp" in t:
        kwargs["strategy"] = repr("ddp")
    elif "fsdp" in t:  # Lightning's FSDPStrategy wraps with FSDP1 (FullyShardedDataParallel)
        kwargs["strategy"] = "FSDPStrategy(cpu_offload=True)" if "cpu_offload" in t else repr("fsdp")
    elif "deepspeed" in t:
        mode = t["deepspeed"]
        kwargs["strategy"] = repr(f"deepspeed_stage_{mode[4]}" + ("_offload" if mode.endswith("-offload") else ""))
    kwargs["devices"] = repr(world)
    kwargs["accelerator"] = repr("cpu" if cfg.device == "cpu" else "auto")
    kwargs["max_steps"] = repr(cfg.warmup_steps + cfg.steps)
    return kwargs


def _lightning_module(cfg: Any) -> list[str]:
    t = cfg.toggles
    i = "        "
    lines = ["class LitModel(L.LightningModule):", "    def __init__(self, model):", f"{i}super().__init__()",
             f"{i}self.model = model", "", "    def configure_model(self):"]
    body = [i + line for line in _checkpointing_line(cfg, "self.model")]
    if "compile" in t:
        body.append(f"{i}self.model = torch.compile(self.model, mode={t['compile']!r})")
    lines += body or [f"{i}pass"]
    lines += ["", "    def training_step(self, batch, batch_idx):", f"{i}loss = self.model(**batch).loss",
              f'{i}self.log("loss", loss)', f"{i}return loss", "", "    def configure_optimizers(self):",
              f"{i}return {_optimizer_line(cfg, 'self.parameters()')}"]
    if "empty_cache_steps" in t:
        n = t["empty_cache_steps"]
        lines += ["", "    def on_train_batch_end(self, outputs, batch, batch_idx):",
                  f"{i}if (self.trainer.global_step + 1) % {n} == 0:", f"{i}    torch.cuda.empty_cache()"]
    return lines


def _lightning(cfg: Any, world: int) -> str:
    t = cfg.toggles
    kwargs = lightning_trainer_kwargs(cfg, world)
    lines = [*_header(cfg, "Lightning"), "import torch", "from torch.utils.data import DataLoader", "import lightning as L",
             *(["from lightning.pytorch.strategies import FSDPStrategy"] if "FSDPStrategy" in str(kwargs) else []),
             *(["import bitsandbytes as bnb"] if "bnb." in _optimizer_line(cfg, "p") else []),
             "from transformers import AutoModelForCausalLM", "", "", *_lightning_module(cfg), "", ""]
    if "tf32" in t:
        lines.append('torch.set_float32_matmul_precision("high")  # tf32, as Lightning asks for it')
    if "fsdp" in t:
        lines.append("# Lightning's FSDPStrategy is FSDP1 (FullyShardedDataParallel); scalekit's fsdp is FSDP2 "
                     "(fully_shard: Lightning's ModelParallelStrategy)")
    lines += [*_model_lines(cfg), _loader_line(cfg, world, ""), "trainer = " + "\n".join(_call("L.Trainer", kwargs)),
              "trainer.fit(LitModel(model), train_dataloaders=train_dataloader)"]
    if "optim" in t and OPTIM_OUT.get(t["optim"], ("", ""))[1]:
        lines.append(f"# note: {OPTIM_OUT[t['optim']][1]}")
    return "\n".join(lines) + "\n"
