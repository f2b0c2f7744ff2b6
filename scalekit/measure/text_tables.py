"""Plain-text tables for terminals: the table layout, the cells of a speed-up and its interval, the footer
saying how the intervals were made, and the two-column table of facts (`scalekit doctor`)."""

from __future__ import annotations

from .stats import Interval


def cell_or_missing(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a plain-text table: the first and last columns (names, notes) left-aligned, numbers right."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, len(header) - 1))

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header), line("-" * w for w in widths), *(line(r) for r in rows)]


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


def facts_table(facts: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in facts)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in facts)
