"""GenerateResult: what one measured generation measured, and side-by-side ratios of several."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..measure.results import STATUSES, write_results_json
from ..measure.timing import Spread


@dataclass
class TokenRecord:
    """One decode step as streamed to callbacks and kept for plots: a new token for every prompt."""

    index: int  # 0: the first new token (from the prefill); 1, 2, ...: decode steps
    position: int  # its position in the (padded) sequence
    ms: float  # the time this token took: prefill + first sampling for index 0, one decode step after
    token_ids: list[int]  # the new token of each prompt
    texts: list[str]  # those tokens decoded


@dataclass
class GenerateResult:
    label: str
    config: dict
    status: str = "ok"  # one of measure.results.STATUSES
    error: str | None = None
    device: str = ""
    torch_version: str = ""
    batch_size: int = 0  # prompts generated together
    prompt_tokens: list[int] = field(default_factory=list)  # each prompt's length in tokens
    new_tokens: int = 0  # tokens generated after each prompt (fewer if stopped)
    texts: list[str] = field(default_factory=list)  # each prompt followed by what was generated
    token_ids: list[list[int]] = field(default_factory=list)  # the generated ids of each prompt
    # -- time (ms): measured after the warm-up, device-synchronized ----------------------------------
    prefill_ms: float | None = None  # the prompt's forward pass, filling the cache
    ttft_ms: float | None = None  # time to first token: from the prompt ids to the first new token
    token_ms: list[float] = field(default_factory=list)  # each decode step (tokens 2, 3, ...): for plots
    decode_ms: Spread | None = None  # over token_ms
    decode_ms_p90: float | None = None
    decode_tokens_per_s: float | None = None  # batch ÷ the median decode step (as training's tokens/s)
    decode_tokens_per_s_wall: float | None = None  # batch × decode steps ÷ their summed time (spikes included)
    total_s: float | None = None  # the whole measured generation, prefill included
    warmup_s: float | None = None  # the unmeasured warm-up generation
    compile_s: float | None = None  # warm-up decode steps beyond a steady step, when compile is on
    graphs_compiled: int | None = None  # graphs torch.compile made (warm-up and measured), when compile is on
    recompiles_measured: int | None = None  # of those, made during the measured generation (should be 0)
    build_s: float | None = None
    # -- memory (bytes) ----------------------------------------------------------------------------------
    weight_bytes: int | None = None  # the weights as stored for this run (quantized formats counted as stored)
    weight_bytes_before: int | None = None  # the same model as built, before quantization
    kv_cache_bytes: int | None = None  # the cache at the end of the generation (0: no cache)
    peak_mem_bytes: int | None = None
    mem_source: str = ""
    # -- quality -----------------------------------------------------------------------------------------
    heldout_loss: float | None = None  # nats per token on held-out windows, this configuration's model
    perplexity: float | None = None  # exp(heldout_loss)
    reference_perplexity: float | None = None  # the model as built (fp32, unquantized) on the same windows
    agreement: float | None = None  # share of held-out positions where the greedy token equals the reference's
    same_prefix_tokens: list[int] | None = None  # greedy: tokens equal to the reference's greedy output, per prompt
    notes: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in ("ok", "stopped") and bool(self.token_ms or self.ttft_ms)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the full result as JSON, atomically."""
        write_results_json(path, self.to_dict())

    def summary_row(self) -> dict[str, Any]:
        d = self.decode_ms
        return {
            "run": self.label, "status": self.status, "batch": self.batch_size,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_ms": d.median if d else None, "decode_ms_p90": self.decode_ms_p90,
            "prefill_ms": self.prefill_ms, "ttft_ms": self.ttft_ms,
            "weight_mb": _mb(self.weight_bytes), "kv_cache_mb": _mb(self.kv_cache_bytes),
            "peak_mem_mb": _mb(self.peak_mem_bytes), "perplexity": self.perplexity, "agreement": self.agreement,
            "compile_s": self.compile_s, "note": self.error or "; ".join(self.notes),
        }


def _mb(n: int | None) -> float | None:
    return None if n is None else n / 2**20


def p90(values: list[float]) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def compare_generations(results: list[GenerateResult]):
    """A DataFrame, one row per generation, with the decode speed-up and weight ratio against the first."""
    import pandas as pd

    rows = [r.summary_row() for r in results]
    df = pd.DataFrame(rows)
    base = next((r for r in rows if r["decode_tokens_per_s"]), None)
    if rows:
        df["speedup"] = [_ratio(r["decode_tokens_per_s"], base and base["decode_tokens_per_s"]) for r in rows]
        df["weight_ratio"] = [_ratio(r["weight_mb"], base and base["weight_mb"]) for r in rows]
    cols = ["run", "status", "batch", "decode_tokens_per_s", "speedup", "decode_ms", "decode_ms_p90", "prefill_ms",
            "ttft_ms", "weight_mb", "weight_ratio", "kv_cache_mb", "peak_mem_mb", "perplexity", "agreement",
            "compile_s", "note"]
    return df.reindex(columns=cols)


def _ratio(num, den):
    if num is None or den is None or not den or (isinstance(num, float) and math.isnan(num)):
        return None
    return num / den


__all__ = ["GenerateResult", "TokenRecord", "compare_generations", "STATUSES"]
