"""The Lab's results table: one row per finished run, ratios against the first one (the baseline)."""

from __future__ import annotations

import html
import math

import pandas as pd

from ..training.results import RunResult, compare

COLUMNS = ["#", "run", "status", "flags", "batch_size", "step_ms", "step_ms_iqr", "tokens_per_s", "speedup", "speedup_low",
           "speedup_high", "verdict", "data_wait_ms", "data_wait_frac", "peak_mem_mb", "mem_ratio", "mfu", "final_loss",
           "compile_s", "threads", "sdpa", "note"]


FINETUNE_COLUMNS = ["trainable_params", "trainable_%", "heldout_before", "heldout_after"]


def results_frame(runs: list[tuple[int, RunResult]]) -> pd.DataFrame:
    """(run number, result) pairs → the table (scalekit.compare's figures).

    Speed-up is per token, against the first run that measured, with its 95% interval and verdict (faster,
    slower, within noise): runs with different batch sizes are compared per token (the note says so); runs on
    different thread counts are not compared (the note says why).
    """
    df = compare([r for _, r in runs])
    df.insert(0, "#", [n for n, _ in runs])
    df["batch_size"] = [r.config.get("batch_size") for _, r in runs]
    extra = [c for c in FINETUNE_COLUMNS if c in df.columns]  # fine-tuning runs: what trains, what it learned
    return df.reindex(columns=COLUMNS[:-1] + extra + COLUMNS[-1:])


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


FORMATS = {"mfu": "{:.1%}", "data_wait_frac": "{:.1%}", "speedup": "{:.2f}×", "speedup_low": "{:.2f}",
           "speedup_high": "{:.2f}", "threads": "{:.0f}", "mem_ratio": "{:.2f}×",
           "tokens_per_s": "{:,.0f}", "step_ms": "{:.2f}", "step_ms_iqr": "{:.2f}", "data_wait_ms": "{:.2f}",
           "peak_mem_mb": "{:.2f}", "compile_s": "{:.2f}", "final_loss": "{:.4f}", "heldout_before": "{:.4f}",
           "heldout_after": "{:.4f}", "trainable_%": "{:.2f}%", "trainable_params": "{:,.0f}"}

HEADERS = {"#": "#", "run": "configuration", "status": "status", "flags": "flags", "batch_size": "batch", "step_ms": "median step ms",
           "step_ms_iqr": "IQR ms", "tokens_per_s": "tokens/s", "speedup": "speed-up", "speedup_low": "95% from",
           "speedup_high": "to", "verdict": "vs baseline", "threads": "threads", "data_wait_ms": "data wait ms",
           "data_wait_frac": "waiting for data", "peak_mem_mb": "peak MB",
           "mem_ratio": "memory ratio", "mfu": "MFU", "final_loss": "final loss", "compile_s": "compile s",
           "trainable_params": "trainable", "trainable_%": "trainable share", "heldout_before": "held-out before",
           "heldout_after": "held-out after", "sdpa": "attention kernels",
           "note": "note"}


def results_html(df: pd.DataFrame) -> str:
    """The training table as plain HTML; MFU on a device without a known peak reads "n/a"."""
    return html_table(df, HEADERS, FORMATS, missing={"mfu": "n/a"})


def html_table(df: pd.DataFrame, headers: dict[str, str], formats: dict[str, str], *,
               missing: dict[str, str] | None = None, other=str) -> str:
    """A plain HTML table (no styling libraries), one <tr> per run in <tbody>, for both Labs.

    `formats` gives a column's format string; other values go through `other`; a missing value
    (None, NaN) reads "–" unless `missing` names a column's own word.
    """
    def fmt(column: str, value) -> str:
        if value is None or _nan(value):
            return (missing or {}).get(column, "–")
        return formats[column].format(value) if column in formats else other(value)

    head = "".join(f"<th style='padding:2px 8px;text-align:right'>{headers[c]}</th>" for c in df.columns)
    rows = []
    for _, row in df.iterrows():
        cells = "".join(f"<td style='padding:2px 8px;text-align:{'left' if c in ('run', 'note') else 'right'}'>"
                        f"{html.escape(fmt(c, row[c]))}</td>" for c in df.columns)
        rows.append(f"<tr>{cells}</tr>")
    return (f"<table class='scalekit-results' style='border-collapse:collapse;font-size:0.9em'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
