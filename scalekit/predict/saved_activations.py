"""What a training step holds beyond its weights, walked op by op: the counted model (traffic.py: the built-in GPT
for the GPT-2 layout, llama_layout.py for Llama, Qwen2 and Mistral) run forward, through the loss as torchtitan
computes it (logits → .float() → cross_entropy, the logits dropped before backward) and backward, on fake tensors
at the real sizes (a fake tensor has a shape and no memory), under scalekit's memory timeline
(measure/memory_timeline.py: a dispatch mode that adds each new output storage and takes it off when a weakref says
it died).  Checkpointing is applied as torch applies it: torch.utils.checkpoint around each block, with torch's
selective checkpoint API for the policies that keep some outputs (scalekit's 'selective' keeps every matmul's and
fused attention's; torchtitan's op policy keeps fused attention's and every second matmul's in a block).

The peak is the most bytes alive at once (activations kept for backward, and whatever is in flight at that op),
not a sum of inventories; it usually falls at the loss or as backward begins.  The walk runs the model with two
layers, at two and at three rows (one row alone as it is: there a reshape is a view where more rows copy): every
tensor's size is affine in the rows, and a point of the walk between the first block's forward and its backward
holds that block's kept tensors (what its forward made that is still alive then), so L layers hold L − 1 blocks'
there.  Blocks checkpointed differently (every k-th, checkpoint_sequential's segments) are priced
from the walks of each kind, at the last block and at each other block's backward.  Parameters are the walk's
baseline; the gradients it sees are returned apart (the caller shards them as the layout does).  On this CPU the
walk gives the peak the same model measures for real, op for op (tests/predict/test_saved_activations.py).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# the policies a walk runs: None (no checkpointing), 1 (every block), 'selective' (scalekit's), 'selective-torchtitan'
# (torchtitan's op policy); every k-th block and 'sequential' (checkpoint_sequential) are priced from the first two
WALKED = (None, 1, "selective", "selective-torchtitan")


@dataclass(frozen=True)
class StepWalk:
    """Live bytes after every op of one training step (parameters apart) of the counted model with 2 layers at two
    rows, and what one more layer adds where it is held."""

    rows: tuple[int, int]  # the rows the two walks ran at (the same twice: the walk holds for those rows only)
    acts: tuple[np.ndarray, np.ndarray]  # activations and temporaries after each op, at those rows
    roots: tuple[np.ndarray, np.ndarray]  # of them, what the root made (embeddings, the final norm, head and loss)
    grads: np.ndarray  # gradients of the walked model alive after each op (its parameter dtype)
    region: tuple[int, int]  # the points where the first block's kept tensors are alive (its forward's end → backward)
    backward: int  # the first point of backward
    # bytes one block keeps from its forward to its backward, at those rows: as forward ends (autocast's cache
    # of cast weights still alive) and as backward begins
    held: tuple[tuple[int, int], tuple[int, int]]
    block_grad_bytes: int  # one block's gradients in the walk's parameter dtype
    grad_bytes_2: int  # the two-layer model's gradients, all of them
    loss_point: int  # the point at which the loss is computed (the forward's end)
    head: int  # the first point after the blocks (the final norm, the head)
    last_backward: int  # the first point of the last block's backward (the loss's and the head's are done)

    def _at(self, rows: int, low, high):
        r0, r1 = self.rows
        return low if r0 == r1 else low + (rows - r0) / (r1 - r0) * (high - low)  # every size is affine in the rows

    def held_per_block(self, rows: int, backward: bool = False) -> float:
        return self._at(rows, *self.held[backward])

    def curve(self, rows: int, layers: int, others_held=None):
        """(activation bytes, fraction of all gradients alive, the root's share of the bytes) after each op, at `rows`
        rows and `layers` layers.  `others_held`: (forward, backward) bytes the other layers keep (default: layers − 1
        blocks like this one)."""
        acts = np.asarray(self._at(rows, *(a.astype(float) for a in self.acts)), dtype=float).copy()
        lo, hi = self.region
        for phase, (start, end) in enumerate(((lo, self.backward), (self.backward, hi))):
            held = self.held_per_block(rows, bool(phase))
            extra = (layers - 1) * held if others_held is None else others_held[phase]
            acts[start:end] += extra - held  # the two-layer walk already holds one other block there
        grads = self.grads.astype(float)
        grads[hi:] += (layers - 2) * self.block_grad_bytes  # the later blocks' gradients exist by then
        total = self.grad_bytes_2 + (layers - 2) * self.block_grad_bytes
        return acts, grads / total if total else grads * 0, self._at(rows, *(r.astype(float) for r in self.roots))

    def backward_curve(self, rows: int, layers: int, before_held: float, later: int):
        """(activation bytes, fraction of all gradients alive) over this block's backward when it is not the last:
        `before_held` bytes kept by the blocks before it, the gradients of the `later` blocks after it there."""
        lo, hi = self.last_backward, self.region[1]
        acts = np.asarray(self._at(rows, *(a[lo:hi].astype(float) for a in self.acts)), dtype=float)
        acts = acts + before_held - self.held_per_block(rows, True)
        grads = self.grads[lo:hi].astype(float) + later * self.block_grad_bytes
        total = self.grad_bytes_2 + (layers - 2) * self.block_grad_bytes
        return acts, grads / total if total else grads * 0, self._at(rows, *(r[lo:hi].astype(float) for r in self.roots))

    def where(self, point: int) -> str:
        """The part of the step a point of the walk falls in."""
        if point < self.head:
            return "in the blocks' forward"
        if point < self.backward:
            return "at the head and the loss"
        return "as backward begins" if point < self.last_backward else "in the blocks' backward"


# torchtitan's op policy (torchtitan/distributed/activation_checkpoint.py, SelectiveAC): the ops whose outputs it
# saves (the partitioner's compute-intensive ops, the SDPA kernels, linear, max), every second mm/linear of a block
# recomputed; the CPU's flash kernel is the GPU's under the name a CPU (or a fake CPU tensor) dispatches to
@functools.cache
def _titan_save_ops() -> frozenset:
    import torch
    from torch._functorch.partitioners import get_default_op_list

    aten = torch.ops.aten
    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    ops |= {aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_attention_math.default,
            aten._scaled_dot_product_fused_attention_overrideable.default, aten.max.default, aten.linear.default,
            aten.topk.default, aten._scaled_dot_product_flash_attention_for_cpu.default}
    return frozenset(ops)


def titan_policy():
    """A fresh torchtitan op policy (its mm count starts at 0 for each block's forward and each recompute)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    save, mm_ops = _titan_save_ops(), (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            count[mode] += 1
        if func in save:
            if func in mm_ops and count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def checkpoint_blocks(blocks, policy) -> None:
    """Apply `policy` to the blocks as a run applies it: scalekit's toggle for k, 'sequential' and 'selective';
    torchtitan's op policy through torch's selective checkpoint API, one policy per block call."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ..toggles.checkpointing import checkpoint_all_sequential, checkpoint_every, sequential_segments

    if policy is None:
        return
    if policy == "sequential":  # scalekit's spelling: the blocks take one tensor (the built-in GPT's do)
        checkpoint_all_sequential(blocks, min(sequential_segments(len(blocks)), len(blocks)))
        return
    if policy == "selective-torchtitan":
        def context():
            return create_selective_checkpoint_contexts(titan_policy())

        for block in blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False, context_fn=context)
        return
    checkpoint_every(blocks, 1 if policy == "selective" else int(policy), selective=policy == "selective")


def train_step(model, ids, vocab: int, cast=None, on_loss=None, on_backward=None):
    """One forward, the loss as torchtitan computes it (the logits, in the compute dtype, cast to fp32 into
    cross_entropy; the logits dropped before backward) and backward."""
    import torch.nn.functional as F

    with cast or contextlib.nullcontext():
        out = model(ids)
        pred = out if not isinstance(out, tuple) else out[0]
        loss = F.cross_entropy(pred.float().reshape(-1, vocab), ids.reshape(-1))
    if on_loss is not None:
        on_loss()
    del out, pred
    if on_backward is not None:
        on_backward()
    loss.backward()


class _Walk(NamedTuple):
    """One step of the counted model on fake tensors, at one size."""

    acts: np.ndarray  # activations and temporaries after each op
    grads: np.ndarray  # gradients alive after each op
    marks: dict[str, int]  # the points where the step's parts begin (see _mark_blocks and train_step)
    grad_bytes: tuple[int, int]  # the model's gradients, one block's
    held: tuple[int, int]  # what the first block keeps to its backward: as the loss ends, as backward begins
    blocks: np.ndarray  # of acts, what the blocks' forwards and backwards made (the rest is the root's)


def _mark_blocks(blocks, recorder, marks: dict) -> list:
    """Hooks that note the op count where the first block's forward begins ('first') and ends ('held_from'), where
    its backward begins ('held_to'), where the head begins ('head'), where the last block's backward begins
    ('last_backward') and where the first block's ends ('blocks_done')."""
    def noted(name):
        return lambda *_: (marks.setdefault(name, len(recorder.ops)), None)[1]  # a hook that returns None

    def done(start: str, backward: str):
        def hook(module, args, output):
            marks[start] = len(recorder.ops)
            (output[0] if isinstance(output, tuple) else output).register_hook(noted(backward))
        return hook

    def first(module, args):
        noted("first")()
        args[0].register_hook(noted("blocks_done"))  # the gradient of the blocks' input: their backward is over

    return [blocks[0].register_forward_pre_hook(first),
            blocks[0].register_forward_hook(done("held_from", "held_to")),
            blocks[-1].register_forward_hook(done("head", "last_backward"))]


def _one_walk(shape, n_layer: int, rows: int, seq: int, policy, param_bytes: int, autocast: bool,
              fused: bool) -> _Walk:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..measure.memory_timeline import TimelineRecorder
    from ..models.blocks import find_blocks
    from .traffic import counted_builder

    build = counted_builder(shape, n_layer, fused, torch.bfloat16 if param_bytes == 2 else torch.float32, seq)
    marks: dict[str, int] = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build()
        model.eval()  # no dropout, as the traffic count
        blocks = find_blocks(model)
        checkpoint_blocks(blocks, policy)
        recorder = TimelineRecorder(model)
        hooks = _mark_blocks(blocks, recorder, marks)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else None
        with recorder:
            train_step(model, torch.zeros(rows, seq, dtype=torch.long), shape.vocab, cast,
                       lambda: marks.setdefault("loss", len(recorder.ops) - 1),  # points count ops: its last op
                       lambda: marks.setdefault("backward", len(recorder.ops)))
        for hook in hooks:
            hook.remove()
        timeline = recorder.timeline(0.0)
        grad_bytes = tuple(sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad)
                           for m in (model, blocks[0]))
        # what the first block's forward made that is alive as the loss ends (autocast's cache of cast weights
        # too) and as backward begins (the tensors saved for it, and its output where the next block keeps it)
        held = tuple(recorder.bytes_kept(marks["first"], marks["held_from"], at)
                     for at in (marks["loss"], marks["backward"]))
        blocks = recorder.made_in([(marks["first"], marks["head"]), (marks["last_backward"], marks["blocks_done"])])
    acts = np.add(timeline.bytes["activations"], timeline.bytes["temporaries"], dtype=np.int64)
    return _Walk(acts, np.array(timeline.bytes["gradients"], dtype=np.int64), marks, grad_bytes, held,
                 np.array(blocks, dtype=np.int64))


class NotAffine(Exception):
    """The counted step dispatched different operators at the two rows (a reshape that is a view at one row and a
    copy at more): walk at the rows asked."""


@functools.lru_cache(maxsize=128)
def step_walk(shape, seq: int, policy, param_bytes: int = 2, autocast: bool = False, fused: bool = True,
              rows: tuple[int, int] = (2, 3)) -> StepWalk:
    """The walk of one training step of `shape`'s counted model at `seq` tokens a row under checkpointing `policy`
    (one of WALKED), with weights of `param_bytes` (2: bf16, FSDP's param_dtype; 4: fp32) and bf16 `autocast` or
    not, at the two `rows` (any rows from there by the affine rule, or those rows alone if both are the same);
    cached, as the shape, the sequence, the policy, the dtypes and the rows make it."""
    if policy not in WALKED:
        raise ValueError(f"the walk runs checkpointing {WALKED}; got {policy!r}")
    args = (seq, policy, param_bytes, autocast, fused)
    two = [_one_walk(shape, 2, r, *args) for r in sorted(set(rows))] * (3 - len(set(rows)))
    if len(two[0].acts) != len(two[1].acts):  # the same ops at both rows, or the sizes are not affine in the rows
        raise NotAffine(rows)
    w, m = two[0], two[0].marks
    held = tuple(tuple(x.held[phase] for x in two) for phase in (0, 1))
    return StepWalk(rows, (w.acts, two[1].acts), (w.acts - w.blocks, two[1].acts - two[1].blocks), w.grads, (m["held_from"], m["held_to"]), m["backward"], held,
                    w.grad_bytes[1], w.grad_bytes[0], m["loss"], m["head"], m["last_backward"])


@dataclass(frozen=True)
class WalkedPeak:
    """The most bytes a step holds beyond its weights (activations and temporaries), where, and the gradients'
    share alive then."""

    activations: float  # at the peak
    grads_fraction: float  # of all gradients, alive at the peak
    where: str  # the part of the step the peak falls in
    held_per_block: float  # bytes a block keeps to its backward, on average over the blocks


def block_policies(policy, layers: int) -> list:
    """The walked policy of each block in order (a checkpoint_sequential segment counts as one checkpointed block:
    it keeps its input alone; walked_peak prices its recompute as its blocks')."""
    from ..toggles.checkpointing import sequential_segments

    if policy in (None, 1, "selective", "selective-torchtitan"):
        return [policy] * layers
    if policy == "sequential":  # segments − 1 checkpointed, the rest of the blocks run plain
        segments = min(sequential_segments(layers), layers)
        return [1] * (segments - 1) + [None] * (layers - (segments - 1) * (layers // segments))
    return [1 if (i + 1) % int(policy) == 0 else None for i in range(layers)]


def walked_peak(shape, layers: int, rows: int, seq: int, policy, param_bytes: int = 2, autocast: bool = False,
                fused: bool = True, grads_bytes: float = 0.0, divide: tuple[float, float] = (1, 1)) -> WalkedPeak:
    """The peak of activations (the blocks' divided by `divide`[0], the root's by `divide`[1]: a tensor-parallel
    rank holds 1/tp of the blocks' and all of the replicated head's) plus the gradients' bytes alive
    (`grads_bytes` in all, as the layout holds them) over the step, for `layers` layers at `rows` rows: the last
    block's forward, the loss and its backward with every other block's kept tensors held; and, where the blocks
    differ, each other block's backward (the blocks before it held, the gradients of those after it alive)."""
    blocks = block_policies(policy, layers)
    base = (2, 3) if rows > 1 else (1, 1)  # one row reshapes by views where more rows copy
    try:
        walks = {p: step_walk(shape, seq, p, param_bytes, autocast, fused, base) for p in set(blocks)}
    except NotAffine:
        walks = {p: step_walk(shape, seq, p, param_bytes, autocast, fused, (rows, rows)) for p in set(blocks)}
    kept = {p: (w.held_per_block(rows), w.held_per_block(rows, True)) for p, w in walks.items()}
    last, others = walks[blocks[-1]], [sum(kept[p][phase] for p in blocks[:-1]) for phase in (0, 1)]
    segments = blocks.count(1) + 1 if policy == "sequential" else 0
    size = layers // segments if segments else 1
    if segments > 1:  # autocast's cache keeps every block's cast weights to forward's end, a segment's too
        others[0] += (segments - 1) * (size - 1) * (kept[1][0] - kept[1][1])
    candidates = [(*last.curve(rows, layers, others_held=others), last, 0)]
    # a block's backward, not the last's: (walk, bytes the blocks before it keep, blocks after it), for each place
    places = [(p, sum(kept[q][1] for q in blocks[:j]), len(blocks) - 1 - j)
              for j, p in enumerate(blocks[:-1]) if len(walks) > 1 and not (segments and p == 1)]
    # checkpoint_sequential's segments: one's backward recomputes its blocks whole, the segments before it keep
    # their inputs, the blocks after it are done
    places += [(None, s * kept[1][1] + (size - 1) * kept[None][1], layers - (s + 1) * size)
               for s in range(segments - 1)]
    bytes_per_block = grads_bytes / layers  # the gradients a block's backward leaves (as the layout holds them)
    for kind in {p for p, _, _ in places}:
        # the same point peaks at every place (the places differ by constants): take the place that adds most
        _, before, later = max((p for p in places if p[0] == kind),
                               key=lambda p: p[1] / divide[0] + p[2] * bytes_per_block)
        walk = walks[kind]
        candidates.append((*walk.backward_curve(rows, layers, before, later), walk, walk.last_backward))
    best = None
    for a, f, root, walk, offset in candidates:
        acts = (a - root) / divide[0] + root / divide[1]
        total = acts + grads_bytes * f
        i = int(np.argmax(total))
        if best is None or total[i] > best[0]:
            best = (total[i], acts[i], f[i], walk.where(i + offset))
    held = sum(kept[p][0] for p in blocks) / layers / divide[0]
    return WalkedPeak(float(best[1]), float(best[2]), best[3], held)


__all__ = ["StepWalk", "WalkedPeak", "step_walk", "walked_peak", "checkpoint_blocks", "titan_policy", "train_step"]
