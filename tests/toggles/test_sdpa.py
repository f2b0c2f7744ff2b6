"""Which SDPA kernel ran, per call, as the results report it: the choice torch makes on the CPU (its flash kernel,
or math for dropout, 3-D inputs or an sdpa_kernel context asking for it), the watch leaving the numbers as they
are, and the counts in a training run (the built-in GPT, a Hugging Face Llama) and a generation."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalekit import RunConfig, generate, run
from scalekit.measure import attention_backend
from scalekit.measure.attention_backend import AttentionWatch, backends_said, chosen_backend
from scalekit.models import GPT, GPTConfig
from scalekit.training.report import results_table
from tests.families import hf_config
from tests.helpers import built, tiny

STEPS, WARMUP = 2, 1


def qkv(*shape):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def test_the_cpu_runs_flash_attention_unless_dropout_3d_inputs_or_a_context_ask_for_math():
    q, k, v = qkv(2, 4, 16, 8)
    assert chosen_backend(q, k, v, is_causal=True) == "flash"
    assert chosen_backend(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool).tril()) == "flash"  # a mask: still
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert chosen_backend(q, k, v, is_causal=True) == "flash"
    assert chosen_backend(q, k, v, dropout_p=0.1, is_causal=True) == "math"
    assert chosen_backend(q[0], k[0], v[0], is_causal=True) == "math"  # (heads, T, d): no batch dimension
    with sdpa_kernel([SDPBackend.MATH]):
        assert chosen_backend(q, k, v, is_causal=True) == "math"


def test_the_watch_counts_each_call_and_leaves_the_output_as_it_was():
    q, k, v = qkv(2, 4, 16, 8)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.manual_seed(1)
    plain_dropout = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    watch = AttentionWatch()
    with watch.step(measured=True):
        watched = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(q, k, v, None, 0.0, True)  # positional arguments, as some callers pass them
        torch.manual_seed(1)
        watched_dropout = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(watched, plain) and torch.equal(watched_dropout, plain_dropout)
    assert dict(watch.calls) == {"flash": 2, "math": 1}
    assert backends_said(watch.calls) == "flash ×2, math ×1"
    assert F.scaled_dot_product_attention is attention_backend.F.scaled_dot_product_attention  # restored ...
    with watch.step(measured=False):  # ... and a warm-up step is not watched
        F.scaled_dot_product_attention(q, k, v)
    assert sum(watch.calls.values()) == 3


def gpt(toggles: dict) -> RunConfig:
    return RunConfig(preset="tiny", data="synthetic", steps=STEPS, warmup_steps=WARMUP, log_every=1, batch_size=4,
                     seq_len=32, device="cpu", measure_memory=False, toggles=toggles)


def test_a_gpt_training_run_reports_flash_for_every_attention_call_of_its_measured_steps():
    result = run(gpt({"sdpa": True}))
    layers = 2  # the tiny preset's blocks: one attention call each per forward (the backward calls no SDPA)
    assert result.status == "ok" and result.sdpa_backends == {"flash": STEPS * layers}
    assert f"SDPA ran flash ×{STEPS * layers}" in result.notes
    assert result.summary_row()["sdpa"] == f"flash ×{STEPS * layers}"
    assert f"SDPA ran flash ×{STEPS * layers}" in results_table([result])
    manual = run(gpt({}))  # the explicit softmax(QKᵀ)V: no SDPA call to report
    assert manual.sdpa_backends == {} and not any("SDPA ran" in n for n in manual.notes)


def test_the_watch_does_not_change_a_run_s_losses(monkeypatch):
    watched = run(gpt({"sdpa": True}))
    monkeypatch.setattr(AttentionWatch, "step", lambda self, measured: contextlib.nullcontext())
    unwatched = run(gpt({"sdpa": True}))
    assert unwatched.sdpa_backends == {}
    assert watched.losses == unwatched.losses


@pytest.mark.parametrize("attention_dropout, kernel", [(0.0, "flash"), (0.1, "math")])
def test_a_hugging_face_llama_trained_with_attention_dropout_falls_back_to_math(attention_dropout, kernel):
    import transformers

    config = hf_config("llama")
    config.attention_dropout = attention_dropout
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    result = run(RunConfig(model=model, data="synthetic", steps=STEPS, warmup_steps=WARMUP, log_every=1, batch_size=4,
                           seq_len=16, device="cpu", measure_memory=False, toggles={"sdpa": True}))
    assert result.status == "ok", result.error
    assert result.sdpa_backends == {kernel: STEPS * config.num_hidden_layers}
    if kernel == "math":
        assert any("math: the unfused kernel" in note for note in result.notes)


def test_a_generation_reports_the_kernels_of_its_measured_tokens():
    new_tokens = 4
    result = generate(model="tiny", prompts="ROMEO:", max_new_tokens=new_tokens, device="cpu", quality=False,
                      measure_memory=False, toggles={"sdpa": True})
    assert result.status == "ok", result.error
    # one forward per new token (the prefill makes the first), each calling SDPA once per block, whatever the kernel
    assert sum(result.sdpa_backends.values()) == new_tokens * 2 and set(result.sdpa_backends) <= {"flash", "math"}
    assert result.summary_row()["sdpa"] == backends_said(result.sdpa_backends)


def test_sdpa_equals_manual_attention():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64)
    manual = GPT(cfg)
    fused = GPT(dataclasses.replace(cfg, attention="sdpa"))
    fused.load_state_dict(manual.state_dict())
    idx = torch.randint(0, 65, (3, 32))
    (lm, loss_m), (lf, loss_f) = manual(idx, idx), fused(idx, idx)
    torch.testing.assert_close(lf, lm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_f, loss_m, rtol=1e-6, atol=1e-6)
    with built(tiny(toggles=["sdpa"])) as ctx:
        assert ctx.base_model.config.attention == "sdpa"
