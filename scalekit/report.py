"""Plain-text tables for terminals: the Before/After table of runs, and the doctor's facts."""

from __future__ import annotations

from .measure.results import RunResult


def _fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def results_table(results: list[RunResult], throughput: str = "median") -> str:
    """One line per run: median step time with its spread, throughput, speed-up vs the first row, the wait for
    data (median per step, and its share of the step time), memory, MFU; for fine-tuning runs also what trains
    and the held-out loss before → after.

    throughput "median" is tokens per median step; "wall" is measured tokens over the measured loop's wall
    time, the honest figure when steps differ by design (data_echo: one step in k waits for data)."""
    if throughput not in ("median", "wall"):
        raise ValueError(f"results_table: throughput must be 'median' or 'wall', got {throughput!r}")
    base = next((r for r in results if r.finished and r.status != "diverged"), None) or \
        next((r for r in results if r.finished), None)
    finetune = any(r.heldout_loss_before is not None or (r.trainable_share or 1) < 1 for r in results)
    header = ["run", "step ms", "p25–p75 ms", "tokens/s" if throughput == "median" else "tokens/s (wall)",
              "speed-up", "data wait", "peak MB", "mem ×", "MFU", "loss"]
    header += ["trains", "held-out before→after"] if finetune else []
    rows = [_row(r, base, finetune, throughput) for r in results]
    header.append("note")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, len(header) - 1))

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(header), line("-" * w for w in widths), *(line(r) for r in rows)]
    footer = [f"device: {base.device}; torch {base.torch_version}; memory: {base.mem_source}"] if base else []
    mfu_notes = {r.mfu_note for r in results if r.finished and r.mfu is None and r.mfu_note}
    footer += [f"MFU {note}" for note in sorted(mfu_notes)]
    return "\n".join(out + footer)


def _row(r: RunResult, base: RunResult | None, finetune: bool, throughput: str) -> list[str]:
    extra = [_trains(r), _heldout(r)] if finetune else []
    measured = r.step_ms.n if r.step_ms else 0
    if not r.finished and not (r.status == "failed" and measured):
        return [r.label, *["—"] * 9, *extra, f"{r.status}: {r.error or ''}".strip()]
    s = r.step_ms
    if throughput == "median":
        rate, speedup = r.tokens_per_s, base.step_ms.median / s.median if base else None
    else:
        rate = r.tokens_per_s_wall
        speedup = rate / base.tokens_per_s_wall if rate and base and base.tokens_per_s_wall else None
    mem_ratio = (r.peak_mem_bytes / base.peak_mem_bytes) if base and base.peak_mem_bytes and r.peak_mem_bytes \
        else None
    notes = list(r.notes)
    if r.compile_s is not None:
        notes.insert(0, f"compile {r.compile_s:.1f} s")
    if r.status == "stopped":
        notes.insert(0, "stopped")
    if r.status == "diverged":
        notes.insert(0, f"DIVERGED (not ok): {r.error}")
    if r.status == "failed":  # what it measured before it failed is shown, beside why it failed
        notes.insert(0, f"FAILED after {measured} measured steps: {r.error}")
    return [r.label, f"{s.median:.2f}", f"{s.p25:.2f}–{s.p75:.2f}", _fmt(rate, ",.0f"),
            _fmt(speedup, ".2f") + "×" * (speedup is not None), _data_wait(r),
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
