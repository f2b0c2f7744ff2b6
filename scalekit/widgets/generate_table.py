"""The generation Lab's results table: decode speed, memory and quality per run (compare_generations)."""

from __future__ import annotations

from ..inference import GenerateResult, compare_generations
from .table import html_table

COLUMNS = {"#": "#", "run": "configuration", "status": "status", "batch": "batch",
           "decode_tokens_per_s": "decode tok/s", "speedup": "speed-up", "decode_ms": "ms/token",
           "decode_ms_p90": "p90 ms", "ttft_ms": "TTFT ms", "weight_mb": "weights MB", "kv_cache_mb": "KV MB",
           "perplexity": "perplexity", "agreement": "agreement", "compile_s": "compile s", "note": "note"}

FORMATS = {"speedup": "{:.2f}×", "agreement": "{:.1%}", "decode_tokens_per_s": "{:,.0f}", "perplexity": "{:.3f}"}


def results_frame(runs: list[tuple[int, GenerateResult]]):
    """(run number, result) pairs → the table, in COLUMNS' order."""
    df = compare_generations([r for _, r in runs])
    df.insert(0, "#", [n for n, _ in runs])
    return df.reindex(columns=list(COLUMNS))


def _other(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def results_html(df) -> str:
    """The generation table as plain HTML; floats without a format of their own get two decimals."""
    return html_table(df, COLUMNS, FORMATS, other=_other)
