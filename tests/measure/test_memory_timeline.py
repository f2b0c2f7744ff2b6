"""The memory timeline of a training step (scalekit/measure/memory_timeline.py): every byte in one category at
every point, its peak the engine's own measurement of the same step, and each category what it says."""

import contextlib

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import scalekit
from scalekit import RunConfig
from scalekit.measure.memory import optimizer_state_tensors, storage_bytes
from scalekit.measure.memory_timeline import CATEGORIES, TimelineRecorder, record_cuda_step, record_step
from scalekit.training import build
from tests.families import PlainLM, hf_model


def test_the_peak_is_the_engines_own_measurement_and_the_categories_add_up():
    hw = scalekit.detect("cpu")
    cfg = RunConfig(preset="tiny", batch_size=4, seq_len=32, data="synthetic", steps=2).resolve(hw)
    with contextlib.ExitStack() as stack:
        ctx = scalekit.build(cfg, hw, stack)
        build.train_step(ctx, next(ctx.batches))  # AdamW's state exists from here on
        measured = build.probe_step_memory(ctx, build.step_tracker(ctx))  # what the engine reports as the peak
        timeline = record_step(lambda: build.train_step(ctx, next(ctx.batches)), ctx.base_model, ctx.optimizer)
        weights = storage_bytes(ctx.base_model.parameters())
        params = storage_bytes([*ctx.base_model.parameters(), *ctx.base_model.buffers()])
        state = storage_bytes(optimizer_state_tensors(ctx.optimizer))
    # the same ops on tensors of the same shapes, counted the same way: the same bytes.  (1% leaves room for a
    # storage freed by the garbage collector rather than its last reference, at a moment that can vary.)
    assert abs(timeline.peak_bytes - measured) <= 0.01 * measured, (timeline.peak_bytes, measured)
    assert timeline.category_sums() == timeline.total_bytes  # every byte alive in exactly one category
    assert timeline.peak_blind_to_resizes == timeline.peak_bytes  # nothing resized without FSDP
    assert timeline.bytes["parameters"][0] == params and timeline.bytes["optimizer state"][-1] == state
    assert set(timeline.phases) == {"forward", "backward", "optimizer"}
    forward_end = timeline.phases.index("backward") - 1
    assert timeline.bytes["activations"][forward_end] == timeline.most("activations") > 0  # kept through forward
    assert timeline.bytes["gradients"][-1] == 0  # set to None after the update
    # backward freed what forward kept, all but the step's returned loss and the batch it read (a few KiB)
    assert timeline.bytes["activations"][-1] < 0.01 * timeline.most("activations")
    assert timeline.most("gradients") == weights  # every parameter's gradient, once, before the update


def test_a_hugging_face_model_and_what_checkpointing_keeps():
    from scalekit.hf.model import HFCausalLM

    model = hf_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (2, 16))

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    plain = record_step(step, model)  # forward and backward (the optimizer's part is the test above's)
    HFCausalLM(model).checkpoint(model, every=1)  # the Transformers way, as the checkpointing toggle asks it
    model.train()
    checkpointed = record_step(step, model)
    for timeline in (plain, checkpointed):
        assert timeline.category_sums() == timeline.total_bytes
        assert timeline.bytes["gradients"][-1] == storage_bytes(p for p in model.parameters())
    assert 0 < checkpointed.most("activations") < plain.most("activations")  # only the blocks' inputs are kept
    assert checkpointed.most("temporaries", "backward") > 0  # the blocks recomputed during backward


def test_a_plain_module_and_the_blocks_inputs_kept_by_checkpointing():
    model = PlainLM(layers=3)
    ids = torch.randint(0, 65, (4, 64))

    def forward(use_checkpoint):
        x = model.emb(ids)
        for block in model.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x))
        model.head(x).square().mean().backward()

    kept = {flag: record_step(lambda flag=flag: forward(flag), model).most("activations") for flag in (False, True)}
    block_input = 4 * 64 * 32 * 4  # batch × tokens × width × fp32
    assert kept[True] < kept[False]
    assert kept[True] >= 3 * block_input  # each block's input is what checkpointing keeps
    model.zero_grad(set_to_none=True)


def test_a_storage_resized_behind_the_dispatchers_back_is_followed():
    """FSDP2 frees a gathered weight with storage.resize_(0) and gathers it again into the same storage."""
    gathered = torch.empty(1000)  # made before the recorder: it first sees it written into
    source = torch.randn(1000)
    recorder = TimelineRecorder(torch.nn.Module())
    with recorder:
        gathered.copy_(source)
        source.add(1)  # an op after it: the point that sees the weight alive
        gathered.untyped_storage().resize_(0)
        source.add(1)
        gathered.untyped_storage().resize_(4000)
        gathered.copy_(source)
        source.add(1)
    timeline = recorder.timeline(0.0)
    alive = [b for b, op in zip(timeline.total_bytes, timeline.ops, strict=True) if op.startswith("add")]
    assert alive == [8000, 4000, 8000], alive  # the weight's 4000 bytes, or none, and the add's own output
    away = [b for b, op in zip(timeline.resized_away_bytes, timeline.ops, strict=True) if op.startswith("add")]
    assert away == [0, 4000, 0]  # what a count that reads a size once would still hold
    assert timeline.peak_blind_to_resizes == timeline.peak_bytes == 8000
    assert timeline.category_sums() == timeline.total_bytes


def test_the_categories_are_the_documented_ones():
    assert CATEGORIES == ("parameters", "gathered parameters", "gradients", "optimizer state", "activations",
                          "temporaries")


@pytest.mark.gpu
def test_on_a_gpu_the_allocator_history_agrees_with_the_recorder():
    model = PlainLM(layers=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 65, (8, 128), device="cuda")

    def step():
        model(ids).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    timeline = record_cuda_step(step, model, optimizer)
    assert timeline.category_sums() == timeline.total_bytes
    # the allocator's trace counts from what was allocated before the step: with it, torch's own peak
    assert before + timeline.allocator_peak_bytes == torch.cuda.max_memory_allocated()
    # the allocator rounds every block up to 512 bytes: the recorder's storages are at most that much smaller each
    assert timeline.peak_bytes <= before + timeline.allocator_peak_bytes <= 1.10 * timeline.peak_bytes + 2**20


def test_bytes_kept_and_made_in_count_what_a_stretch_of_ops_left_alive():
    x, y = torch.ones(256), torch.ones(256)  # 1 KiB each
    recorder = TimelineRecorder(torch.nn.Linear(1, 1))
    with recorder:
        kept = x + y
        dropped = x - y
        made = len(recorder.ops)  # the two ops above
        del dropped
        later = kept * y
    assert made == 2 and recorder.bytes_kept(0, made, at=1) == 2048  # both alive after the second op
    assert recorder.bytes_kept(0, made, at=2) == 1024  # the second's freed by then
    assert recorder.bytes_kept(2, 3, at=2) == later.untyped_storage().nbytes() == 1024
    assert recorder.made_in([(0, made)]) == [1024, 2048, 1024]  # the two ops' bytes after each op
