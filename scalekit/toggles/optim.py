"""Optimizer choice: torch AdamW (default, foreach, fused), bitsandbytes 8-bit Adam/AdamW/Lion, torch Adafactor,
torch Muon paired with AdamW.

Names follow HF TrainingArguments' `optim`.  bitsandbytes is imported only when an 8-bit optimizer is
chosen: importing it in a notebook's parent process gets in the way of launching worker processes.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from typing import Any

import torch

from ..errors import ConfigError, ToggleUnavailable
from ..measure.memory import storage_bytes
from ..models.muon import block_matrix_ids, muon_with_adamw
from ..optional import quiet_import
from .base import BuildContext, Spelling, Toggle, Tune

# name -> (library, what it keeps per parameter)
OPTIMIZERS = {
    "adamw_bnb_8bit": ("bitsandbytes", "AdamW8bit: two uint8 moments, ≈2 bytes/param"),
    "adam_bnb_8bit": ("bitsandbytes", "Adam8bit: two uint8 moments, ≈2 bytes/param"),
    "paged_adamw_8bit": ("bitsandbytes", "PagedAdamW8bit: as AdamW8bit, state in unified memory that can page "
                                          "out to the host"),
    "lion_8bit": ("bitsandbytes", "Lion8bit: one uint8 momentum, ≈1 byte/param"),
    "adafactor": ("torch", "Adafactor: factored second moment (a row and a column per matrix), no momentum"),
    "adamw_torch": ("torch", "AdamW, torch's default implementation: two fp32 moments, 8 bytes/param"),
    "adamw_torch_foreach": ("torch", "AdamW(foreach=True): the update batched over many tensors per kernel"),
    "adamw_torch_fused": ("torch", "AdamW(fused=True): the whole update in one fused kernel"),
    "muon": ("torch", "Muon for the blocks' 2-D weight matrices (one fp32 momentum, 4 bytes/param), AdamW for "
                      "the rest (embeddings, norms, biases, head: 8 bytes/param)"),
}
EIGHT_BIT = ("adamw_bnb_8bit", "adam_bnb_8bit", "paged_adamw_8bit", "lion_8bit")


# name -> (TrainingArguments' name, torch's weight decay (TrainingArguments' is 0.0), code, what that name does not say)
SPELLED = {
    "adamw_torch": ("adamw_torch", 0.01, "torch.optim.AdamW({p}, lr={lr})", ""),
    "adamw_torch_foreach": ("adamw_torch", 0.01, "torch.optim.AdamW({p}, lr={lr}, foreach=True)", "TrainingArguments has "
                            "no foreach switch: adamw_torch is torch's AdamW, foreach by default on a GPU"),
    "adamw_torch_fused": ("adamw_torch_fused", 0.01, "torch.optim.AdamW({p}, lr={lr}, fused=True)", ""),
    "adamw_bnb_8bit": ("adamw_bnb_8bit", 0.01, "bnb.optim.AdamW8bit({p}, lr={lr})", ""),
    "adam_bnb_8bit": ("adamw_bnb_8bit", 0.0, "bnb.optim.Adam8bit({p}, lr={lr})", "TrainingArguments has no Adam8bit: "
                      "AdamW8bit with weight_decay=0 is the same update"),
    "paged_adamw_8bit": ("paged_adamw_8bit", 0.01, "bnb.optim.PagedAdamW8bit({p}, lr={lr})", ""),
    "lion_8bit": ("lion_8bit", 0.0, "bnb.optim.Lion8bit({p}, lr={lr})", ""),
    "adafactor": ("adafactor", 0.0, "torch.optim.Adafactor({p})  # its lr is relative: torch's default 1e-2",
                  "TrainingArguments' adafactor is transformers' Adafactor; scalekit's is torch.optim.Adafactor"),
    "muon": ("", 0.01, "muon_with_adamw({m}, [p for p in {m}.parameters() if p.requires_grad], lr={lr})", ""),
}
# TrainingArguments' optim -> this toggle's value (None: the baseline, torch's AdamW)
FROM_TRAINING_ARGUMENTS = {"adamw_torch": None, "adamw_torch_fused": "adamw_torch_fused", "adamw_bnb_8bit": "adamw_bnb_8bit",
                           "adamw_8bit": "adamw_bnb_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
                           "lion_8bit": "lion_8bit", "adafactor": "adafactor"}


class Optim(Toggle):
    name = "optim"
    summary = "the optimizer: 8-bit Adam/AdamW/Lion (bitsandbytes), Adafactor, AdamW foreach/fused, or Muon with AdamW"
    cost = "8-bit and factored states approximate the fp32 moments; losses differ a little from AdamW"
    helps_when = "optimizer state is a large part of memory (AdamW keeps 8 bytes per parameter)"
    group = "optimizer"
    kind = "both"
    # a wrap-phase toggle, first of them: swapping the token embedding is a change to the model, so it must
    # come before checkpointing, compile and data-parallel wrappers see the parameters
    phase = "wrap"
    choices = tuple(OPTIMIZERS)
    tuning = (Tune("adamw_torch_fused", rank=60, label="fused AdamW"),
              Tune("adamw_bnb_8bit", rank=140, label="8-bit AdamW (to fit)", memory_only=True),
              Tune("muon", rank=145, label="Muon for the block matrices (to fit)", memory_only=True))

    def choice_available(self, hw, value: Any = True) -> tuple[bool, str]:
        """Whether optimizer `value` can be built here, and why not (the device does not matter: the library does)."""
        value = self.validate(value)
        library = OPTIMIZERS[value][0]
        if library == "bitsandbytes" and importlib.util.find_spec("bitsandbytes") is None:
            return False, f"optim={value!r} needs bitsandbytes, which is not installed (pip install bitsandbytes)"
        if value == "adafactor" and not hasattr(torch.optim, "Adafactor"):
            return False, f"torch {torch.__version__} has no torch.optim.Adafactor (added in torch 2.5)"
        if value == "muon" and not hasattr(torch.optim, "Muon"):
            return False, f"torch {torch.__version__} has no torch.optim.Muon (added in torch 2.9)"
        return True, ""

    def apply(self, ctx: BuildContext, value: str) -> None:
        # whether `value` runs here was asked before the build (choice_available, through check_available)
        if value in EIGHT_BIT:
            keep_embeddings_32bit(ctx, quiet_import("bitsandbytes"))
            if value.startswith("paged") and ctx.device.type != "cuda":
                ctx.notes.append("paged optimizer on CPU: bitsandbytes falls back to ordinary buffers")
        if value == "muon":
            if not block_matrix_ids(ctx.base_model):
                raise ToggleUnavailable(f"optim='muon' found no 2-D weight matrix in the repeated blocks of "
                                        f"{type(ctx.base_model).__name__} (Muon is for hidden matrices; "
                                        f"models.blocks says which modules are the blocks)")
            # the split is made over the final parameters (after wrappers), looked up through the wrappers
            ctx.optimizer_factory = lambda params: make_optimizer(value, params, lr=ctx.config.lr, model=ctx.model)
            return
        ctx.optimizer_factory = partial(make_optimizer, value, lr=ctx.config.lr)


    def plan(self, facts, value: str) -> None:
        facts.optimizer = value

    def traced(self, value: str) -> bool:
        return value not in EIGHT_BIT  # bitsandbytes' kernels cannot run on fake tensors: traced as AdamW

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"optim": "adamw_torch_fused"}

    def from_training_arguments(self, fields, notes) -> str | None:
        name = getattr(fields["optim"], "value", fields["optim"])  # transformers' OptimizerNames, or its string
        if not isinstance(name, str):
            raise ConfigError(f"TrainingArguments.optim must be an optimizer's name (a string such as 'adamw_torch'), "
                              f"got {name!r}")
        if name not in FROM_TRAINING_ARGUMENTS:
            notes.append(f"optim={name!r} not mapped: scalekit has no such optimizer (it trains with torch AdamW); "
                         f"mapped: {', '.join(FROM_TRAINING_ARGUMENTS)}")
            return None
        if name == "adafactor":
            notes.append(SPELLED[name][3])  # the same name, another implementation
        return FROM_TRAINING_ARGUMENTS[name]

    def spelling(self, target, value: str, cfg) -> Spelling:
        return optimizer_spelling(target, value, cfg)

    def off_spelling(self, target, cfg) -> Spelling:
        return optimizer_spelling(target, "adamw_torch", cfg)  # the baseline: torch's AdamW


def make_optimizer(value: str, params, lr: float, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
    """Optimizer `value` over `params`; Muon also needs the `model` (which of its 2-D weights are in its blocks)."""
    if value == "muon":
        if model is None:
            raise ConfigError("optim='muon' needs the model: which 2-D weights are in its repeated blocks decides what "
                              "Muon updates (make_optimizer(..., model=...))")
        return muon_with_adamw(model, list(params), lr=lr)
    if value == "adamw_torch":
        return torch.optim.AdamW(params, lr=lr)
    if value == "adamw_torch_foreach":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    if value == "adamw_torch_fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if value == "adafactor":
        # its lr is relative (a step is lr × the weight's RMS), not AdamW's: keep torch's default of 1e-2
        return torch.optim.Adafactor(params)
    bnb = quiet_import("bitsandbytes")
    cls = {"adamw_bnb_8bit": bnb.optim.AdamW8bit, "adam_bnb_8bit": bnb.optim.Adam8bit,
           "paged_adamw_8bit": bnb.optim.PagedAdamW8bit, "lion_8bit": bnb.optim.Lion8bit}[value]
    return cls(params, lr=lr)


def state_bytes_by_kind(optimizer: torch.optim.Optimizer) -> dict[str, dict[str, int]]:
    """{'quantized' | 'full precision': {'params': n, 'state_bytes': b}}: which tensors keep uint8 state."""
    params: dict[str, int] = {}
    tensors: dict[str, list[torch.Tensor]] = {}
    for p, state in optimizer.state.items():
        held = [v for v in state.values() if isinstance(v, torch.Tensor)]
        kind = "quantized" if any(v.dtype == torch.uint8 for v in held) else "full precision"
        params[kind] = params.get(kind, 0) + p.numel()
        tensors.setdefault(kind, []).extend(held)
    return {kind: {"params": params[kind], "state_bytes": storage_bytes(tensors[kind])} for kind in params}


def keep_embeddings_32bit(ctx: BuildContext, bnb) -> None:
    """8-bit state is too coarse for token embeddings (rare rows, large updates): keep theirs in 32 bits.

    The built-in GPT trained from scratch gets bitsandbytes' StableEmbedding (the embedding plus a LayerNorm,
    32-bit state), tied to lm_head as before; a model of your own, or pretrained weights (which a new LayerNorm
    would change), has its nn.Embedding weights registered for 32-bit state instead (what HF's Trainer does);
    a frozen embedding has no state at all.  bitsandbytes keeps such overrides in a process-wide manager: they
    are removed after the run.
    """
    manager = bnb.optim.GlobalOptimManager.get_instance()
    saved = dict(manager.pid2config), dict(manager.index2config), list(manager.module_weight_config_triple)
    # what an earlier optimizer left there is stale: index2config is keyed by (group, position) and pid2config
    # by id(), both of which a new model's parameters reuse (a Trainer run with an 8-bit optimizer leaves its
    # embeddings' entries behind, which would give this run's second parameter 32-bit state)
    manager.pid2config, manager.index2config = {}, {}
    model = ctx.base_model
    embedding = getattr(getattr(model, "transformer", None), "wte", None)
    if ctx.config.custom_model or ctx.config.init != "random" or \
            (embedding is not None and not embedding.weight.requires_grad):
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    else:
        old = model.transformer.wte
        # no device= here: bitsandbytes passes it positionally where torch now expects `_freeze`, which
        # would freeze the weight; build on the CPU and move it
        new = bnb.nn.StableEmbedding(old.num_embeddings, old.embedding_dim).to(old.weight.device)
        with torch.no_grad():
            new.weight.copy_(old.weight)  # GPT-2's initialisation, so only the optimizer and the norm differ
        model.transformer.wte = new
        if model.lm_head.weight is old.weight:
            model.lm_head.weight = new.weight
        ctx.notes.append("token embedding → bitsandbytes StableEmbedding (LayerNorm after it, 32-bit state)")

    def restore() -> None:
        manager.pid2config, manager.index2config = saved[0], saved[1]
        manager.module_weight_config_triple[:] = saved[2]

    ctx.stack.callback(restore)


def optimizer_spelling(target: str, value: str, cfg) -> Spelling:
    """Optimizer `value` in `target`'s code: TrainingArguments' optim, or the optimizer built over the parameters."""
    name, decay, code, caveat = SPELLED[value]
    if value == "muon":
        if target == "hf":
            return Spelling(missing="TrainingArguments has no Muon: give the Trainer optimizers=(muon_with_adamw(model, "
                                    "params, lr), None) from scalekit.models.muon")
        return Spelling(optimizer=code.format(m="self" if target == "lightning" else "model", lr=repr(cfg.lr)),
                        imports=("from scalekit.models.muon import muon_with_adamw",))
    if target == "hf":
        return Spelling(kwargs={"optim": name, "weight_decay": decay},
                        notes=(f"optim={value!r} → {name!r}: {caveat}",) if caveat else ())
    line = code.format(p="self.parameters()" if target == "lightning" else "model.parameters()", lr=repr(cfg.lr))
    if value not in EIGHT_BIT:
        return Spelling(optimizer=line)
    return Spelling(optimizer=f"{line}  # bitsandbytes; weight_decay={decay} by default", imports=("import bitsandbytes as bnb",))


TOGGLE = Optim()
