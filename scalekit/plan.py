"""Predict a run's memory and FLOPs before running it: `scalekit.estimate(config)`.

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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .config import RunConfig
from .errors import ConfigError
from .hardware import detect
from .measure.flops import gpt_train_flops_per_token
from .models.presets import PRESETS
from .toggles.checkpointing import SEQUENTIAL, sequential_segments
from .toggles.nice_numbers import VOCAB_MULTIPLE, round_up
from .toggles.optim import EIGHT_BIT

if TYPE_CHECKING:
    import pandas as pd

FP32 = 4
INT64 = 8
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes quantizes tensors of at least this many values (min_8bit_size)
BNB_BLOCK = 256  # values per fp32 absmax in bitsandbytes' block-wise quantization


@dataclass
class Estimate:
    """What `estimate` predicts for one training step of a config (bytes and FLOPs)."""

    label: str
    params_bytes: int  # weights and buffers
    grads_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int  # the peak minus the other three, as RunResult measures it
    peak_bytes: int
    saved_activations_bytes: int  # what forward keeps for backward (one micro-batch)
    flops_per_step: float  # model FLOPs (6N per token plus attention), as the engine reports for MFU
    hardware_flops_per_step: float  # plus the forward that activation checkpointing recomputes
    n_params: int
    notes: list[str] = field(default_factory=list)

    def memory_breakdown(self) -> dict[str, int]:
        return {"params": self.params_bytes, "grads": self.grads_bytes,
                "optimizer_state": self.optimizer_state_bytes, "activations": self.activations_bytes,
                "peak": self.peak_bytes}

    def to_dict(self) -> dict:
        return asdict(self)


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

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def param_shapes(self, stable_embedding: bool) -> list[tuple[int, ...]]:
        """Every parameter tensor, the embedding (tied to lm_head) first and once."""
        d = self.d
        block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
        shapes = [(self.vocab_rows, d), (self.block_size, d), *block * self.n_layer, (d,), (d,)]
        return shapes + ([(d,), (d,)] if stable_embedding else [])


def optimizer_state_bytes(optim: str, shapes: list[tuple[int, ...]], embedding_index: int | None = None) -> int:
    """State bytes after the first step for parameters of `shapes`; 8-bit optimizers keep `embedding_index` 32-bit."""
    total = 0
    quantized = False
    for i, shape in enumerate(shapes):
        n = math.prod(shape)
        if optim == "adafactor":  # a step counter; a row and a column for a matrix, else a full variance
            total += FP32 + (sum(shape) if len(shape) == 2 else n) * FP32
        elif optim in EIGHT_BIT:
            moments = 1 if optim == "lion_8bit" else 2
            if n < BNB_MIN_8BIT_SIZE or i == embedding_index:
                total += moments * n * FP32
            else:  # one uint8 per value and an fp32 absmax per block, per moment
                total += moments * (n + math.ceil(n / BNB_BLOCK) * FP32)
                quantized = True
        else:  # torch AdamW: exp_avg, exp_avg_sq and a step-counter tensor
            total += 2 * n * FP32 + FP32
    if quantized:  # one shared 256-entry fp32 code book per moment
        total += (1 if optim == "lion_8bit" else 2) * 256 * FP32
    return total


def layer_activation_bytes(s: Shape, act: int, sdpa: bool, cuda: bool) -> int:
    """Bytes one transformer block keeps for backward (Korthikanti's inventory, for this GPT)."""
    d, h, T = s.d, s.n_head, s.seq
    per_token = (2 * d * FP32  # the two LayerNorm inputs: the residual stream, fp32 even under autocast
                 + 2 * 2 * FP32  # their mean and rstd
                 + 2 * d * act  # the LayerNorm outputs, kept by c_attn and c_fc
                 + 4 * d * act + 4 * d * act  # c_fc output (kept by GELU) and GELU output (kept by c_proj)
                 + d * act)  # the attention output, kept by c_proj
    if sdpa:
        per_token += 3 * d * act + h * FP32  # q, k, v (one buffer) and a log-sum-exp per head
    else:
        probs = FP32 + act if (cuda and act != FP32) else act  # CUDA autocast runs softmax in fp32
        per_token += 3 * d * act + h * T * probs  # contiguous q, kᵀ, v copies; the T×T probabilities
    mask = 0 if sdpa else T * T  # the inverted causal mask (bool) masked_fill keeps
    return s.tokens * per_token + mask


def head_activation_bytes(s: Shape, act: int, stable_embedding: bool) -> int:
    """What the embedding, final LayerNorm, lm_head and loss keep."""
    t, d = s.tokens, s.d
    kept = (2 * t * INT64 + s.seq * INT64  # token ids, targets, positions
            + t * d * FP32 + 2 * t * FP32  # ln_f input and statistics
            + t * d * act  # ln_f output, kept by lm_head
            + t * s.vocab_rows * FP32)  # the log-softmax output (the loss is computed in fp32)
    if stable_embedding:
        kept += t * d * FP32 + 2 * t * FP32  # StableEmbedding's LayerNorm input and statistics
    return kept


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


def backward_peak_bytes(s: Shape, groups, layer: int, head: int, weights_16bit: int, grads_before: int,
                        block_grads: int, head_grads: int) -> int:
    """The most live bytes (activations, gradients, working set) at any moment of one backward pass."""
    t = s.tokens
    boundary = t * s.d * FP32  # a checkpointed group keeps only its input
    alive = head + weights_16bit + sum(boundary if ckpt else n * layer for n, ckpt in groups)
    # at the start: two logit-sized gradients (loss and log-softmax) and two residual-stream gradients
    peak = grads_before + alive + 2 * t * s.vocab_rows * FP32 + 2 * t * s.d * FP32
    grads = grads_before or head_grads
    alive -= head
    for n, ckpt in reversed(groups):
        if ckpt:  # the group's forward runs again: its activations return, next to its input
            peak = max(peak, grads + alive + n * layer + 2 * t * s.d * FP32)
        alive -= boundary if ckpt else n * layer
        grads = grads_before or grads + n * block_grads
    return peak


def estimate(config: RunConfig, device: str | None = None) -> Estimate:
    """Predict params, grads, optimizer state, activations, the peak and the FLOPs of one step of `config`.

    For the built-in GPT under any combination of precision (bf16/fp16 autocast), sdpa, nice_numbers, the
    optimizer (`optim`, `fused_adamw`), grad_accum and checkpointing.  `device` ('cpu' or 'cuda') picks
    autocast's rules; by default the device the config would run on.
    """
    if config.custom_model:
        raise ConfigError("estimate covers the built-in GPT presets; for your own model, run it and read the "
                          "measured breakdown (RunResult.memory_breakdown())")
    device_type = (device or detect(config.device).device_type).split(":")[0]
    if device_type not in ("cpu", "cuda"):
        raise ConfigError(f"estimate: device must be 'cpu' or 'cuda', got {device!r}")
    cuda = device_type == "cuda"
    # planning needs only the kind of device (a GPU can be planned for on a laptop)
    cfg = config.resolve(SimpleNamespace(device_type=device_type))
    toggles = cfg.toggles
    p = PRESETS[cfg.preset]
    k = toggles.get("grad_accum", 1)
    if cfg.batch_size % k:
        raise ConfigError(f"RunConfig.toggles['grad_accum']={k} must divide batch_size={cfg.batch_size}")
    rows = round_up(p.vocab_size, VOCAB_MULTIPLE) if "nice_numbers" in toggles else p.vocab_size
    s = Shape(p.n_layer, p.n_head, p.n_embd, p.vocab_size, rows, max(p.block_size, cfg.seq_len),
              cfg.batch_size // k, cfg.seq_len)
    optim = toggles.get("optim") or ("adamw_torch_fused" if "fused_adamw" in toggles else "adamw_torch")
    stable = optim in EIGHT_BIT  # the GPT's embedding becomes a StableEmbedding
    sdpa = "sdpa" in toggles
    act = 2 if ("bf16" in toggles or "fp16" in toggles) else FP32

    shapes = s.param_shapes(stable)
    sizes = [math.prod(shape) for shape in shapes]
    n_params = sum(sizes)
    masks = 0 if sdpa else s.n_layer * s.block_size ** 2  # bool causal-mask buffers
    params = n_params * FP32 + masks
    grads = n_params * FP32
    state = optimizer_state_bytes(optim, shapes, 0 if stable else None)

    layer = layer_activation_bytes(s, act, sdpa, cuda)
    head = head_activation_bytes(s, act, stable)
    linear_weights = s.n_layer * 12 * s.d * s.d + s.vocab_rows * s.d
    weights_16bit = linear_weights * act if act != FP32 else 0  # autocast's cached 16-bit weight copies
    groups = block_groups(s.n_layer, toggles.get("checkpointing"))
    saved = head + weights_16bit + sum((s.tokens * s.d * FP32) if c else n * layer for n, c in groups)
    block_grads = (12 * s.d * s.d + 13 * s.d) * FP32
    backward = backward_peak_bytes(s, groups, layer, head, weights_16bit, grads_before=grads if k > 1 else 0,
                                   block_grads=block_grads, head_grads=grads - s.n_layer * block_grads)
    step = grads + step_temporaries_bytes(optim, sizes, cuda)
    peak = params + state + max(backward, step)

    notes = []
    if "compile" in toggles:
        notes.append("compile fuses ops and can keep less; this estimate is for eager execution")
    n_model = n_params - s.block_size * s.d - (rows - p.vocab_size) * s.d  # as GPT.num_params() counts
    tokens_step = cfg.batch_size * cfg.seq_len
    flops = gpt_train_flops_per_token(n_model, p.n_layer, p.n_embd, cfg.seq_len) * tokens_step
    block_forward = 2 * 12 * s.d * s.d + 4 * s.d * cfg.seq_len  # per token: weight matmuls and attention
    # recomputation stops once backward has what it needs (torch's checkpoint early stop): a group's last
    # projection (4d×d) is not run again, as its output was never saved
    recomputed = sum(n * block_forward - 2 * 4 * s.d * s.d for n, c in groups if c)
    return Estimate(label=cfg.label, params_bytes=params, grads_bytes=grads, optimizer_state_bytes=state,
                    activations_bytes=peak - params - grads - state, peak_bytes=peak,
                    saved_activations_bytes=saved, flops_per_step=float(flops),
                    hardware_flops_per_step=float(flops + recomputed * tokens_step),
                    n_params=n_params, notes=notes)


def planned_vs_measured(results) -> pd.DataFrame:
    """One row per measured run of the built-in GPT: planned and measured peak (MiB) and the planner's error."""
    import pandas as pd

    rows = []
    for r in results:
        if r.memory_breakdown() is None:
            continue
        fields = {k: v for k, v in r.config.items() if k not in ("model", "batch_fn", "loss_fn")}
        planned = estimate(RunConfig(**fields))
        rows.append({"run": r.label, "planned peak MiB": planned.peak_bytes / 2**20,
                     "measured peak MiB": r.peak_mem_bytes / 2**20,
                     "error %": 100 * (planned.peak_bytes - r.peak_mem_bytes) / r.peak_mem_bytes,
                     "planned activations MiB": planned.activations_bytes / 2**20,
                     "measured activations MiB": r.activations_bytes / 2**20})
    return pd.DataFrame(rows)
