"""The scale model against published runs: one set of efficiency factors for every row (cost.PUBLISHED, each set
from a public microbenchmark figure and said where it comes from; none tuned to a row here), the parts table, and
the model's shape by name.  These rows are calibration points, not results: a row that misses its band names the
term the model lacks.

- torchtitan, Llama 3.1 8B on 8×H100 (FSDP, bf16 mixed precision, selective activation checkpointing with its
  "op" policy, local batch 2 × 8,192 tokens; eager and compiled).  Its H100s are a 500 W, 96 GB HBM2e part whose
  peak its authors give only as "between SXM and NVL": throughput is predicted at both ends and shown as the
  interval.  Its memory is the allocator's reserved peak (max_reserved_gib), at or above the allocated peak the
  model predicts.
- build-nanogpt, GPT-2 124M on one A100, B=16, T=1024: the ladder from bf16 on.
- gpt-fast, Llama-2-7B decode at batch 1 on one A100 80GB, beside the bandwidth ceiling (the weights read once per
  token at 100% of the datasheet bandwidth).
"""

from __future__ import annotations

import dataclasses

from ..course.published_figures import (
    GPT2_A100_LADDER_MS,
    GPT2_A100_SOURCE,
    GPT_FAST_README_LLAMA2_7B_A100_80GB_TOKENS_PER_S,
    GPT_FAST_README_SOURCE,
    TORCHTITAN_LLAMA31_8B_8XH100,
    TORCHTITAN_SOURCE,
)
from .parts import H100_96GB_500W_PEAK_FLOOR, part, register
from .shapes import shape_of
from .step import predict, predict_decode, unmodelled

TITAN_TOGGLES = {"fsdp": True, "bf16": True, "checkpointing": "selective-torchtitan", "sdpa": True}
FLOOR_PART = "H100-96GB-500W-NVL-peaks"
LADDER = (("bf16", "+ bf16", {"bf16": True}), ("+ compile", "+ compile", {"bf16": True, "compile": True}),
          ("+ flash attention", "+ sdpa", {"bf16": True, "compile": True, "sdpa": True}),
          ("+ vocab 50304", "+ nice_numbers", {"bf16": True, "compile": True, "sdpa": True}),
          ("+ fused AdamW", "+ fused_adamw", {"bf16": True, "compile": True, "sdpa": True, "fused_adamw": True}))
# what the model lacks, for a row outside its band (named, never tuned away)
MISSING = {
    "torchtitan tokens/s": "the part's peak, known only as between the NVL's and the SXM's (both ends predicted); "
                           "FlashAttention-2's 35% of peak and the matmul factor are the 700 W SXM's",
    "torchtitan GiB": "torchtitan's figure is max_reserved, the caching allocator's reserve over the allocated peak "
                      "the walk predicts (segments kept around the loss's three fp32 logits-sized tensors), plus any "
                      "CUDA-only allocation a CPU walk does not see; no published max_active splits the two",
    "GPT-2": "eager mode's host dispatch and kernel launches, taken as hidden on a GPU (op_overhead_s = 0); "
             "fused AdamW and the padded vocabulary have no term",
    "decode": "int8 weight-only matmuls at batch 1 dequantise inside the kernel and stream below a copy's bandwidth; "
              "the KV cache's reads, kernel launches and sampling per token",
}


@dataclasses.dataclass
class Row:
    """One published figure beside its prediction; `low` is the interval's lower end where the part's peak is
    known only as a range (else None)."""

    source: str
    row: str
    predicted: float
    published: float
    band: float
    kind: str  # a key of MISSING
    low: float | None = None
    note: str = ""

    @property
    def ratios(self) -> tuple[float, float]:
        """(lowest, highest) predicted over published."""
        return ((self.low if self.low is not None else self.predicted) / self.published,
                self.predicted / self.published)

    @property
    def within(self) -> bool:
        """The published figure within the band of the prediction (of some point of the interval)."""
        lo, hi = self.ratios
        return lo - 1 <= self.band and 1 - hi <= self.band

    @property
    def missing(self) -> str:
        return "" if self.within else MISSING[self.kind]


