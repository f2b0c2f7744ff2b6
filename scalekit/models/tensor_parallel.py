"""Megatron-style tensor parallelism for a model's blocks, with torch.distributed.tensor.parallel.

In each block, the layers that widen (attention's query/key/value projection, the MLP's first linear) are
split by output columns (ColwiseParallel: each rank computes its own heads, its own slice of the hidden
units) and the layers that narrow back (attention's output projection, the MLP's second linear) by input rows
(RowwiseParallel: each rank's partial product, then one all-reduce).  Two all-reduces per block in forward,
two in backward (Shoeybi et al., "Megatron-LM", 2019, section 3).  Everything else is replicated.

The built-in GPT fuses q, k and v in one `c_attn` linear ([q; k; v] rows): split by columns as it is, rank 0
would get all of q and half of k.  Its rows are regrouped by rank first ([q_0; k_0; v_0; q_1; k_1; v_1]) so
each rank's slice holds its own heads' q, k and v; `full_parameters` undoes the regrouping.
The built-in GPT is recognised by its class: GPT-2 from transformers or a nanoGPT-style model of your own has the
same attribute names, not the same layout (GPT-2's c_attn is a Conv1D, its weight in × out).
A Hugging Face model is split by its own plan (`config.base_model_tp_plan`, transformers' tensor-parallel
plan), its layers' entries read here and applied with the same two torch styles (where the plan gathers a
column-split output whole again, as Phi-3's does for its fused qkv, or cuts a whole input for a row-split layer,
the styles say so); its embeddings and head stay replicated.  A model transformers declares no plan for (GPT-2,
OPT and Falcon in transformers 5.25) is refused, naming it.

Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
2022, section 4.2.2) splits what tensor parallelism leaves whole: between the split layers, the residual
stream, the norms and their activations are cut along the sequence (`Shard(1)`), each rank normalising its
own tokens (torch's `SequenceParallel`).  The row-wise layers then reduce-scatter instead of all-reducing
(`RowwiseParallel(output_layouts=Shard(1))`), and attention and the MLP gather the sequence back at their
input (`PrepareModuleInput`: `Shard(1)` → `Replicate()`): the same traffic as the all-reduce, and the norms'
activations 1/degree per rank.  The first block cuts its input (the embeddings), the head gathers the last
norm's output.
"""

from __future__ import annotations

import inspect
import re

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..errors import ConfigError
from .gpt import GPT

GPT_PLAN = {"attn.c_attn": "colwise", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}
# transformers' names of the styles, as torch's: a layer split by columns whose output is gathered whole again, a
# layer split by rows that takes a whole input and cuts it (Phi-3's plan: its attention runs whole on every rank,
# its fused qkv and gate/up weights split)
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
          "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
          "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate())}
# the Hugging Face families trained split against one process (tests/test_distributed_parallel*.py)
CHECKED_FAMILIES = ("llama", "phi3", "gemma2", "gpt_neox")
LOCAL_STYLES = ("colwise", "rowwise")  # the styles whose output stays split: what sequence parallelism rewrites


def is_builtin_gpt(model: nn.Module) -> bool:
    """scalekit's own GPT (by its class: a nanoGPT-style model of your own, or GPT-2 from transformers, has the same
    attribute names and neither its layout nor its plan)."""
    return isinstance(model, GPT)


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


def layer_plan(config) -> dict[str, dict[str, str]]:
    """A transformers config's tensor-parallel plan for its layers: {'layers': {'self_attn.q_proj': 'colwise', ...}}
    (the embeddings and head, which the plan may name too, stay replicated)."""
    layers: dict[str, dict[str, str]] = {}
    for pattern, style in (getattr(config, "base_model_tp_plan", None) or {}).items():  # "layers.*.mlp.up_proj"
        head, star, rest = pattern.partition(".*.")
        if star:
            layers.setdefault(head, {})[rest] = style
    return layers


def plan_refusal(config, name: str) -> str | None:
    """Why a Hugging Face model of class `name` with transformers config `config` is not split here (None: it is)."""
    layers = layer_plan(config)
    if not layers:
        return (f"tensor_parallel: {name} has no tensor-parallel plan: scalekit splits the built-in GPT "
                f"(scalekit.models.gpt.GPT) and Hugging Face models whose config declares one for their layers "
                f"(config.base_model_tp_plan; {', '.join(CHECKED_FAMILIES)} checked), and transformers declares none "
                f"for this model")
    other = sorted({style for inner in layers.values() for style in inner.values() if style not in STYLES})
    if other:
        return (f"tensor_parallel: {name}'s plan uses {', '.join(other)}, which scalekit does not apply (it applies "
                f"{', '.join(STYLES)})")
    return None


def _hf_plan(model: nn.Module) -> tuple[list[tuple[nn.Module, dict]], int, int]:
    """A Hugging Face model's plan for its layers, refused in one line where it has none or it cannot be applied."""
    config = getattr(model, "config", None)
    base = getattr(model, "base_model", None)
    name = type(model).__name__
    why = plan_refusal(config, name) if base is not None else plan_refusal(None, name)
    if why is not None:
        raise ConfigError(why)
    layers = layer_plan(config)
    pairs: list[tuple[nn.Module, dict]] = []
    for head, inner in layers.items():
        pairs += [(block, dict(inner)) for block in base.get_submodule(head)]
    for block, inner in pairs[:1]:  # torch's styles split nn.Linear (weight: out × in) only
        odd = {sub: type(block.get_submodule(sub)).__name__ for sub in inner
               if not isinstance(block.get_submodule(sub), nn.Linear)}
        if odd:
            raise ConfigError(f"tensor_parallel: {name}'s plan splits {', '.join(f'{k} ({v})' for k, v in odd.items())}"
                              f", which torch's column- and row-wise styles do not split (they split nn.Linear)")
    heads = config.num_attention_heads
    return pairs, heads, getattr(config, "num_key_value_heads", None) or heads


