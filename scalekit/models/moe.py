"""A mixture-of-experts layer written out: a router, top-k routing with a capacity, and the experts.

A router (one linear layer and a softmax) scores each token against E experts; each token goes to its k best
(k=1: Switch Transformer, Fedus et al. 2021; k=2: GShard, Lepikhin et al. 2020), and its output is the experts'
outputs weighted by their router probabilities (for k>1 renormalized over the k chosen, as GShard and Mixtral do).
Each expert takes at most `capacity = ceil(capacity_factor * tokens * k / E)` tokens; the rest are dropped: their
output from this layer is zero, so a transformer block passes them on through its residual connection alone.
Places are given first choices first, in token order, then second choices (GShard's priority).

The auxiliary load-balance loss is Switch Transformer's: E * sum_e f_e * P_e, with f_e the share of the tokens'
choices that picked expert e (before dropping) and P_e the mean router probability of e. It is 1.0 when both are
uniform and grows as the router favours some experts. `MoE.forward` keeps the last routing (`MoE.last`: tokens per
expert, dropped count, the loss) and, with `aux_weight` set, adds the loss's gradient in backward without changing
the output (Megatron-Core's MoEAuxLossAutoScaler does the same), so the layer trains balanced wherever an MLP sits.
`moe_gpt` swaps a built-in GPT's MLPs for this layer; `expert_loop` is the per-token reference the tests hold it to.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = ("gelu", "swiglu")


class Expert(nn.Module):
    """One expert: an MLP, GPT-2's (`gelu`) or Llama's gated one (`swiglu`: silu(x W1) * (x W3), then W2)."""

    def __init__(self, d_model: int, d_hidden: int, activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.c_fc = nn.Linear(d_model, d_hidden, bias=False)
        self.gate = nn.Linear(d_model, d_hidden, bias=False) if activation == "swiglu" else None
        self.c_proj = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
        return self.c_proj(F.silu(self.c_fc(x)) * self.gate(x))


@dataclass
class Routing:
    """Where the tokens of one forward went. Assignments are listed choice-major: the N first choices in token
    order, then the N second choices, ... (k*N in all)."""

    token: torch.Tensor  # (k*N,) which token each assignment is
    expert: torch.Tensor  # (k*N,) which expert it picked
    gate: torch.Tensor  # (k*N,) its weight in the token's output (router probability, renormalized when k > 1)
    kept: torch.Tensor  # (k*N,) bool: within the expert's capacity
    capacity: int  # places per expert
    aux_loss: torch.Tensor  # Switch Transformer's load-balance loss (a scalar, differentiable)
    chosen_per_expert: torch.Tensor  # (E,) assignments each expert was picked for, before dropping
    tokens_per_expert: torch.Tensor  # (E,) assignments each expert processed (kept)

    @property
    def dropped(self) -> int:
        """Assignments dropped for want of capacity."""
        return int((~self.kept).sum())

    def __deepcopy__(self, memo) -> Routing:
        # a copy of the layer (copy.deepcopy(moe)) copies its last routing as plain values, not the graph behind them
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return Routing(**{k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()})


def capacity_of(tokens: int, experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Places per expert: ceil(capacity_factor * tokens * k / E); None is unlimited (every token kept)."""
    if capacity_factor is None:
        return tokens * top_k
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def route(logits: torch.Tensor, top_k: int, capacity: int) -> Routing:
    """Top-k routing of N tokens' router logits (N, E), with at most `capacity` assignments per expert."""
    N, E = logits.shape
    probs = F.softmax(logits.float(), dim=-1)  # (N, E)
    gate, expert = probs.topk(top_k, dim=-1)  # (N, k), best first
    if top_k > 1:
        gate = gate / gate.sum(dim=-1, keepdim=True)
    expert, gate = expert.t().reshape(-1), gate.t().reshape(-1).to(logits.dtype)  # choice-major (k*N,)
    token = torch.arange(N, device=logits.device).repeat(top_k)
    one_hot = F.one_hot(expert, E)  # (k*N, E)
    place = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1  # this assignment's place in its expert's queue
    kept = place < capacity
    chosen = one_hot.sum(dim=0)
    share = chosen.float() / (N * top_k)  # f_e: not differentiable (an argmax), as in Switch
    aux = E * (share * probs.mean(dim=0)).sum()
    return Routing(token, expert, gate, kept, capacity, aux, chosen, (one_hot * kept[:, None]).sum(dim=0))