def floor_part():
    """The 500 W part with the NVL's peaks (added as a user adds a part): the lower end of its throughput."""
    floor = part(H100_96GB_500W_PEAK_FLOOR)
    return register(dataclasses.replace(part("H100-96GB-500W"), name=FLOOR_PART, peak_flops=dict(floor.peak_flops)))


def titan_rows() -> list[Row]:
    floor_part()
    out = []
    for name, (tps, gib) in TORCHTITAN_LLAMA31_8B_8XH100.items():
        toggles = dict(TITAN_TOGGLES, **({"compile": True} if "compile" in name else {}))
        high = predict("llama3-8b", "8xH100-96GB-500W", toggles=toggles, batch_size=16, seq_len=8192)
        low = predict("llama3-8b", f"8x{FLOOR_PART}", toggles=toggles, batch_size=16, seq_len=8192)
        out.append(Row(TORCHTITAN_SOURCE, f"Llama 3.1 8B {name}: tokens/s/GPU", high.tokens_per_s_per_gpu, tps, 0.20,
                       "torchtitan tokens/s", low=low.tokens_per_s_per_gpu))
        out.append(Row(TORCHTITAN_SOURCE, f"Llama 3.1 8B {name}: peak GiB per GPU", high.memory["peak"] / 2**30, gib,
                       0.15, "torchtitan GiB", note="predicted: allocated; published: reserved"))
    return out


def ladder_rows() -> list[Row]:
    gpt2 = shape_of("gpt2-124m")
    padded = dataclasses.replace(gpt2, name="gpt2-124m-50304", vocab=50304, root=((50304, 768),) + gpt2.root[1:])
    out = []
    for name, key, toggles in LADDER:
        shape = padded if key in ("+ nice_numbers", "+ fused_adamw") else gpt2
        p = predict(shape, "1xA100-80GB-SXM", toggles=toggles, batch_size=16, seq_len=1024)
        absent = unmodelled(toggles)
        out.append(Row(GPT2_A100_SOURCE, f"GPT-2 124M {name}: ms/step", p.step_s * 1e3, GPT2_A100_LADDER_MS[key],
                       0.25, "GPT-2", note=f"no term for {', '.join(absent)}: predicted as without" if absent else ""))
    return out


def decode_rows() -> list[Row]:
    out = []
    for name, tps in GPT_FAST_README_LLAMA2_7B_A100_80GB_TOKENS_PER_S.items():
        d = predict_decode("llama2-7b", "A100-80GB-SXM", weight_bytes={"bf16": 2.0, "int8": 1.0}[name])
        out.append(Row(GPT_FAST_README_SOURCE, f"Llama-2-7B decode {name}: tokens/s (ceiling "
                       f"{d['ceiling_tokens_per_s']:.1f})", d["tokens_per_s"], tps, 0.25, "decode"))
    return out


def rows() -> list[Row]:
    """Every published row beside its prediction (seconds on this CPU: predictions only, nothing runs)."""
    return titan_rows() + ladder_rows() + decode_rows()


def table(rows_: list[Row] | None = None) -> str:
    """The comparison as text: predicted (an interval where the part's peak is), published, ratio, band, verdict."""
    lines = [f"{'row':<52}{'predicted':>17}{'published':>10}{'ratio':>11}  band  verdict / missing term"]
    for r in rows() if rows_ is None else rows_:
        lo, hi = r.ratios
        predicted = f"{r.low:,.0f}–{r.predicted:,.0f}" if r.low is not None else f"{r.predicted:,.1f}"
        ratio = f"{lo:.2f}–{hi:.2f}" if r.low is not None else f"{hi:.2f}"
        lines.append(f"{r.row:<52}{predicted:>17}{r.published:>10,.1f}{ratio:>11}  ±{r.band:.0%}  "
                     + ("within" if r.within else "MISS: " + r.missing) + (f" ({r.note})" if r.note else ""))
    return "\n".join(lines)


def sources() -> list[str]:
    return [TORCHTITAN_SOURCE, GPT2_A100_SOURCE, GPT_FAST_README_SOURCE]
