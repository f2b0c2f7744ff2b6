"""What one forward pass asks of the hardware, operator by operator, counted by running the model's code on fake
tensors (shapes only: no weights, no memory, no arithmetic): the matmuls' FLOPs at their sizes, the fused
attention's FLOPs and bytes, and the bytes every other operator reads and writes.

Eager execution is taken literally: each operator that is not a matmul reads its inputs from memory and writes
its outputs back (views, metadata and aliases move nothing; a gather reads the rows it gathers, not the table).
The backward pass is derived, not traced: a matmul's backward is two matmuls of the same size (2× its FLOPs), a
fused attention's backward runs 2.5× its forward FLOPs (FlashAttention recomputes the scores: five matmuls against
two), and every other operator's backward moves 2× its forward bytes (it reads the output's gradient and what it
saved, and writes the inputs' gradients).

The model's code is the one the shape names: scalekit's built-in GPT (nanoGPT's structure) for the GPT-2 layout
and the built-in presets; for the Llama layout (Llama 3, Llama 2, Qwen2, Mistral), a Llama decoder written as
torchtitan's (llama_layout.py: RMSNorm in fp32, complex rotary, K/V repeated for grouped-query attention, SwiGLU).
Blocks are counted by running the model with one and with two layers: the difference is one block, the rest is
the root (embeddings, the final norm, the head and the mask).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default")
FUSED_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
MOVES_NOTHING = ("aten._unsafe_view.default", "aten.alias.default", "prim.device.default", "aten.detach.default",
                 "aten.lift_fresh.default", "prim.layout.default")
GATHERS = ("aten.embedding.default", "aten.index.Tensor", "aten.gather.default", "aten.index_select.default")
ATTENTION_BACKWARD_FLOPS = 2.5  # FlashAttention's backward: five matmuls of the forward's two (Dao 2023, sec. 3)
BACKWARD_BYTES = 2.0  # an element-wise operator's backward reads its output's gradient and saved inputs, writes grads


@dataclass
class Traffic:
    """One forward pass of one part (a block, or the root), per micro-batch of `rows` × `seq` tokens."""

    matmuls: list[tuple[int, int, int]] = field(default_factory=list)  # (m, n, k) of each matmul, batched folded in m
    attention_flops: float = 0.0  # what a fused attention kernel computes (causal: the half under the diagonal)
    attention_bytes: float = 0.0  # its inputs and outputs
    other_bytes: float = 0.0  # every other operator's reads and writes
    ops: int = 0  # operators that do work

    @property
    def matmul_flops(self) -> float:
        return float(sum(2 * m * n * k for m, n, k in self.matmuls))

    def minus(self, other: Traffic) -> Traffic:
        mine = list(self.matmuls)
        for mm in other.matmuls:
            if mm in mine:
                mine.remove(mm)
        return Traffic(mine, self.attention_flops - other.attention_flops,
                       self.attention_bytes - other.attention_bytes, self.other_bytes - other.other_bytes,
                       self.ops - other.ops)


@dataclass(frozen=True)
class ModelTraffic:
    """A model's forward, split as the cost model needs it: one block, the root, and where they came from."""

    block: Traffic
    root: Traffic
    code: str  # whose code was run

    def forward(self, n_layer: int) -> Traffic:
        b, r = self.block, self.root
        return Traffic(r.matmuls + b.matmuls * n_layer, r.attention_flops + n_layer * b.attention_flops,
                       r.attention_bytes + n_layer * b.attention_bytes, r.other_bytes + n_layer * b.other_bytes,
                       r.ops + n_layer * b.ops)


def _bytes(t) -> int:
    """Bytes a tensor occupies as read: an expanded (broadcast) tensor reads its storage once."""
    import torch

    if not isinstance(t, torch.Tensor):
        return 0
    dense = t.numel() * t.element_size()
    try:
        return min(dense, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return dense


def _tensors(xs):
    import torch

    for x in xs:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _tensors(x)


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.traffic = Traffic()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func)
            t = self.traffic
            if name in MOVES_NOTHING or getattr(func, "is_view", False):
                return out
            if name in MATMULS:
                a, b = (args[1], args[2]) if name.endswith(("addmm.default", "baddbmm.default")) else args[:2]
                batch = a.shape[0] if a.dim() == 3 else 1
                t.matmuls.append((batch * a.shape[-2], b.shape[-1], a.shape[-1]))
            elif any(k in name for k in FUSED_ATTENTION):
                q, k = args[0], args[1]
                causal = bool(kwargs.get("is_causal", args[4] if len(args) > 4 and isinstance(args[4], bool)
                                         else False))
                flops = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
                t.attention_flops += flops / 2 if causal else flops
                outs = out if isinstance(out, (tuple, list)) else (out,)
                t.attention_bytes += sum(_bytes(x) for x in args[:3]) + _bytes(outs[0])
            elif name in GATHERS:
                outs = list(_tensors(out if isinstance(out, (tuple, list)) else (out,)))
                index = [x for x in _tensors(args[1:]) if not x.is_floating_point()]
                t.other_bytes += 2 * sum(_bytes(x) for x in outs) + sum(_bytes(x) for x in index)
            else:
                outs = out if isinstance(out, (tuple, list)) else (out,)
                t.other_bytes += sum(_bytes(x) for x in _tensors(args)) + sum(_bytes(x) for x in _tensors(outs))
            t.ops += 1
            return out

    return Count()


