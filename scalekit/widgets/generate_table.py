"""The generation Lab's results table: decode speed, memory and quality per run (compare_generations)."""

from __future__ import annotations

from ..inference import GenerateResult, compare_generations
from .table import html_table

COLUMNS = {"#": "#", "run": "configuration", "status": "status", "flags": "flags", "batch": "batch",
           "decode_tokens_per_s": "decode tok/s", "speedup": "speed-up", "speedup_low": "95% from",
           "speedup_high": "to", "verdict": "vs baseline", "decode_ms": "ms/token", "decode_ms_p25": "p25 ms",
           "decode_ms_p75": "p75 ms", "decode_ms_p90": "p90 ms", "ttft_ms": "TTFT ms", "weight_mb": "weights MB",
           "kv_cache_mb": "KV MB", "perplexity": "perplexity", "agreement": "agreement",
           "acceptance": "draft kept", "target_forwards_per_token": "forwards/token", "compile_s": "compile s",
           "threads": "threads", "sdpa": "attention kernels", "note": "note"}

FORMATS = {"speedup": "{:.2f}×", "agreement": "{:.1%}", "acceptance": "{:.0%}", "target_forwards_per_token": "{:.2f}", "decode_tokens_per_s": "{:,.0f}", "perplexity": "{:.3f}",
           "threads": "{:.0f}"}


def results_frame(runs: list[tuple[int, GenerateResult]]):
    """(run number, result) pairs → the table, in COLUMNS' order: the speed-up per token against the first run
    that measured, with its interval and verdict; generations of different lengths are not compared (the note
    says why: a decode step's time grows with the sequence)."""
    df = compare_generations([r for _, r in runs])
    df.insert(0, "#", [n for n, _ in runs])
    return df.reindex(columns=list(COLUMNS))


def _other(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def results_html(df) -> str:
    """The generation table as plain HTML; floats without a format of their own get two decimals."""
    return html_table(df, COLUMNS, FORMATS, other=_other)
