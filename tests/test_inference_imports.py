"""scalekit, its generation engine and its CLI import and run without the optional inference libraries
(the GPU reference machine has no torchao, hqq or bitsandbytes); a method that needs one says so."""

from __future__ import annotations

import subprocess
import sys

OPTIONAL = ("torchao", "hqq", "bitsandbytes", "transformers", "peft")


def test_import_scalekit_imports_no_quantization_or_hf_library():
    code = ("import sys, scalekit, scalekit.cli, scalekit.inference.engine; "
            f"bad = [m for m in {OPTIONAL!r} if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_generation_runs_with_the_optional_libraries_missing():
    code = f"""
import sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # as if not installed: importing it raises ImportError
import scalekit
from scalekit.toggles import TOGGLES
r = scalekit.generate(max_new_tokens=4, warmup_tokens=0, quality=True, quality_windows=1, measure_memory=False,
                      device="cpu", toggles={{"kv_cache": "static"}})
assert r.status == "ok" and len(r.token_ids[0]) == 4, r.error
hw = scalekit.detect("cpu")
ok, why = TOGGLES["quantize"].choice_available(hw, "hqq-4bit")
assert not ok and "needs hqq, which is not installed" in why, why
assert TOGGLES["quantize"].choice_available(hw, "torch-dynamic-int8")[0]  # torch's own needs nothing more
r = scalekit.generate(max_new_tokens=4, warmup_tokens=0, quality=False, measure_memory=False, device="cpu",
                      toggles={{"quantize": "torch-dynamic-int8"}})
assert r.status == "ok", r.error
try:
    scalekit.generate(max_new_tokens=4, device="cpu", toggles={{"quantize": "bnb-nf4"}})
except scalekit.ToggleUnavailable as exc:
    assert "bitsandbytes" in str(exc)
else:
    raise AssertionError("bnb-nf4 ran without bitsandbytes")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# torch's heavy corners (each about a second to import, sympy and dynamo with them): imported where a run uses them
HEAVY_TORCH = ("torch._dynamo", "torch._inductor", "torch.distributed.pipelining", "torch.distributed.fsdp",
               "torch.distributed.tensor.parallel", "sympy")


def test_import_scalekit_leaves_torchs_heavy_corners_to_the_runs_that_use_them():
    code = ("import sys, torch; before = set(sys.modules); import scalekit, scalekit.cli; "
            f"bad = [m for m in {HEAVY_TORCH!r} if m in sys.modules and m not in before]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
