"""The decode loop: prefill the prompts, then one new token per prompt per step, timed step by step.

Read `decode` top to bottom: a fresh KV cache of the kind the toggles chose (or none), the prompt's forward
(the prefill), then steps that feed the last token (with a cache) or the whole sequence so far (without
one) and pick the next token.  How a forward runs with a cache and where its logits are is the model
family's (`ctx.model_adapter`, scalekit.models.family): the built-in GPT's convention, gpt-fast's
setup_caches, transformers' own caches; the loop is the same for all.  Each decode step is timed on the device (CUDA events, or a monotonic clock
on the CPU, where ops run synchronously); tokens are read back to the host only where a caller streams them.
With a static cache the position goes in as a tensor updated in place, so a compiled step sees the same
inputs every time: one graph.  The prefill runs the model eagerly (its shape is the prompt's): only the
decode step is compiled.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..measure.timing import step_timer, synchronize
from ..models.conventions import BUILTIN
from ..models.family import logits_of  # noqa: F401 - reached as scalekit.inference.loop.logits_of
from ..toggles import BuildContext


@dataclass
class Decoded:
    """What one pass of the decode loop produced and how long each part took."""

    tokens: torch.Tensor  # (B, new) the generated ids
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    step_ms: list[float] = field(default_factory=list)  # each decode step after the first token
    total_s: float = 0.0
    cache_bytes: int = 0
    stopped: bool = False
    # speculative decoding (scalekit.inference.speculative): per verification, draft tokens kept and proposed
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    target_forwards: int = 0  # forwards of the model itself, the prefill included
    draft_forwards: int = 0  # forwards of the draft model
    draft_ms: float = 0.0  # time spent proposing with the draft model


def pad_prompts(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts of different lengths, left-padded into one (B, T) tensor; `pad` counts each row's padding
    (None when every prompt has the same length)."""
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, longest - len(p):] = torch.tensor(p, dtype=torch.long)
    pad = torch.tensor([longest - len(p) for p in prompts], dtype=torch.long)
    same = bool((pad == 0).all())
    return ids.to(device), (None if same else pad.to(device))


def sample(logits: torch.Tensor, sampling) -> torch.Tensor:
    """The next token of each row: the argmax (temperature 0), or a draw from softmax(logits / temperature)."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, sampling)
    return torch.multinomial(probs, num_samples=1, generator=sampling.generator).squeeze(-1)


def probabilities(logits: torch.Tensor, sampling) -> torch.Tensor:
    """What sampling draws from: softmax(logits / temperature), over the top_k most likely tokens if set."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(logits, min(sampling.top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return F.softmax(logits, dim=-1)


def step_contexts(ctx: BuildContext):
    """The contexts generation runs under: the grad mode (no_grad, or inference_mode) and autocast."""
    stack = contextlib.ExitStack()
    stack.enter_context(ctx.inference_context())
    if ctx.compute_dtype is not None:
        stack.enter_context(torch.autocast(ctx.device.type, dtype=ctx.compute_dtype))
    return stack


def prepare_caches(ctx: BuildContext, family, model, batch: int, max_len: int) -> None:
    """The family's preparation of `model` for forwards of `batch` rows and up to `max_len` positions (a gpt-fast
    style model sets up its caches), under the autocast those forwards run under: caches are then allocated in
    the dtype the keys will come in.  Not under the grad mode: a cache allocated in inference_mode could not be
    written by a later forward outside it (the quality's reference)."""
    autocast = torch.autocast(ctx.device.type, dtype=ctx.compute_dtype) if ctx.compute_dtype is not None \
        else contextlib.nullcontext()
    with autocast:
        family.prepare(model, batch, max_len)


PROBE_TOKENS = 2  # a forward of this many tokens shows whether a model returns logits for each position


def positions_shortfall(model: torch.nn.Module, logits: torch.Tensor, tokens: int) -> str | None:
    """None when `logits` hold a row for each of the `tokens` positions given; else what the model returned, in
    words naming its class (nanoGPT's forward without targets returns the last position alone, (B, 1, vocab))."""
    if logits.dim() == 3 and logits.shape[1] == tokens:
        return None
    only = " for the last position only" if logits.dim() == 3 and logits.shape[1] == 1 else ""
    name = type(getattr(model, "_orig_mod", model)).__name__
    return f"{name}'s forward returns logits{only} (shape {tuple(logits.shape)} for {tokens} tokens)"


@torch.no_grad()
def probe_positions(family, model: torch.nn.Module, device) -> str | None:
    """positions_shortfall of one forward of a short sequence (eager, without a cache): decoding reads only the
    last position, so any model generates; perplexity and speculative verification need every position."""
    ids = torch.zeros(1, PROBE_TOKENS, dtype=torch.long, device=device)
    family.prepare(model, 1, PROBE_TOKENS)
    return positions_shortfall(model, family.logits(model, ids), PROBE_TOKENS)


