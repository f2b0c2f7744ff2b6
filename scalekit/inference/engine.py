"""The measured generation: build fresh with the inference toggles, warm up, measure, probe memory, quality.

Read `generate` top to bottom.  The warm-up (a short generation with the same prompts and cache size)
is not measured: compilation happens there, and its extra time is reported apart as `compile_s`.  The
measured generation times the prefill, the first token and every decode step on the device.  On a CPU
the peak memory comes from counting live tensor bytes over one more, unmeasured generation (eagerly, as
the training engine probes a compiled model); on a GPU from the allocator over the measured one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from ..errors import TokenCacheUnavailable
from ..machine import hardware
from ..measure import memory
from ..measure.attention_backend import AttentionWatch, backends_note
from ..measure.compiled import CompileWatch, graphs_made
from ..measure.session import measured_run
from ..measure.timing import Spread
from ..toggles import BuildContext
from .build import build_generation
from .config import GenerateConfig
from .loop import GREEDY, Decoded, Sampling, decode, pad_prompts
from .quality import heldout_unmeasurable, lossy_cache, measure_quality, same_prefix, unmeasurable
from .results import GenerateResult, TokenRecord, p90
from .speculative import speculative_decode
from .weights import _module_tensors, weight_bytes


def generate(config: GenerateConfig | None = None, *, on_token=None, on_status=None, stop=None, hw=None,
             catch_errors: bool = False, **fields) -> GenerateResult:
    """Generate from `config` (or GenerateConfig(**fields)), measured; the result holds the text and figures.

    on_token receives a TokenRecord per new token (the measured generation's: streaming reads each token
    back, a device sync per step); on_status short progress messages; `stop` (a threading.Event) ends the
    generation before its next token, keeping what it made.  With catch_errors, a failure comes back as a
    result with status "failed" and the error in plain words.
    """
    if config is None:
        config = GenerateConfig(**fields)
    elif fields:
        config = dataclasses.replace(config, **fields)
    hw = hw or hardware.detect(config.device, "GenerateConfig")
    cfg = config.resolve(hw)
    cfg.check_available(hw)
    status = on_status or (lambda message: None)
    result = GenerateResult(label=cfg.label, config=cfg.to_dict(), device=hw.device_name,
                            torch_version=torch.__version__)
    if stop is not None and stop.is_set():  # stopped before it began (a time budget ran out): build nothing
        result.status = "stopped"
        result.notes.append("stopped before it started: nothing was measured")
        return result
    with measured_run(result, hw.device_type, catch_errors, threads=cfg.threads) as stack:
        _build_and_measure(cfg, hw, stack, result, on_token, stop, status)
    status(f"{cfg.label}: {result.status}")
    return result


def _build_and_measure(cfg: GenerateConfig, hw, stack, result: GenerateResult, on_token, stop, status) -> None:
    t = time.perf_counter()
    status(f"building {cfg.label}")
    ctx = build_generation(cfg, hw, stack)
    result.build_s = time.perf_counter() - t
    result.notes.extend(ctx.notes)
    result.weight_bytes, result.weight_bytes_before = weight_bytes(ctx.base_model), ctx.built_weight_bytes
    prompts = cfg.prompt_ids()
    ids, pad = pad_prompts(prompts, ctx.device)
    result.batch_size, result.prompt_tokens = len(prompts), [len(p) for p in prompts]
    max_len = ids.shape[1] + cfg.max_new_tokens
    watch = CompileWatch() if ctx.compiled else None
    warm = _warm_up(ctx, cfg, result, ids, pad, max_len, stop, status)
    if warm is not None and warm.stopped:
        return
    graphs1 = graphs_made() if ctx.compiled else 0
    status(f"generating {cfg.max_new_tokens} tokens × {len(prompts)} prompt(s)")
    memory.cuda_memory_reset(ctx.device)
    text_prompts = any(isinstance(p, str) for p in cfg.prompts)
    tokenizer = cfg.get_tokenizer() if cfg.tokenizer is not None or text_prompts else None
    attention = AttentionWatch(enabled=not ctx.compiled)  # which SDPA kernel the measured generation ran
    with attention.step(measured=True):
        done = _decoder(ctx)(ctx, ids, pad, cfg.max_new_tokens, max_len, _sampling(cfg, ctx),
                             _streamer(on_token, tokenizer), stop)
    _record(ctx, result, done, prompts, tokenizer)
    result.sdpa_backends = dict(attention.calls)
    if attention.calls:
        result.notes.append(backends_note(attention.calls))
    if watch is not None:
        captured = watch.captured()
        result.graphs_compiled, result.graph_breaks = captured.graphs, captured.graph_breaks
        result.recompiles_measured = graphs_made() - graphs1
        result.compile_note = captured.note()
        if result.compile_note:
            result.notes.append(result.compile_note)
        if warm is not None:
            result.compile_s = max(0.0, warm.total_s - _steady_s(warm, result))
    if result.status == "ok":
        try:
            _memory(ctx, cfg, result, ids, pad, max_len, stop, status)
            _quality(ctx, cfg, result, ids, pad, done, max_len, status)
        except KeyboardInterrupt:  # Ctrl-C or Stop after the generation: its figures are kept
            result.status = "stopped"
            result.notes.append("stopped after the generation, while measuring memory or quality: the "
                                "generation's figures are kept, the rest is not measured")


def _warm_up(ctx: BuildContext, cfg: GenerateConfig, result: GenerateResult, ids, pad, max_len, stop, status):
    """The unmeasured generation first (compilation happens here); None when there is none."""
    if not cfg.warmup_tokens:
        return None
    status(f"warm-up: {min(cfg.warmup_tokens, cfg.max_new_tokens)} tokens"
           + (" (compiling: this can take a while)" if ctx.compiled else ""))
    warm = _decoder(ctx)(ctx, ids, pad, min(cfg.warmup_tokens, cfg.max_new_tokens), max_len, _sampling(cfg, ctx),
                         stop=stop)
    result.warmup_s = warm.total_s
    if warm.stopped:
        result.status = "stopped"
        result.notes.append("stopped during the warm-up: nothing was measured")
    return warm


def _decoder(ctx: BuildContext):
    """The decode loop this build runs: the speculative one when a toggle asked for it, else the plain one."""
    return speculative_decode if ctx.speculative is not None else decode


def _sampling(cfg: GenerateConfig, ctx: BuildContext) -> Sampling:
    """Greedy, or sampling from a generator seeded afresh for each generation (the same draws every time)."""
    if cfg.temperature == 0:
        return GREEDY
    return Sampling(cfg.temperature, cfg.top_k, torch.Generator(device=ctx.device).manual_seed(cfg.seed))


def _steady_s(warm: Decoded, result: GenerateResult) -> float:
    """What the warm-up would have taken at the measured pace: prefill plus its steps at the median step."""
    median = result.decode_ms.median if result.decode_ms and result.decode_ms.n else 0.0
    return (result.ttft_ms + median * len(warm.step_ms)) / 1e3


def _streamer(on_token, tokenizer):
    if on_token is None:
        return None

    def emit(index: int, position: int, ms: float, ids: list[int], accepted: int | None = None) -> None:
        texts = [_decoded(tokenizer, [i]) or f"<{i}>" for i in ids]
        on_token(TokenRecord(index=index, position=position, ms=ms, token_ids=ids, texts=texts, accepted=accepted))

    return emit


NO_DECODE_STEP = ("one new token: no decode step to time (the prefill made it: see TTFT); decode tok/s and "
                  "ms/token need max_new_tokens of 2 or more")


def _record(ctx: BuildContext, result: GenerateResult, done: Decoded, prompts, tokenizer) -> None:
    """The measured generation's figures and text into the result."""
    batch = len(prompts)
    result.status = "stopped" if done.stopped else "ok"
    if done.stopped:
        result.notes.append("stopped: the tokens generated so far are kept")
    result.prefill_ms, result.ttft_ms, result.total_s = done.prefill_ms, done.ttft_ms, done.total_s
    result.token_ms = list(done.step_ms)
    result.decode_ms = Spread.of(result.token_ms) if result.token_ms else None
    result.decode_ms_p90 = p90(result.token_ms)
    if not result.token_ms and done.tokens.shape[1] == 1 and not done.stopped:
        result.notes.append(NO_DECODE_STEP)
    if result.token_ms:
        result.decode_tokens_per_s = batch / (result.decode_ms.median / 1e3)
        result.decode_tokens_per_s_wall = batch * len(result.token_ms) / (sum(result.token_ms) / 1e3)
    result.new_tokens = done.tokens.shape[1]
    result.token_ids = done.tokens.tolist()
    texts = [_decoded(tokenizer, list(p) + ids) for p, ids in zip(prompts, result.token_ids, strict=True)]
    if all(t is not None for t in texts):
        result.texts = texts
    elif tokenizer is not None:
        result.notes.append("the text is not decoded: the model made token ids the tokenizer does not have "
                            "(token_ids holds them)")
    result.kv_cache_bytes = done.cache_bytes
    if ctx.speculative is not None:
        result.record_speculation(done.accepted, done.drafted, done.target_forwards, done.draft_forwards,
                                  done.draft_ms, ctx.speculative.k)


