"""What one forward pass asks of the hardware, operator by operator, counted by running the model's code on fake
tensors (shapes only: no weights, no memory, no arithmetic): the matmuls' FLOPs at their sizes, the fused
attention's FLOPs and bytes, and the bytes every other operator reads and writes.

Eager execution is taken literally: each operator that is not a matmul reads its inputs from memory and writes
its outputs back (views, metadata and aliases move nothing; a gather reads the rows it gathers, not the table).
Each matmul keeps its own bytes too (its inputs and its output at their dtypes), for its own roofline: it takes
the longer of its FLOPs at the matmul rate and its bytes at the memory's (`matmul_seconds`), so attention's
batched matmuls (K = the head size, 64) are priced by what they move where that is longer, a large square one by
its FLOPs.  A 2-D matmul's second operand is taken as a weight, read once whatever the rows; a batched matmul's
operands and output all grow with the rows.
The backward pass is derived, not traced: a matmul's backward is two matmuls of the same size (2× its FLOPs; dA =
dC·Bᵀ and dB = Aᵀ·dC move the same three tensors' bytes as the forward), a fused attention's backward runs 2.5×
its forward FLOPs (FlashAttention recomputes the scores: five matmuls against two), and every other operator's
backward moves 2× its forward bytes (it reads the output's gradient and what it saved, and writes the inputs'
gradients).

Mixed precision follows the autocast policy of the device predicted (`device`).  For this CPU (the part
"this-cpu") it is torch's CPU autocast itself, the fake tensors being CPU tensors (aten/src/ATen/autocast_mode.cpp,
`TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`: matmuls in bf16, softmax and layer_norm as their inputs come,
cross_entropy_loss in fp32).  For a GPU it is CUDA autocast's policy (`cuda_autocast`), applied by a dispatch mode
to the operators of the same count: the lists autocast_mode.h defines and autocast_mode.cpp registers for CUDA
(the "CUDA Ops that can autocast to float32" of torch's Autocast Op Reference): AT_FORALL_LOWER_PRECISION_FP (mm,
addmm, bmm, baddbmm, linear, matmul, scaled_dot_product_attention, ...) cast to bf16, AT_FORALL_FP32 (layer_norm,
group_norm, exp, log, pow, rsqrt, nll_loss and the other losses, ...) and AT_FORALL_FP32_SET_OPT_DTYPE (softmax,
log_softmax, sum, cumsum, prod, ...) to fp32, so the T×T attention scores' softmax reads and writes fp32 and its
inputs and output are cast on the way in and out.  The policy is applied by hand rather than by torch's own CUDA
kernels because a torch without CUDA cannot run a model on fake CUDA tensors (torch.autocast("cuda") switches
itself off, SDPA cannot choose a CUDA kernel, indexing asks for a CUDA device guard);
tests/predict/test_traffic.py checks it against torch's own AutocastCUDA kernels, operator by operator, on fake
CUDA tensors.  SDPA's fused kernel is counted as the CPU's flash kernel runs it: the same FLOPs and the same
inputs and output as the GPU's FlashAttention-2.  One difference by construction: a dtype passed explicitly to
softmax or log_softmax (cross_entropy passes its input's own to log_softmax) is not seen at the operators the count
sees, so such a (log_)softmax of 16-bit values is counted in fp32 where CUDA runs it in 16 bits; the counted models
cast their logits to fp32 before the loss, which the two policies then run alike.

The model's code is the one the shape names: scalekit's built-in GPT (nanoGPT's structure) for the GPT-2 layout
and the built-in presets; for the Llama layout (Llama 3, Llama 2, Qwen2, Mistral), a Llama decoder written as
torchtitan's (llama_layout.py: RMSNorm in fp32, complex rotary, K/V repeated for grouped-query attention, SwiGLU).
Blocks are counted by running the model with one and with two layers: the difference is one block, the rest is
the root (embeddings, the final norm, the head and the mask).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default")
FUSED_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
MOVES_NOTHING = ("aten._unsafe_view.default", "aten.alias.default", "prim.device.default", "aten.detach.default",
                 "aten.lift_fresh.default", "prim.layout.default")
GATHERS = ("aten.embedding.default", "aten.index.Tensor", "aten.gather.default", "aten.index_select.default")
ATTENTION_BACKWARD_FLOPS = 2.5  # FlashAttention's backward: five matmuls of the forward's two (Dao 2023, sec. 3)
BACKWARD_BYTES = 2.0  # an element-wise operator's backward reads its output's gradient and saved inputs, writes grads


class Matmul(NamedTuple):
    """One matmul, (m × k) @ (k × n) with a batched one's batch folded into m, and the bytes it reads and writes."""

    m: int
    n: int
    k: int
    row_bytes: int = 0  # bytes that grow with the rows: its first operand and output (a batched one's second too)
    fixed_bytes: int = 0  # bytes read once whatever the rows: a 2-D matmul's weight and its bias

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def bytes(self) -> int:
        return self.row_bytes + self.fixed_bytes


