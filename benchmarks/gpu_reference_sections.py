"""The sections of the GPU reference run (benchmarks/gpu_reference.py), each a function(dry_run) -> dict.

A section returns {"tables": [{"title", "columns", "rows"}], "claims": {key: text}, "claims_why": {key: why}}
and may set "status" ("ok" by default; "skipped" with "why" when it cannot run here).  With dry_run the
same code runs at toy sizes on whatever device there is, so the script cannot rot between GPU runs.
"""

from __future__ import annotations

import contextlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

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
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if re.search(r"mark\.(gpu|multi_gpu)", p.read_text(encoding="utf-8")))
    if dry_run:
        files = [f for f in files if f.endswith("test_gpu.py")]  # they skip on a CPU: this checks the parsing
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        # without nbval's plugin: no notebook is among these files, and its imports (nbformat, jsonschema's
        # IRI grammar) are 3 s of this pytest's start on a CPU
        subprocess.run([sys.executable, "-m", "pytest", *files, "-m", "gpu or multi_gpu", "-q", "-p",
                        "no:cacheprovider", "-p", "no:nbval", "--continue-on-collection-errors", f"--junitxml={xml}"],
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
    from scalekit.training.ladder import LADDER, ladder

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
        rows.append({"config": label, "status": r.status, "planned_mb": _mb(e.peak_bytes),
                     "measured_mb": _mb(r.peak_mem_bytes),
                     "error_%": err, "source": r.mem_source})
    claims = {"planner_error": f"largest |error| {max(errors):.1f}% over {len(errors)} configs" if errors else None}
    return {"tables": [_table(f"planner vs measured, {preset}, {device}", rows)], "claims": claims}


# -- 4. fine-tuning ----------------------------------------------------------------------------------------
def finetune(dry_run: bool) -> dict:
    from scalekit.training.finetune import FINETUNE_RUNGS, finetune_config, finetune_ladder

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


# -- 4. inference: the generation ladder, and the KV cache over 1,000 tokens ---------------------------------
def inference(dry_run: bool) -> dict:
    from scalekit.inference import GenerateConfig, generate
    from scalekit.inference.ladder import INFERENCE_LADDER, inference_ladder

    device = _device(dry_run)
    # on the GPU a GPT-2-sized model with random weights (speed does not depend on the weights; the quality
    # columns then compare each rung with the same model unquantized); in the dry run the shipped model
    model, new = ("shakespeare-char", 8) if dry_run else ("gpt2-124m", 200)
    base = GenerateConfig(model=model, prompts="ROMEO:", max_new_tokens=new, device=device,
                          quality_windows=2 if dry_run else 8, quality_seq_len=64 if dry_run else 256)
    # the dry run leaves compile out: a cold compile on a CPU takes longer than the whole dry run may
    rungs = tuple((label, t) for label, t in INFERENCE_LADDER if "compile" not in t) if dry_run else INFERENCE_LADDER
    results = inference_ladder(base, rungs=rungs)
    rows = [{"rung": r.label, "status": r.status, "decode_tok_s": r.decode_tokens_per_s,
             "ms_per_token": r.decode_ms.median if r.decode_ms else None, "ttft_ms": r.ttft_ms,
             "weights_mb": _mb(r.weight_bytes), "kv_mb": _mb(r.kv_cache_bytes), "peak_mb": _mb(r.peak_mem_bytes),
             "perplexity": r.perplexity, "agreement": r.agreement, "compile_s": r.compile_s,
             "note": r.error or "; ".join(r.notes)} for r in results]
    ok = {r.label: r for r in results if r.status == "ok" and r.decode_tokens_per_s}
    claims, why = {}, {}
    first = results[0] if results and results[0].status == "ok" else None
    for key, label in (("static_compile", "+ static cache + compile"), ("int8", "+ int8"), ("four_bit", "+ 4-bit")):
        r = ok.get(label)
        if first and r:
            claims[f"gen_{key}"] = f"{r.decode_tokens_per_s:,.0f} tok/s, {r.decode_tokens_per_s / first.decode_tokens_per_s:.2f}× " \
                                   f"the baseline's {first.decode_tokens_per_s:,.0f} ({model}, batch 1)"
        else:
            why[f"gen_{key}"] = f"the rung {label!r} did not run here" + (" (dry run: no compile)" if dry_run else "")
    # the KV cache over a long generation: the same tokens with and without it, side by side
    long_new = 32 if dry_run else 1000
    timed = {}
    for name, toggles in (("no cache", {}), ("kv_cache", {"kv_cache": "dynamic"})):
        r = generate(GenerateConfig(model=model, prompts="ROMEO:", max_new_tokens=long_new, toggles=toggles,
                                    device=device, quality=False, measure_memory=False))
        timed[name] = r
    a, b = timed["no cache"], timed["kv_cache"]
    if a.status == b.status == "ok":
        same = a.token_ids == b.token_ids
        claims["kv_cache_1000"] = f"{a.total_s / b.total_s:.2f}× faster for {long_new} tokens ({a.total_s:.2f} → " \
                                  f"{b.total_s:.2f} s; {'the same' if same else 'DIFFERENT'} greedy tokens)"
    else:
        why["kv_cache_1000"] = f"no cache: {a.status} {a.error or ''}; kv_cache: {b.status} {b.error or ''}"
    claims["vs_hf_generate"] = _against_hf_generate(device, dry_run)
    return {"tables": [_table(f"inference ladder, {model}, {device}", rows)], "claims": claims, "claims_why": why}


def _against_hf_generate(device: str, dry_run: bool) -> str:
    """scalekit's best generation against transformers' generate() on the shipped model's weights, batch 1 and
    8, side by side (ABBA), same greedy tokens checked: benchmarks/generate_vs_hf.py on this device."""
    import time

    from transformers import LogitsProcessorList

    from benchmarks.generate_vs_hf import prompts
    from scalekit.inference import GenerateConfig, generate
    from scalekit.inference.config import corpus_tokenizer
    from scalekit.inference.hf_gpt2 import to_gpt2lmhead
    from scalekit.models import load_pretrained

    best = {"kv_cache": "static", "inference_mode": True} if dry_run else \
        {"kv_cache": "static", "compile": "default", "inference_mode": True}
    new = 16 if dry_run else 200
    peer = to_gpt2lmhead(load_pretrained(), attn_implementation="sdpa").to(device)
    tok = corpus_tokenizer()

    def ours(batch):
        r = generate(GenerateConfig(prompts=prompts(batch), max_new_tokens=new, toggles=best, device=device,
                                    quality=False, measure_memory=False))
        return batch * (new - 1) / (r.total_s - r.ttft_ms / 1e3), r.token_ids

    def theirs(batch):
        ids = torch.tensor([tok.encode(p) for p in prompts(batch)], device=device)
        times = []

        def clock(input_ids, scores):
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter())
            return scores

        with torch.inference_mode():
            out = peer.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                do_sample=False, use_cache=True, pad_token_id=0,
                                logits_processor=LogitsProcessorList([clock]))
        return batch * (new - 1) / (times[-1] - times[0]), out[:, ids.shape[1]:].tolist()

    parts = []
    for batch in (1, 8):
        ours(batch), theirs(batch)  # warm-up: each side's one-time costs
        ratios, same = [], True
        for k in range(2):
            (a, a_ids), (b, b_ids) = (ours(batch), theirs(batch)) if k == 0 else reversed((theirs(batch), ours(batch)))
            ratios.append(a / b)
            same = same and a_ids == b_ids
        parts.append(f"batch {batch}: {statistics.median(ratios):.2f}×{'' if same else ' (DIFFERENT tokens)'}")
    return "scalekit ÷ transformers generate() decode tokens/s: " + ", ".join(parts)


