"""The GPU reference script cannot rot between GPU runs: its dry run exercises every section on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dry_run_runs_every_section_and_writes_json_and_markdown(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_reference.py"), str(tmp_path), "--dry-run"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "reference.json").read_text())
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_reference_sections import CLAIMS, SECTIONS

    assert list(doc["sections"]) == list(SECTIONS)
    for name, section in doc["sections"].items():
        assert section["status"] in ("ok", "skipped"), (name, section)
        if section["status"] == "skipped":
            assert section["why"]
    assert {p.name for p in tmp_path.iterdir()} == {"reference.json", "reference.md"}  # a handful of files at most
    md = (tmp_path / "reference.md").read_text()
    assert "DRY RUN" in md
    for claim, _, _ in CLAIMS:  # every GPU claim is listed, with a value or why not
        line = next(line for line in md.splitlines() if line.startswith(f"| {claim} |"))
        assert line.split("|")[2].strip()
    for name in ("train_ladder", "planner", "inference", "data", "finetune"):  # these run on a CPU too
        assert doc["sections"][name]["status"] == "ok", (name, doc["sections"][name])
        assert doc["sections"][name]["tables"][0]["rows"][0]["status"] == "ok", (name, doc["sections"][name])
    predicted = doc["sections"]["predict"]  # calibrate() on the CPU, then its ladder predicted beside measured
    assert predicted["status"] == "ok", predicted
    baseline = next(t for t in predicted["tables"] if "ladder" in t["title"])["rows"][0]
    assert baseline["status"] == "ok" and baseline["calibrated_ratio"] > 0, baseline
    assert time.monotonic() - t0 < 300  # "well under a minute" alone; generous on a shared CI machine
