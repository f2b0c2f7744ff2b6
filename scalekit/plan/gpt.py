"""The built-in GPT's plan: memory and FLOPs of one training step, worked out from its shapes.

Memory of a training step has four parts (EleutherAI, "Transformer Math 101"):
  parameters      fp32 weights, 4 bytes each (autocast keeps fp32 weights; its 16-bit copies are activations)
  gradients       one per trainable weight, same dtype: 4 bytes each
  optimizer state AdamW 8 bytes/param (two fp32 moments); 8-bit Adam ≈2; 8-bit Lion ≈1; Adafactor a row and a
                  column per matrix
  activations     what forward keeps for backward

The activation count follows the per-layer inventory of Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models", which the Ultra-Scale Playbook reproduces as 34·s·b·h + 5·a·s²·b
bytes per layer (16-bit, with dropout).  It is redone here term by term for this GPT: no dropout (its masks
drop out), the residual stream and LayerNorm inputs stay fp32 under autocast, each linear layer keeps its
16-bit input and a 16-bit copy of its weight, batched matmuls keep contiguous copies of q, k and v, and the
explicit attention keeps its T×T probabilities once per head (twice on CUDA, where softmax runs in fp32).

The peak is not the sum of the four parts: gradients appear while backward frees activations, and a
checkpointed block's activations come back only while backward passes through it.  `estimate` walks
backward block by block to find the largest moment, and compares it with the optimizer step (gradients
plus the step's temporaries).  With accumulation the gradients of earlier micro-batches are alive
throughout the later ones.  `activations_bytes` is reported as the measured breakdown defines it (the peak
minus the other three parts); `saved_activations_bytes` is the inventory itself.

Every size of a parameter comes from one description of the model: the GPT itself, built on the meta
device (no memory allocated), so nothing here restates its shapes by hand.
"""

from __future__ import annotations

import functools
import math
from dataclasses import astuple, dataclass

import torch

from ..measure.flops import gpt_train_flops_per_token
from ..models import GPT, GPTConfig
from ..models.muon import block_matrix_ids
from ..toggles.checkpointing import SEQUENTIAL, sequential_segments
from ..toggles.optim import EIGHT_BIT
from .estimate import FP32, INT64, Estimate
from .optimizer_state import optimizer_state_bytes


@dataclass(frozen=True)
class ModelShapes:
    """What the planner needs of the model's parameters, read off the GPT built on the meta device."""

    param_shapes: tuple[tuple[int, ...], ...]  # every parameter tensor, a tied one once, in module order
    embedding_index: int  # position of the token embedding in param_shapes
    block_matrices: tuple[int, ...]  # positions of the blocks' 2-D weights in param_shapes (Muon's share)
    block_params: int  # parameters of one transformer block
    block_linear_weights: int  # values in one block's matmul weights (its biases and norms left out)
    block_last_linear: int  # values in a block's last projection (MLP c_proj), which recomputation skips
    linear_weights: int  # values in every nn.Linear weight (autocast keeps a 16-bit copy of each)
    buffer_bytes: int  # the causal-mask buffers of manual attention
    n_model_params: int  # GPT.num_params() of the model as trained (what the engine's MFU counts)

    @property
    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes)


def model_shapes(gpt_config: GPTConfig, stable_embedding: bool) -> ModelShapes:
    """Build the GPT on the meta device and read its sizes (with bitsandbytes' StableEmbedding, the
    LayerNorm the 8-bit optimizers add after the token embedding).  Kept per config: a ladder or a search plans
    the same shapes once per rung or candidate, and building the model, even on the meta device, takes tens of ms."""
    return _model_shapes(astuple(gpt_config), stable_embedding)


@functools.lru_cache(maxsize=64)
def _model_shapes(gpt_fields: tuple, stable_embedding: bool) -> ModelShapes:
    gpt_config = GPTConfig(*gpt_fields)
    with torch.device("meta"):
        model = GPT(gpt_config)
        extra = list(torch.nn.LayerNorm(gpt_config.n_embd).parameters()) if stable_embedding else []
    params = list(model.parameters())  # tied lm_head/embedding once
    wte = model.transformer.wte.weight
    linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    block_linear = [m.weight.numel() for m in model.transformer.h[0].modules() if isinstance(m, torch.nn.Linear)]
    return ModelShapes(param_shapes=tuple(tuple(p.shape) for p in [*params, *extra]),
                       embedding_index=next(i for i, p in enumerate(params) if p is wte),
                       block_matrices=tuple(i for i, p in enumerate(params) if id(p) in block_matrix_ids(model)),
                       block_params=sum(p.numel() for p in model.transformer.h[0].parameters()),
                       block_linear_weights=sum(block_linear), block_last_linear=block_linear[-1],
                       linear_weights=sum(linear.values()),
                       buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
                       n_model_params=model.num_params() + sum(p.numel() for p in extra))