class _AddAuxGradient(torch.autograd.Function):
    """Returns `out` unchanged; in backward, also sends gradient `weight` to the auxiliary loss, so the loss trains
    without being added to the model's output (Megatron-Core: MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, out, aux_loss, weight: float):
        ctx.weight = weight
        ctx.save_for_backward(aux_loss)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (aux_loss,) = ctx.saved_tensors
        return grad_out, torch.full_like(aux_loss, ctx.weight), None


def with_aux_gradient(out: torch.Tensor, aux_loss: torch.Tensor, weight: float) -> torch.Tensor:
    """`out`, whose backward also trains `weight * aux_loss` (when weight is set and gradients are on)."""
    if not weight or not torch.is_grad_enabled():
        return out
    return _AddAuxGradient.apply(out, aux_loss, weight)


def run_experts(experts, x: torch.Tensor, expert: torch.Tensor, first: int = 0) -> torch.Tensor:
    """Each row of x through its expert (`expert[i] - first` indexes `experts`): rows grouped by expert, one
    matmul per expert, outputs back in the rows' order."""
    out = x.new_zeros(x.shape[0], experts[0].c_proj.out_features)
    for e, module in enumerate(experts):
        rows = (expert == e + first).nonzero().squeeze(1)
        if rows.numel():
            out = out.index_copy(0, rows, module(x[rows]))
    return out


class MoE(nn.Module):
    """A mixture-of-experts MLP: (..., d_model) in and out; see the module's docstring."""

    def __init__(self, d_model: int, d_hidden: int, experts: int = 4, top_k: int = 1,
                 capacity_factor: float | None = 1.25, activation: str = "gelu", aux_weight: float = 0.0):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k must be between 1 and the number of experts ({experts}), got {top_k}")
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_hidden, activation) for _ in range(experts))
        self.top_k, self.capacity_factor, self.aux_weight = top_k, capacity_factor, aux_weight
        self.last: Routing | None = None

    @property
    def num_experts(self) -> int:
        return len(self.router.weight)

    def routing(self, x: torch.Tensor) -> Routing:
        """The routing of the tokens x (N, d_model)."""
        return route(self.router(x), self.top_k, capacity_of(len(x), self.num_experts, self.top_k,
                                                             self.capacity_factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, d_model): every token of the batch
        r = self.last = self.routing(x)
        keep = r.kept.nonzero().squeeze(1)
        token, expert, gate = r.token[keep], r.expert[keep], r.gate[keep]
        y = run_experts(self.experts, x[token], expert) * gate[:, None]  # (kept, d_model)
        out = x.new_zeros(x.shape).index_add(0, token, y)  # a token's k outputs summed; dropped ones add nothing
        return with_aux_gradient(out, r.aux_loss, self.aux_weight).reshape(shape)


def expert_loop(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The same layer one token and one choice at a time: its own softmax, top-k and queue per expert (a Python
    counter, choices in priority order). Slow; the reference the tests hold `MoE.forward` to."""
    x = x.reshape(-1, x.shape[-1])
    N, E, k = len(x), moe.num_experts, moe.top_k
    capacity = capacity_of(N, E, k, moe.capacity_factor)
    probs = F.softmax(moe.router(x).float(), dim=-1)
    choices = [probs[n].topk(k) for n in range(N)]
    queue = [0] * E
    out = torch.zeros_like(x)
    for j in range(k):  # first choices of every token, then second choices
        for n in range(N):
            p, e = choices[n]
            e_j = int(e[j])
            queue[e_j] += 1
            if queue[e_j] > capacity:
                continue  # dropped
            weight = p[j] / p.sum() if k > 1 else p[j]
            out[n] = out[n] + weight * moe.experts[e_j](x[n:n + 1])[0]
    return out


def moe_gpt(model: nn.Module, experts: int = 4, top_k: int = 1, capacity_factor: float | None = 1.25,
            activation: str = "gelu", aux_weight: float = 0.01, seed: int | None = 0) -> nn.Module:
    """The built-in GPT with each block's MLP swapped for a MoE of `experts` experts as wide as the MLP was (so
    top-1 computes what the dense model did per token, with E times the MLP's parameters). In place; returns it."""
    cfg = model.config
    if seed is not None:
        torch.manual_seed(seed)
    for block in model.transformer.h:
        moe = MoE(cfg.n_embd, 4 * cfg.n_embd, experts, top_k, capacity_factor, activation, aux_weight)
        for e in moe.experts:
            for linear in (e.c_fc, e.gate):
                if linear is not None:
                    nn.init.normal_(linear.weight, std=0.02)
            nn.init.normal_(e.c_proj.weight, std=0.02 * (2 * cfg.n_layer) ** -0.5)  # GPT-2's residual scaling
        nn.init.normal_(moe.router.weight, std=0.02)
        block.mlp = moe.to(next(model.parameters()).device)
    return model


def routings(model: nn.Module) -> list[Routing]:
    """The last routing of every MoE layer of a model, in order."""
    return [m.last for m in model.modules() if isinstance(m, MoE) and m.last is not None]
