"""What the repeated blocks of a model are: the one rule that checkpointing, FSDP and adapter targeting share.

The rule, in order:
1. a container at a path that model libraries use for their layer stack, searched in this order:
   `transformer.h` (scalekit's GPT, nanoGPT, Hugging Face GPT-2), `model.layers` (Llama, Mistral, Qwen),
   `model.decoder.layers` (OPT), `gpt_neox.layers`, `encoder.layer` (BERT), then `layers`, `blocks`, `h`
   at the top level; a wrapper's inner model (torch.compile's `_orig_mod`, DDP's `module`, peft's
   `base_model.model`) is looked through;
2. else the `nn.ModuleList` or `nn.Sequential` holding the most parameters (its members are the blocks);
3. else None: the model has no repeated blocks.
"""

from __future__ import annotations

import torch

KNOWN_PATHS = ("transformer.h", "model.layers", "model.decoder.layers", "gpt_neox.layers", "encoder.layer",
               "layers", "blocks", "h")
WRAPPER_PATHS = ("_orig_mod", "module", "base_model.model")
CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


def _get(module: torch.nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, torch.nn.Module):
            return None
    return module


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The model beneath compile, DDP and peft wrappers."""
    while True:
        inner = next((m for p in WRAPPER_PATHS if (m := _get(model, p)) is not None), None)
        if inner is None or inner is model:
            return model
        model = inner


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: torch.nn.Module) -> torch.nn.ModuleList | torch.nn.Sequential | None:
    """The container of the model's repeated blocks, by the rule in this module's docstring."""
    inner = _inner(model)
    for path in KNOWN_PATHS:
        found = _get(inner, path)
        if isinstance(found, CONTAINERS) and len(found):
            return found
    containers = [m for m in inner.modules() if isinstance(m, CONTAINERS) and len(m) and _n_params(m)]
    if not containers:
        return None
    return max(containers, key=_n_params)  # the first of equals: the outermost, in module order


def block_list(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks themselves, in order ([] when the model has none)."""
    blocks = find_blocks(model)
    return [] if blocks is None else list(blocks)


def is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' Conv1D (GPT-2's projections): a linear layer whose weight is stored (in, out)."""
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers")


def block_linears(model: torch.nn.Module, names=None, conv1d: bool = False) -> list[str]:
    """Qualified names of the nn.Linear layers inside the model's repeated blocks (the layers adapters and
    quantization act on), optionally only those whose own name is in `names` (e.g. ('c_attn', 'c_fc')).
    conv1d: count transformers' Conv1D as linear too (LoRA adapts it; the quantizers take only nn.Linear)."""
    blocks = find_blocks(model)
    if blocks is None:
        return []
    inside = {id(m) for b in blocks for m in b.modules()}
    return [qualified for qualified, m in model.named_modules()
            if id(m) in inside and (isinstance(m, torch.nn.Linear) or (conv1d and is_conv1d(m)))
            and (names is None or qualified.rsplit(".", 1)[-1] in names)]