# -- 5. the data pipeline: the data ladder -------------------------------------------------------------------
def data(dry_run: bool) -> dict:
    from scalekit import RunConfig
    from scalekit.training.ladder import data_ladder

    device = _device(dry_run)
    # on the GPU the data ladder gives the model tf32, bf16 and sdpa itself (its step must be fast for the data
    # to matter); GPT-2 at batch 16 × 1024 tokens makes the raw pipeline's per-sample work the bottleneck
    base = RunConfig(preset="tiny" if dry_run else "gpt2-124m", batch_size=4 if dry_run else 16,
                     seq_len=64 if dry_run else None, steps=4 if dry_run else 20, warmup_steps=2, device=device)
    results = data_ladder(base)
    rows = [{"rung": r.label, "status": r.status, "tokens_per_s_wall": r.tokens_per_s_wall,
             "data_wait_ms": r.data_wait_ms.median if r.data_wait_ms and r.data_wait_ms.n else None,
             "data_wait_frac": r.data_wait_frac, "steps_per_batch": r.steps_per_batch,
             "note": r.error or "; ".join(r.notes)} for r in results]
    ok = [r for r in results if r.status == "ok" and r.tokens_per_s_wall]
    claims, why = {}, {}
    if len(ok) >= 2 and ok[0].data_wait_frac is not None:
        claims["data_wait"] = f"data wait {100 * ok[0].data_wait_frac:.0f}% of the step ({ok[0].label}) → " \
                              f"{100 * (ok[-1].data_wait_frac or 0):.0f}% ({ok[-1].label}); wall tokens/s " \
                              f"{ok[-1].tokens_per_s_wall / ok[0].tokens_per_s_wall:.2f}×"
    else:
        why["data_wait"] = "fewer than two rungs of the data ladder ran"
    echo = next((i for i, r in enumerate(ok) if "data_echo" in r.config.get("toggles", {})), None)
    if echo:
        claims["data_echo"] = f"{ok[echo].tokens_per_s_wall / ok[echo - 1].tokens_per_s_wall:.2f}× wall tokens/s " \
                              f"with data_echo=2 over the rung before it"
    else:
        why["data_echo"] = "the data_echo rung did not run"
    return {"tables": [_table(f"data ladder, {base.preset}, {device}", rows)], "claims": claims, "claims_why": why}


