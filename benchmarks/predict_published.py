"""Predictions against published runs, with one set of efficiency factors for every row (cost.PUBLISHED, set from
public microbenchmark figures, each with its source; none tuned to a row here):

- torchtitan, Llama 3.1 8B on 8×H100 (its docs/performance.md): FSDP, bf16 mixed precision, selective activation
  checkpointing (its "op" policy: every second matmul's output recomputed), local batch 2, sequence 8192: 5,762
  tokens/s/GPU at 82.4 GiB; + torch.compile 6,667 at 77.0 GiB;
- build-nanogpt, GPT-2 124M on one A100, B=16, T=1024: bf16 300 ms/step → compile 130 → flash attention 96 →
  vocabulary 50304 93 → fused AdamW 90;
- gpt-fast, Llama-2-7B decode at batch 1 on one A100 80GB: 104.9 tokens/s bf16, 155.6 int8 (its README), beside
  the bandwidth ceiling (weights read once per token at 100% of the datasheet bandwidth).

    python benchmarks/predict_published.py [--out reference/predict_published.txt]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys

from scalekit.predict import PUBLISHED, predict, predict_decode
from scalekit.predict.shapes import shape_of
from scalekit.predict.step import unmodelled

TITAN = "torchtitan docs/performance.md: Llama 3.1 8B, 8×H100 (96 GB HBM2e, 2.4 TB/s, 500 W), FSDP, local batch 2"
NANOGPT = "build-nanogpt (Karpathy, 'Let's reproduce GPT-2 (124M)', 2024): one A100 (80 GB SXM), B=16, T=1024"
GPTFAST = "gpt-fast README (pytorch-labs/gpt-fast): Llama-2-7B, batch 1, A100 80GB"
TITAN_TOGGLES = {"fsdp": True, "bf16": True, "checkpointing": "selective-torchtitan", "sdpa": True}


def rows() -> list[dict]:
    out = []
    for name, published_tps, published_gib in (("FSDP", 5762, 82.4), ("FSDP + compile", 6667, 77.0)):
        toggles = dict(TITAN_TOGGLES, **({"compile": True} if "compile" in name else {}))
        p = predict("llama3-8b", "8xH100-96GB-500W", toggles=toggles, batch_size=16, seq_len=8192)
        out.append(dict(source=TITAN, row=f"Llama 3.1 8B {name}: tokens/s/GPU", predicted=p.tokens_per_s_per_gpu,
                        published=published_tps, band=0.20, missing=""))
        out.append(dict(source=TITAN, row=f"Llama 3.1 8B {name}: peak GiB per GPU", predicted=p.memory["peak"] / 2**30,
                        published=published_gib, band=0.15, missing=""))
    gpt2 = shape_of("gpt2-124m")
    padded = dataclasses.replace(gpt2, name="gpt2-124m-50304", vocab=50304, root=((50304, 768),) + gpt2.root[1:])
    ladder = (("bf16", gpt2, {"bf16": True}, 300), ("+ compile", gpt2, {"bf16": True, "compile": True}, 130),
              ("+ flash attention", gpt2, {"bf16": True, "compile": True, "sdpa": True}, 96),
              ("+ vocab 50304", padded, {"bf16": True, "compile": True, "sdpa": True}, 93),
              ("+ fused AdamW", padded, {"bf16": True, "compile": True, "sdpa": True, "fused_adamw": True}, 90))
    for name, shape, toggles, ms in ladder:
        p = predict(shape, "1xA100-80GB-SXM", toggles=toggles, batch_size=16, seq_len=1024)
        absent = unmodelled(toggles)
        out.append(dict(source=NANOGPT, row=f"GPT-2 124M {name}: ms/step", predicted=p.step_s * 1e3, published=ms,
                        band=0.25, missing="", note=f"no term for {', '.join(absent)}: predicted as without"
                        if absent else ""))
    for name, wbytes, tps in (("bf16", 2.0, 104.9), ("int8", 1.0, 155.6)):
        d = predict_decode("llama2-7b", "A100-80GB-SXM", weight_bytes=wbytes)
        out.append(dict(source=GPTFAST, row=f"Llama-2-7B decode {name}: tokens/s (ceiling "
                        f"{d['ceiling_tokens_per_s']:.1f})", predicted=d["tokens_per_s"], published=tps, band=0.25,
                        missing=""))
    for r in out:
        r["ratio"] = r["predicted"] / r["published"]
        if abs(r["ratio"] - 1) > r["band"] and not r["missing"]:
            r["missing"] = _missing(r["row"], r["ratio"])
    return out


def _missing(row: str, ratio: float) -> str:
    if "GiB" in row:
        return ("the peak taken as the sum of the parts, and Korthikanti's GPT inventory (4h MLP, dropout masks) "
                "used for Llama's SwiGLU and GQA layers, where torchtitan's op policy keeps only half the matmul "
                "outputs; torchtitan's loss head")
    if "decode" in row:
        return ("int8 weight-only matmuls at batch 1 dequantise inside the kernel and stream below a copy's "
                "bandwidth; the KV cache's reads, kernel launches and sampling per token")
    if "GPT-2" in row and ratio < 1:
        return ("CUDA's autocast runs softmax over the T×T scores in fp32 where the count (CPU autocast's policy) "
                "keeps bf16: about half the attention's bytes; attention's batched matmuls (K = 64) counted at the "
                "large-matmul factor")
    return ("the part's 500 W power cap: its peaks are the 700 W SXM's, an upper bound (no public figure for the "
            "capped part's sustained matmul rate); FlashAttention-2's 35% of peak is the H100 SXM's")


def shape_checks(names=("gpt2-124m", "llama3-8b", "llama2-7b", "qwen2-7b", "mistral-7b")) -> list[str]:
    """Each public shape's parameter count against the transformers model its config builds on the meta device
    (offline: no hub, no weights)."""
    import torch

    from scalekit.predict.shapes import hf_config

    transformers = __import__("transformers")
    lines = []
    for name in names:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config(name))
        counted = sum(p.numel() for p in model.parameters())
        lines.append(f"# shape {name}: {shape_of(name).n_params:,} parameters predicted, {counted:,} in transformers' "
                     f"model built from the same config on the meta device")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    lines = [f"# predict against published runs: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
             "# command: python benchmarks/predict_published.py (no GPU: the figures are predictions from the parts "
             "table and one set of efficiency factors)",
             *(f"# factor {k}: {v}" for k, v in PUBLISHED.sources.items()),
             f"{'row':<58}{'predicted':>11}{'published':>11}{'ratio':>7}  band  verdict / missing term"]
    for r in rows():
        ok = abs(r["ratio"] - 1) <= r["band"]
        lines.append(f"{r['row']:<58}{r['predicted']:>11,.1f}{r['published']:>11,.1f}{r['ratio']:>7.2f}  "
                     f"±{r['band']:.0%}  {'within' if ok else 'MISS: ' + r['missing']}"
                     + (f" ({r['note']})" if r.get("note") else ""))
    lines += shape_checks()
    lines += ["# sources:", f"#   {TITAN}", f"#   {NANOGPT}", f"#   {GPTFAST}"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
