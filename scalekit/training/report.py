"""The Before/After table of training runs, for terminals (scalekit.inference.report is generation's)."""

from __future__ import annotations

import statistics

from ..measure.text_tables import cell_or_missing, interval_cells, measurement_footer, text_table
from .results import RunResult, speedup_over


def results_table(results: list[RunResult], throughput: str = "median") -> str:
    """One line per run: median step time with its spread, throughput, speed-up vs the first row with its 95%
    interval and what it says (faster, slower, within noise), the wait for data (median per step, and its share
    of the step time), memory, MFU; for fine-tuning runs also what trains and the held-out loss before → after.
    The footer says how the intervals were made, the threads, and whether the machine was busy.

    throughput "median" is tokens per median step; "wall" is measured tokens over the measured loop's wall
    time, the honest figure when steps differ by design (data_echo: one step in k waits for data)."""
    if throughput not in ("median", "wall"):
        raise ValueError(f"results_table: throughput must be 'median' or 'wall', got {throughput!r}")
    base = next((r for r in results if r.finished and r.status != "diverged"), None) or \
        next((r for r in results if r.finished), None)
    finetune = any(r.heldout_loss_before is not None or (r.trainable_share or 1) < 1 for r in results)
    header = ["run", "step ms", "p25–p75 ms", "tokens/s" if throughput == "median" else "tokens/s (wall)",
              "speed-up", "95% interval", "vs baseline", "data wait", "peak MB", "mem ×", "MFU", "loss"]
    header += ["trains", "held-out before→after"] if finetune else []
    rows = [_row(r, base, finetune, throughput) for r in results]
    header.append("note")
    return "\n".join(text_table(header, rows) + _footer(results, base))


def _footer(results: list[RunResult], base: RunResult | None) -> list[str]:
    footer = [f"device: {base.device}; torch {base.torch_version}; memory: {base.mem_source}"] if base else []
    footer += measurement_footer(results)
    mfu_notes = {r.mfu_note for r in results if r.finished and r.mfu is None and r.mfu_note}
    return footer + [f"MFU {note}" for note in sorted(mfu_notes)]


def _row(r: RunResult, base: RunResult | None, finetune: bool, throughput: str) -> list[str]:
    extra = [_trains(r), _heldout(r)] if finetune else []
    measured = r.step_ms.n if r.step_ms else 0
    if not r.finished and not (r.status == "failed" and measured):
        why = r.error or "; ".join(r.notes)  # a failure's error; a stopped or skipped row's notes say why
        said = why if why.startswith(r.status) else f"{r.status}: {why}".strip()  # not "stopped: stopped ..."
        return [r.label, *["—"] * 11, *extra, said]
    s = r.all_steps_ms or r.step_ms
    rate = r.tokens_per_s if throughput == "median" else r.tokens_per_s_wall
    statistic = statistics.median if throughput == "median" else statistics.fmean
    compared = base and r is not base and r.finished  # a failed run's steps are shown, not compared
    interval, why = speedup_over(base, r, statistic) if compared else (None, "")
    mem_ratio = (r.peak_mem_bytes / base.peak_mem_bytes) if base and base.peak_mem_bytes and r.peak_mem_bytes \
        else None
    notes = [why] if why else []
    notes += list(r.notes)
    if r.compile_s is not None:
        notes.insert(0, f"compile {r.compile_s:.1f} s")
    if r.status == "stopped":
        notes.insert(0, "stopped")
    if r.flags:  # an "ok" row that is not what its label says (compile on, no graph: eager code measured)
        notes.insert(0, ", ".join(flag.upper() for flag in r.flags))
    if r.status == "diverged":
        notes.insert(0, f"DIVERGED (not ok): {r.error}")
    if r.status == "failed":  # what it measured before it failed is shown, beside why it failed
        notes.insert(0, f"FAILED after {measured} measured steps: {r.error}")
    if r.busy_note:
        notes.append("machine busy")
    return [r.label, f"{r.median_step_ms:.2f}", f"{s.p25:.2f}–{s.p75:.2f}", cell_or_missing(rate, ",.0f"),
            *interval_cells(interval, r is base, why), _data_wait(r),
            cell_or_missing(r.peak_mem_bytes and r.peak_mem_bytes / 2**20, ".1f"), cell_or_missing(mem_ratio, ".2f"),
            "n/a" if r.mfu is None else f"{100 * r.mfu:.1f}%", cell_or_missing(r.final_loss, ".4f"), *extra, "; ".join(notes)]


def _trains(r: RunResult) -> str:
    if r.trainable_params is None:
        return "—"
    return f"{r.trainable_params:,} ({100 * r.trainable_share:.1f}%)"


def _heldout(r: RunResult) -> str:
    if r.heldout_loss_before is None:
        return "—"
    return f"{r.heldout_loss_before:.3f} → {cell_or_missing(r.heldout_loss_after, '.3f')}"


def _data_wait(r: RunResult) -> str:
    """The median wait for data per step, and its share of the step time: '3.10 ms (62%)'."""
    if r.data_wait_ms is None or not r.data_wait_ms.n or r.data_wait_frac is None:
        return "—"
    return f"{r.data_wait_ms.median:.2f} ms ({100 * r.data_wait_frac:.0f}%)"