# -- 8. memory levers of training: chunked cross-entropy, selective checkpointing; regional compile's compile time --
def train_memory(dry_run: bool) -> dict:
    from scalekit import RunConfig, run
    from scalekit.toggles import TOGGLES

    device = _device(dry_run)
    preset, vocab_preset = ("tiny", "tiny-vocab50k") if dry_run else ("gpt2-124m", "gpt2-124m")
    base_toggles = {} if device == "cpu" else {"bf16": True, "sdpa": True}

    def measure(label, toggles, p=preset):
        r = run(RunConfig(preset=p, batch_size=2 if dry_run else 8, steps=1 if dry_run else 8,
                          warmup_steps=0 if dry_run else 1,
                          toggles={**base_toggles, **toggles}, device=device, data="synthetic"), catch_errors=True)
        return r, {"config": label, "status": r.status, "step_ms": r.median_step_ms, "peak_mb": _mb(r.peak_mem_bytes),
                   "activations_mb": _mb(r.activations_bytes), "compile_s": r.compile_s, "note": r.error or ""}

    liger = TOGGLES["chunked_cross_entropy"].choice_available(SimpleNamespace(device_type=device), "liger")[0]
    runs = {"whole logits": {}, "chunked_cross_entropy=8": {"chunked_cross_entropy": 8},
            **({"chunked_cross_entropy=liger": {"chunked_cross_entropy": "liger"}} if liger else {})}
    head = {label: measure(label, toggles, vocab_preset) for label, toggles in runs.items()}
    ac = {label: measure(label, toggles) for label, toggles in
          {"no checkpointing": {}, "checkpointing=selective": {"checkpointing": "selective"},
           "checkpointing=1": {"checkpointing": 1}}.items()}
    # the dry run leaves compile out: a cold compile on a CPU takes longer than the whole dry run may
    compiles = {} if dry_run else {label: measure(label, {"compile": mode}) for label, mode in
                                   (("compile (whole model)", "default"), ("compile=regional", "regional"))}
    claims, why = {}, {}
    whole, chunked = head["whole logits"][0], head["chunked_cross_entropy=8"][0]
    if whole.status == chunked.status == "ok":
        claims["chunked_ce_memory"] = (f"{100 * (1 - chunked.peak_mem_bytes / whole.peak_mem_bytes):.0f}% less peak with 8 "
                                       f"chunks ({vocab_preset}), step ×{chunked.median_step_ms / whole.median_step_ms:.2f}")
    fused = head.get("chunked_cross_entropy=liger", (None,))[0]
    if fused is not None and fused.status == "ok" and whole.status == "ok":
        claims["liger_ce_memory"] = f"{100 * (1 - fused.peak_mem_bytes / whole.peak_mem_bytes):.0f}% less peak (liger)"
    why["liger_ce_memory"] = "needs a CUDA GPU with liger-kernel installed"
    none, sel, full = (ac[k][0] for k in ("no checkpointing", "checkpointing=selective", "checkpointing=1"))
    if none.status == sel.status == full.status == "ok":
        claims["selective_ac"] = (f"selective: step ×{sel.median_step_ms / none.median_step_ms:.2f}, activations "
                                  f"×{sel.activations_bytes / none.activations_bytes:.2f}; full: step "
                                  f"×{full.median_step_ms / none.median_step_ms:.2f}, activations "
                                  f"×{full.activations_bytes / none.activations_bytes:.2f}")
    if compiles and all(r.status == "ok" for r, _ in compiles.values()):
        w, g = (compiles[k][0] for k in ("compile (whole model)", "compile=regional"))
        claims["regional_compile_s"] = (f"compile {w.compile_s:.1f} s whole → {g.compile_s:.1f} s regional; steady step "
                                        f"×{g.median_step_ms / w.median_step_ms:.2f}")
    why["regional_compile_s"] = "the dry run leaves compile out (a cold compile on a CPU outlasts it)"
    rows = [row for _, row in (*head.values(), *ac.values(), *compiles.values())]
    return {"tables": [_table(f"training memory levers, {preset}, {device}", rows)], "claims": claims, "claims_why": why}

