"""A configuration found in scalekit, as code for the framework you train with: Transformers' TrainingArguments
and Trainer, Accelerate's Accelerator and notebook_launcher, or Lightning's Trainer.

`export_code(cfg, "hf" | "accelerate" | "lightning", world_size=1)` returns Python source (`scalekit export
...` prints it).  Each toggle says how it is written in each framework (Toggle.spelling): this module puts the
pieces in place and names no toggle.  What a framework has no switch for is written as the code that does it;
what does not carry over exactly says so in a `# note:`; a toggle no code carries is named in a `# not carried:`
line with why.  The code assumes `config` (a transformers config) and `train_dataset` (dicts of "input_ids" and
"labels") are defined, and runs where it was exported (on the CPU where there is no GPU); nothing here imports
the frameworks.  For your own nn.Module (RunConfig.model that is not a Transformers model) it assumes `model`,
your `loss_fn(model, batch)` and `train_dataset` instead, and trains that model with that loss.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..toggles import needs_process_group
from ..toggles.base import EXPORT_TARGETS, Spelling
from .arguments import assemble, hf_arguments, own_module, per_device_batch, runs_on_cpu

TARGETS = EXPORT_TARGETS


def export_code(cfg: Any, target: str = "hf", world_size: int = 1) -> str:
    """Python source that trains with `cfg`'s settings in `target` ('hf', 'accelerate' or 'lightning')."""
    if target not in TARGETS:
        raise ConfigError(f"export: unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"export: world_size must be a positive integer (processes), got {world_size!r}")
    world = world_size if needs_process_group(cfg.toggles) else 1
    per_device_batch(cfg, world)  # refused here, for every target, when it is not a whole number
    return {"hf": _hf, "accelerate": _accelerate, "lightning": _lightning}[target](cfg, world)


def _call(name: str, kwargs: dict, indent: str = "") -> list[str]:
    """`name(` one keyword argument per line `)`."""
    return [f"{indent}{name}(", *[f"{indent}    {k}={v}," for k, v in kwargs.items()], f"{indent})"]


def _header(cfg: Any, where: str, notes: list[str], missing: list[str]) -> list[str]:
    label = cfg.label or cfg.describe()
    own = own_module(cfg)
    assumes = ("# Assumes `config` (a transformers config) and `train_dataset` (dicts of input_ids, labels)." if not own
               else f"# Assumes `model` (your {own}, built as scalekit built it), your `loss_fn(model, batch)` and "
                    f"`train_dataset` (samples your loss_fn reads once torch's default_collate batches them).")
    if _folder(cfg) is not None:  # a checkpoint folder: its config and weights are read from it
        assumes = "# Assumes `train_dataset` (dicts of input_ids, labels)."
    return [f"# scalekit configuration {label!r} in {where}.", assumes,
            *[f"# note: {n}" for n in notes], *[f"# not carried: {m}" for m in missing]]


def _model_lines(cfg: Any, spelled: Spelling, indent: str = "") -> list[str]:
    """The model built from `config` with the toggles' model-side changes, the Transformers way; your own model (defined
    beforehand) with them."""
    options = "".join(f", {k}={v}" for k, v in spelled.model_kwargs.items())
    built = [] if own_module(cfg) else [f"{indent}model = AutoModelForCausalLM.from_config(config{options})"]
    if _folder(cfg) is not None:
        built = [f"{indent}model = AutoModelForCausalLM.from_pretrained({_folder(cfg)!r}, dtype=\"float32\"{options})"]
    return [*built, *[indent + line for line in spelled.model]]


def _folder(cfg: Any) -> str | None:
    """The checkpoint folder RunConfig.model was read from (scalekit.hf.checkpoint_folder), or None."""
    folder = getattr(cfg.model, "folder", None)
    return None if folder is None else str(folder)


def _auto_model_import(cfg: Any) -> list[str]:
    return [] if own_module(cfg) else ["from transformers import AutoModelForCausalLM"]


def _loss(cfg: Any, model: str) -> str:
    """The loss of one batch: the Transformers model's own, or your loss_fn's."""
    return f"loss_fn({model}, batch)" if own_module(cfg) else f"{model}(**batch).loss"


def _loader_line(cfg: Any, spelled: Spelling, world: int, indent: str) -> str:
    batch = per_device_batch(cfg, world) or 8  # batch_size not set: the frameworks' usual 8
    options = "".join(f", {k}={v}" for k, v in spelled.loader.items())
    return f"{indent}train_dataloader = DataLoader(train_dataset, batch_size={batch}, shuffle=True{options})"


def _launch_note(world: int) -> list[str]:
    return [f"# run it in {world} processes: torchrun --nproc-per-node {world} train.py"] if world > 1 else []


# -- Transformers -------------------------------------------------------------------------------------------
def _hf(cfg: Any, world: int) -> str:
    kwargs, notes, missing = hf_arguments(cfg, world, here=True)
    spelled, _ = assemble(cfg, "hf", here=True)
    own = own_module(cfg)
    imports = ["from torch.utils.data import default_collate", "from transformers import Trainer, TrainingArguments"] \
        if own else ["from transformers import AutoModelForCausalLM, Trainer, TrainingArguments"]
    trainer = "trainer = Trainer(model=model, args=args, train_dataset=train_dataset)"
    if own:  # the Trainer reads a loss from the model's output: here it is your loss_fn's
        imports += ["", "", "class LossFnTrainer(Trainer):  # your loss_fn in place of a Transformers model's own loss",
                    "    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):",
                    "        loss = loss_fn(model, inputs)", "        return (loss, None) if return_outputs else loss", ""]
        trainer = ("trainer = LossFnTrainer(model=model, args=args, train_dataset=train_dataset, "
                   "data_collator=default_collate)")
    lines = [*_header(cfg, "Transformers", notes, missing), *imports, *spelled.imports, "",
             *_model_lines(cfg, spelled), "args = " + "\n".join(_call("TrainingArguments", {k: repr(v) for k, v in kwargs.items()})),
             trainer, "trainer.train()", *_launch_note(world)]
    return "\n".join(lines) + "\n"


# -- Accelerate ----------------------------------------------------------------------------------------------
def _accelerate(cfg: Any, world: int) -> str:
    spelled, missing = assemble(cfg, "accelerate", here=True)
    cpu, why = runs_on_cpu(cfg, "cpu=True")
    own = "model" if own_module(cfg) else ""  # your model, handed to each process
    kwargs = {**{k: str(v) for k, v in spelled.kwargs.items()}, **({"cpu": "True"} if cpu else {})}
    i = "    "
    lines = [*_header(cfg, "Accelerate", [*([why] if why else []), *spelled.notes], missing),
             "import torch", "from torch.utils.data import DataLoader", "from accelerate import Accelerator, notebook_launcher",
             *spelled.imports, *_auto_model_import(cfg), "", "", f"def training_function({own}):",
             *[i + line for line in spelled.setup], f"{i}accelerator = " + "\n".join(_call("Accelerator", kwargs, i)).lstrip(),
             *_model_lines(cfg, spelled, i), f"{i}optimizer = {spelled.optimizer}", _loader_line(cfg, spelled, world, i),
             f"{i}model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)",
             f"{i}model.train()", f"{i}for step, batch in enumerate(train_dataloader):",
             f"{i}    with accelerator.accumulate(model):", f"{i}        loss = {_loss(cfg, 'model')}",
             f"{i}        accelerator.backward(loss)", f"{i}        optimizer.step()",
             f"{i}        optimizer.zero_grad(set_to_none=True)", *[f"{i}    {line}" for line in spelled.after_step],
             "", "", f"notebook_launcher(training_function, {'args=(model,), ' * bool(own)}num_processes={world})"]
    return "\n".join(lines) + "\n"


# -- Lightning ----------------------------------------------------------------------------------------------
def lightning_trainer_kwargs(cfg: Any, world: int) -> dict:
    """Keyword arguments (as source text) of lightning.Trainer for `cfg`."""
    kwargs = {k: str(v) for k, v in assemble(cfg, "lightning", here=True)[0].kwargs.items()}
    kwargs["devices"] = repr(world)
    kwargs["accelerator"] = repr("cpu" if runs_on_cpu(cfg, "")[0] else "auto")
    kwargs["max_steps"] = repr(cfg.warmup_steps + cfg.steps)
    return kwargs


def _lightning_module(cfg: Any, spelled: Spelling) -> list[str]:
    i = "        "
    lines = ["class LitModel(L.LightningModule):", "    def __init__(self, model):", f"{i}super().__init__()",
             f"{i}self.model = model", "", "    def configure_model(self):", *([i + line for line in spelled.wrap] or [f"{i}pass"]),
             "", "    def training_step(self, batch, batch_idx):", f"{i}loss = {_loss(cfg, 'self.model')}",
             f'{i}self.log("loss", loss)', f"{i}return loss", "", "    def configure_optimizers(self):",
             f"{i}return {spelled.optimizer}"]
    if spelled.after_step:
        lines += ["", "    def on_train_batch_end(self, outputs, batch, batch_idx):", *[i + line for line in spelled.after_step]]
    return lines


def _lightning(cfg: Any, world: int) -> str:
    spelled, missing = assemble(cfg, "lightning", here=True)
    why = runs_on_cpu(cfg, "accelerator='cpu'")[1]
    lines = [*_header(cfg, "Lightning", [*([why] if why else []), *spelled.notes], missing),
             "import torch", "from torch.utils.data import DataLoader", "import lightning as L", *spelled.imports,
             *_auto_model_import(cfg), "", "", *_lightning_module(cfg, spelled), "", "", *spelled.setup,
             *_model_lines(cfg, spelled), _loader_line(cfg, spelled, world, ""),
             "trainer = " + "\n".join(_call("L.Trainer", lightning_trainer_kwargs(cfg, world))),
             "trainer.fit(LitModel(model), train_dataloaders=train_dataloader)"]
    return "\n".join(lines) + "\n"