@dataclass
class Traffic:
    """One forward pass of one part (a block, or the root), per micro-batch of `rows` × `seq` tokens."""

    matmuls: list[Matmul] = field(default_factory=list)  # each matmul, batched folded in m, with its bytes
    attention_flops: float = 0.0  # what a fused attention kernel computes (causal: the half under the diagonal)
    attention_bytes: float = 0.0  # its inputs and outputs
    other_bytes: float = 0.0  # every other operator's reads and writes
    ops: int = 0  # operators that do work
    # of other_bytes, the operators inside a block's attention and MLP modules (SPLIT_MODULES): what tensor
    # parallelism splits over its ranks; the rest (norms, residual adds, the root) each rank runs whole
    split_bytes: float = 0.0

    @property
    def matmul_flops(self) -> float:
        return float(sum(mm.flops for mm in self.matmuls))

    def minus(self, other: Traffic) -> Traffic:
        mine = list(self.matmuls)
        for mm in other.matmuls:
            if mm in mine:
                mine.remove(mm)
        return Traffic(mine, self.attention_flops - other.attention_flops,
                       self.attention_bytes - other.attention_bytes, self.other_bytes - other.other_bytes,
                       self.ops - other.ops, self.split_bytes - other.split_bytes)

    def per_rank_bytes(self, tp: int, attention: bool = True) -> float:
        """The other operators' (and, with `attention`, fused attention's) bytes one tensor-parallel rank moves: the
        split modules' 1/tp, the rest whole."""
        split = self.split_bytes + (self.attention_bytes if attention else 0.0)
        return split / tp + self.other_bytes - self.split_bytes


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
                       r.ops + n_layer * b.ops, r.split_bytes + n_layer * b.split_bytes)


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


def _matmul(name: str, args, out) -> Matmul:
    """A counted matmul with its bytes: addmm's and baddbmm's added input first, then the two operands."""
    added = name.endswith(("addmm.default", "baddbmm.default"))
    a, b = (args[1], args[2]) if added else args[:2]
    bias = _bytes(args[0]) if added else 0
    if a.dim() == 3:  # bmm, baddbmm: every operand is per row (attention's Q, K, V and scores)
        return Matmul(a.shape[0] * a.shape[-2], b.shape[-1], a.shape[-1], _bytes(a) + _bytes(b) + _bytes(out) + bias)
    # mm, addmm: the second operand is a weight (read once); a bias the size of the output grows with the rows
    bias_rows = bias if added and args[0].numel() == out.numel() else 0
    return Matmul(a.shape[-2], b.shape[-1], a.shape[-1], _bytes(a) + _bytes(out) + bias_rows,
                  _bytes(b) + bias - bias_rows)


def _argument(func, args, kwargs, name: str, default):
    """An operator's argument by its schema's name, given by position or keyword."""
    if name in kwargs:
        return kwargs[name]
    names = [a.name for a in func._schema.arguments]
    i = names.index(name) if name in names else len(args)
    return args[i] if i < len(args) else default


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.traffic = Traffic()
            self.split_depth = 0  # > 0 inside a module tensor parallelism splits (split_modules' hooks)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func)
            t = self.traffic
            if name in MOVES_NOTHING or getattr(func, "is_view", False):
                return out
            if name in MATMULS:
                t.matmuls.append(_matmul(name, args, out))
            elif any(k in name for k in FUSED_ATTENTION):
                q, k = args[0], args[1]
                causal = _argument(func, args, kwargs, "is_causal", False)
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
                moved = sum(_bytes(x) for x in _tensors(args)) + sum(_bytes(x) for x in _tensors(outs))
                t.other_bytes += moved
                t.split_bytes += moved if self.split_depth else 0
            t.ops += 1
            return out

    return Count()


# the modules of a block whose work tensor parallelism splits over its ranks (scalekit's plan: attention's heads and
# the MLP's hidden units); the built-in GPT's names, and llama_layout.py's (torchtitan's)
SPLIT_MODULES = ("attn", "mlp", "attention", "feed_forward")