@dataclass(frozen=True)
class Shape:
    """The built-in GPT's sizes for one config (batch is the micro-batch)."""

    n_layer: int
    n_head: int
    d: int  # n_embd
    vocab: int
    vocab_rows: int  # padded vocabulary: embedding rows and logits width
    block_size: int  # rows of the position table and of each causal-mask buffer
    batch: int
    seq: int
    loss_chunks: int = 0  # the head and loss computed in this many chunks of tokens (chunked_cross_entropy; 0: not)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def logit_tokens(self) -> int:
        """Tokens whose logits exist at once: all of them, or one chunk's."""
        return -(-self.tokens // max(1, self.loss_chunks))


def layer_activation_bytes(s: Shape, act: int, sdpa: bool, cuda: bool, tp: int = 1) -> int:
    """Bytes one transformer block keeps for backward (Korthikanti's inventory, for this GPT); with tensor
    parallelism over `tp` ranks, what one rank keeps: the split layers' activations 1/tp, the norms' whole."""
    d, h, T = s.d, s.n_head, s.seq
    per_token = (2 * d * FP32  # the two LayerNorm inputs: the residual stream, fp32 even under autocast
                 + 2 * 2 * FP32  # their mean and rstd
                 + 2 * d * act)  # the LayerNorm outputs, kept by c_attn and c_fc
    split = (4 * d * act + 4 * d * act  # c_fc output (kept by GELU) and GELU output (kept by c_proj)
             + d * act)  # the attention output, kept by c_proj
    if sdpa:
        split += 3 * d * act + h * FP32  # q, k, v (one buffer) and a log-sum-exp per head
    else:
        probs = FP32 + act if (cuda and act != FP32) else act  # CUDA autocast runs softmax in fp32
        split += 3 * d * act + h * T * probs  # contiguous q, kᵀ, v copies; the T×T probabilities
    mask = 0 if sdpa else T * T  # the inverted causal mask (bool) masked_fill keeps
    return s.tokens * (per_token + split // tp) + mask


def head_activation_bytes(s: Shape, act: int, stable_embedding: bool) -> int:
    """What the embedding, final LayerNorm, lm_head and loss keep."""
    t, d = s.tokens, s.d
    kept = (2 * t * INT64 + s.seq * INT64  # token ids, targets, positions
            + t * d * FP32 + 2 * t * FP32)  # ln_f input and statistics
    if s.loss_chunks:  # the chunked loss keeps ln_f's fp32 output and a log-sum-exp per token, no logits
        kept += t * d * FP32 + t * FP32 + t  # (and which targets count)
    else:
        kept += t * d * act + t * s.vocab_rows * FP32  # ln_f output kept by lm_head; the fp32 log-softmax output
    if stable_embedding:
        kept += t * d * FP32 + 2 * t * FP32  # StableEmbedding's LayerNorm input and statistics
    return kept


def loss_chunks_of(gpt_config: GPTConfig) -> int:
    """The chunks the GPT's loss head runs in: 0 (whole logits, unchunked), its count, or Liger's (a chunk of about as many
    tokens × vocabulary as tokens × width: ⌈vocab / d⌉ chunks)."""
    chunks = gpt_config.loss_chunks
    if chunks == "liger":
        return max(2, -(-gpt_config.embedding_rows // gpt_config.n_embd))
    return int(chunks or 0)


def block_groups(n_layer: int, checkpointing) -> list[tuple[int, bool]]:
    """Blocks in forward order as (blocks in the group, checkpointed?), as the checkpointing toggle applies it."""
    if checkpointing is None:
        return [(1, False)] * n_layer
    if checkpointing == SEQUENTIAL:
        segments = min(sequential_segments(n_layer), n_layer)
        size = n_layer // segments
        return [(size, True)] * (segments - 1) + [(n_layer - size * (segments - 1), False)]
    return [(1, (i + 1) % checkpointing == 0) for i in range(n_layer)]


def step_temporaries_bytes(optim: str, sizes: list[int], cuda: bool) -> int:
    """Peak extra bytes inside optimizer.step()."""
    if optim == "adamw_torch_fused":
        return 0
    if optim == "adamw_torch_foreach" or (optim == "adamw_torch" and cuda):  # torch uses foreach on GPU
        return sum(sizes) * FP32  # _foreach_sqrt makes a temporary for every parameter at once
    return 2 * max(sizes) * FP32  # a loop over parameters: a couple of temporaries of the largest


def head_backward_bytes(s: Shape, act: int) -> int:
    """What the head's backward holds beside the saved activations at its fullest.  Whole logits: two fp32
    logit-sized gradients (the loss's and log-softmax's) and two residual-stream gradients.  A chunked loss
    (models/chunked_loss.py), at a chunk's weight-gradient matmul: the chunk's fp32 logits, turned into their
    gradient in place, with their copy and the chunk's hidden states in autocast's 16-bit dtype (no copies in
    fp32, where the dtypes already agree); the head's fp32 weight gradient and the matmul's (vocab × d) product
    being added into it; the hidden states' whole fp32 gradient."""
    t, d, vocab = s.tokens, s.d, s.vocab_rows
    if not s.loss_chunks:
        return 2 * t * vocab * FP32 + 2 * t * d * FP32
    copy = act if act != FP32 else 0
    chunk = s.logit_tokens * (vocab * (FP32 + copy) + d * copy)
    return chunk + vocab * d * (FP32 + act) + t * d * FP32


def backward_peak_bytes(s: Shape, groups, layer: int, head: int, weights_16bit: int, grads_before: int,
                        block_grads: int, head_grads: int, act: int) -> int:
    """The most live bytes (activations, gradients, working set) at any moment of one backward pass."""
    t = s.tokens
    boundary = t * s.d * FP32  # a checkpointed group keeps only its input
    alive = head + weights_16bit + sum(boundary if ckpt else n * layer for n, ckpt in groups)
    peak = grads_before + alive + head_backward_bytes(s, act)  # at the start: the head's working set
    grads = grads_before or head_grads
    alive -= head
    for n, ckpt in reversed(groups):
        if ckpt:  # the group's forward runs again: its activations return, next to its input
            peak = max(peak, grads + alive + n * layer + 2 * t * s.d * FP32)
        alive -= boundary if ckpt else n * layer
        grads = grads_before or grads + n * block_grads
    return peak


def gpt_estimate(cfg, facts, gpt_config: GPTConfig, device_type: str, label: str) -> Estimate:
    """Params, grads, optimizer state, activations, the peak and the FLOPs of one step of the built-in GPT.

    `cfg` is resolved; `facts` (scalekit.toggles.PlanFacts) is what its toggles change in memory; `gpt_config`
    is the GPT it builds (after the architecture toggles).
    """
    cuda = device_type == "cuda"
    k = facts.micro_batches
    s = Shape(gpt_config.n_layer, gpt_config.n_head, gpt_config.n_embd, gpt_config.vocab_size,
              gpt_config.embedding_rows, gpt_config.block_size, cfg.batch_size // k, cfg.seq_len,
              loss_chunks_of(gpt_config))
    optim = facts.optimizer
    stable = optim in EIGHT_BIT  # the GPT's embedding becomes a StableEmbedding
    shapes = model_shapes(gpt_config, stable)
    sdpa = gpt_config.attention == "sdpa"
    act = facts.activation_bytes

    sizes = [math.prod(shape) for shape in shapes.param_shapes]
    params = shapes.n_params * FP32 + shapes.buffer_bytes
    grads = shapes.n_params * FP32
    state = optimizer_state_bytes(optim, shapes.param_shapes, [shapes.embedding_index] if stable else [],
                                  shapes.block_matrices)

    layer = layer_activation_bytes(s, act, sdpa, cuda, facts.tensor_parallel)
    flight = facts.pipeline_in_flight
    if flight is not None:  # the stage holding the most micro-batches' activations as a backward begins (1F1B's
        # first stage: min(stages, micro-batches) of them), each micro-batch a share of the batch
        layer = int(layer * max(flight.first) / flight.micro_batches)
    head = head_activation_bytes(s, act, stable)
    weights_16bit = shapes.linear_weights * act if act != FP32 else 0  # autocast's cached 16-bit weight copies
    # a pipeline stage keeps the activations of its own blocks only (of the micro-batches it holds: above)
    groups = block_groups(s.n_layer // facts.pipeline_stages, facts.checkpointing)
    saved = head + weights_16bit + sum((s.tokens * s.d * FP32) if c else n * layer for n, c in groups)
    block_grads = shapes.block_params * FP32
    backward = backward_peak_bytes(s, groups, layer, head, weights_16bit, grads_before=grads if k > 1 else 0,
                                   block_grads=block_grads, head_grads=grads - s.n_layer * block_grads, act=act)
    peak = params + state + max(backward, grads + step_temporaries_bytes(optim, sizes, cuda))
    flops, hardware_flops = step_flops(cfg, s, shapes, groups)
    return Estimate(label=label, params_bytes=params, grads_bytes=grads, optimizer_state_bytes=state,
                    activations_bytes=peak - params - grads - state, peak_bytes=peak,
                    saved_activations_bytes=saved, flops_per_step=float(flops),
                    hardware_flops_per_step=float(hardware_flops), n_params=shapes.n_params,
                    largest_block_bytes=shapes.block_params * FP32, blocks_bytes=s.n_layer * shapes.block_params * FP32,
                    method="analytic: Korthikanti's per-layer inventory for this GPT, shapes from the model")


def step_flops(cfg, s: Shape, shapes: ModelShapes, groups) -> tuple[int, int]:
    """(model FLOPs, hardware FLOPs) of one step: 6N + attention per token, plus what checkpointing recomputes."""
    tokens_step = cfg.batch_size * cfg.seq_len
    flops = gpt_train_flops_per_token(shapes.n_model_params, s.n_layer, s.d, cfg.seq_len) * tokens_step
    block_forward = 2 * shapes.block_linear_weights + 4 * s.d * cfg.seq_len  # per token: matmuls and attention
    # recomputation stops once backward has what it needs (torch's checkpoint early stop): a group's last
    # projection is not run again, as its output was never saved
    recomputed = sum(n * block_forward - 2 * shapes.block_last_linear for n, c in groups if c)
    if s.loss_chunks:  # a chunked loss runs the head's matmul again in backward
        recomputed += 2 * s.d * s.vocab_rows
    return flops, flops + recomputed * tokens_step