def _decoded(tokenizer, ids: list[int]) -> str | None:
    """The text of `ids`, or None when there is no tokenizer or it has no such ids (a 50257-token model
    generating from a character tokenizer's prompt)."""
    if tokenizer is None:
        return None
    try:
        return tokenizer.decode(ids)
    except Exception:  # noqa: BLE001 - a user's tokenizer can raise anything: the tokens are kept, not the text
        return None


def _memory(ctx: BuildContext, cfg: GenerateConfig, result: GenerateResult, ids, pad, max_len, stop, status) -> None:
    if ctx.device.type == "cuda":
        result.peak_mem_bytes = memory.cuda_peak(ctx.device)[0]
        result.mem_source = "CUDA allocator: max_memory_allocated over the measured generation"
        return
    if not cfg.measure_memory:
        return
    status("counting live tensor memory over one more generation")
    weights = [t for module in ctx.base_model.modules() for t in _module_tensors(module)]
    # every buffer too, persistent or not (the GPT's causal masks): resident in every run, so counted from the
    # start, not only in the runs whose forward happens to slice one (a no-cache forward does, a cached one not)
    tracker = memory.LiveTensorBytes([*weights, *ctx.base_model.buffers()])
    # a dispatch mode cannot see inside compiled kernels: the eager model runs here (blocks compiled in place too)
    with tracker, torch.compiler.set_stance("force_eager") if ctx.compiled else contextlib.nullcontext():
        probe = _decoder(ctx)(ctx, ids, pad, cfg.max_new_tokens, max_len, _sampling(cfg, ctx), stop=stop,
                              model=ctx.base_model)
    if probe.stopped:
        raise KeyboardInterrupt  # the probe did not see the whole generation: its peak would be too low
    result.peak_mem_bytes = tracker.peak_bytes
    result.mem_source = "live tensor bytes over one more generation (CPU has no allocator statistics)"
    if ctx.compiled:
        result.mem_source += "; compiled runs are probed eagerly"


