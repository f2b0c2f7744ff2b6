"""Plain-text tables for terminals: the Before/After table of runs, and the doctor's facts."""

from __future__ import annotations

import statistics

from .measure.results import RunResult, speedup_over
from .measure.stats import Interval


def _fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


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


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a plain-text table: the first and last columns (names, notes) left-aligned, numbers right."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, len(header) - 1))

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header), line("-" * w for w in widths), *(line(r) for r in rows)]


def _footer(results: list[RunResult], base: RunResult | None) -> list[str]:
    footer = [f"device: {base.device}; torch {base.torch_version}; memory: {base.mem_source}"] if base else []
    footer += measurement_footer(results)
    mfu_notes = {r.mfu_note for r in results if r.finished and r.mfu is None and r.mfu_note}
    return footer + [f"MFU {note}" for note in sorted(mfu_notes)]


def measurement_footer(results) -> list[str]:
    """How the intervals were made, the threads the runs computed on, and a busy machine said (training and
    generation tables alike)."""
    measured = [r for r in results if r.finished]
    if not measured:
        return []
    rounds = min(len(r.timing_rounds()) for r in measured)
    threads = sorted({r.threads for r in measured if r.threads})
    lines = [f"intervals: {rounds} paired rounds in alternating order, Student's t over the rounds" if rounds > 1
             else "intervals: one run each, from the steps' own spread: they cannot see the machine change between "
                  "runs (--repeats 5 measures that)"] if len(measured) > 1 else [""]
    lines[0] += f"; {'/'.join(map(str, threads))} thread(s)" if threads else ""
    lines = [line.lstrip("; ") for line in lines if line]
    busy = [r.label for r in measured if r.busy_note]
    if busy:
        worst = max((r for r in measured if r.busy_note), key=lambda r: r.load.other_cpu_cores or 0)
        lines.append(f"{worst.busy_note.replace(': timings unreliable', '')} during {', '.join(busy)}: "
                     f"timings unreliable")
    return lines


def interval_cells(interval: Interval | None, is_base: bool, why: str = "") -> list[str]:
    """The speed-up, its interval and the verdict as three table cells."""
    if is_base:
        return ["1.00×", "", "baseline"]
    if interval is None:
        return ["—", "—", "not compared" if why else "—"]
    return [f"{interval.estimate:.2f}×", f"{interval.low:.2f}–{interval.high:.2f}", interval.verdict]


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
    return [r.label, f"{r.median_step_ms:.2f}", f"{s.p25:.2f}–{s.p75:.2f}", _fmt(rate, ",.0f"),
            *interval_cells(interval, r is base, why), _data_wait(r),
            _fmt(r.peak_mem_bytes and r.peak_mem_bytes / 2**20, ".1f"), _fmt(mem_ratio, ".2f"),
            "n/a" if r.mfu is None else f"{100 * r.mfu:.1f}%", _fmt(r.final_loss, ".4f"), *extra, "; ".join(notes)]


def _trains(r: RunResult) -> str:
    if r.trainable_params is None:
        return "—"
    return f"{r.trainable_params:,} ({100 * r.trainable_share:.1f}%)"


def _heldout(r: RunResult) -> str:
    if r.heldout_loss_before is None:
        return "—"
    return f"{r.heldout_loss_before:.3f} → {_fmt(r.heldout_loss_after, '.3f')}"


def _data_wait(r: RunResult) -> str:
    """The median wait for data per step, and its share of the step time: '3.10 ms (62%)'."""
    if r.data_wait_ms is None or not r.data_wait_ms.n or r.data_wait_frac is None:
        return "—"
    return f"{r.data_wait_ms.median:.2f} ms ({100 * r.data_wait_frac:.0f}%)"


def facts_table(facts: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in facts)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in facts)
