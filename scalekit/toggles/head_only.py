"""Head only: freeze the whole model and train a new output layer on top of it."""

from __future__ import annotations

import torch

from ..errors import ToggleUnavailable
from ..models.blocks import find_blocks, own_model_on_meta
from .base import BuildContext, Spelling, Toggle


class HeadOnly(Toggle):
    name = "head_only"
    summary = "freeze the body, train a new output layer (a copy of the old one, untied from the embedding)"
    cost = "only the last layer learns: the representation stays the pretrained one"
    helps_when = "the new task is close to the old one and memory or time is tight: the smallest fine-tune"
    group = "finetune"
    trains_few_weights = True  # the base stays frozen
    kind = "memory"
    phase = "wrap"

    def apply(self, ctx: BuildContext, value) -> None:
        model = ctx.base_model
        name, old = output_layer(model)
        for p in model.parameters():
            p.requires_grad_(False)
        head = new_head(old)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, head)
        ctx.notes.append(f"head_only: {name} trains ({sum(p.numel() for p in head.parameters()):,} parameters); "
                         f"the rest is frozen")


    def plan(self, facts, value) -> None:
        facts.analytic = False  # the built-in GPT's analytic plan has no frozen base or adapters: traced

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        own, why = own_model_on_meta(getattr(cfg, "model", None))
        if own is not None or why:
            return own_model_spelling(own, why)
        # a copy of the output layer, not shared with the frozen input embedding (GPT-2 ties them)
        return Spelling(imports=("import copy",), model=(
            "for p in model.parameters():  # head_only: the body frozen, a fresh copy of the output layer trains",
            "    p.requires_grad_(False)",
            "model.set_output_embeddings(copy.deepcopy(model.get_output_embeddings()).requires_grad_(True))",
            "model.config.tie_word_embeddings = False"))


def output_layer(model: torch.nn.Module) -> tuple[str, torch.nn.Linear]:
    """The model's output layer: its `lm_head` (the built-in GPT, nanoGPT, Hugging Face causal LMs), else the
    last nn.Linear outside its repeated blocks."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, torch.nn.Linear):
        return "lm_head", head
    blocks = find_blocks(model)
    inside = {id(m) for b in (blocks or []) for m in b.modules()}
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and id(m) not in inside]
    if not linears:
        raise ToggleUnavailable("head_only needs an output layer: the model has no lm_head and no nn.Linear outside "
                                "its repeated blocks")
    return linears[-1]


def new_head(old: torch.nn.Linear) -> torch.nn.Linear:
    """A fresh nn.Linear of the same shape starting from the old weights, not shared with anything (the
    built-in GPT ties lm_head to the token embedding, which stays frozen)."""
    head = torch.nn.Linear(old.in_features, old.out_features, bias=old.bias is not None,
                           device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        if old.bias is not None:
            head.bias.copy_(old.bias)
    return head


def own_model_spelling(model: torch.nn.Module | None, why: str) -> Spelling:
    """head_only written for your own nn.Module (`model`, built on the meta device; None and `why` when it could not
    be): every parameter frozen, and the output layer scalekit picks (output_layer) replaced by a trained copy."""
    if model is None:
        return Spelling(missing=f"{why}, to find its output layer: freeze all but a copy of it by hand")
    try:
        name, _ = output_layer(model)
    except ToggleUnavailable as exc:
        return Spelling(missing=str(exc))
    parent, _, attr = name.rpartition(".")
    if not parent and attr.isidentifier():
        swap = f"model.{attr} = copy.deepcopy(model.{attr}).requires_grad_(True)"
    else:
        owner = f"model.get_submodule({parent!r})" if parent else "model"
        swap = f"setattr({owner}, {attr!r}, copy.deepcopy(model.get_submodule({name!r})).requires_grad_(True))"
    return Spelling(imports=("import copy",), model=(
        f"for p in model.parameters():  # head_only: the body frozen, a fresh copy of the output layer ({name}) trains",
        "    p.requires_grad_(False)",
        swap))


TOGGLE = HeadOnly()