def group_qkv_by_rank(t: torch.Tensor, degree: int) -> torch.Tensor:
    """c_attn's rows [q; k; v] as [q_0; k_0; v_0; q_1; ...], rank r's slice holding its heads' q, k, v."""
    return t.reshape(3, degree, t.shape[0] // (3 * degree), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def ungroup_qkv(t: torch.Tensor, degree: int) -> torch.Tensor:
    return t.reshape(degree, 3, t.shape[0] // (3 * degree), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def parallelize(model: nn.Module, mesh, degree: int, sequence_parallel: bool = False, only=None) -> int:
    """Split every block of `model` over `mesh` (tp_plan), or only the blocks in `only` (a pipeline stage's), with the
    norms split along the sequence if `sequence_parallel`; the blocks split.  The built-in GPT's attention then runs
    its share of the heads."""
    pairs, heads = tp_plan(model, degree)
    every = len(pairs)
    if only is not None:
        held = {id(block) for block in only}
        pairs = [(block, plan) for block, plan in pairs if id(block) in held]
    if not pairs:
        raise ConfigError(f"tensor_parallel: none of the {every} blocks of {type(model).__name__}'s plan is among the "
                          f"blocks this rank holds")
    if sequence_parallel and len(pairs) < every:
        raise ConfigError(f"tensor_parallel={degree},sequence_parallel: the sequence is cut at the model's first block "
                          f"and gathered at its head, and this rank holds {len(pairs)} of its {every} blocks (a "
                          f"pipeline's stage): split the sequence without a pipeline, or give tensor_parallel={degree}")
    gpt = is_builtin_gpt(model)
    gathered = sorted({style for _, plan in pairs for style in plan.values() if style not in LOCAL_STYLES})
    if sequence_parallel and gathered:
        raise ConfigError(f"tensor_parallel={degree},sequence_parallel: {type(model).__name__}'s plan takes or gives "
                          f"its split layers' activations whole ({', '.join(gathered)}), which the sequence-parallel "
                          f"styles do not rewrite (they rewrite plans of 'colwise' and 'rowwise' only); give "
                          f"tensor_parallel={degree}")
    ends = sequence_ends(model) if sequence_parallel else None  # refused here before anything is split
    for block, plan in pairs:
        if gpt:
            with torch.no_grad():
                for p in block.attn.c_attn.parameters():
                    p.copy_(group_qkv_by_rank(p, degree))
            block.attn.n_head = heads // degree  # its forward reads the local width from the tensors
        styles = {name: STYLES[style]() for name, style in plan.items()}
        if sequence_parallel:
            styles = {**styles, **sequence_styles(block, plan, gpt)}
        parallelize_module(block, mesh, styles)
    if ends is not None:
        first, norm, head = ends
        parallelize_module(first, mesh, PrepareModuleInput(input_layouts=(Replicate(),),
                                                           desired_input_layouts=(Shard(1),), use_local_output=True))
        parallelize_module(norm, mesh, SequenceParallel())
        parallelize_module(head, mesh, PrepareModuleInput(input_layouts=(Shard(1),),
                                                          desired_input_layouts=(Replicate(),), use_local_output=True))
    return len(pairs)


def sequence_ends(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    """(the first block, the final norm, the head): where the sequence is cut and gathered back; ConfigError for a
    model whose final norm scalekit does not find."""
    if is_builtin_gpt(model):
        return model.transformer.h[0], model.transformer.ln_f, model.lm_head
    norm = getattr(getattr(model, "base_model", None), "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if norm is None or head is None:
        raise ConfigError(f"tensor_parallel sequence_parallel: {type(model).__name__} has no base_model.norm and "
                          f"output embeddings where scalekit cuts and gathers the sequence (Llama-style decoders "
                          f"and the built-in GPT have them)")
    return _hf_plan(model)[0][0][0], norm, head


def sequence_styles(block: nn.Module, plan: dict, gpt: bool) -> dict:
    """A block's styles for sequence parallelism: its norms SequenceParallel, the row-wise layers reduce-scattering
    along the sequence, attention and the MLP gathering it at their input."""
    styles = {name: RowwiseParallel(output_layouts=Shard(1)) for name, style in plan.items() if style == "rowwise"}
    norms = [name for name, child in block.named_children() if _is_norm(child)]
    styles.update({name: SequenceParallel() for name in norms})
    for inner in sorted({name.split(".")[0] for name in plan}):  # attention and the MLP
        takes = block.get_submodule(inner)
        if gpt and inner == "attn":  # attn(x, cache, input_pos, mask), positionally
            styles[inner] = PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                               desired_input_layouts=(Replicate(), None, None, None))
        elif not gpt and inner != "mlp" and "hidden_states" in inspect.signature(takes.forward).parameters:
            # a Hugging Face attention is called with hidden_states=...; its MLP positionally
            styles[inner] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                               desired_input_kwarg_layouts={"hidden_states": Replicate()})
        else:
            styles[inner] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return styles


def _is_norm(module: nn.Module) -> bool:
    """A LayerNorm or RMSNorm (torch's, or a model's own class named so): one weight vector, no children."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith(("LayerNorm", "RMSNorm"))


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