# -- speculative decoding and the int8 KV cache -------------------------------------------------------------
def speculative(dry_run: bool) -> dict:
    """The shipped model with its draft and with prompt lookup against plain decoding (same greedy tokens, ABBA),
    and the KV-cache bytes of fp32, bf16 and int8 caches over a long generation of GPT-2 124M's shape."""
    from scalekit.inference import GenerateConfig, generate

    device = _device(dry_run)
    new, rounds = (16, 2) if dry_run else (400, 4)
    prompt = "ROMEO:\nI will not stay, I will not stay, I will not stay.\n\nJULIET:\n"
    cases = {"plain": {"kv_cache": "static"}, "draft": {"kv_cache": "static", "speculative": "draft"},
             "prompt lookup": {"kv_cache": "static", "speculative": "prompt_lookup"}}
    seconds: dict = {name: [] for name in cases}
    last: dict = {}
    for i in range(rounds):
        for name in (list(cases) if i % 2 == 0 else list(cases)[::-1]):
            last[name] = generate(GenerateConfig(prompts=prompt, max_new_tokens=new, toggles=cases[name], device=device,
                                                 quality=False, measure_memory=False))
            seconds[name].append(last[name].total_s)
    rows, claims, why = [], {}, {}
    for name, r in last.items():
        rows.append({"run": name, "status": r.status, "s": statistics.median(seconds[name]),
                     "speedup": statistics.median(seconds["plain"]) / statistics.median(seconds[name]),
                     "acceptance": r.acceptance_rate, "model_forwards_per_token": r.target_forwards_per_token,
                     "draft_ms": r.draft_ms, "note": r.error or ""})
    if all(r.status == "ok" for r in last.values()):
        same = last["draft"].token_ids == last["plain"].token_ids == last["prompt lookup"].token_ids
        d, p = rows[1], rows[2]
        claims["speculative"] = (f"draft {d['speedup']:.2f}× plain (acceptance {d['acceptance']:.2f}), prompt lookup "
                                 f"{p['speedup']:.2f}× (acceptance {p['acceptance']:.2f}); {'the same' if same else 'DIFFERENT'} "
                                 f"greedy tokens; shipped model and its draft, {new} tokens, batch 1")
    else:
        why["speculative"] = "; ".join(f"{n}: {r.status} {r.error or ''}" for n, r in last.items())
    kv_rows, kv_claims = _int8_kv(device, dry_run)
    claims.update(kv_claims)
    if "int8_kv" not in kv_claims:
        why["int8_kv"] = "; ".join(f"{r['cache']}: {r['status']} {r['note']}" for r in kv_rows)
    return {"tables": [_table(f"speculative decoding, shipped model, {device}", rows),
                       _table(f"KV cache bytes, {device}", kv_rows)], "claims": claims, "claims_why": why}


def _int8_kv(device: str, dry_run: bool) -> tuple[list[dict], dict]:
    from scalekit.inference import GenerateConfig, generate

    model, new = ("shakespeare-char", 24) if dry_run else ("gpt2-124m", 1000)
    rows = {}
    for name, toggles in (("fp32", {"kv_cache": "static"}), ("bf16", {"kv_cache": "static", "bf16": True}),
                          ("int8", {"kv_cache": "static-int8"})):
        r = generate(GenerateConfig(model=model, prompts="ROMEO:", max_new_tokens=new, toggles=toggles, device=device,
                                    quality=name == "int8", quality_windows=2, measure_memory=False))
        rows[name] = {"cache": name, "status": r.status, "kv_mb": _mb(r.kv_cache_bytes),
                      "decode_tok_s": r.decode_tokens_per_s, "perplexity": r.perplexity,
                      "reference_perplexity": r.reference_perplexity, "agreement": r.agreement,
                      "note": r.error or ""}
    claims = {}
    if all(r["status"] == "ok" and r["kv_mb"] for r in rows.values()):
        i8, f32, b16 = rows["int8"], rows["fp32"], rows["bf16"]
        claims["int8_kv"] = (f"int8 KV cache {i8['kv_mb']:.3g} MB against bf16's {b16['kv_mb']:.3g} and fp32's "
                             f"{f32['kv_mb']:.3g} ({model}, {new} tokens); perplexity {i8['perplexity']:.3f} against "
                             f"{i8['reference_perplexity']:.3f}, agreement {i8['agreement']:.3f}")
    return list(rows.values()), claims

# -- float8 training and Liger's kernels, beside their published figures ----------------------------------------
def _paired(base, other) -> tuple[dict, str | None]:
    """Rows for a run without and with a toggle, and the speed-up with its interval (None: one did not run)."""
    from scalekit.measure.stats import speedup_interval

    rows = [{"run": r.label, "status": r.status, "tokens_per_s": r.tokens_per_s, "peak_alloc_mb": _mb(r.peak_mem_bytes),
             "note": r.error or "; ".join(r.notes)} for r in (base, other)]
    if base.status != "ok" or other.status != "ok":
        return rows, None
    interval = speedup_interval(base.timing_rounds(), other.timing_rounds())
    memory = f"; peak {_mb(base.peak_mem_bytes):.0f} → {_mb(other.peak_mem_bytes):.0f} MB" \
        if base.peak_mem_bytes and other.peak_mem_bytes else ""
    return rows, (interval.text() if interval is not None else "n/a") + memory