def _quality(ctx: BuildContext, cfg: GenerateConfig, result: GenerateResult, ids, pad, done: Decoded,
             max_len: int, status) -> None:
    if not cfg.quality:
        return
    why = unmeasurable(cfg.vocab_size(), cfg.quality_tokens)
    if why:
        result.notes.append(why)
        return
    status("measuring quality: held-out perplexity and agreement with the model as built")
    why = heldout_unmeasurable(ctx)  # a forward that returns the last position only: the rest is still measured
    if why:
        result.notes.append(why)
    else:
        _heldout_quality(ctx, cfg, result)
    changed = ctx.reference_model is not ctx.base_model or ctx.compute_dtype is not None or lossy_cache(ctx) \
        or ctx.speculative is not None
    if cfg.temperature == 0 and changed:
        reference = _reference_generation(ctx, ids, pad, done.tokens.shape[1], max_len)
        result.same_prefix_tokens = same_prefix(done.tokens, reference)
    if cfg.temperature == 0 and ctx.speculative is not None:  # the same model and cache, one token per forward
        plain = decode(ctx, ids, pad, done.tokens.shape[1], max_len).tokens
        result.same_as_plain_tokens = min(same_prefix(done.tokens, plain))


def _heldout_quality(ctx: BuildContext, cfg: GenerateConfig, result: GenerateResult) -> None:
    """Perplexity and agreement on held-out tokens; when the shipped corpus' token cache cannot be built (a full
    disk), the generation measured before is kept and a note says why these figures are missing."""
    try:
        q = measure_quality(ctx, cfg.quality_window(), cfg.quality_windows, cfg.quality_tokens)
    except TokenCacheUnavailable as exc:
        result.notes.append(f"quality not measured (perplexity, agreement): {exc}")
        return
    result.heldout_loss, result.perplexity = q["heldout_loss"], q["perplexity"]
    result.reference_perplexity, result.agreement = q["reference_perplexity"], q["agreement"]


def _reference_generation(ctx: BuildContext, ids, pad, new_tokens: int, max_len: int) -> torch.Tensor:
    """Greedy tokens of the reference (fp32, unquantized, a KV cache of the family's, no_grad, eager)."""
    family = ctx.model_adapter
    kind = next((k for k in ("dynamic", "static") if family.kv_cache_support(k)[0]), None)
    ref = BuildContext(config=ctx.config, hw=ctx.hw, device=ctx.device, stack=ctx.stack, gpt_config=ctx.gpt_config,
                       model_adapter=family, base_model=ctx.reference_model, model=ctx.reference_model, kv_cache=kind)
    return decode(ref, ids, pad, new_tokens, max_len).tokens
