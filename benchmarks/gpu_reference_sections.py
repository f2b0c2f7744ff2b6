"""The sections of the GPU reference run (benchmarks/gpu_reference.py), each a function(dry_run) -> dict.

A section returns {"tables": [{"title", "columns", "rows"}], "claims": {key: text}, "claims_why": {key: why}}
and may set "status" ("ok" by default; "skipped" with "why" when it cannot run here).  With dry_run the
same code runs at toy sizes on whatever device there is, so the script cannot rot between GPU runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _device(dry_run: bool) -> str:
    return "cuda" if torch.cuda.is_available() and not dry_run else "cpu"


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), driver=_driver())
    else:
        env["gpu"] = "none (CPU only)"
    return env


def _driver() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "unknown"
    return "unknown"


def _table(title: str, rows: list[dict]) -> dict:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return {"title": title, "columns": columns, "rows": rows}


def _mb(n) -> float | None:
    return None if n is None else n / 2**20


# -- 1. the gpu-marked tests -----------------------------------------------------------------------------
def gpu_tests(dry_run: bool) -> dict:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if re.search(r"mark\.(gpu|multi_gpu)", p.read_text(encoding="utf-8")))
    if dry_run:
        files = [f for f in files if f.endswith("test_gpu.py")]  # they skip on a CPU: this checks the parsing
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        subprocess.run([sys.executable, "-m", "pytest", *files, "-m", "gpu or multi_gpu", "-q", "-p",
                        "no:cacheprovider", "--continue-on-collection-errors", f"--junitxml={xml}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
        rows = _junit_rows(xml) if xml.exists() else []
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "skipped", "error")}
    return {"tables": [_table("gpu-marked tests", rows)],
            "claims": {"gpu_tests": ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none collected"}}


def _junit_rows(path: Path) -> list[dict]:
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (node.get("message") or node.text or "")[:200]
        rows.append({"test": f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}", "outcome": outcome,
                     "reason": why})
    return rows


# -- 2. the training ladder, and a bare loop beside it -------------------------------------------------------
def train_ladder(dry_run: bool) -> dict:
    from benchmarks.harness_overhead import bare_tokens_per_s, scalekit_tokens_per_s
    from scalekit import RunConfig
    from scalekit.ladder import LADDER, ladder

    device = _device(dry_run)
    preset, steps = ("tiny", 3) if dry_run else ("gpt2-124m", 10)
    base = RunConfig(preset=preset, batch_size=4 if dry_run else 16, steps=steps, warmup_steps=2, device=device,
                     data="synthetic", measure_memory=not dry_run or device == "cpu")
    # the dry run leaves compile out: a cold compile on a CPU takes longer than the whole dry run may
    results = ladder(base, rungs=tuple(r for r in LADDER if r != "compile") if dry_run else LADDER)
    rows = [{"rung": r.label, "status": r.status, "step_ms": r.median_step_ms, "tokens_per_s": r.tokens_per_s,
             "mfu": r.mfu, "peak_alloc_mb": _mb(r.peak_mem_bytes), "peak_reserved_mb": _mb(r.peak_mem_reserved_bytes),
             "compile_s": r.compile_s, "note": r.error or ""} for r in results]
    ok = [r for r in results if r.status == "ok"]
    claims = {}
    if ok:
        claims["ladder_speedup"] = f"{ok[0].median_step_ms / ok[-1].median_step_ms:.2f}× ({ok[0].median_step_ms:.1f} → " \
                                   f"{ok[-1].median_step_ms:.1f} ms/step, {ok[-1].label})"
        claims["ladder_mfu"] = f"{100 * ok[-1].mfu:.1f}%" if ok[-1].mfu is not None else None
    ratios = []
    for k in range(2):  # ABBA: bare and scalekit, the order flipped
        pair = [bare_tokens_per_s(preset, steps, 2), scalekit_tokens_per_s(preset, steps, 2)] if k == 0 else \
            list(reversed([scalekit_tokens_per_s(preset, steps, 2), bare_tokens_per_s(preset, steps, 2)]))
        ratios.append(pair[1] / pair[0])
    claims["harness_ratio"] = f"{statistics.median(ratios):.3f} (scalekit ÷ bare loop, {preset})"
    return {"tables": [_table(f"training ladder, {preset}, {device}", rows)], "claims": claims}


# -- 3. the planner against the allocator -------------------------------------------------------------------
def planner(dry_run: bool) -> dict:
    from scalekit import RunConfig, estimate, run

    device = _device(dry_run)
    preset, batch = ("tiny", 4) if dry_run else ("gpt2-124m", 4)
    configs = {"baseline": {}, "bf16": {"bf16": True}, "checkpointing": {"checkpointing": 1},
               "grad_accum=2": {"grad_accum": 2}, "8-bit AdamW": {"optim": "adamw_bnb_8bit"}}
    if dry_run:
        configs = {k: configs[k] for k in ("baseline", "checkpointing")}
    rows, errors = [], []
    for label, toggles in configs.items():
        cfg = RunConfig(preset=preset, batch_size=batch, steps=2, warmup_steps=1, toggles=toggles, device=device,
                        data="synthetic")
        r = run(cfg, catch_errors=True)
        if r.status != "ok" or r.peak_mem_bytes is None:
            rows.append({"config": label, "status": r.status, "note": r.error})
            continue
        e = estimate(cfg, device=device)
        err = 100 * (e.peak_bytes - r.peak_mem_bytes) / r.peak_mem_bytes
        errors.append(abs(err))
        rows.append({"config": label, "planned_mb": _mb(e.peak_bytes), "measured_mb": _mb(r.peak_mem_bytes),
                     "error_%": err, "source": r.mem_source})
    claims = {"planner_error": f"largest |error| {max(errors):.1f}% over {len(errors)} configs" if errors else None}
    return {"tables": [_table(f"planner vs measured, {preset}, {device}", rows)], "claims": claims}


# -- 4. fine-tuning ----------------------------------------------------------------------------------------
def finetune(dry_run: bool) -> dict:
    from scalekit.finetune import FINETUNE_RUNGS, finetune_config, finetune_ladder

    device = _device(dry_run)
    base = finetune_config(seq_len=64 if dry_run else 1024, batch_size=4 if dry_run else 16,
                           steps=2 if dry_run else 10, warmup_steps=1, device=device)
    rungs = [r for r in FINETUNE_RUNGS if r[0] in ("LoRA r=8", "QLoRA (nf4 base, LoRA r=8)")] if dry_run \
        else FINETUNE_RUNGS
    results = finetune_ladder(base, rungs=rungs)
    rows = [{"method": r.label, "status": r.status, "step_ms": r.median_step_ms, "trainable": r.trainable_params,
             "peak_mb": _mb(r.peak_mem_bytes), "heldout_before": r.heldout_loss_before,
             "heldout_after": r.heldout_loss_after, "note": r.error or ""} for r in results]
    by = {r.label: r for r in results if r.status == "ok"}
    lora, qlora = by.get("LoRA r=8"), by.get("QLoRA (nf4 base, LoRA r=8)")
    claims = {}
    if lora and qlora:
        claims["qlora_memory"] = f"{100 * (1 - qlora.peak_mem_bytes / lora.peak_mem_bytes):.0f}% less peak than LoRA"
        claims["lora_speed"] = f"LoRA {qlora.median_step_ms / lora.median_step_ms:.2f}× as fast as QLoRA"
    return {"tables": [_table(f"fine-tuning ladder, {device}", rows)], "claims": claims,
            "claims_why": {"qlora_memory": "a LoRA or QLoRA rung did not run", "lora_speed": "idem"}}


# -- 5. odds and ends: empty_cache, TF32, fp16 + GradScaler, SDPA's backend ----------------------------------
def odds_and_ends(dry_run: bool) -> dict:
    device = _device(dry_run)
    claims, why = {}, {}
    if device != "cuda":
        why = dict.fromkeys(("empty_cache_every_step", "empty_cache_every_10", "tf32_error", "fp16_scaler",
                             "flash_backend"), "needs a CUDA GPU (dry run on the CPU)")
        rows = [{"check": k, "result": v} for k, v in why.items()]
        return {"tables": [_table("odds and ends", rows)], "claims": claims, "claims_why": why}
    claims.update(_empty_cache_cost())
    claims["tf32_error"] = _tf32_error()
    claims["fp16_scaler"] = _fp16_scaler()
    claims["flash_backend"] = _flash_backend()
    rows = [{"check": k, "result": v} for k, v in claims.items()]
    return {"tables": [_table("odds and ends", rows)], "claims": claims}


def _empty_cache_cost() -> dict:
    from scalekit import RunConfig, run

    def ms(toggles):
        return run(RunConfig(preset="gpt2-124m", batch_size=8, steps=10, warmup_steps=2, toggles=toggles,
                             data="synthetic", device="cuda")).median_step_ms

    base = statistics.median([ms({"bf16": True}) for _ in range(2)])
    every = ms({"bf16": True, "empty_cache_steps": 1})
    tenth = ms({"bf16": True, "empty_cache_steps": 10})
    return {"empty_cache_every_step": f"{every / base:.2f}× the step time", "empty_cache_every_10": f"{tenth / base:.2f}×"}


def _tf32_error() -> str:
    a, b = torch.randn(2048, 2048, device="cuda"), torch.randn(2048, 2048, device="cuda")
    exact = (a.double() @ b.double()).float()
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        out = {}
        for flag in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = flag
            out[flag] = ((a @ b) - exact).abs().max().item() / exact.abs().max().item()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return f"relative max error fp32 {out[False]:.1e}, TF32 {out[True]:.1e} (2048² matmul)"


def _fp16_scaler() -> str:
    from scalekit import RunConfig, run

    r = run(RunConfig(preset="small", steps=20, warmup_steps=2, toggles={"fp16": True}, device="cuda"))
    losses = [v for _, v in r.losses]
    return f"{r.status}; loss {losses[0]:.3f} → {losses[-1]:.3f}" if losses else r.status


def _flash_backend() -> str:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(4, 12, 1024, 64, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return "flash attention runs (bf16, head dim 64, causal)"
    except RuntimeError as exc:
        return f"flash attention refused: {str(exc).splitlines()[0][:160]}"


def _not_here(what: str, module: str):
    def section(dry_run: bool) -> dict:
        if importlib.util.find_spec(module) is None:
            return {"status": "skipped", "why": f"{what}: {module} is not part of this version of scalekit"}
        return {"status": "skipped", "why": f"{what}: not wired into the reference run yet"}

    return section


# name -> (function, time limit in seconds), in priority order
SECTIONS = {
    "gpu_tests": (gpu_tests, 150),
    "train_ladder": (train_ladder, 150),
    "planner": (planner, 60),
    "inference": (_not_here("the inference ladder and HF generate", "scalekit.inference"), 90),
    "data": (_not_here("the data ladder", "scalekit.data.raw"), 60),
    "finetune": (finetune, 90),
    "odds_and_ends": (odds_and_ends, 60),
}

# (the claim in the course's words, section, key of the section's claims)
CLAIMS = [
    ("gpu-marked tests pass on a GPU", "gpu_tests", "gpu_tests"),
    ("the GPT-2 124M ladder: ≈11× from fp32 to everything on (A100, build-nanogpt: 1000 → 90 ms)", "train_ladder",
     "ladder_speedup"),
    ("≈50% MFU for GPT-2 124M with every toggle (A100, build-nanogpt)", "train_ladder", "ladder_mfu"),
    ("scalekit's harness costs ≤ 2% against a bare PyTorch loop", "train_ladder", "harness_ratio"),
    ("the planner predicts the allocator's peak within 10% on a GPU", "planner", "planner_error"),
    ("QLoRA ≈75% less peak GPU memory than LoRA (Vertex AI guidance)", "finetune", "qlora_memory"),
    ("LoRA ≈66% faster than QLoRA (Vertex AI guidance)", "finetune", "lora_speed"),
    ("empty_cache every step: up to ≈40% slower", "odds_and_ends", "empty_cache_every_step"),
    ("empty_cache every N steps: ≈10% slower", "odds_and_ends", "empty_cache_every_10"),
    ("TF32 rounds matmul inputs to ~3 significant digits", "odds_and_ends", "tf32_error"),
    ("fp16 autocast trains with a GradScaler", "odds_and_ends", "fp16_scaler"),
    ("SDPA uses flash attention on the GPU", "odds_and_ends", "flash_backend"),
]

__all__ = ["SECTIONS", "CLAIMS", "environment"]
