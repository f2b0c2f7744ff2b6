"""Building a generation: the model, fresh, with the inference toggles applied phase by phase.

The same phases as a training run (`scalekit.toggles.PHASES`), walked with loop="generate": only toggles
that apply to generation act (tf32, bf16, sdpa, kv_cache, quantize, compile, inference_mode).  After the
"model_config" phase the model is built: the shipped weights loaded into a GPT of the (possibly changed)
config, a preset's random weights, or your model (built by its family: a Hugging Face model the Transformers
way, with the attention the sdpa toggle chose).  Generation has no data or optimizer to build.  Every
generation has a model family in `ctx.model_adapter` (scalekit.hf.family_of.generation_family): it says how the
decode loop runs a forward with the model's cache.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ..errors import ConfigError, ToggleUnavailable, toggle_why
from ..hf.family_of import generation_family
from ..models import GPT, PRESETS, GPTConfig
from ..models.blocks import find_blocks
from ..models.pretrained import PRETRAINED_NAMES, load_pretrained, pretrained_info
from ..models.speculative import tokenizer_mismatch
from ..toggles import PHASES, TOGGLES, BuildContext, apply_toggles
from .config import GenerateConfig
from .loop import probe_positions
from .weights import weight_bytes


def initial_gpt_config(cfg: GenerateConfig) -> GPTConfig | None:
    """The built-in GPT's config before the toggles change it (None for your own model)."""
    if isinstance(cfg.model, str):
        if cfg.model in PRETRAINED_NAMES:
            return GPTConfig(**pretrained_info(cfg.model)["config"])
        return PRESETS[cfg.model].gpt_config()
    if not cfg.custom_model:  # a scalekit GPT instance
        return copy.deepcopy(cfg.model.config)
    return None


def build_generation(cfg: GenerateConfig, hw, stack: contextlib.ExitStack) -> BuildContext:
    """The model, built fresh, with the generation toggles of `cfg` applied phase by phase."""
    torch.manual_seed(cfg.seed)
    ctx = BuildContext(config=cfg, hw=hw, device=hw.device, stack=stack, gpt_config=initial_gpt_config(cfg),
                       model_adapter=generation_family(cfg.model).copy())  # the toggles change the copy
    for phase in PHASES:
        apply_toggles(ctx, phase, cfg.toggles, loop="generate")
        if phase in BUILDERS:
            BUILDERS[phase](ctx)
    return ctx


def build_generation_model(ctx: BuildContext) -> None:
    cfg: GenerateConfig = ctx.config
    if ctx.gpt_config is None:  # a Hugging Face model, or your own: built fresh by its family
        model = ctx.model_adapter.build()
    else:
        model = GPT(ctx.gpt_config)  # the toggles' config (sdpa), with the source's weights loaded into it
        if isinstance(cfg.model, str) and cfg.model in PRETRAINED_NAMES:
            model.load_state_dict(load_pretrained(cfg.model).state_dict())
        elif not isinstance(cfg.model, str):
            model.load_state_dict(cfg.model.state_dict())
    # eval mode (no dropout); parameters keep requires_grad as built: autocast caches its bf16 copies of
    # weights only for leaves that require grad, so turning it off would re-cast every weight at every op
    model = model.to(ctx.device).eval()
    ctx.base_model = ctx.model = model
    ctx.blocks = find_blocks(model)
    ctx.built_weight_bytes = weight_bytes(model)
    # the reference quality is measured against: the model as built, in fp32 and unquantized. A copy only
    # when a toggle will replace weights; otherwise the same module, run without autocast
    changes = any(TOGGLES[name].changes_weights for name in cfg.toggles)
    ctx.reference_model = copy.deepcopy(model) if cfg.quality and changes else model


def check_verifiable(ctx: BuildContext) -> None:
    """Speculative decoding scores k drafted tokens in one forward of the model: refused, before anything is
    generated, for a model whose forward returns fewer positions than it is given (nanoGPT's returns the last)."""
    if ctx.speculative is None:
        return
    # under the run's autocast: a toggle may have left layers computing in its dtype (hqq's bf16 4-bit layers)
    autocast = (torch.autocast(ctx.device.type, dtype=ctx.compute_dtype) if ctx.compute_dtype is not None
                else contextlib.nullcontext())
    with torch.no_grad(), autocast:
        shortfall = probe_positions(ctx.model_adapter, ctx.base_model, ctx.device)
    if shortfall:
        raise ToggleUnavailable(toggle_why("speculative", (
            f"checks k drafted tokens in one forward of the model, which needs logits for every position, and "
            f"{shortfall}: generate without speculative, or give the model a forward that returns all positions")))


def build_draft(ctx: BuildContext) -> None:
    """The draft model speculative decoding proposes with (ctx.draft), when a toggle asked for one: a shipped
    model or a preset by name, or any model generation takes, built by its family; it must read the same
    token ids as the model (a draft's forward may return its last position alone: that is all a draft reads)."""
    check_verifiable(ctx)
    spec = ctx.speculative
    if spec is None or spec.mode != "draft":
        return
    cfg: GenerateConfig = ctx.config
    if isinstance(spec.draft, str):
        model = load_pretrained(spec.draft) if spec.draft in PRETRAINED_NAMES else GPT(PRESETS[spec.draft].gpt_config())
        family = generation_family(model)
    else:
        family = generation_family(spec.draft).copy()
        model = family.build()
    why = tokenizer_mismatch(cfg.vocab_size(), family.vocab_size,
                             spec.draft if isinstance(spec.draft, str) else family.family)
    if why:
        raise ConfigError(why)
    ctx.draft = (family, model.to(ctx.device).eval())


# What the generation build makes after the toggles of a phase.
BUILDERS = {"model_config": build_generation_model, "wrap": build_draft}
