"""What importing scalekit loads: none of the optional libraries (the GPU reference machine has no torchao, hqq or
bitsandbytes), none of the Lab's widget libraries and none of torch's heavy corners, each left to the run, Lab or
method that uses it; and generation runs without the optional libraries, a method that needs one saying so."""

from __future__ import annotations

import subprocess
import sys

OPTIONAL = ("torchao", "hqq", "bitsandbytes", "transformers", "peft")
WIDGETS = ("ipywidgets", "plotly", "anywidget")  # the Lab's: loaded when a Lab is made
# torch's heavy corners (each about a second to import, sympy and dynamo with them): imported where a run uses them
HEAVY_TORCH = ("torch._dynamo", "torch._inductor", "torch.distributed.pipelining", "torch.distributed.fsdp",
               "torch.distributed.tensor.parallel", "sympy")


def test_import_scalekit_loads_no_optional_library_widget_library_or_heavy_torch_corner():
    # one fresh interpreter for every rule: importing the most (the package, its Transformers bridge, engines and
    # CLI) loads none of them, so no smaller import does
    code = f"""
import sys, torch
before = set(sys.modules)
import scalekit, scalekit.hf, scalekit.training.engine, scalekit.cli.main, scalekit.inference.engine
present = lambda names: [m for m in names if m in sys.modules]
assert not present({OPTIONAL!r}), ("optional libraries", present({OPTIONAL!r}))
assert not present({WIDGETS!r}), ("widget libraries", present({WIDGETS!r}))
by_scalekit = [m for m in present({HEAVY_TORCH!r}) if m not in before]  # (not those torch's import loads itself)
assert not by_scalekit, ("torch's heavy corners", by_scalekit)
print("none loaded")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "none loaded", proc.stderr[-2000:]


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
