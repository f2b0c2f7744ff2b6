"""The Lab's results table: one row per finished run, ratios against the first one (the baseline)."""

from __future__ import annotations

import html
import math

import pandas as pd

from ..measure.results import RunResult, compare

COLUMNS = ["#", "run", "status", "batch_size", "step_ms", "step_ms_iqr", "tokens_per_s", "speedup", "data_wait_ms",
           "data_wait_frac", "peak_mem_mb", "mem_ratio", "mfu", "final_loss", "compile_s", "note"]


FINETUNE_COLUMNS = ["trainable_params", "trainable_%", "heldout_before", "heldout_after"]


def results_frame(runs: list[tuple[int, RunResult]]) -> pd.DataFrame:
    """(run number, result) pairs → the table.

    Speed-up is tokens/s over the baseline's tokens/s, which is the step-time ratio when the batch is
    the same and stays honest when the batch size was changed between runs.  The baseline is the first
    run that has measured steps.
    """
    df = compare([r for _, r in runs])
    df.insert(0, "#", [n for n, _ in runs])
    df["batch_size"] = [r.config.get("batch_size") for _, r in runs]
    measured = [r for _, r in runs if r.tokens_per_s]
    if measured:
        base = measured[0]
        base_mem = base.peak_mem_bytes / 2**20 if base.peak_mem_bytes else None
        df["speedup"] = [r.tokens_per_s / base.tokens_per_s if r.tokens_per_s else None for _, r in runs]
        df["mem_ratio"] = [m / base_mem if base_mem and m is not None and not _nan(m) else None
                           for m in df["peak_mem_mb"]]
    else:
        df["speedup"] = None
        df["mem_ratio"] = None
    extra = [c for c in FINETUNE_COLUMNS if c in df.columns]  # fine-tuning runs: what trains, what it learned
    return df.reindex(columns=COLUMNS[:-1] + extra + COLUMNS[-1:])


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _fmt(column: str, value) -> str:
    if value is None or _nan(value):
        return "n/a" if column == "mfu" else "–"
    if column in ("mfu", "data_wait_frac"):
        return f"{value:.1%}"
    if column in ("speedup", "mem_ratio"):
        return f"{value:.2f}×"
    if column == "tokens_per_s":
        return f"{value:,.0f}"
    if column in ("step_ms", "step_ms_iqr", "data_wait_ms", "peak_mem_mb", "compile_s"):
        return f"{value:.2f}"
    if column in ("final_loss", "heldout_before", "heldout_after"):
        return f"{value:.4f}"
    if column == "trainable_%":
        return f"{value:.2f}%"
    if column == "trainable_params":
        return f"{int(value):,}"
    return str(value)


HEADERS = {"#": "#", "run": "configuration", "status": "status", "batch_size": "batch", "step_ms": "median step ms",
           "step_ms_iqr": "IQR ms", "tokens_per_s": "tokens/s", "speedup": "speed-up", "data_wait_ms": "data wait ms",
           "data_wait_frac": "waiting for data", "peak_mem_mb": "peak MB",
           "mem_ratio": "memory ratio", "mfu": "MFU", "final_loss": "final loss", "compile_s": "compile s",
           "trainable_params": "trainable", "trainable_%": "trainable share", "heldout_before": "held-out before",
           "heldout_after": "held-out after",
           "note": "note"}


def results_html(df: pd.DataFrame) -> str:
    """A plain HTML table (no styling libraries), one <tr> per run in <tbody>."""
    head = "".join(f"<th style='padding:2px 8px;text-align:right'>{HEADERS[c]}</th>" for c in df.columns)
    rows = []
    for _, row in df.iterrows():
        cells = "".join(f"<td style='padding:2px 8px;text-align:{'left' if c in ('run', 'note') else 'right'}'>"
                        f"{html.escape(_fmt(c, row[c]))}</td>" for c in df.columns)
        rows.append(f"<tr>{cells}</tr>")
    return (f"<table class='scalekit-results' style='border-collapse:collapse;font-size:0.9em'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
