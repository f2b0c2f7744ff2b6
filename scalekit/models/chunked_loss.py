"""The output projection and the cross-entropy loss computed chunk by chunk: the (tokens × vocab) logits never exist
at once, in forward or in backward.

`chunked_cross_entropy(hidden, weight, targets, chunks)` equals
`F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)` (a mean over the targets that are not
ignored), up to the order of a float sum.  Forward keeps only the hidden states, the head's weight and each row's
log-sum-exp; backward recomputes one chunk's logits at a time and turns them into that chunk's gradients (the
softmax minus the one-hot target), so the largest tensor alive is one chunk's (tokens/chunks × vocab) logits.
The price is the head's matmul run twice, once in forward and once in backward (≈2·tokens·d·vocab more FLOPs).
Liger-Kernel's fused linear cross-entropy does the same in Triton, computing the gradients during forward.
"""

from __future__ import annotations

import contextlib

import torch

IGNORE_INDEX = -100  # targets with this value are left out of the loss (the Hugging Face and torch convention)


def _compute_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast would run the head's matmul in here (None: no autocast)."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias, dtype, valid_vocab: int | None) -> torch.Tensor:
    """One chunk's logits in fp32, computed as the unchunked head would (in autocast's dtype where it is on)."""
    if dtype is not None:
        h, weight = h.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    logits = torch.nn.functional.linear(h, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (n, V), at least fp32
    if valid_vocab is not None and logits.size(-1) > valid_vocab:
        logits[:, valid_vocab:] = float("-inf")  # padded vocabulary rows are not tokens (nice_numbers)
    return logits


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of linear(hidden, weight, bias) against targets, one chunk of rows at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunks: int, valid_vocab):
        dtype = _compute_dtype(hidden.device)
        keep = targets != IGNORE_INDEX
        count = keep.sum().clamp_min(1)  # (as torch: a batch with every target ignored gives 0/0 = nan there)
        total = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
        lse_parts = []
        with torch.autocast(hidden.device.type, enabled=False):
            for h, t, k in zip(hidden.chunk(chunks), targets.chunk(chunks), keep.chunk(chunks), strict=True):
                logits = _chunk_logits(h, weight, bias, dtype, valid_vocab)
                lse = torch.logsumexp(logits, dim=-1)  # (n,)
                picked = logits.gather(1, t.clamp_min(0)[:, None]).squeeze(1)
                total = total + ((lse - picked) * k).sum()
                lse_parts.append(lse)
                del logits
        ctx.save_for_backward(hidden, weight, bias, targets, torch.cat(lse_parts), count)
        ctx.chunks, ctx.valid_vocab, ctx.dtype = chunks, valid_vocab, dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, bias, targets, lse, count = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        wide = torch.promote_types(weight.dtype, torch.float32)  # gradients summed over chunks in at least fp32
        grad_weight = torch.zeros_like(weight, dtype=wide) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=wide) if bias is not None and ctx.needs_input_grad[2] else None
        scale = grad_loss / count
        start = 0
        with torch.autocast(hidden.device.type, enabled=False):
            for h, t, lse_c in zip(hidden.chunk(ctx.chunks), targets.chunk(ctx.chunks), lse.chunk(ctx.chunks),
                                       strict=True):
                n = h.shape[0]
                # d loss / d logits = (softmax - one_hot(target)) / count, zero for ignored rows
                g = _chunk_logits(h, weight, bias, ctx.dtype, ctx.valid_vocab).sub_(lse_c[:, None]).exp_()
                keep = t != IGNORE_INDEX
                g[torch.arange(n, device=g.device)[keep], t[keep]] -= 1
                g.mul_((keep * scale)[:, None])
                cast = g.to(ctx.dtype or weight.dtype)  # the matmuls' backward in autocast's dtype (or the weight's)
                w = weight.to(cast.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:start + n] = cast @ w
                if grad_weight is not None:
                    grad_weight += cast.t() @ h.to(cast.dtype)
                if grad_bias is not None:
                    grad_bias += g.sum(0)
                start += n
                del g, cast
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunks: int,
                          bias: torch.Tensor | None = None, valid_vocab: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of the head `linear(hidden, weight, bias)` against `targets` (ignore_index -100), computed
    in `chunks` chunks of rows; hidden (..., d) and targets (...) are flattened to rows first."""
    rows = hidden.reshape(-1, hidden.size(-1))
    return ChunkedLinearCrossEntropy.apply(rows, weight, bias, targets.reshape(-1), chunks, valid_vocab)


def liger_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same loss through Liger-Kernel's fused linear cross-entropy (Triton, CUDA only)."""
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    rows = hidden.reshape(-1, hidden.size(-1))
    dtype = _compute_dtype(hidden.device)
    with torch.autocast(hidden.device.type, enabled=False) if dtype else contextlib.nullcontext():
        w = weight if dtype is None else weight.to(dtype)
        return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX)(w, rows.to(w.dtype), targets.reshape(-1),
                                                                           bias)


def head_loss(hidden, weight, targets, mode, bias=None, valid_vocab=None) -> torch.Tensor:
    """The loss of the output head, chunked in `mode` chunks (a count) or through Liger's kernel ('liger')."""
    if mode == "liger":
        if valid_vocab is not None and valid_vocab < weight.shape[0]:
            weight = weight[:valid_vocab]  # padded rows are not tokens
            bias = None if bias is None else bias[:valid_vocab]
        return liger_cross_entropy(hidden, weight, targets, bias)
    return chunked_cross_entropy(hidden, weight, targets, mode, bias, valid_vocab)
