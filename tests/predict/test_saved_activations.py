"""The walked peak of a training step (scalekit/predict/saved_activations.py) against the same counted model run for
real on this CPU under the memory timeline, torchtitan's op policy keeping what its source says, and predict's
memory reading the walk."""

import pytest
import torch

from scalekit.measure.memory_timeline import TimelineRecorder
from scalekit.models.blocks import find_blocks
from scalekit.predict import predict
from scalekit.predict import saved_activations as sa
from scalekit.predict.shapes import llama_shape
from scalekit.predict.traffic import counted_builder

LLAMA = llama_shape("llama-small", 3, 128, 4, 2, 352, 512)  # grouped-query attention, SwiGLU, untied head
SEQ = 128


def measured_peak(shape, policy, rows, param_dtype=torch.float32, autocast=False) -> int:
    """Bytes beyond the weights at the step's peak (activations, temporaries and the gradients alive then), the
    counted model run for real."""
    torch.manual_seed(0)
    model = counted_builder(shape, shape.n_layer, True, param_dtype, SEQ)()
    model.eval()
    sa.checkpoint_blocks(find_blocks(model), policy)
    recorder = TimelineRecorder(model)
    with recorder:
        sa.train_step(model, torch.randint(0, shape.vocab, (rows, SEQ)), shape.vocab,
                      torch.autocast("cpu", dtype=torch.bfloat16) if autocast else None)
    timeline = recorder.timeline(0.0)
    return max(total - timeline.bytes["parameters"][i] for i, total in enumerate(timeline.total_bytes))


# 3 layers predicted from walks of 1 and 2; 4 rows from walks at 2 and 3 rows (the sizes are affine in the rows),
# 1 row walked as it is (one row reshapes by views where more rows copy); every 2nd block checkpointed mixes the
# plain walk and the checkpointed one.  Checked by hand as well, all exact: 5, 6 and 9 layers at 1, 2 and 5 rows, every
# policy (scalekit's 'selective', 'sequential', every 2nd and 3rd block), fp32, bf16 weights and bf16 autocast
@pytest.mark.parametrize(("policy", "rows", "dtype"), [
    (None, 4, torch.float32), (2, 1, torch.float32),
    ("selective-torchtitan", 1, torch.bfloat16)])  # torchtitan's: its op policy on bf16 weights
def test_the_walked_peak_is_the_measured_peak_within_one_percent(policy, rows, dtype):
    param_bytes = 2 if dtype == torch.bfloat16 else 4
    grads = sum(p.numel() for p in counted_builder(LLAMA, LLAMA.n_layer, True, torch.float32, SEQ)().parameters())
    walk = sa.walked_peak(LLAMA, LLAMA.n_layer, rows, SEQ, policy, param_bytes, False, True,
                          grads_bytes=grads * param_bytes)
    predicted = walk.activations + walk.grads_fraction * grads * param_bytes
    # within 1%: a fake tensor holds the bytes a real one would, op for op (the walk comes out exact here)
    assert predicted == pytest.approx(measured_peak(LLAMA, policy, rows, dtype), rel=0.01)


def test_torchtitan_op_policy_keeps_the_input_attention_and_every_second_matmul():
    hd, t, d, kv, ffn = LLAMA.d // LLAMA.n_head, SEQ, LLAMA.d, LLAMA.n_kv_head * (LLAMA.d // LLAMA.n_head), LLAMA.ffn
    walk = sa.step_walk(LLAMA, SEQ, "selective-torchtitan", 2, False, True, (1, 1))
    # bf16: the block's input, wq's output (1st mm), wv's (3rd), SDPA's output and its fp32 log-sum-exp, w1's (5th),
    # w2's (7th); wk, wo and w3 (2nd, 4th, 6th) and every norm, rotation and product recomputed
    kept = 2 * t * (d + d + kv + d + ffn + d) + 4 * LLAMA.n_head * t
    assert walk.held_per_block(1) == kept == walk.held_per_block(1, backward=True)
    assert hd * LLAMA.n_head == d
    full = sa.step_walk(LLAMA, SEQ, 1, 2, False, True, (1, 1))
    assert full.held_per_block(1) == 2 * t * d  # full checkpointing keeps the block's input alone


def test_a_tensor_parallel_rank_divides_the_blocks_share_and_keeps_the_heads_whole():
    def walked(divide):
        return sa.walked_peak(LLAMA, 3, 1, SEQ, "selective-torchtitan", 2, False, True, divide=divide).activations

    whole = walked((1, 1))
    assert walked((2, 2)) == whole / 2  # context parallel: half of every sequence, the head's too
    root = 2 * walked((2, 1)) - whole  # blocks / 2 + root, at the same point
    # as backward begins the root holds the loss's three fp32 logits-sized tensors (log-softmax, its gradient and the
    # logits' gradient) and a little more (the final norm, the head's input)
    assert 3 * 4 * SEQ * LLAMA.vocab < root < 1.5 * 3 * 4 * SEQ * LLAMA.vocab < whole


def test_predict_walks_the_public_shapes_memory_and_says_it_is_the_allocated_peak():
    base = dict(gpus="8xH100-SXM", batch_size=8, seq_len=2048)
    peaks = {ckpt: predict("gpt2-124m", toggles={"fsdp": True, "bf16": True, "sdpa": True,
                                                 **({"checkpointing": ckpt} if ckpt else {})}, **base)
             for ckpt in (None, "selective", "selective-torchtitan", 1)}
    memory = [p.memory["peak"] for p in peaks.values()]
    assert memory == sorted(memory, reverse=True)  # each policy keeps less than the one before
    p = peaks["selective-torchtitan"]
    assert p.memory_method.startswith("walked")
    parts = p.memory["params"] + p.memory["optimizer_state"] + p.memory["comm_buffers"] + p.memory["activations"]
    assert parts <= p.memory["peak"] <= parts + p.memory["grads"]  # the gradients alive at the peak, not all of them
    text = " ".join(p.assumptions)
    assert "allocated peak" in text and "reserved" in text and "not a sum" in text