def family_of(ctx: BuildContext):
    """The model family that says how a forward runs (the built-in GPT's convention when the run has none:
    a training run's evaluation of the built-in GPT)."""
    return ctx.model_adapter if ctx.model_adapter is not None else BUILTIN


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy (temperature 0), or drawn from softmax(logits / temperature)."""

    temperature: float = 0.0
    top_k: int | None = None
    generator: torch.Generator | None = None


GREEDY = Sampling()


def decode(ctx: BuildContext, ids: torch.Tensor, pad: torch.Tensor | None, new_tokens: int, max_len: int,
           sampling: Sampling = GREEDY, on_token: Callable | None = None, stop=None, model=None) -> Decoded:
    """Generate `new_tokens` after the prompts `ids` (B, T0); the cache (if any) holds `max_len` positions."""
    model = model or ctx.model  # what decode steps call: compiled when compile is on
    family = family_of(ctx)
    B, T0 = ids.shape
    prepare_caches(ctx, family, ctx.base_model, B, max_len)
    cache = family.new_cache(ctx.base_model, ctx.kv_cache, B, max_len, ctx.device) if ctx.kv_cache else None
    seq = torch.zeros(B, T0 + new_tokens, dtype=torch.long, device=ctx.device)
    seq[:, :T0] = ids
    timer = step_timer(ctx.device)
    out = Decoded(tokens=seq[:, T0:T0])
    t0 = time.perf_counter()
    steps = 0  # tokens made so far (a Ctrl-C keeps them)
    with step_contexts(ctx):
        try:
            logits = _prefill(ctx, family, model, ids, pad, cache, out)
            tok = sample(logits[:, -1], sampling)
            seq[:, T0] = tok
            steps = 1
            first = tok.tolist()  # the first token on the host: time to first token
            out.ttft_ms = (time.perf_counter() - t0) * 1e3
            if on_token is not None:
                on_token(0, T0, out.ttft_ms, first)
            input_pos = torch.tensor([T0], device=ctx.device)  # the position of the token fed next
            for i in range(1, new_tokens):
                if stop is not None and stop.is_set():
                    out.stopped = True
                    break
                t_step = time.perf_counter()
                timer.start()
                logits = _step_logits(family, model, seq, tok, cache, input_pos, pad, T0 + i)
                tok = sample(logits[:, -1], sampling)
                seq[:, T0 + i] = tok
                steps += 1
                timer.stop()
                if on_token is not None:  # reading the token is a device sync: only when streaming
                    ids_now = tok.tolist()
                    on_token(i, T0 + i, (time.perf_counter() - t_step) * 1e3, ids_now)
        except KeyboardInterrupt:  # Ctrl-C: what was made is kept, the step it interrupted is not timed
            timer.discard()
            out.stopped = True
        out.step_ms = timer.collect()[:max(0, steps - 1)]
        synchronize(ctx.device)
    out.total_s = time.perf_counter() - t0
    out.tokens = seq[:, T0:T0 + steps]
    out.cache_bytes = family.cache_bytes(cache) if cache is not None else 0
    return out


def _step_logits(family, model, seq: torch.Tensor, tok: torch.Tensor, cache, input_pos: torch.Tensor, pad,
                 length: int):
    """One decode step's logits: the last token into the cache, or (without one) the whole sequence again."""
    if cache is None:
        return family.logits(model, seq[:, :length], pad=pad, last_only=True)
    # the last token as its own (B, 1) tensor: a slice of `seq` would carry seq's strides, which differ
    # between generations of different lengths and would make compile recompile
    logits = family.logits(model, tok.view(-1, 1), cache, input_pos, pad, last_only=True)
    input_pos += 1  # in place: the compiled step sees the same tensor, one graph
    return logits


def _prefill(ctx: BuildContext, family, model, ids: torch.Tensor, pad, cache, out: Decoded) -> torch.Tensor:
    """The prompts' forward pass (filling the cache, if any), timed on its own; the logits."""
    synchronize(ctx.device)
    t = time.perf_counter()
    if cache is not None:
        # eagerly, on the unwrapped model: its shape is the prompt's, and only the decode step is compiled
        input_pos = torch.arange(ids.shape[1], device=ctx.device)
        logits = family.logits(ctx.base_model, ids, cache, input_pos, pad, last_only=True)
    else:
        logits = family.logits(model, ids, pad=pad, last_only=True)
    synchronize(ctx.device)
    out.prefill_ms = (time.perf_counter() - t) * 1e3
    return logits
