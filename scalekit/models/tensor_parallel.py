"""Megatron-style tensor parallelism for a model's blocks, with torch.distributed.tensor.parallel.

In each block, the layers that widen (attention's query/key/value projection, the MLP's first linear) are
split by output columns (ColwiseParallel: each rank computes its own heads, its own slice of the hidden
units) and the layers that narrow back (attention's output projection, the MLP's second linear) by input rows
(RowwiseParallel: each rank's partial product, then one all-reduce).  Two all-reduces per block in forward,
two in backward (Shoeybi et al., "Megatron-LM", 2019, section 3).  Everything else is replicated.

The built-in GPT fuses q, k and v in one `c_attn` linear ([q; k; v] rows): split by columns as it is, rank 0
would get all of q and half of k.  Its rows are regrouped by rank first ([q_0; k_0; v_0; q_1; k_1; v_1]) so
each rank's slice holds its own heads' q, k and v; `full_parameters` undoes the regrouping.
A Hugging Face model is split by its own plan (`config.base_model_tp_plan`, transformers' tensor-parallel
plan), read here and applied with the same two torch styles.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ..errors import ConfigError

GPT_PLAN = {"attn.c_attn": "colwise", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def is_builtin_gpt(model: nn.Module) -> bool:
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    return blocks is not None and len(blocks) > 0 and hasattr(blocks[0], "attn") and hasattr(blocks[0].attn, "c_attn")


def tp_plan(model: nn.Module, degree: int) -> tuple[list[tuple[nn.Module, dict]], int]:
    """(block, {submodule: style name}) for every block of `model`, and its attention heads; ConfigError when the
    model has no plan or `degree` does not divide its heads (naming the numbers)."""
    if is_builtin_gpt(model):
        heads, kv_heads = model.config.n_head, model.config.n_head
        pairs = [(block, dict(GPT_PLAN)) for block in model.transformer.h]
    else:
        pairs, heads, kv_heads = _hf_plan(model)
    for what, n in (("attention heads", heads), ("key/value heads", kv_heads)):
        if n % degree:
            raise ConfigError(f"tensor_parallel={degree}: the model's {n} {what} do not split over {degree} ranks "
                              f"(the degree must divide {n})")
    return pairs, heads


def _hf_plan(model: nn.Module) -> tuple[list[tuple[nn.Module, dict]], int, int]:
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    base = getattr(model, "base_model", None)
    name = type(model).__name__
    if not plan or base is None:
        raise ConfigError(f"tensor_parallel: {name} has no tensor-parallel plan (the built-in GPT has one; a Hugging "
                          f"Face model brings its own as config.base_model_tp_plan, and this one has none)")
    other = sorted({style for style in plan.values() if style not in STYLES})
    if other:
        raise ConfigError(f"tensor_parallel: {name}'s plan uses {', '.join(other)}, which scalekit does not apply "
                          f"(it applies 'colwise' and 'rowwise' only)")
    pairs: list[tuple[nn.Module, dict]] = []
    layers = {}
    for pattern, style in plan.items():  # "layers.*.self_attn.q_proj": "colwise"
        head, _, rest = pattern.partition(".*.")
        layers.setdefault(head, {})[rest] = style
    for head, inner in layers.items():
        pairs += [(block, dict(inner)) for block in base.get_submodule(head)]
    heads = config.num_attention_heads
    return pairs, heads, getattr(config, "num_key_value_heads", None) or heads


def group_qkv_by_rank(t: torch.Tensor, degree: int) -> torch.Tensor:
    """c_attn's rows [q; k; v] as [q_0; k_0; v_0; q_1; ...], rank r's slice holding its heads' q, k, v."""
    return t.reshape(3, degree, t.shape[0] // (3 * degree), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def ungroup_qkv(t: torch.Tensor, degree: int) -> torch.Tensor:
    return t.reshape(degree, 3, t.shape[0] // (3 * degree), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def parallelize(model: nn.Module, mesh, degree: int) -> int:
    """Split every block of `model` over `mesh` (tp_plan); the blocks split.  The built-in GPT's attention then
    runs its share of the heads."""
    pairs, heads = tp_plan(model, degree)
    gpt = is_builtin_gpt(model)
    for block, plan in pairs:
        if gpt:
            with torch.no_grad():
                for p in block.attn.c_attn.parameters():
                    p.copy_(group_qkv_by_rank(p, degree))
            block.attn.n_head = heads // degree  # its forward reads the local width from the tensors
        parallelize_module(block, mesh, {name: STYLES[style]() for name, style in plan.items()})
    return len(pairs)


def full_parameters(model: nn.Module, degree: int = 1, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or its gradient) as one process would hold it: sharded ones gathered (a collective: every
    rank calls it), the built-in GPT's c_attn rows in their own order again."""
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None or t.device.type == "meta":  # (a pipeline stage's rank holds only its stage's weights)
            continue
        t = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
        if degree > 1 and re.search(r"\.attn\.c_attn\.(weight|bias)$", name) and is_builtin_gpt(model):
            t = ungroup_qkv(t, degree)
        out[name] = t
    return out
