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

from .family import ModelAdapter

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


def from_transformers(obj) -> bool:
    """A transformers model or config (or its class), subclasses of them included, told by the modules of its classes:
    transformers is not imported here."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__module__.startswith("transformers.") for c in cls.__mro__)


def is_own_model(source) -> bool:
    """RunConfig.model is your own model (a module, or what builds one), not the built-in GPT nor a Transformers model
    or spec; a function is taken as yours until it is called (own_model_on_meta looks at what it builds)."""
    return source is not None and not isinstance(source, ModelAdapter) and not from_transformers(source)


def own_model_on_meta(source) -> tuple[torch.nn.Module | None, str]:
    """Your own nn.Module for code written about it (exports), and why not: `source` is RunConfig.model (a module, or
    a class or function that builds one, built here on the meta device: no memory, no weights).  (None, "") for a
    Transformers model or spec, and for the built-in GPT (None); (None, why) when building it failed."""
    if not is_own_model(source):
        return None, ""
    try:
        if isinstance(source, torch.nn.Module):
            model = source
        else:
            with torch.device("meta"):
                model = source()
    except Exception as exc:  # noqa: BLE001 - any failure of the user's code: said, and the caller's general code kept
        return None, f"your model could not be built on the meta device ({type(exc).__name__}: {exc})"
    return (None, "") if from_transformers(model) or not isinstance(model, torch.nn.Module) else (model, "")


def blocks_path(model: torch.nn.Module) -> str | None:
    """The qualified name of the model's block container (None: no blocks, or the model itself is the container)."""
    blocks = find_blocks(model)
    return next((name for name, m in model.named_modules() if m is blocks and name), None)