def training_kernels(dry_run: bool) -> dict:
    from scalekit import RunConfig, run
    from scalekit.machine.hardware import detect
    from scalekit.toggles import TOGGLES

    device = _device(dry_run)
    hw = detect(device)
    tables, claims, why = [], {}, {}
    steps = dict(steps=3 if dry_run else 20, warmup_steps=1 if dry_run else 3)
    ok, reason = TOGGLES["float8"].available(hw)
    if ok:  # GPT-2 124M in bf16 and compiled (torchtitan's setting), with and without float8
        def gpt2_run(toggles):
            return run(RunConfig(preset="gpt2-124m", batch_size=16, data="synthetic", device=device, toggles=toggles,
                                 **steps))

        rows, claims["float8"] = _paired(gpt2_run({"bf16": True, "compile": True}),
                                         gpt2_run({"bf16": True, "compile": True, "float8": True}))
        tables.append(_table(f"float8 training, gpt2-124m, {device}", rows))
    else:
        why["float8"] = reason
    ok, reason = TOGGLES["liger_kernels"].available(hw)
    if ok:  # a Llama of GPT-2 small's shape, bf16, with and without Liger's kernels
        from scalekit.hf import causal_lm

        def llama_run(toggles):
            return run(RunConfig(model=causal_lm("llama", preset="gpt2-124m"), batch_size=8, seq_len=1024,
                                 data="synthetic", device=device, toggles=toggles, **steps))

        rows, claims["liger"] = _paired(llama_run({"bf16": True}), llama_run({"bf16": True, "liger_kernels": True}))
        tables.append(_table(f"Liger kernels, Llama (gpt2-124m shape), {device}", rows))
    else:
        why["liger"] = reason
    return {"tables": tables, "claims": claims, "claims_why": why}

# -- tensor, pipeline, 2-D and 3-D parallelism -------------------------------------------------------------
PARALLEL_MODES = {"ddp": {"ddp": True}, "zero1": {"zero": "zero1"}, "zero2": {"zero": "zero2"},
                  "fsdp (ZeRO-3)": {"fsdp": True}, "tensor_parallel=2": {"tensor_parallel": 2},
                  "tensor_parallel=2,sequence_parallel": {"tensor_parallel": "2,sequence_parallel"},
                  "pipeline_parallel 1f1b/8": {"pipeline_parallel": "1f1b/8"},
                  "pipeline_parallel 1f1b/8, Hugging Face Llama": {"pipeline_parallel": "1f1b/8"},
                  "2-D fsdp x tensor_parallel=2": {"fsdp": True, "tensor_parallel": 2},
                  "2-D pipeline_parallel 1f1b/8,stages=2 x fsdp": {"pipeline_parallel": "1f1b/8,stages=2", "fsdp": True},
                  "3-D pipeline_parallel 1f1b/8,stages=2 x tensor_parallel=2": {"pipeline_parallel": "1f1b/8,stages=2",
                                                                               "tensor_parallel": 2}}


def parallelism(dry_run: bool) -> dict:
    """Per-rank memory of each mode, planned; measured too where there are GPUs enough (2; 4 for 2-D and 3-D)."""
    from scalekit import RunConfig, estimate
    from scalekit.machine.hardware import gpu_count_without_cuda_init

    gpus = 0 if dry_run else gpu_count_without_cuda_init()
    preset, batch = ("tiny", 8) if dry_run else ("gpt2-124m", 8)
    rows = []
    for label, toggles in PARALLEL_MODES.items():
        world = 4 if "2-D" in label or "3-D" in label else 2
        model = None
        if "Llama" in label:  # the same shape as a Llama built from its config (transformers, no hub)
            from scalekit.hf import causal_lm

            model = causal_lm("llama", preset)
        cfg = RunConfig(preset=preset, model=model, batch_size=batch, steps=3, warmup_steps=1, toggles=toggles,
                        device="cuda" if gpus else "cpu", data="synthetic")
        planned = estimate(cfg, device="cuda", world_size=world)
        row = {"mode": label, "status": "ok", "ranks": world, "planned_mb_per_rank": _mb(planned.peak_bytes)}
        if gpus >= world:
            row.update(_measured_over_ranks(cfg, world))
        else:
            row["note"] = f"planned only: {gpus} GPU(s) here, {world} needed to measure"
        rows.append(row)
    measured = [r for r in rows if "measured_mb_per_rank" in r]
    claims = {"parallel_memory": (f"{len(measured)} of {len(rows)} modes measured; the rest planned per rank only"
                                  if gpus else "per-rank memory model only: this run has fewer than 2 GPUs")}
    return {"tables": [_table(f"parallelism per rank, {preset} (planned on CUDA's rules)", rows)], "claims": claims}


def _measured_over_ranks(cfg, world: int) -> dict:
    from scalekit.launch import launch_run

    r = launch_run(cfg, nprocs=world, catch_errors=True)
    if r.status != "ok":
        return {"status": r.status, "note": r.error}
    return {"measured_mb_per_rank": _mb(r.peak_mem_bytes), "tokens_per_s": r.tokens_per_s,
            "step_ms": r.median_step_ms}


