"""Public reference figures the course compares a reader's own measurements against.

These are other people's measurements on other machines, shown beside yours, never used as results.
"""

from __future__ import annotations

import json
from pathlib import Path

# GPT-2 124M, one A100 80GB SXM, B=16, T=1024: ms per step as each optimization is added cumulatively.
# Source: Andrej Karpathy, build-nanogpt (video "Let's reproduce GPT-2 (124M)", 2024).
GPT2_A100_LADDER_MS = {
    "baseline": 1000.0,  # fp32
    "+ tf32": 333.0,
    "+ bf16": 300.0,
    "+ compile": 130.0,
    "+ sdpa": 96.0,  # flash attention
    "+ nice_numbers": 93.0,  # vocab 50257 → 50304
    "+ fused_adamw": 90.0,
}
GPT2_A100_SOURCE = "build-nanogpt: GPT-2 124M, A100, B=16, T=1024"

# Other published rules of thumb, with where they come from.
FIGURES = {
    "activation_checkpointing_slowdown": (1.20, "full recomputation ≈20% slower (selective ≈12%)"),
    "empty_cache_every_step_slowdown": (1.40, "torch.cuda.empty_cache() every step: up to ≈40% slower"),
    "empty_cache_every_n_slowdown": (1.10, "empty_cache every N steps: ≈10% slower (HF torch_empty_cache_steps)"),
    "adam8bit_state_bytes_per_param": (2.0, "bitsandbytes 8-bit Adam: 2 bytes/param of state vs 8 for fp32 Adam"),
    "kv_cache_speedup_1000_tokens": (4.7, "KV cache: ≈4.7× faster generation of 1,000 tokens (GPT-2, T4; as "
                                          "reported in João Lages, 'Transformers KV Caching Explained', 2023)"),
    "gpt2_a100_mfu": (0.50, "build-nanogpt reaches ≈50% MFU on an A100"),
    "llmc_a100_mfu": (0.60, "llm.c reaches ≈60% MFU on an A100 for GPT-2 124M"),
    "data_echoing_wallclock_speedup": (3.25, "data echoing (Choi et al., 2019): ResNet-50 on ImageNet trained in "
                                             "3.25× less wall-clock time with its data read over a network"),
}

# Inference: Llama-2-7B, batch 1, one A100, decode tokens/s as each optimization is added (cumulatively).
# Source: PyTorch blog "Accelerating Generative AI with PyTorch II: GPT, Fast" (Nov 2023) and the gpt-fast
# repository (pytorch-labs/gpt-fast); int4 is GPTQ-style int4 weight-only, and speculative decoding adds ≈245.
GPT_FAST_LLAMA2_7B_A100_TOKENS_PER_S = {
    "baseline": 25.5,  # eager
    "+ static cache + compile": 107.0,  # torch.compile(mode="reduce-overhead") of the decode step, static KV cache
    "+ int8": 157.0,  # int8 weight-only
    "+ 4-bit": 202.0,  # int4 weight-only (GPTQ)
}
GPT_FAST_SOURCE = "gpt-fast: Llama-2-7B, batch 1, A100 (PyTorch blog, Nov 2023)"

# The same model's decode rates as the gpt-fast repository's README gives them (A100 80GB, batch 1, compiled, static
# cache): the figures benchmarks/predict_published.py holds the scale model against.
GPT_FAST_README_LLAMA2_7B_A100_80GB_TOKENS_PER_S = {"bf16": 104.9, "int8": 155.6}
GPT_FAST_README_SOURCE = "gpt-fast README (pytorch-labs/gpt-fast): Llama-2-7B, batch 1, A100 80GB"


# torchtitan, Llama 3.1 8B on 8 H100s (Grand Teton: 96 GB HBM2e at 2.4 TB/s, the default 500 W power limit), FSDP,
# bf16 mixed precision, selective activation checkpointing (its "op" policy), local batch 2 × 8,192 tokens: tokens/s
# per GPU and the allocator's reserved peak (torchtitan logs max_reserved_gib), as each technique is added.
TORCHTITAN_LLAMA31_8B_8XH100 = {"FSDP": (5762.0, 82.4), "FSDP + compile": (6667.0, 77.0)}
TORCHTITAN_SOURCE = ("torchtitan benchmarks/llama3_h100_202412_torchtitan.md (earlier docs/performance.md), Table 1: "
                     "Llama 3.1 8B, 8×H100 (96 GB HBM2e, 2.4 TB/s, 500 W), FSDP, local batch 2, selective AC")


def recorded(name: str) -> dict | None:
    """A measurement recorded on a named machine by one of the repository's benchmarks (reference/NAME.json,
    with its date, device, versions and command), or None when this copy of scalekit has no such file."""
    path = Path(__file__).resolve().parents[1] / "reference" / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

# Fine-tuning with few trainable weights: what the methods were published with.
FINETUNE_FIGURES = {
    "qlora_65b_one_48gb_gpu": (65, "QLoRA (Dettmers et al., 2023): a 65B model fine-tuned on one 48 GB GPU"),
    "answerai_70b_two_24gb_gpus": (70, "Answer.ai (2024): a 70B model fine-tuned on two 24 GB GPUs with FSDP + QLoRA"),
    "qlora_vs_lora_peak_memory": (0.75, "Google Vertex AI guidance: QLoRA ≈75% less peak GPU memory than LoRA"),
    "lora_vs_qlora_speed": (1.66, "Google Vertex AI guidance: LoRA ≈66% faster than QLoRA"),
}

# torchtitan logs the share of each step spent loading data (its metric time_metrics/data_loading(%)): the
# same question as a run's data_wait_frac, asked of large training runs.
TORCHTITAN_DATA_LOADING_METRIC = "time_metrics/data_loading(%)"
