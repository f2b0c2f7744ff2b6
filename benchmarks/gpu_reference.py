"""The GPU reference run: every GPU claim scalekit makes, checked on one CUDA GPU, the figures recorded.

    python benchmarks/gpu_reference.py OUT_DIR              # on the GPU machine (≤ 8 minutes in all)
    python benchmarks/gpu_reference.py OUT_DIR --dry-run    # the same sections on a CPU, toy sizes (CI)
    bash benchmarks/gpu_reference.sh OUT_DIR                # installs wheels brought along, then runs this

Sections run in priority order, each in its own process under its own time limit, so a section that hangs
or crashes costs only its own slot (a dry run's toy sections share one process, and one that raises is reported
and the next still runs); results are written after every section (`OUT_DIR/reference.json` and
`OUT_DIR/reference.md`, both atomically), so a run cut off at any point still leaves what it measured.

Sections (see SECTIONS): the gpu-marked tests; the training ladder on gpt2-124m with a bare PyTorch loop
beside it; the planner against the allocator; predict against measurement (`calibrate(device="cuda")`, then
the gpt2-124m ladder and DDP/FSDP over every GPU here, each predicted on the calibrated part and on the
datasheet part at cost.PUBLISHED's factors beside its measured step); the inference ladder and HF generate; the
data ladder; the fine-tuning ladder; and the odds and ends (empty_cache's cost, TF32 numerics, fp16 +
GradScaler, SDPA's flash backend).  The Markdown lists every claim the course makes about GPUs with the value measured here
beside it, or "not measured" and why.

The reference GPU machine has torch, transformers, peft and pytest but not the widget libraries,
bitsandbytes, torchao or hqq; the engine, the CLI and this script need none of the widget libraries.
Bring the missing ones as wheels: on a machine with network, `pip download --only-binary=:all: --no-deps
-d wheels bitsandbytes torchao hqq ipywidgets plotly anywidget jupyterlab nbval` (for the GPU machine's
Python), carry `wheels/` beside the repository, and run `benchmarks/gpu_reference.sh`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_reference_sections import CLAIMS, SECTIONS, environment  # noqa: E402

TOTAL_BUDGET_S = 480  # the whole run must fit in 8 minutes, with room for a rerun


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run_sections(names: list[str], limit_s: float, dry_run: bool) -> dict[str, dict]:
    """Sections in one child process, under one limit: each one's JSON, or why there is none.  A section that
    raises is reported as failed by the child, which goes on to the next; one that hangs or crashes the child
    costs the sections after it in the same child."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *names] + (["--dry-run"] if dry_run else [])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        stdout, stderr, why = proc.stdout, proc.stderr, f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        stdout, stderr = (text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
                          for text in (exc.stdout, exc.stderr))
        why = f"over its {limit_s:.0f} s limit"
    results = {}
    for line in stdout.splitlines():
        if line.startswith("SECTION-RESULT "):
            name, _, doc = line[len("SECTION-RESULT "):].partition(" ")
            results[name] = {"status": "ok", **json.loads(doc)}
    seconds = time.monotonic() - t0
    for name in names:  # what the child did not report: the limit or a crash took it
        results.setdefault(name, {"status": "timed out" if "limit" in why else "failed", "why": why,
                                  "stderr_tail": stderr[-3000:]})
        results[name].setdefault("seconds", seconds)
    return {name: results[name] for name in names}


def run_child(names: list[str], dry_run: bool) -> None:
    """In the child: each section in turn, its result printed as one line the parent reads, with its seconds; a
    section that raises is reported failed with its traceback's tail, and the next one still runs."""
    for name in names:
        t0 = time.monotonic()
        try:
            result = SECTIONS[name][0](dry_run=dry_run)
        except Exception:  # noqa: BLE001 - reported in the section's row; the run goes on
            result = {"status": "failed", "why": "raised", "stderr_tail": traceback.format_exc()[-3000:]}
        result["seconds"] = time.monotonic() - t0
        print(f"SECTION-RESULT {name} " + json.dumps(result, default=str), flush=True)


def markdown(doc: dict) -> str:
    env = doc["environment"]
    lines = [f"# scalekit GPU reference run{' (DRY RUN on a CPU: toy sizes, not reference figures)' if doc['dry_run'] else ''}",
             "", f"- date: {doc['date']}", *[f"- {k}: {v}" for k, v in env.items()], "",
             "## Claims the course makes about GPUs, and what this run measured", "",
             "| claim | measured here |", "|---|---|"]
    for claim, value in claim_rows(doc["sections"]):
        lines.append(f"| {claim} | {value} |")
    lines += ["", "## Sections", ""]
    for name, section in doc["sections"].items():
        lines.append(f"### {name}: {section.get('status')} ({section.get('seconds', 0):.0f} s)")
        if section.get("why"):
            lines.append(f"why: {section['why']}")
        for table in section.get("tables", []):
            lines += ["", f"**{table['title']}**", "", *table_lines(table)]
        lines.append("")
    return "\n".join(lines) + "\n"


def table_lines(table: dict) -> list[str]:
    cols = table["columns"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table["rows"]:
        out.append("| " + " | ".join(_cell(row.get(c)) for c in cols) + " |")
    return out


def _cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def claim_rows(sections: dict) -> list[tuple[str, str]]:
    rows = []
    for claim, section, key in CLAIMS:
        s = sections.get(section)
        if s is None:
            rows.append((claim, f"not measured: section {section} did not run (time budget)"))
        elif s.get("status") != "ok":
            rows.append((claim, f"not measured: section {section} {s.get('status')} ({s.get('why', '')})"))
        else:
            value = s.get("claims", {}).get(key)
            rows.append((claim, value if value is not None else "not measured: " + s.get("claims_why", {}).get(
                key, "the section had no figure for it")))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, help="folder for reference.json and reference.md")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on whatever device there is (CI)")
    parser.add_argument("--child", nargs="+", metavar="SECTION", help=argparse.SUPPRESS)
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), help="only these sections")
    args = parser.parse_args()
    if args.child:
        run_child(args.child, args.dry_run)
        return 0
    if args.out is None:
        parser.error("OUT is required (the folder the figures go into)")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "dry_run": args.dry_run, "environment": environment(), "sections": {}}
    t0 = time.monotonic()
    chosen = [name for name in SECTIONS if not args.sections or name in args.sections]
    # on the GPU each section has a process of its own (CUDA state, an out-of-memory, a hang cost only their own
    # slot); a dry run's toy sections share one, which saves a process start and torch's import per section
    groups = [chosen] if args.dry_run else [[name] for name in chosen]
    for group in groups:
        left = TOTAL_BUDGET_S - (time.monotonic() - t0)
        if left < 10:
            doc["sections"].update({name: {"status": "not run", "why": "the total time budget was spent"}
                                    for name in group})
        else:
            limit_s = min(sum(SECTIONS[name][1] for name in group), left)
            print(f"[{time.monotonic() - t0:5.0f} s] {', '.join(group)} (limit {limit_s:.0f} s)", flush=True)
            doc["sections"].update(run_sections(group, limit_s, args.dry_run))
        write_atomic(args.out / "reference.json", json.dumps(doc, indent=1, default=str) + "\n")
        write_atomic(args.out / "reference.md", markdown(doc))
    print(f"done in {time.monotonic() - t0:.0f} s: {args.out / 'reference.md'}")
    # a section skipped here says why (it cannot run on this machine); one that failed or timed out fails the run
    return 0 if all(s.get("status") in ("ok", "skipped", "not run") for s in doc["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
