"""The speculative decode loop: a draft proposes, the model verifies k + 1 positions in one forward, the
caches of both are cut back to what was kept.

Read `speculative_decode` top to bottom; the rules it applies (which proposals are kept, where prompt lookup's
come from) are plain functions in scalekit.models.speculative.  Both models run through their family's
forward with its own KV cache (scalekit's caches, gpt-fast's setup_caches, transformers' DynamicCache or
StaticCache), so Hugging Face models take this same loop: it reports the acceptance of every verification,
which transformers' `generate(assistant_model=...)` does not.  A model without a cache re-reads the
sequence at every forward, as the plain loop does.  One prompt at a time (batch 1): rows of a batch would
keep different numbers of tokens per verification.
"""

from __future__ import annotations

import time

import torch

from ..errors import ConfigError
from ..measure.timing import synchronize
from ..models.speculative import greedy_accept, lookup_draft, one_hot, sample_accept
from ..toggles import BuildContext
from .loop import GREEDY, Decoded, Sampling, family_of, prepare_caches, probabilities, sample, step_contexts


class Runner:
    """One model and its cache, fed from the shared token buffer: `length` positions are in its cache."""

    def __init__(self, ctx: BuildContext, family, model, kind: str | None, max_len: int):
        self.family, self.model, self.length = family, model, 0
        prepare_caches(ctx, family, model, 1, max_len)
        self.cache = family.new_cache(model, kind, 1, max_len, ctx.device) if kind else None

    def advance(self, seq: torch.Tensor, end: int) -> torch.Tensor:
        """Logits (T, V) of positions length..end-1 of `seq` (1, N), those positions then kept in the cache.  The rows
        are counted from the last: a draft reads only the last one, which a forward that returns the last position
        alone (nanoGPT's) gives too; the model verified returns every position (checked when the run is built)."""
        start, self.length = self.length, end
        if self.cache is None:  # no cache: the whole sequence so far, and the positions asked for
            return self.family.logits(self.model, seq[:, :end])[0, start - end:]
        pos = torch.arange(start, end, device=seq.device)
        return self.family.logits(self.model, seq[:, start:end], self.cache, pos)[0, start - end:]

    def rollback(self, length: int) -> None:
        """Forget positions from `length` on (rejected drafts)."""
        if length < self.length and self.cache is not None:
            try:
                self.family.rollback(self.cache, length)
            except NotImplementedError as exc:
                raise ConfigError(f"toggle 'speculative' cannot run with this KV cache on {self.family.family}: "
                                  f"{exc}") from None
        self.length = min(self.length, length)


def speculative_decode(ctx: BuildContext, ids: torch.Tensor, pad, new_tokens: int, max_len: int,
                       sampling: Sampling = GREEDY, on_token=None, stop=None, model=None) -> Decoded:
    """Generate `new_tokens` after the one prompt `ids` (1, T0), `ctx.speculative.k` draft tokens per verification."""
    spec = ctx.speculative
    if ids.shape[0] != 1:
        raise ConfigError(f"toggle 'speculative' decodes one prompt at a time (batch 1); got {ids.shape[0]}")
    T0 = ids.shape[1]
    seq = torch.zeros(1, T0 + new_tokens + spec.k + 1, dtype=torch.long, device=ctx.device)
    seq[:, :T0] = ids
    target = Runner(ctx, family_of(ctx), model or ctx.model, ctx.kv_cache, max_len + spec.k)
    draft = None
    if spec.mode == "draft":
        family, draft_model = ctx.draft
        draft = Runner(ctx, family, draft_model, draft_cache_kind(family), max_len + spec.k)
    out = Decoded(tokens=seq[:, T0:T0])
    t0 = time.perf_counter()
    n = T0
    with step_contexts(ctx):
        try:
            first = sample(target.advance(seq, n)[-1:], sampling)
            seq[0, n] = first[0]
            n += 1
            out.target_forwards = 1
            out.prefill_ms = out.ttft_ms = (time.perf_counter() - t0) * 1e3
            if on_token is not None:
                on_token(0, T0, out.ttft_ms, first.tolist())
            while n < T0 + new_tokens and not (stop is not None and stop.is_set()):
                n = _verify_round(spec, seq, T0, n, T0 + new_tokens, target, draft, sampling, out, on_token)
        except KeyboardInterrupt:
            out.stopped = True
        out.stopped = out.stopped or n < T0 + new_tokens
        synchronize(ctx.device)
    out.total_s = time.perf_counter() - t0
    out.tokens = seq[:, T0:n]
    out.cache_bytes = target.family.cache_bytes(target.cache) if target.cache is not None else 0
    return out


def draft_cache_kind(family) -> str | None:
    """The draft keeps a cache of its family's first kind (a draft without one re-reads the sequence)."""
    return next((kind for kind in ("dynamic", "static") if family.kv_cache_support(kind)[0]), None)


def _propose(spec, seq: torch.Tensor, n: int, k: int, draft: Runner | None, sampling: Sampling, out: Decoded):
    """k proposed tokens written at seq[n:n+k] (fewer for prompt lookup), and the proposer's probabilities."""
    if draft is None:  # prompt lookup: copied from an earlier match of the last n-gram
        drafted = lookup_draft(seq[0, :n], k, spec.ngram)
        seq[0, n:n + drafted.numel()] = drafted
        return drafted, None
    t = time.perf_counter()
    q = []
    logits = draft.advance(seq, n)[-1:]  # catches up on the tokens the draft has not seen yet
    for i in range(k):
        if sampling.temperature > 0:
            q.append(probabilities(logits, sampling)[0])
        seq[0, n + i] = sample(logits, sampling)[0]
        out.draft_forwards += 1
        if i < k - 1:
            logits = draft.advance(seq, n + i + 1)[-1:]
    out.draft_ms += (time.perf_counter() - t) * 1e3
    return seq[0, n:n + k], (torch.stack(q) if q else None)


def _verify_round(spec, seq, T0: int, n: int, end: int, target: Runner, draft: Runner | None,  # noqa: N803
                  sampling: Sampling, out: Decoded, on_token) -> int:
    """One verification: propose, check k + 1 positions in one target forward, keep, roll back; the new n."""
    t = time.perf_counter()
    k = min(spec.k, end - n - 1)  # the last token of the generation is always the target's own
    drafted, q = _propose(spec, seq, n, k, draft, sampling, out) if k > 0 else (seq[0, n:n], None)
    logits = target.advance(seq, n + drafted.numel())  # (1 + drafted, V): positions n-1 .. n-1+drafted
    out.target_forwards += 1
    if sampling.temperature == 0:
        kept, nxt = greedy_accept(logits, drafted)
    else:
        p = probabilities(logits, sampling)
        q = q if q is not None else one_hot(drafted, p.shape[-1])
        kept, nxt = sample_accept(p, q, drafted, sampling.generator)
    seq[0, n + kept] = nxt
    target.rollback(n + kept)  # the cache holds every token but the newest
    if draft is not None:
        draft.rollback(n + kept)
    out.accepted.append(kept)
    out.drafted.append(drafted.numel())
    ms = (time.perf_counter() - t) * 1e3 / (kept + 1)  # the round's time, shared by the tokens it made
    out.step_ms.extend([ms] * (kept + 1))
    if on_token is not None:
        for j in range(kept + 1):
            on_token(n - T0 + j, n + j, ms, [int(seq[0, n + j])], kept)
    return n + kept + 1

