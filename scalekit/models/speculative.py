"""Speculative decoding's rules in plain PyTorch: where draft tokens come from, and which the target keeps.

A cheap proposer guesses k next tokens; the target model scores all of them in ONE forward (k + 1
positions); the longest prefix the target agrees with is kept, plus one token of the target's own.  Each
verification makes between 1 and k + 1 tokens for one target forward, instead of one.
- draft model: a small model of the same tokenizer proposes the k tokens one by one (k cheap forwards);
- prompt lookup (transformers' `prompt_lookup_num_tokens`): the last n tokens are searched for earlier in
  the sequence, and the k tokens that followed that match are proposed: free, and right on text that repeats.

Greedy: keep draft token i while it is the target's argmax at its position; the first disagreement is
replaced by the target's argmax, so the output is the target's own greedy output.  Sampling (Leviathan et
al., 2023; Chen et al., 2023): keep draft token x, drawn from the draft's q, with probability min(1, p(x)/q(x));
at the first rejection draw from the residual max(0, p - q), renormalised.  Every kept token is then
distributed exactly as the target's p, whatever the draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MODES = ("draft", "prompt_lookup")
DEFAULT_DRAFT = "shakespeare-char-draft"  # the small model shipped beside shakespeare-char (models/weights)
DEFAULT_K = 4
DEFAULT_NGRAM = 3


@dataclass(frozen=True)
class Speculation:
    """How generation speculates: the mode, the tokens proposed per verification, and the draft or n-gram."""

    mode: str  # one of MODES
    k: int = DEFAULT_K  # draft tokens proposed per target forward
    draft: Any = DEFAULT_DRAFT  # mode "draft": the draft model (a shipped name, a preset, or a model)
    ngram: int = DEFAULT_NGRAM  # mode "prompt_lookup": the longest n-gram searched for (down to 1)


def tokenizer_mismatch(model_vocab: int | None, draft_vocab: int | None, draft_name: str) -> str:
    """Why `draft_name` cannot draft for the model ('' when it can, or when either side does not say): a draft
    must read the model's token ids."""
    if model_vocab is None or draft_vocab is None or model_vocab == draft_vocab:
        return ""
    return (f"GenerateConfig.toggles['speculative']: the draft {draft_name} reads {draft_vocab} token ids and the "
            f"model {model_vocab}; a draft must share the model's tokenizer")


def lookup_draft(seq: torch.Tensor, k: int, max_ngram: int = DEFAULT_NGRAM) -> torch.Tensor:
    """Up to k tokens that followed the first earlier occurrence of the sequence's last n tokens (n from
    max_ngram down to 1), as transformers' prompt lookup picks them; empty when nothing matches.  seq: (T,)."""
    T = seq.numel()
    for n in range(min(max_ngram, T - 1), 0, -1):
        windows = seq[: T - 1].unfold(0, n, 1)  # (T - n, n): every earlier n-gram, the last one left out
        starts = (windows == seq[T - n:]).all(dim=1).nonzero().flatten()
        for start in starts.tolist():
            follow = seq[start + n: min(start + n + k, T)]
            if follow.numel():
                return follow
    return seq[:0]


def greedy_accept(target_logits: torch.Tensor, drafted: torch.Tensor) -> tuple[int, torch.Tensor]:
    """target_logits (k + 1, V) at the positions of the last token and the k drafted ones; drafted (k,).
    Returns (tokens kept, the target's next token after them)."""
    best = target_logits.argmax(dim=-1)  # (k + 1,)
    k = drafted.numel()
    kept = int((best[:k] == drafted).long().cumprod(0).sum())
    return kept, best[kept]


def sample_accept(p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor,
                  generator: torch.Generator | None = None) -> tuple[int, torch.Tensor]:
    """Rejection sampling: p (k + 1, V) the target's probabilities, q (k, V) the draft's, drafted (k,) drawn
    from q.  Returns (tokens kept, the next token: from the residual at a rejection, else from p[k])."""
    for i, x in enumerate(drafted.tolist()):
        r = torch.rand((), generator=generator, device=p.device)
        if r * q[i, x] < p[i, x]:  # kept with probability min(1, p(x) / q(x))
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[i]
        return i, torch.multinomial(dist, 1, generator=generator)[0]
    return drafted.numel(), torch.multinomial(p[-1], 1, generator=generator)[0]


def one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """The 'distribution' of a deterministic proposer (prompt lookup): all mass on the proposed token."""
    return torch.nn.functional.one_hot(tokens, vocab).float()
