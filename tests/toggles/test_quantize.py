"""The quantize toggle on the shipped model: the bytes each format stores (exact: they depend on no hardware),
what is quantized and what is not, and quality within stated bounds beside the unquantized model."""

from __future__ import annotations

import contextlib

import pytest
import torch

from scalekit.inference import GenerateConfig, generate
from scalekit.inference.build import build_generation
from scalekit.inference.weights import weight_bytes, weight_bytes_by_dtype
from scalekit.models.quantization import METHODS, method_available
from scalekit.toggles import TOGGLES
from tests.helpers import CPU, one_thread

# The shipped model: 4 blocks of c_attn (384×128), attn.c_proj (128×128), c_fc (512×128), mlp.c_proj (128×512)
BLOCK_LINEARS = [(384, 128), (128, 128), (512, 128), (128, 512)] * 4
N_Q = sum(o * i for o, i in BLOCK_LINEARS)  # 786,432 weights quantized
ROWS = sum(o for o, _ in BLOCK_LINEARS)  # 4,608 output rows (and biases)
PARAMS = 932_736
KEPT = 4 * (PARAMS - N_Q)  # fp32 bytes of all the rest: embedding (tied head), positions, norms, biases


def bnb_4bit_state(o: int, i: int) -> int:
    """bitsandbytes 4-bit, blocks of 64, absmax quantized again (uint8) in groups of 256 with fp32 absmax:
    codebook 16 fp32, offset fp32, nested codebook 256 fp32, nested absmax per 256 blocks."""
    blocks = o * i // 64
    return blocks + 16 * 4 + 4 + 256 * 4 + -(-blocks // 256) * 4


EXPECTED_BYTES = {
    "torchao-int8": KEPT + N_Q + ROWS * (4 + 1),  # int8, a fp32 scale and an int8 zero point per row
    "torchao-int8-dynamic": KEPT + N_Q + ROWS * (4 + 1),
    "torchao-int4": KEPT + N_Q + (N_Q // 32) * (4 + 1),  # on CPU: int4 values unpacked, one byte each
    "bnb-int8": KEPT + N_Q + ROWS * 4,  # int8 and a fp32 scale per row (SCB)
    "bnb-nf4": KEPT + N_Q // 2 + sum(bnb_4bit_state(o, i) for o, i in BLOCK_LINEARS),
    "bnb-fp4": KEPT + N_Q // 2 + sum(bnb_4bit_state(o, i) for o, i in BLOCK_LINEARS),
    "hqq-8bit": KEPT + N_Q + (N_Q // 64) * 2 * 4,  # uint8, a fp32 scale and zero per group of 64
    "hqq-4bit": KEPT + N_Q // 2 + (N_Q // 64) * 2 * 4,  # two values per byte
    "hqq-2bit": KEPT + N_Q // 4 + (N_Q // 64) * 2 * 4,  # four per byte
    "torch-dynamic-int8": KEPT + N_Q,  # int8, one scale per tensor (a number, not a tensor)
}
INT8 = ("torchao-int8", "torchao-int8-dynamic", "bnb-int8", "hqq-8bit", "torch-dynamic-int8")
FOUR_BIT = ("torchao-int4", "bnb-nf4", "bnb-fp4", "hqq-4bit")
RUNNABLE = [m for m in EXPECTED_BYTES if method_available(m, "cpu")[0]]
QUALITY = dict(max_new_tokens=16, warmup_tokens=0, measure_memory=False, device="cpu", quality_windows=8)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def results():
    return {m: generate(toggles={"quantize": m, "kv_cache": "static"}, hw=CPU, **QUALITY) for m in RUNNABLE}


def test_every_method_runs_here_or_says_why():
    assert set(METHODS) == set(TOGGLES["quantize"].choices)
    for method in METHODS:
        ok, why = method_available(method, "cpu")
        assert ok or why, method
    assert not method_available("gptq", "cpu")[0] and "CUDA" in method_available("gptq", "cpu")[1]
    assert not method_available("awq", "cpu")[0]
    assert not method_available("torch-dynamic-int8", "cuda")[0]
    assert set(RUNNABLE) == set(EXPECTED_BYTES), "bitsandbytes, torchao and hqq are installed with scalekit"


@pytest.mark.parametrize("method", list(EXPECTED_BYTES))
def test_weight_bytes_after_quantization_are_what_the_format_stores(results, method):
    r = results[method]
    assert r.status == "ok", r.error
    assert r.weight_bytes_before == 4 * PARAMS
    assert r.weight_bytes == EXPECTED_BYTES[method], (method, r.weight_bytes - EXPECTED_BYTES[method])
    assert any(f"quantize={method}: 16 linear layers" in n for n in r.notes)


def test_only_the_blocks_linears_are_quantized_and_the_head_stays_tied():
    cfg = GenerateConfig(toggles={"quantize": "hqq-4bit"}, quality=False, device="cpu").resolve(CPU)
    with contextlib.ExitStack() as stack:
        ctx = build_generation(cfg, CPU, stack)
        model = ctx.base_model
        kinds = {type(m).__name__ for b in model.transformer.h for m in b.modules()}
        assert "HQQLinear" in kinds and "Linear" not in kinds
        assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.transformer.wte.weight
        assert model.lm_head.weight.dtype == torch.float32
        assert weight_bytes_by_dtype(model)["uint8"] == N_Q // 2


@pytest.mark.parametrize("method", [m for m in INT8 if m in RUNNABLE])
def test_int8_keeps_the_models_greedy_choices(results, method):
    # stated bound: int8 (any method) picks the unquantized model's greedy token at >= 95% of held-out
    # positions and moves its perplexity by at most 1.5% (measured here: 96.6% to 99.6%, +0.01% to +0.5%)
    r = results[method]
    assert r.agreement >= 0.95, (method, r.agreement)
    assert abs(r.perplexity / r.reference_perplexity - 1) <= 0.015, (method, r.perplexity, r.reference_perplexity)


@pytest.mark.parametrize("method", [m for m in FOUR_BIT if m in RUNNABLE])
def test_4bit_perplexity_rises_within_bounds(results, method):
    # stated bound: 4-bit raises held-out perplexity by at most 6% and lowers it by no more than 0.5%
    # (measured here: +0.7% HQQ, +2.1% nf4, +2.3% torchao int4, +3.7% fp4); agreement stays >= 85%
    r = results[method]
    change = r.perplexity / r.reference_perplexity - 1
    assert -0.005 <= change <= 0.06, (method, change)
    assert r.agreement >= 0.85, (method, r.agreement)


def test_fewer_bits_cost_more_quality(results):
    ppl = {m: results[m].perplexity for m in ("hqq-8bit", "hqq-4bit", "hqq-2bit")}
    assert ppl["hqq-8bit"] < ppl["hqq-4bit"] < ppl["hqq-2bit"], ppl
    assert results["hqq-2bit"].weight_bytes < results["hqq-4bit"].weight_bytes < results["hqq-8bit"].weight_bytes


def test_the_reference_is_the_model_as_built(results):
    plain = generate(toggles={"kv_cache": "static"}, hw=CPU, **QUALITY)
    assert plain.agreement == 1.0 and plain.perplexity == plain.reference_perplexity
    for r in results.values():
        assert r.reference_perplexity == pytest.approx(plain.perplexity, rel=1e-6)


def test_weight_bytes_count_tied_weights_once_and_skip_the_causal_mask():
    from scalekit.models import load_pretrained

    model = load_pretrained()
    assert weight_bytes(model) == 4 * PARAMS  # the (1024 × 1024) causal-mask buffers are not weights
    assert model.lm_head.weight is model.transformer.wte.weight