@contextlib.contextmanager
def split_modules(model, count):
    """While inside: `count.split_depth` above 0 whenever one of the model's SPLIT_MODULES is running its forward."""
    def enter(*_):
        count.split_depth += 1

    def leave(*_):
        count.split_depth -= 1

    handles = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in SPLIT_MODULES:
            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _run(build, rows: int, seq: int, vocab: int, autocast: bool, loss: bool = True, device: str = "cpu") -> Traffic:
    """Count one forward (and the loss) of the model `build()` makes, on fake tensors, under bf16 autocast with
    `device`'s policy if `autocast` (see the module's docstring)."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build()
        model.eval()  # no dropout: neither nanoGPT's GPT-2 runs nor torchtitan's Llama use it
        ids = torch.zeros(rows, seq, dtype=torch.long)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast and device == "cpu" \
            else contextlib.nullcontext()
        with torch.no_grad(), cast:
            count = _counter()
            policy = cuda_autocast() if autocast and device == "cuda" else contextlib.nullcontext()
            with count, policy, split_modules(model, count):  # the policy's casts reach the count, as autocast's
                out = model(ids)
                logits = out if isinstance(out, torch.Tensor) else (out[0] if isinstance(out, tuple) else out.logits)
                if loss:  # the loss in fp32, as the runs compute it
                    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), ids.view(-1))
    return count.traffic


# CUDA autocast's policy (aten/src/ATen/autocast_mode.h: the lists autocast_mode.cpp registers for the CUDA key), by
# the aten operators the count sees: a listed composite operator (linear, matmul, softmax.int, layer_norm, nll_loss)
# reaches a dispatch mode as the operator it decomposes into, and is cast there (each value: the listed op).
CUDA_LOWER_PRECISION = {  # AT_FORALL_LOWER_PRECISION_FP: floating inputs cast to bf16
    "aten.mm.default": "mm, linear, matmul", "aten.addmm.default": "addmm, linear", "aten.bmm.default": "bmm, matmul",
    "aten.baddbmm.default": "baddbmm", "aten.addbmm.default": "addbmm", "aten.mv.default": "mv",
    "aten.addmv.default": "addmv", "aten.addr.default": "addr", "aten.convolution.default": "conv1d, conv2d, conv3d",
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention.default": "_scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention.default": "_scaled_dot_product_efficient_attention",
}
CUDA_FP32 = {  # AT_FORALL_FP32: floating inputs cast to fp32
    "aten.native_layer_norm.default": "layer_norm, native_layer_norm", "aten.native_group_norm.default": "group_norm",
    "aten.nll_loss_forward.default": "nll_loss", "aten.nll_loss2d_forward.default": "nll_loss2d",
    "aten.exp.default": "exp", "aten.expm1.default": "expm1", "aten.log.default": "log", "aten.log2.default": "log2",
    "aten.log10.default": "log10", "aten.log1p.default": "log1p", "aten.reciprocal.default": "reciprocal",
    "aten.rsqrt.default": "rsqrt", "aten.acos.default": "acos", "aten.asin.default": "asin",
    "aten.cosh.default": "cosh", "aten.sinh.default": "sinh", "aten.tan.default": "tan",
    "aten.erfinv.default": "erfinv", "aten.pow.Tensor_Scalar": "pow", "aten.pow.Tensor_Tensor": "pow",
    "aten.pow.Scalar": "pow", "aten.softplus.default": "softplus", "aten.mse_loss.default": "mse_loss",
    "aten.smooth_l1_loss.default": "smooth_l1_loss", "aten.huber_loss.default": "huber_loss",
    "aten.binary_cross_entropy_with_logits.default": "binary_cross_entropy_with_logits",
    "aten.logsumexp.default": "logsumexp", "aten.cdist.default": "cdist",
    # AT_FORALL_FP32_SET_OPT_DTYPE, softmax and log_softmax: dtype=float32 makes them cast their bf16 input and run in
    # fp32 (aten/src/ATen/native/SoftMax.cpp; only a CUDA fp16 input skips the cast, with half_to_float)
    "aten._softmax.default": "softmax", "aten._log_softmax.default": "log_softmax",
}
CUDA_FP32_DTYPE = {  # AT_FORALL_FP32_SET_OPT_DTYPE with a dtype argument: it is set to fp32 (no separate cast)
    "aten.sum.default": "sum", "aten.sum.dim_IntList": "sum", "aten.cumsum.default": "cumsum",
    "aten.cumprod.default": "cumprod", "aten.prod.default": "prod", "aten.prod.dim_int": "prod",
    "aten.linalg_vector_norm.default": "linalg_vector_norm",
}


def cuda_autocast(dtype=None):
    """A dispatch mode that runs bf16 (or `dtype`) autocast with CUDA's policy on tensors of any device: the inputs
    of the lower-precision operators cast to `dtype`, those of the fp32 ones to fp32, the others left as they come
    (their own type promotion).  As autocast, a cast of an fp32 weight (a leaf that requires grad, or a view of
    one) is made once and reused.  Each cast is an `aten._to_copy` the modes below see."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    low = dtype or torch.bfloat16
    to_copy = torch.ops.aten._to_copy.default  # what Tensor.to runs (called as Tensor.to, a mode sees aten.to)

    class CudaAutocast(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.cached: dict = {}

        def cast(self, x, to):
            if isinstance(x, (list, tuple)):
                return type(x)(self.cast(v, to) for v in x)
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype in (to, torch.float64):
                return x
            root = x._base if x._base is not None else x
            if to == low and x.dtype == torch.float32 and root.is_leaf and root.requires_grad:
                key = (id(root), tuple(x.shape), x.stride(), x.storage_offset())
                if key not in self.cached:
                    self.cached[key] = (root, to_copy(x, dtype=to))  # the root kept alive: its id stays its own
                return self.cached[key][1]
            return to_copy(x, dtype=to)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func)
            to = low if name in CUDA_LOWER_PRECISION else torch.float32 if name in CUDA_FP32 else None
            if to is not None:
                args = self.cast(tuple(args), to)
                kwargs = {k: self.cast(v, to) for k, v in kwargs.items()}
            elif name in CUDA_FP32_DTYPE and kwargs.get("dtype") is None and isinstance(args[0], torch.Tensor) \
                    and args[0].is_floating_point() and args[0].dtype != torch.float64:
                kwargs = dict(kwargs, dtype=torch.float32)
            return func(*args, **kwargs)

    return CudaAutocast()


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
def model_traffic(shape, seq: int, fused_attention: bool, autocast: bool, param_bytes: int = 4,
                  device: str = "cpu") -> ModelTraffic:
    """The forward's traffic per row of the batch (counted at one row: every figure but the mask's is linear in the
    rows), for a block and for the root.  `autocast`: bf16 autocast around the forward, with `device`'s policy
    ('cuda' for a GPU, 'cpu' for this CPU); `param_bytes`: 2 where the weights themselves are bf16 (FSDP's
    param_dtype), 4 where autocast casts fp32 weights for each matmul."""
    import torch

    dtype = torch.bfloat16 if param_bytes == 2 else torch.float32
    if shape.mlp_matrices == 2:
        builder, code = _gpt_builder, "scalekit's built-in GPT (nanoGPT's structure)"
    else:
        builder, code = _llama_builder, "a Llama decoder written as torchtitan's (scalekit/predict/llama_layout.py)"
    one = _run(builder(shape, 1, fused_attention, dtype, seq), 1, seq, shape.vocab, autocast, device=device)
    two = _run(builder(shape, 2, fused_attention, dtype, seq), 1, seq, shape.vocab, autocast, device=device)
    block = two.minus(one)
    return ModelTraffic(block, one.minus(block), code + (", fused attention (SDPA)" if fused_attention
                                                         else ", attention written out (softmax(QKᵀ)V)")
                        + (f", bf16 autocast ({'CUDA' if device == 'cuda' else 'CPU'} policy)" if autocast else "")
                        + (", bf16 weights" if param_bytes == 2 else ""))


def scaled(matmuls, rows: int) -> list[Matmul]:
    """The matmuls of one row at `rows` rows (the rows fold into m; a weight's bytes stay)."""
    return [mm._replace(m=mm.m * rows, row_bytes=mm.row_bytes * rows) for mm in matmuls]


def matmul_seconds(matmuls, rate_at, bandwidth: float | None = None) -> float:
    """Seconds for these matmuls' forward, each on its own roofline: the longer of its FLOPs at `rate_at(size)`
    FLOP/s, read at the matmul's smallest dimension (a skinny matmul, attention's K = head size say, runs at about
    the rate of a square one that size), and its bytes (inputs and output) at `bandwidth` bytes/s (None: FLOPs
    only)."""
    return sum(max(mm.flops / rate_at(max(1, min(mm.m, mm.n, mm.k))), mm.bytes / bandwidth if bandwidth else 0.0)
               for mm in matmuls)
