"""Where the test suite's time goes: the per-test log of `SCALEKIT_TEST_CPU_LOG`, summed per file.

    SCALEKIT_TEST_CPU_LOG=/tmp/cpu.jsonl bash scripts/test.sh
    python tools/suite_cpu.py /tmp/cpu.jsonl            # files by CPU seconds, then the costliest tests
    python tools/suite_cpu.py /tmp/cpu.jsonl --top 40

A test's CPU is its own process's plus that of the children it reaped while it ran: a notebook kernel's whole
CPU is counted at its last cell (nbval stops the kernel there), a forked rank's or a subprocess's when it ends.
On a machine with as many cores as workers, the suite's wall time is about the summed CPU over the cores, so the
CPU column says what a change would save wherever the tests run; the wall column also holds waiting (time
limits, servers starting, sleeps).  Under xdist the log has a FILE.busy beside it (the machine's busy share once
a second): then the summary ends with how busy the machine was while tests ran, and which files it idled under.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def per_file(rows: list[dict]) -> list[tuple[str, float, float, int]]:
    """(file, CPU s, wall s, tests), the costliest file first."""
    cpu, wall, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for r in rows:
        name = r["id"].split("::")[0]
        cpu[name] += r["own_cpu_s"] + r["children_cpu_s"]
        wall[name] += r["wall_s"]
        count[name] += 1
    return sorted(((n, cpu[n], wall[n], count[n]) for n in cpu), key=lambda t: -t[1])


def report(rows: list[dict], top: int) -> str:
    cpu = sum(r["own_cpu_s"] + r["children_cpu_s"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    notebooks = sum(c for n, c, _, _ in per_file(rows) if n.endswith(".ipynb"))
    workers = sorted({r["worker"] for r in rows})
    lines = [f"{len(rows)} tests on {len(workers)} worker(s): {cpu:,.0f} CPU s, {wall:,.0f} s of tests' wall time; "
             f"notebooks {notebooks:,.0f} CPU s ({notebooks / cpu:.0%})" if cpu else f"{len(rows)} tests, no CPU",
             "", f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file"]
    lines += [f"{c:8.1f} {w:8.1f} {k:6d}  {n}" for n, c, w, k in per_file(rows)[:top]]
    lines += ["", f"{'CPU s':>8} {'wall s':>8}  test"]
    costly = sorted(rows, key=lambda r: -(r["own_cpu_s"] + r["children_cpu_s"]))[:top]
    lines += [f"{r['own_cpu_s'] + r['children_cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['id']}" for r in costly]
    return "\n".join(lines)


def read_busy(path: Path) -> tuple[list[tuple[float, float]], int]:
    """FILE.busy's samples, (wall time, busy share of the cores since the last one), and the sampled machine's
    cores."""
    samples, cores = [], 1
    for line in path.read_text().splitlines():
        t, busy, cores_text = line.split()
        samples.append((float(t), float(busy)))
        cores = int(cores_text)
    return samples, cores


def busy_report(rows: list[dict], samples: list[tuple[float, float]], cores: int, top: int) -> str:
    """How busy the machine was while tests ran, and the tests it idled under: each second's idle core-seconds
    shared among the tests running then (a test's start time and wall seconds say when it ran)."""
    timed = [r for r in rows if "start" in r]
    if not timed or not samples:
        return "no busy samples to match (the log has no start times, or the run had one worker: no sampler)"
    first, last = min(r["start"] for r in timed), max(r["start"] + r["wall_s"] for r in timed)
    during = [(t, b) for t, b in samples if first <= t <= last]
    if not during:
        return "no busy sample falls while tests ran"
    idle_by_file: dict[str, float] = defaultdict(float)
    for t, busy in during:
        mid = t - 0.5  # a sample covers the second before it
        running = [r for r in timed if r["start"] <= mid <= r["start"] + r["wall_s"]]
        for r in running:
            idle_by_file[r["id"].split("::")[0]] += (1 - busy) * cores / len(running)
        if not running:
            idle_by_file["(between tests)"] += (1 - busy) * cores
    mean = sum(b for _, b in during) / len(during)
    lines = [f"machine busy {mean:.1%} of the {last - first:,.0f} s tests ran ({len(during)} samples, {cores} cores): "
             f"{sum(idle_by_file.values()):,.0f} idle core-s", "", f"{'idle':>8}  file (core-s idle while it ran)"]
    lines += [f"{v:8.1f}  {name}" for name, v in sorted(idle_by_file.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the file SCALEKIT_TEST_CPU_LOG named")
    parser.add_argument("--top", type=int, default=25, help="files and tests to list (default 25)")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        parser.error(f"log: no such file {str(args.log)!r} (run the suite with SCALEKIT_TEST_CPU_LOG={args.log})")
    if args.top < 1:
        parser.error(f"--top: {args.top} is not a count of rows (allowed: 1 or more)")
    try:
        rows = read(args.log)
        text = report(rows, args.top)
        busy = args.log.with_name(args.log.name + ".busy")
        if busy.is_file():
            text += "\n\n" + busy_report(rows, *read_busy(busy), args.top)
        print(text, flush=True)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush then has a sink
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
