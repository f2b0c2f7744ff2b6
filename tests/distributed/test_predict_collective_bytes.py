"""The bytes predict says each collective carries are the bytes the ranks send: torch.distributed's collectives
wrapped in each rank, one training step of the built-in tiny GPT counted per kind, and held against
scalekit.predict's collectives for the same layout, to the byte."""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter

import pytest
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import scalekit
from scalekit.distributed import runtime
from scalekit.launch import launch
from scalekit.predict import cost, predict
from scalekit.predict.shapes import shape_of
from scalekit.training.build import build, train_step
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here
from tests.helpers import tiny

# the calls a rank can make, by module, with the kind predict names them and the argument holding the buffer S
# each moves, as predict counts it (an all-gather's output, a reduce-scatter's input, an all-reduce's or a broadcast's
# tensor): torch.distributed's (FSDP2 calls the *_single forms) and the functional all-reduce DTensor's tensor
# parallelism calls.  (isend/irecv are left alone: torch's pipelining checks P2POp's function by identity.)
WRAPPED = {
    dist: {"all_reduce": ("all_reduce", "tensor"), "all_gather_into_tensor": ("all_gather", "output_tensor"),
           "all_gather_single": ("all_gather", "output_tensor"), "reduce_scatter_tensor": ("reduce_scatter", "input"),
           "reduce_scatter_single": ("reduce_scatter", "input"), "broadcast": ("broadcast", "tensor"),
           "_broadcast_coalesced": ("broadcast", None)},
    funcol: {"all_reduce": ("all_reduce", "self")},
}
MODES = {"ddp": ["ddp"], "fsdp": ["fsdp"], "zero1": {"zero": "zero1"}, "zero2": {"zero": "zero2"},
         "fsdp+bf16": ["fsdp", "bf16"], "tensor_parallel": {"tensor_parallel": 2},
         "gpipe": {"pipeline_parallel": "gpipe/2"}, "1f1b": {"pipeline_parallel": "1f1b/4"}}
# tiny has 2 layers: a pipeline of 2 stages, so only on 2 ranks (on 4, two pipelines side by side need fsdp too)
AT_FOUR = [m for m in MODES if "pipeline_parallel" not in MODES[m]]
BATCH = 8


def _nbytes(fn, arg, args, kwargs) -> int:
    if arg is None:  # _broadcast_coalesced(process_group, tensors, buffer_size, src), a C++ function: its tensors
        return sum(t.numel() * t.element_size() for t in args[1])
    t = inspect.signature(fn).bind_partial(*args, **kwargs).arguments[arg]
    return t.numel() * t.element_size()


def _count_one_step(toggles) -> dict:
    cpu = scalekit.detect("cpu")
    cfg = tiny(batch_size=BATCH, toggles=toggles).resolve(cpu)
    sent: Counter = Counter()
    calls: Counter = Counter()
    originals = [(module, name, getattr(module, name)) for module, names in WRAPPED.items() for name in names
                 if hasattr(module, name)]

    def wrap(kind, arg, fn):
        def counted(*args, **kwargs):
            sent[kind] += _nbytes(fn, arg, args, kwargs)
            calls[kind] += 1
            return fn(*args, **kwargs)
        return counted

    from torch.distributed.pipelining import schedules

    batch_p2p = schedules._batch_p2p  # a pipeline's sends: P2POps whose function is torch's own isend

    def counted_p2p(ops, *args, **kwargs):
        for op in ops:
            if op.op is dist.isend:
                sent["send_recv"] += op.tensor.numel() * op.tensor.element_size()
                calls["send_recv"] += 1
        return batch_p2p(ops, *args, **kwargs)

    originals.append((schedules, "_batch_p2p", batch_p2p))
    try:
        schedules._batch_p2p = counted_p2p
        for module, name, fn in originals[:-1]:
            setattr(module, name, wrap(*WRAPPED[module][name], fn))
        with contextlib.ExitStack() as stack:
            runtime.setup(cpu, stack, cfg.batch_size)
            ctx = build(cfg, cpu, stack)
            if hasattr(ctx.model, "register_comm_hook"):  # DDP's reducer calls the process group from C++: its
                # buckets go through dist.all_reduce by the default hook, spelled out
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

                ctx.model.register_comm_hook(None, allreduce_hook)
            train_step(ctx, next(ctx.batches))  # the first step (DDP's bucket rebuild, the optimizer's state)
            sent.clear()
            calls.clear()
            train_step(ctx, next(ctx.batches))
            del ctx
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    return {"bytes": dict(sent), "calls": dict(calls)}


def _all_modes():
    dist.init_process_group("gloo")
    modes = MODES if dist.get_world_size() == 2 else AT_FOUR
    try:
        return {mode: _count_one_step(MODES[mode]) for mode in modes}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n} ranks")
def counted(request):
    return request.param, launch(_all_modes, nprocs=request.param, timeout_s=120)


def _predicted(toggles, ranks: int) -> dict:
    pred = predict("tiny", f"{ranks}xH100-SXM", toggles=toggles, batch_size=BATCH)
    out_bytes: Counter = Counter()
    out_calls: Counter = Counter()
    for c in pred.collectives:
        out_bytes[c.op] += c.bytes
        out_calls[c.op] += c.calls
    return {"bytes": dict(out_bytes), "calls": dict(out_calls)}


@pytest.mark.parametrize("mode", MODES)
def test_predicted_bytes_per_collective_equal_what_the_ranks_send(counted, mode):
    ranks, per_rank = counted
    if mode not in per_rank[0]:
        assert ranks == 4 and mode not in AT_FOUR
        return
    predicted = _predicted(MODES[mode], ranks)
    for rank, measured in enumerate(per_rank):
        assert measured[mode]["bytes"] == predicted["bytes"], (mode, rank)
        assert measured[mode]["calls"] == predicted["calls"], (mode, rank)


def test_fsdp_moves_its_padded_units_twice_forward_and_back_and_ddp_its_gradients_once():
    shape = shape_of("tiny")
    lay = cost.Layout(world=4, dp=4, sharding="fsdp")
    colls = {c.name: c for c in cost.step_collectives(shape, lay, micro_batch_rows=2, seq=64)}
    gathered = sum(cost.unit_bytes(shape, 4, 4))
    assert gathered >= 4 * shape.n_params  # padding only adds
    assert [c.bytes for c in colls.values() if c.op == "all_gather"] == [gathered, gathered]
    ddp = cost.step_collectives(shape, cost.Layout(world=2, dp=2, sharding="ddp"), 4, 64)
    assert ddp[0].op == "all_reduce" and ddp[0].bytes == 4 * shape.n_params