# -- prediction against measurement: calibrate() on the device in hand, the ladder and DDP/FSDP --------------------
PREDICT_BAND = 0.25  # a prediction "within" is within ±25% of the measured step (benchmarks/predict_vs_measured.py's)
PREDICT_PARALLEL = {"ddp": {"ddp": True}, "fsdp": {"fsdp": True}}


def predict_section(dry_run: bool) -> dict:
    """calibrate() on the device in hand, then the single-GPU training ladder on gpt2-124m and DDP and FSDP on
    every GPU here (2 or more), each predicted on the calibrated part and on the datasheet part the GPU's name maps
    to (cost.PUBLISHED's factors), beside what it measured.  DDP and FSDP run first: their ranks fork, which a
    process that has touched CUDA cannot.  The dry run calibrates the CPU (small sizes, no ranks) and climbs the
    ladder on tiny; its DDP and FSDP rows are predicted only."""
    from scalekit.machine.hardware import gpu_count_without_cuda_init

    gpus = 0 if dry_run else gpu_count_without_cuda_init() or int(torch.cuda.is_available())
    if not dry_run and not gpus:
        return {"status": "skipped", "why": "no CUDA GPU here: calibrate(device='cuda') needs one", "tables": []}
    size = SimpleNamespace(preset="tiny", batch=4, seq=64, steps=3, device="cpu", threads=1) if dry_run else \
        SimpleNamespace(preset="gpt2-124m", batch=16, seq=1024, steps=10, device="cuda", threads=None)
    parallel = _parallel_measured(gpus, size, dry_run)
    part, sheet, calibration = _calibrated(gpus, dry_run)
    ladder_rows = _ladder_predicted(part, sheet, size, dry_run)
    parallel_rows = [dict(row, **_predicted(cfg, max(2, gpus), part, sheet, row.get("measured_ms")))
                     for cfg, row in parallel]
    claims, why = _predict_claims(part, sheet, ladder_rows, parallel_rows, gpus, dry_run)
    return {"tables": [_table(f"calibrate() on {calibration['device']}", calibration["rows"]),
                       _table(f"predicted against measured, training ladder, {size.preset}, {size.device}", ladder_rows),
                       _table(f"predicted against measured, DDP and FSDP, {size.preset}, {size.device}", parallel_rows)],
            "claims": claims, "claims_why": why}


def _parallel_measured(gpus: int, size, dry_run: bool) -> list[tuple]:
    """(config, row) for DDP and FSDP over every GPU here, measured through scalekit's launch where there are 2 or
    more (before anything in this process touches CUDA); otherwise the row says why it is predicted only."""
    from scalekit import RunConfig

    world = max(2, gpus)
    out = []
    for mode, toggles in PREDICT_PARALLEL.items():
        on_gpu = {"bf16": True, "sdpa": True} if not dry_run else {}  # the ladder's rungs a GPU run would keep
        cfg = RunConfig(preset=size.preset, batch_size=size.batch * world, seq_len=size.seq, steps=size.steps,
                        warmup_steps=2, toggles={**on_gpu, **toggles}, device=size.device, data="synthetic",
                        threads=size.threads, measure_memory=False)
        row = {"mode": f"{mode} ×{world}", "status": "ok", "ranks": world}
        if gpus >= 2:
            measured = _measured_over_ranks(cfg, world)
            row.update(measured_ms=measured.pop("step_ms", None), **measured)
        else:
            row.update(status="predicted only", note="dry run: two launches of 2 gloo ranks would cost more CPU "
                       "seconds than the rest of this section" if dry_run else f"{gpus} GPU here: DDP and FSDP need 2")
        out.append((cfg, row))
    return out


def _calibrated(gpus: int, dry_run: bool):
    """(the calibrated part, the datasheet part the device's name maps to or None, a table of what was measured)."""
    from scalekit.predict import calibrate
    from scalekit.predict.calibrate import measured_figures
    from scalekit.predict.parts import GB, datasheet_part

    if dry_run:
        part = calibrate(ranks=0, matmul_sizes=(32, 64, 128), copy_mbytes=8, repeats=2, threads=1)
    else:
        part = calibrate(device="cuda", ranks=gpus)
        torch.cuda.empty_cache()  # the microbenchmarks' buffers, before the ladder measures
    fig, eff = measured_figures(part.name), part.efficiency
    sheet = datasheet_part(fig.device_name)
    rows = [{"figure": f"{dt} matmul, best TFLOP/s", "measured": max(f for _, f in c) / 1e12,
             "datasheet": sheet.peak(dt) / 1e12 if sheet and dt in sheet.peak_flops else None,
             "by size": ", ".join(f"{n}: {f / 1e12:.3g}" for n, f in c)} for dt, c in fig.curves.items()]
    rows += [{"figure": "copy bandwidth, GB/s", "measured": part.memory_bandwidth / GB,
              "datasheet": sheet.memory_bandwidth / GB if sheet else None},
             {"figure": "memory factor (element-wise ÷ copy)", "measured": eff.memory, "datasheet": None},
             {"figure": "per-operator overhead, µs", "measured": eff.op_overhead_s * 1e6, "datasheet": None},
             {"figure": "link, GB/s one way", "measured": part.intra_bandwidth / GB if fig.collectives else None,
              "datasheet": sheet.intra_bandwidth / GB if sheet else None, "by size": part.sources.get("intra", "")}]
    return part, sheet, {"device": fig.device_name, "rows": rows}