def _run(build, rows: int, seq: int, vocab: int, autocast: bool, loss: bool = True) -> Traffic:
    """Count one forward (and the loss) of the model `build()` makes, on fake tensors, under bf16 autocast if
    `autocast` (this torch's CPU autocast policy: the fake tensors are CPU tensors)."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build()
        model.eval()  # no dropout: neither nanoGPT's GPT-2 runs nor torchtitan's Llama use it
        ids = torch.zeros(rows, seq, dtype=torch.long)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with torch.no_grad(), cast:
            count = _counter()
            with count:
                out = model(ids)
                logits = out if isinstance(out, torch.Tensor) else (out[0] if isinstance(out, tuple) else out.logits)
                if loss:  # the loss in fp32, as the runs compute it
                    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), ids.view(-1))
    return count.traffic


def _in_dtype(make, dtype):
    """The model `make()` builds, its parameters created in `dtype` (fake tensors cannot be converted after)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make()
    finally:
        torch.set_default_dtype(before)


def _gpt_builder(shape, n_layer: int, fused: bool, dtype, seq: int):
    from ..models.gpt import GPT, GPTConfig

    # a sequence longer than the learned positions: the table grown to fit, as RunConfig grows the built-in GPT's
    cfg = GPTConfig(block_size=max(shape.positions, seq), vocab_size=shape.vocab, n_layer=n_layer, n_head=shape.n_head,
                    n_embd=shape.d, attention="sdpa" if fused else "manual")

    return functools.partial(_in_dtype, lambda: GPT(cfg), dtype)


def _llama_builder(shape, n_layer: int, fused: bool, dtype, seq: int):
    from .llama_layout import LlamaLayout

    return functools.partial(_in_dtype, lambda: LlamaLayout(shape, n_layer, fused), dtype)


def counted_builder(shape, n_layer: int, fused: bool, dtype, seq: int):
    """A function that builds the counted model of `shape` with `n_layer` layers, its weights in `dtype` (the code
    model_traffic runs: the built-in GPT for the GPT-2 layout, llama_layout.py for the Llama layout)."""
    builder = _gpt_builder if shape.mlp_matrices == 2 else _llama_builder
    return builder(shape, n_layer, fused, dtype, seq)


@functools.lru_cache(maxsize=64)
def model_traffic(shape, seq: int, fused_attention: bool, autocast: bool, param_bytes: int = 4) -> ModelTraffic:
    """The forward's traffic per row of the batch (counted at one row: every figure but the mask's is linear in the
    rows), for a block and for the root.  `autocast`: bf16 autocast around the forward; `param_bytes`: 2 where the weights themselves are
    bf16 (FSDP's param_dtype), 4 where autocast casts fp32 weights for each matmul."""
    import torch

    dtype = torch.bfloat16 if param_bytes == 2 else torch.float32
    if shape.mlp_matrices == 2:
        builder, code = _gpt_builder, "scalekit's built-in GPT (nanoGPT's structure)"
    else:
        builder, code = _llama_builder, "a Llama decoder written as torchtitan's (scalekit/predict/llama_layout.py)"
    one = _run(builder(shape, 1, fused_attention, dtype, seq), 1, seq, shape.vocab, autocast)
    two = _run(builder(shape, 2, fused_attention, dtype, seq), 1, seq, shape.vocab, autocast)
    block = two.minus(one)
    return ModelTraffic(block, one.minus(block), code + (", fused attention (SDPA)" if fused_attention
                                                         else ", attention written out (softmax(QKᵀ)V)")
                        + (", bf16 autocast (CPU policy)" if autocast else "")
                        + (", bf16 weights" if param_bytes == 2 else ""))


def scaled(matmuls, rows: int) -> list[tuple[int, int, int]]:
    """The matmuls of one row at `rows` rows (the rows fold into m)."""
    return [(m * rows, n, k) for m, n, k in matmuls]


def matmul_seconds(matmuls, rate_at) -> float:
    """Seconds for these matmuls' forward at `rate_at(size)` FLOP/s, read at the matmul's smallest dimension (a
    skinny matmul, attention's K = head size say, runs at about the rate of a square one that size)."""
    return sum(2 * m * n * k / rate_at(max(1, min(m, n, k))) for m, n, k in matmuls)
