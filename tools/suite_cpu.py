"""Where the test suite's time goes: the per-test log of `SCALEKIT_TEST_CPU_LOG`, summed per file.

    SCALEKIT_TEST_CPU_LOG=/tmp/cpu.jsonl bash scripts/test.sh
    python tools/suite_cpu.py /tmp/cpu.jsonl            # files by CPU seconds, then the costliest tests
    python tools/suite_cpu.py /tmp/cpu.jsonl --top 40

A test's CPU is its own process's plus that of the children it reaped while it ran: a notebook kernel's whole
CPU is counted at its last cell (nbval stops the kernel there), a forked rank's or a subprocess's when it ends.
On a machine with as many cores as workers, the suite's wall time is about the summed CPU over the cores, so the
CPU column says what a change would save wherever the tests run; the wall column also holds waiting (time
limits, servers starting, sleeps).
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
        print(report(read(args.log), args.top), flush=True)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush then has a sink
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