def _ladder_predicted(part, sheet, size, dry_run: bool) -> list[dict]:
    """The training ladder as scalekit climbs it (the dry run without compile), each rung that ran predicted."""
    import dataclasses

    from scalekit import RunConfig
    from scalekit.training.ladder import LADDER, ladder

    base = RunConfig(preset=size.preset, batch_size=size.batch, seq_len=size.seq, steps=size.steps, warmup_steps=2,
                     device=size.device, data="synthetic", threads=size.threads, measure_memory=False)
    rows = []
    for r in ladder(base, rungs=tuple(r for r in LADDER if r != "compile") if dry_run else LADDER):
        row = {"rung": r.label, "status": r.status, "measured_ms": r.median_step_ms}
        if r.status == "ok":
            row.update(_predicted(dataclasses.replace(base, toggles=r.config["toggles"]), 1, part, sheet,
                                  r.median_step_ms))
        else:
            row["note"] = r.error or ""
        rows.append(row)
    return rows


def _predicted(cfg, count: int, part, sheet, measured_ms) -> dict:
    """Predicted ms/step of `cfg` on `count` of the calibrated part and of the datasheet part (its PUBLISHED
    factors), each with its ratio to the measured step; a refusal is the row's note."""
    from scalekit.errors import ConfigError
    from scalekit.predict import predict
    from scalekit.predict.step import unmodelled

    row, notes = {}, []
    for key, chosen in (("calibrated", part), ("datasheet", sheet)):
        if chosen is None:
            continue
        try:
            step_ms = predict(cfg, f"{count}x{chosen.name}").step_s * 1e3
        except ConfigError as exc:
            notes.append(f"{key}: {exc}")
            continue
        row[f"{key}_ms"] = step_ms
        row[f"{key}_ratio"] = step_ms / measured_ms if measured_ms else None
    if unmodelled(cfg.toggles):
        notes.append(f"not modelled (predicted as off): {', '.join(unmodelled(cfg.toggles))}")
    row["predict_note"] = "; ".join(notes)
    return row


def _within(rows: list[dict], key: str) -> tuple[int, int]:
    ratios = [r[f"{key}_ratio"] for r in rows if r.get(f"{key}_ratio") is not None]
    return sum(abs(x - 1) <= PREDICT_BAND for x in ratios), len(ratios)


def _predict_claims(part, sheet, ladder_rows, parallel_rows, gpus: int, dry_run: bool) -> tuple[dict, dict]:
    from scalekit.predict.parts import GB

    def counted(rows, what):
        k, n = _within(rows, "calibrated")
        ran = sum(r.get("measured_ms") is not None for r in rows)
        text = f"{k} of {n} {what} within ±{PREDICT_BAND:.0%} on the calibrated part ({part.name})" + (
            f" ({ran - n} of the {ran} measured not predicted on it: see the table's notes)" if n < ran else "")
        if sheet is not None:
            k2, n2 = _within(rows, "datasheet")
            return text + f"; {k2} of {n2} on {sheet.name} at PUBLISHED's factors"
        return text + "; no datasheet part: this device's name is no part of the table"

    claims, why = {}, {}
    claims["predict_ladder"] = counted(ladder_rows, "rungs")
    if gpus >= 2:
        claims["predict_parallel"] = counted(parallel_rows, f"modes over {gpus} GPUs")
    else:
        why["predict_parallel"] = parallel_rows[0]["note"]
    if sheet is not None and "bf16" in part.peak_flops:
        claims["matmul_share"] = (f"{part.peak('bf16') / 1e12:,.0f} TFLOP/s best bf16 matmul, "
                                  f"{part.peak('bf16') / sheet.peak('bf16'):.2f} of {sheet.name}'s dense "
                                  f"{sheet.peak('bf16') / 1e12:,.0f}")
        claims["copy_share"] = (f"{part.memory_bandwidth / GB:,.0f} GB/s copy (read + write), "
                                f"{part.memory_bandwidth / sheet.memory_bandwidth:.2f} of {sheet.name}'s "
                                f"{sheet.memory_bandwidth / GB:,.0f}")
    else:
        reason = "dry run on the CPU: no datasheet part" if dry_run else "this GPU's name is no part of the table"
        why.update(matmul_share=reason, copy_share=reason)
    return claims, why


# name -> (function, time limit in seconds), in priority order
SECTIONS = {
    "gpu_tests": (gpu_tests, 150),
    "train_ladder": (train_ladder, 150),
    "planner": (planner, 60),
    "predict": (predict_section, 240),
    "inference": (inference, 150),
    "data": (data, 90),
    "finetune": (finetune, 90),
    "odds_and_ends": (odds_and_ends, 60),
    "train_memory": (train_memory, 120),
    "speculative": (speculative, 90),
    "training_kernels": (training_kernels, 120),
    "parallelism": (parallelism, 90),
}

