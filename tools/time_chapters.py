"""Time course chapters under nbval, as the suite runs them, with one other process busy-looping beside them.

    python tools/time_chapters.py                       # every chapter and solution, a busy neighbour
    python tools/time_chapters.py notebooks/09_finetuning.ipynb --quiet-machine

Each notebook runs alone in a fresh pytest (`--nbval-lax`), one after another.  The neighbour is a separate
process (not this one's child) spinning on one core for the whole run, as another user's job would.  A chapter's
budget is 120 s: the script exits 1 when any notebook fails or goes over it, and prints a table either way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 120.0
BUSY_LOOP = "import time\nwhile True:\n    sum(range(10_000))\n"


def notebooks() -> list[Path]:
    return sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def start_neighbour() -> subprocess.Popen:
    """A busy loop in its own session, so it is another process group's work, not ours."""
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def time_one(path: Path, timeout_s: float) -> tuple[float, str]:
    """Seconds the notebook took under nbval, and 'passed' / 'failed' / 'timed out'."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                               str(path)], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, "timed out"
    status = "passed" if proc.returncode == 0 else "failed"
    if status == "failed":
        sys.stderr.write(proc.stdout[-4000:])
    return time.perf_counter() - start, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: every one under notebooks/)")
    parser.add_argument("--quiet-machine", action="store_true", help="no busy neighbour")
    parser.add_argument("--timeout-s", type=float, default=4 * BUDGET_S, help="stop a notebook after this long")
    args = parser.parse_args(argv)
    paths = args.paths or notebooks()
    neighbour = None if args.quiet_machine else start_neighbour()
    rows = []
    try:
        for path in paths:
            seconds, status = time_one(path, args.timeout_s)
            over = " OVER BUDGET" if seconds > BUDGET_S else ""
            print(f"{path.relative_to(ROOT) if path.is_absolute() else path}: {seconds:6.1f} s  {status}{over}",
                  flush=True)
            rows.append((seconds, status))
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    load = os.getloadavg()[0]
    print(f"{'beside one busy process' if neighbour else 'quiet machine'}; load average now {load:.1f} "
          f"on {os.cpu_count()} cores; budget {BUDGET_S:.0f} s a chapter")
    return 0 if all(s == "passed" and t <= BUDGET_S for t, s in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
