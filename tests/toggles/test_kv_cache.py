"""The built-in GPT's KV caches: the same greedy tokens as re-reading the sequence, in both modes, eager and
compiled, batched and alone; padding never attended (inference_mode's own check:
tests/toggles/test_inference_mode.py)."""

from __future__ import annotations

import pytest
import torch

from scalekit.inference import GenerateConfig
from scalekit.inference.loop import decode, pad_prompts
from scalekit.inference.trap import graphs_for_steps
from scalekit.models import GPT, GPTConfig, load_pretrained
from scalekit.models.kv_cache import StaticKVCache, make_cache
from tests.helpers import CPU, PROMPT, QUICK, greedy, one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> GPT:
    return load_pretrained("shakespeare-char")


@torch.no_grad()
def test_a_prefill_into_either_cache_gives_the_training_forward_logits(model):
    x = torch.randint(0, 65, (2, 40))
    plain = model(x)[0]
    for kind in ("dynamic", "static"):
        cache = make_cache(kind, model.config.n_layer, 64, "cpu")
        cached = model(x, cache=cache, input_pos=torch.arange(40))[0]
        torch.testing.assert_close(cached, plain, rtol=1e-5, atol=1e-5)
        # and a decode step after it equals the last row of the full forward of 41 tokens
        nxt = torch.randint(0, 65, (2, 1))
        step = model(nxt, cache=cache, input_pos=torch.tensor([40]))[0]
        full = model(torch.cat([x, nxt], 1))[0][:, -1:]
        torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_greedy_tokens_are_identical_with_and_without_the_cache_in_both_modes():
    runs = {name: greedy(toggles) for name, toggles in
            (("none", {}), ("dynamic", {"kv_cache": "dynamic"}), ("static", {"kv_cache": "static"}))}
    assert all(r.status == "ok" for r in runs.values())
    tokens = {name: r.token_ids for name, r in runs.items()}
    assert tokens["dynamic"] == tokens["none"] and tokens["static"] == tokens["none"], tokens
    assert len(tokens["none"][0]) == 60
    assert runs["none"].kv_cache_bytes == 0
    # the cache holds 2 (k, v) × layers × batch × positions × width fp32 values
    cfg = load_pretrained().config
    assert runs["static"].kv_cache_bytes == 2 * cfg.n_layer * 1 * (len(PROMPT) + 60) * cfg.n_embd * 4
    assert runs["dynamic"].kv_cache_bytes == 2 * cfg.n_layer * 1 * (len(PROMPT) + 59) * cfg.n_embd * 4


def test_the_shipped_models_greedy_sample_is_reproduced():
    from scalekit.models import pretrained_info

    recorded = pretrained_info("shakespeare-char")["samples"]["greedy_300"]
    result = greedy({"kv_cache": "static"}, n=120)
    assert recorded.startswith(result.texts[0])  # the provenance's greedy sample, written without a cache




@pytest.mark.parametrize("kind", [None, "dynamic", "static"])
def test_batched_prompts_get_the_tokens_each_gets_alone(kind):
    prompts = ["ROMEO:", "JULIET:\nO", "First Citizen:\nBefore we proceed"]  # different lengths: left-padded
    toggles = {"kv_cache": kind} if kind else {}
    together = greedy(toggles, n=30, prompts=prompts)
    alone = [greedy(toggles, n=30, prompts=[p]).token_ids[0] for p in prompts]
    assert together.token_ids == alone
    assert [t.startswith(p) for t, p in zip(together.texts, prompts, strict=True)] == [True] * 3
    assert together.batch_size == 3 and together.prompt_tokens == [len(p) for p in prompts]


@torch.no_grad()
def test_padding_is_never_attended_to(model):
    ids, pad = pad_prompts([[5, 6, 7], [8]], "cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and pad.tolist() == [0, 2]
    a = model(ids, pad=pad)[0][1, -1]
    ids[1, :2] = torch.tensor([40, 41])  # other padding tokens: the real token's logits do not move
    b = model(ids, pad=pad)[0][1, -1]
    assert torch.equal(a, b)
    alone = model(torch.tensor([[8]]))[0][0, -1]
    torch.testing.assert_close(a, alone, rtol=1e-5, atol=1e-5)


def test_a_static_cache_needs_positions():
    m = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=8))
    cache = StaticKVCache(1, 16, "cpu")
    with pytest.raises(ValueError, match="input_pos"):
        m(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="kind"):
        make_cache("paged", m.config.n_layer, 16, "cpu")


def test_a_python_int_position_recompiles_per_position_a_tensor_one_graph(model):
    # dynamo's CompileCounter backend counts graphs without generating kernels
    assert graphs_for_steps(model, 12, "int") == 8  # one per position until the recompile limit (8)
    assert graphs_for_steps(model, 12, "tensor") == 1


@pytest.mark.slow
def test_compiled_static_cache_decoding_is_one_graph_and_gives_the_eager_tokens():
    # chapter 06's generation (its prompt, its 120 tokens, inference_mode): the same decode graph, compiled once
    # in a test run (inductor's cache is shared by the suite's processes)
    eager = greedy({"kv_cache": "static", "inference_mode": True}, n=120)
    compiled = greedy({"kv_cache": "static", "compile": "default", "inference_mode": True}, n=120, warmup_tokens=4)
    assert compiled.status == "ok", compiled.error
    assert compiled.token_ids == eager.token_ids
    assert compiled.graphs_compiled == 1 and compiled.recompiles_measured == 0
    assert compiled.compile_s is not None and compiled.compile_s > 0


def test_decode_reports_what_it_timed(model):
    from contextlib import ExitStack

    from scalekit.inference.build import build_generation

    cfg = GenerateConfig(max_new_tokens=10, toggles={"kv_cache": "static"}, **QUICK).resolve(CPU)
    with ExitStack() as stack:
        ctx = build_generation(cfg, CPU, stack)
        ids, pad = pad_prompts(cfg.prompt_ids(), ctx.device)
        done = decode(ctx, ids, pad, 10, ids.shape[1] + 10)
    assert done.tokens.shape == (1, 10) and len(done.step_ms) == 9  # the first token comes from the prefill
    assert all(ms > 0 for ms in done.step_ms) and 0 < done.prefill_ms <= done.ttft_ms <= 1e3 * done.total_s