# (the claim in the course's words, section, key of the section's claims)
CLAIMS = [
    ("gpu-marked tests pass on a GPU", "gpu_tests", "gpu_tests"),
    ("the GPT-2 124M ladder: ≈11× from fp32 to everything on (A100, build-nanogpt: 1000 → 90 ms)", "train_ladder",
     "ladder_speedup"),
    ("≈50% MFU for GPT-2 124M with every toggle (A100, build-nanogpt)", "train_ladder", "ladder_mfu"),
    ("scalekit's harness costs ≤ 2% against a bare PyTorch loop", "train_ladder", "harness_ratio"),
    ("the planner predicts the allocator's peak within 10% on a GPU", "planner", "planner_error"),
    ("predict within 25% of measured step time on the single-GPU ladder (gpt2-124m; calibrate() on the GPU, and the "
     "datasheet part at cost.PUBLISHED's factors)", "predict", "predict_ladder"),
    ("predict within 25% of measured step time for DDP and FSDP on the GPUs in hand", "predict", "predict_parallel"),
    ("cost.PUBLISHED's matmul factor: bf16 matmuls reach ≈80% of the dense peak (ml-engineering's MAMF, H100 SXM)",
     "predict", "matmul_share"),
    ("cost.PUBLISHED's memory factor: a streaming copy reaches ≈85% of the HBM bandwidth (STREAM/BabelStream-style)",
     "predict", "copy_share"),
    ("QLoRA ≈75% less peak GPU memory than LoRA (Vertex AI guidance)", "finetune", "qlora_memory"),
    ("LoRA ≈66% faster than QLoRA (Vertex AI guidance)", "finetune", "lora_speed"),
    ("gpt-fast: static cache + compile ≈4.2× eager decode (Llama-2-7B, A100: 25.5 → 107 tok/s)", "inference",
     "gen_static_compile"),
    ("gpt-fast: + int8 weight-only ≈6.2× eager decode (157 tok/s)", "inference", "gen_int8"),
    ("gpt-fast: + int4 weight-only ≈7.9× eager decode (202 tok/s)", "inference", "gen_four_bit"),
    ("KV cache: ≈4.7× faster generation of 1,000 tokens (GPT-2, T4)", "inference", "kv_cache_1000"),
    ("scalekit's generation is faster than transformers' generate() (same weights, greedy tokens)", "inference",
     "vs_hf_generate"),
    ("the data wait is visible and the data toggles remove it (torchtitan's data_loading(%))", "data", "data_wait"),
    ("data echoing: up to 3.25× less wall-clock time when data is the bottleneck (Choi et al.)", "data",
     "data_echo"),
    ("empty_cache every step: up to ≈40% slower", "odds_and_ends", "empty_cache_every_step"),
    ("empty_cache every N steps: ≈10% slower", "odds_and_ends", "empty_cache_every_10"),
    ("TF32 rounds matmul inputs to ~3 significant digits", "odds_and_ends", "tf32_error"),
    ("fp16 autocast trains with a GradScaler", "odds_and_ends", "fp16_scaler"),
    ("SDPA uses flash attention on the GPU", "odds_and_ends", "flash_backend"),
    ("Liger-Kernel: −60% memory on LLaMA-3-8B, most of it from the fused linear cross-entropy (README)",
     "train_memory", "liger_ce_memory"),
    ("a chunked loss never holds the whole logits: far less peak for a large vocabulary (Liger, Cut Cross-Entropy)",
     "train_memory", "chunked_ce_memory"),
    ("selective checkpointing ≈12% slower, full ≈20% (build-nanogpt, torchtitan's op policy)", "train_memory",
     "selective_ac"),
    ("per-block (regional) compile cuts compile time; torchtitan compiles per block by default", "train_memory",
     "regional_compile_s"),
    ("gpt-fast: speculative decoding ≈1.9× (Llama-2-70B int4 25.25 → 48.4 tok/s with a 7B int4 draft, A100)",
     "speculative", "speculative"),
    ("torchao: an int8 KV cache holds Llama 3.1 8B at 128K context in under 18.9 GB (half of bf16's cache)",
     "speculative", "int8_kv"),
    ("float8 training: torchtitan Llama 3.1 8B, 8×H100, 6,667 → 8,532 tokens/s/GPU with compile + float8 (+28%)",
     "training_kernels", "float8"),
    ("Liger-Kernel: +20% throughput, −60% memory (LLaMA-3-8B, 8×A100, FSDP1; its README)", "training_kernels", "liger"),
    ("TP, PP, 2-D and ZeRO-1/2/3 per-rank memory, planned and (with GPUs enough) measured", "parallelism",
     "parallel_memory"),
]

__all__ = ["SECTIONS", "CLAIMS", "environment"]
