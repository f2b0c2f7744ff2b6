"""A plan for any model: its training step run once on fake tensors, with the engine's own memory count.

Under torch's FakeTensorMode every tensor has a shape, a dtype and a device but no memory, and every op
computes only the shapes of its outputs.  The planner builds the run exactly as `scalekit.run` would
(the same build phases and toggles: the user's model, batches from its batch_fn, checkpointing, autocast,
accumulation, the optimizer), takes one step so that the optimizer's state exists, then takes one more
step under the live-tensor count the engine uses to measure a CPU run's peak.  So on a CPU the prediction
is the measurement's own method, applied without allocating anything; the parameters, gradients and
optimizer state come from the real parameters' shapes.  The same count also gives what the first forward keeps
for backward (read as it returns its loss), the most held before the first gradient exists, and, for a run with
tensor_parallel, the part of what forward keeps that the split layers hold (scalekit.plan.ranks uses them for a
rank's share).

What fake tensors cannot run is said, not guessed: a step whose Python code reads tensor values (`if
loss > 0`, `.item()`) stops the trace with that error; bitsandbytes' 8-bit optimizers run their own
kernels, so the step is traced with AdamW and their state is counted from the shapes instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..data import first_batch, to_device
from ..data.files import is_data_path
from ..data.packing import PackedDocuments
from ..errors import PlanUnavailable
from ..hf.tokenizer_of import tokenized_data
from ..machine.hardware import Hardware
from ..measure import memory
from ..toggles import TOGGLES
from ..toggles.optim import EIGHT_BIT
from ..training import build
from .estimate import Estimate
from .optimizer_state import optimizer_state_bytes


def planning_hardware(device_type: str) -> Hardware:
    """A stand-in for the device planned for: the trace needs only its type (a GPU can be planned on a laptop)."""
    cuda = device_type == "cuda"
    return Hardware(device_type, 0 if cuda else None, f"planned {device_type}", (8, 0) if cuda else None,
                    bf16_supported=True, tf32_supported=cuda, total_mem_bytes=None, cpu_count=os.cpu_count() or 1,
                    torch_version=torch.__version__, cuda_version=torch.version.cuda)


def _real_batch(cfg, facts, traced_cfg):
    """`traced_cfg` reading one real batch, read here, as a batch_fn's: of your dataset, or of your data file's
    documents packed (their rows and mask); else `traced_cfg` as it is."""
    if cfg.dataset is not None:
        sample = first_batch(PackedDocuments(cfg.dataset, cfg.seq_len, cfg.seed), cfg.batch_size, cfg.seed) \
            if facts.packed_rows else first_batch(cfg.dataset, cfg.batch_size, cfg.seed, cfg.collate_fn)
    elif facts.packed_rows and is_data_path(cfg.data):
        sample = first_batch(PackedDocuments(tokenized_data(cfg).documents("train"), cfg.seq_len, cfg.seed),
                             cfg.batch_size, cfg.seed)
    else:
        return traced_cfg
    return dataclasses.replace(traced_cfg, dataset=None, collate_fn=None, data="custom",
                               batch_fn=lambda batch_size, device: to_device(sample, device))


def traced_estimate(cfg, facts, device_type: str, label: str, quantized: list[tuple[int, int]] | None = None
                    ) -> Estimate:
    """Params, grads, optimizer state and the peak of one step of `cfg` (resolved), traced on fake tensors, with
    the toggles that can run on them (Toggle.traced); `facts` (PlanFacts) accounts for the others.

    `quantized`: the (out_features, in_features) of each weight the quantized_base toggle holds in 4 or 8
    bits (bitsandbytes' kernels cannot run on fake tensors: those weights are traced in fp32 and swapped).
    """
    notes = []
    if device_type == "cuda" and not torch.cuda.is_available():
        # fake CUDA tensors need a CUDA build of torch for many of their ops
        device_type = "cpu"
        notes.append("traced on the CPU (this torch has no CUDA): CUDA autocast keeps a few more tensors in fp32")
    # an 8-bit optimizer is traced as AdamW (its state is counted from the shapes below), a quantized base in fp32
    toggles = {n: v for n, v in cfg.toggles.items() if TOGGLES[n].traced(v)}
    # values do not matter to memory: a pretrained start is traced from random weights, the corpus's batches
    # (and a model family's default batches: Hugging Face reads windows of the corpus) as random tokens of the
    # same shape (the loader itself cannot run on fake tensors)
    data = cfg.data if cfg.batch_fn is not None else "synthetic"
    traced_cfg = _real_batch(cfg, facts, dataclasses.replace(cfg, toggles=toggles, init="random", data=data))
    with FakeTensorMode(allow_non_fake_inputs=True), _no_op_moves_skipped(), contextlib.ExitStack() as stack:
        try:
            step = _trace(traced_cfg, planning_hardware(device_type), stack, facts.tensor_parallel)
        except Exception as exc:
            raise PlanUnavailable(f"estimate could not trace one training step of your model on fake tensors "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                              f"run it and read the measured breakdown (RunResult.memory_breakdown())") from exc
    if facts.optimizer in EIGHT_BIT:
        _eight_bit_state(step, facts.optimizer, notes)
    if quantized:
        _quantized_base(step, facts.quantized_base, quantized, notes)
    params, grads, state, peak = step["params_bytes"], step["grads"], step["state"], step["peak"]
    return Estimate(label=label, params_bytes=params, grads_bytes=grads, optimizer_state_bytes=state,
                    activations_bytes=peak - params - grads - state, peak_bytes=peak,
                    saved_activations_bytes=step["saved"], split_activations_bytes=step["split"],
                    activations_before_grads_bytes=step["before_grads"],
                    flops_per_step=step["flops"], hardware_flops_per_step=step["flops"],
                    n_params=sum(p.numel() for p in step["params"]), largest_block_bytes=step["block_bytes"],
                    blocks_bytes=step["blocks_bytes"], logits_bytes=cfg.batch_size * cfg.seq_len * step["vocab"] * 4,
                    method="traced: one step on fake tensors, "
                    "live tensor bytes counted as the engine measures a CPU run", notes=notes)


@contextlib.contextmanager
def _no_op_moves_skipped():
    """Module.to(...) that would change nothing returns the module as it is.  Fake tensors cannot be swapped
    for themselves, which Module.to does for every parameter even when nothing moves (peft moves each new
    adapter to its base layer's device and dtype, usually where it already is)."""
    real = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*self.parameters(), *self.buffers()]
        if all((device is None or t.device == device) and (dtype is None or not t.is_floating_point()
                                                           or t.dtype == dtype) for t in tensors):
            return self
        return real(self, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = real


def _eight_bit_state(step: dict, optim: str, notes: list[str]) -> None:
    trainable = step["trainable"]
    embeddings = [i for i, p in enumerate(trainable) if id(p) in step["embedding_ids"]]
    state = optimizer_state_bytes(optim, [tuple(p.shape) for p in trainable], embeddings)
    # forward and backward as traced, with the 8-bit state in place of AdamW's; bitsandbytes' update
    # works block by block in place, so it is taken to need nothing beyond weights, gradients and state
    step["peak"] = max(step["backward_peak"] + state - step["state"], step["params_bytes"] + step["grads"] + state)
    step["state"] = state
    notes.append(f"optim={optim}: forward and backward were traced with AdamW (bitsandbytes' kernels cannot run "
                 f"on fake tensors); its 8-bit state is counted from the parameters' shapes")


def quantized_bytes(mode: str, rows: int, cols: int) -> tuple[int, int]:
    """(the parameter's bytes, its quantization state's) for one rows×cols weight in bitsandbytes: int8 values
    and an fp32 scale per row; or 4-bit values packed two to a byte, with an absmax per 64 values itself
    quantized to uint8 (nested: an fp32 absmax per 256 of those, two small code books and an offset)."""
    n = rows * cols
    if mode == "int8":
        return n, 4 * rows
    blocks = math.ceil(n / 64)
    return n // 2, blocks + 4 * math.ceil(blocks / 256) + 4 * 256 + 4 * 16 + 4


def _quantized_base(step: dict, mode: str, shapes: list[tuple[int, int]], notes: list[str]) -> None:
    fp32 = sum(4 * r * c for r, c in shapes)
    packed = sum(quantized_bytes(mode, r, c)[0] for r, c in shapes)
    held = packed + sum(quantized_bytes(mode, r, c)[1] for r, c in shapes)
    # each layer's weight is dequantized to full precision for its matmul, one layer at a time
    transient = max(4 * r * c for r, c in shapes)
    step["params_bytes"] += packed - fp32  # the parameters are the packed values; their state sits beside them
    step["peak"] += held - fp32 + transient
    notes.append(f"quantized_base={mode}: {len(shapes)} frozen weights counted at {held / 2**20:.2f} MiB instead of "
                 f"{fp32 / 2**20:.2f} MiB fp32, plus one dequantized weight at a time (traced in fp32: "
                 f"bitsandbytes' kernels cannot run on fake tensors)")


class SplitTracker(memory.LiveTensorBytes):
    """The engine's live-tensor count, also noting the storages made while `inside` is set (by `split_regions`: in
    the stretch of each block that tensor parallelism splits)."""

    def __init__(self, baseline=(), devices: tuple[str, ...] = ("cpu",)) -> None:
        self.inside, self.split = False, set()
        super().__init__(baseline, devices)

    def _track(self, storage, baseline: bool = False) -> None:
        key = memory.storage_key(storage)
        new = key not in self._live
        super()._track(storage, baseline)
        if new:  # (a freed storage's key can come back for a new one)
            (self.split.add if self.inside else self.split.discard)(key)

    def mark(self, t: torch.Tensor) -> None:
        self.split.add(memory.storage_key(t.untyped_storage()))

    @property
    def split_bytes(self) -> int:
        return sum(self._live.get(key, 0) for key in self.split)


def split_regions(model: torch.nn.Module, degree: int, tracker: SplitTracker) -> list:
    """Hooks setting `tracker.inside` over the stretch of each block that tensor parallelism splits (the model's own
    plan, models.tensor_parallel.tp_plan): from a column-split layer's output (attention's query, key and value,
    the MLP's widening layers) to the row-split layer that narrows back, its input included.  Between them every
    tensor is 1/degree per rank (its heads, its hidden units); the norms and the residual stream are whole."""
    from ..models.tensor_parallel import tp_plan

    def enter(module, args, output) -> None:
        tracker.inside = True
        tracker.mark(output)

    def leave(module, args) -> None:
        tracker.inside = False

    handles = []
    for block, plan in tp_plan(model, degree)[0]:
        for name, style in plan.items():
            layer = block.get_submodule(name)
            handles.append(layer.register_forward_hook(enter) if style == "colwise"
                           else layer.register_forward_pre_hook(leave))
    return handles


def _trace(cfg, hw: Hardware, stack, tensor_parallel: int = 1) -> dict:
    """Build `cfg` under fake tensors, take one step, then count one more; the figures as numbers.  With
    `tensor_parallel` > 1 (the run's degree), the activations its split layers keep are counted apart."""
    ctx = build.build(cfg, hw, stack)
    flops = build.flops_per_step(ctx)
    grads = memory.GradBytesAtStep(ctx.optimizer)
    build.train_step(ctx, next(ctx.batches))  # the optimizer's state appears at its first step
    tracker = build.step_tracker(ctx, SplitTracker, devices=(hw.device_type,))
    for handle in split_regions(ctx.base_model, tensor_parallel, tracker) if tensor_parallel > 1 else ():
        stack.callback(handle.remove)
    before_update = {}  # the peak of forward and backward, read as the optimizer step begins
    forward = {}  # what the first micro-batch's forward keeps for backward, read as it returns its loss

    def read_peak(*_) -> None:
        before_update.setdefault("peak", tracker.peak_bytes)

    def read_peak_before_grads(grad):  # as backward computes the step's first gradient
        before_update.setdefault("before gradients", tracker.peak_bytes - tracker.baseline_bytes)

    def loss_and_saved(model, batch):
        loss = loss_fn(model, batch)
        forward.setdefault("saved", tracker.current_bytes - tracker.baseline_bytes)
        forward.setdefault("split", tracker.split_bytes)
        return loss

    ctx.optimizer.register_step_pre_hook(read_peak)
    for p in ctx.base_model.parameters():
        if p.requires_grad:
            stack.callback(p.register_hook(read_peak_before_grads).remove)
    loss_fn, ctx.loss_fn = ctx.loss_fn, loss_and_saved
    peak = build.probe_step_memory(ctx, tracker)
    params = list(ctx.base_model.parameters())
    trainable = [p for p in params if p.requires_grad]
    embedding_ids = {id(m.weight) for m in ctx.base_model.modules() if isinstance(m, torch.nn.Embedding)}
    blocks = [sum(p.numel() for p in b.parameters()) for b in (ctx.blocks or [])]
    block_bytes = max(blocks, default=sum(p.numel() for p in params)) * 4  # fp32 weights of the largest block
    head = ctx.base_model.get_output_embeddings() if hasattr(ctx.base_model, "get_output_embeddings") else None
    vocab = head.weight.shape[0] if head is not None else 0  # the logits' width (a model of your own: not known)
    return dict(params=params, trainable=trainable, embedding_ids=embedding_ids, block_bytes=block_bytes, vocab=vocab,
                blocks_bytes=sum(blocks) * 4, saved=forward.get("saved"), split=forward.get("split", 0),
                before_grads=before_update.get("before gradients", 0),
                backward_peak=before_update.get("peak", peak), peak=peak, grads=grads.grads_bytes or 0, flops=flops,
                params_bytes=memory.storage_bytes([*params, *ctx.base_model.buffers()]),
                state=memory.storage_bytes(memory.optimizer_state_tensors(ctx.optimizer)))
