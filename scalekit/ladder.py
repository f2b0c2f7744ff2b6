"""The speed-up ladder: a baseline, then optimizations switched on one by one, cumulatively.

The order is the one practitioners apply them in (build-nanogpt's): TF32 → bf16 autocast →
torch.compile → SDPA attention → nice numbers → fused AdamW.  A rung this machine cannot run is kept in
the table as skipped, with the reason, and left out of the rungs above it.
"""

from __future__ import annotations

import dataclasses

from .config import RunConfig
from .engine import run
from .finetune import finetune_ladder
from .hardware import detect
from .measure.results import RunResult
from .toggles import TOGGLES

LADDER = ("tf32", "bf16", "compile", "sdpa", "nice_numbers", "fused_adamw")


def ladder(base: RunConfig | None = None, rungs=LADDER, on_status=None, on_result=None, stop=None) -> list[RunResult]:
    base = base or RunConfig()
    hw = detect(base.device)
    results: list[RunResult] = []
    on: dict = dict(base.toggles)

    def measure(label: str) -> RunResult:
        cfg = dataclasses.replace(base, toggles=dict(on), label=label)
        return run(cfg, on_status=on_status, stop=stop, hw=hw, catch_errors=True)

    rows = [("baseline", None)] + [(f"+ {name}", name) for name in rungs]
    for label, name in rows:
        if stop is not None and stop.is_set():
            break
        if name is not None:
            ok, why = TOGGLES[name].available(hw)
            if not ok:
                result = RunResult(label=label, config={}, status="skipped", error=why, device=hw.device_name)
                results.append(result)
                if on_result:
                    on_result(result)
                continue
            on[name] = True
        result = measure(label)
        if result.status in ("failed", "diverged") and name is not None:
            del on[name]  # keep climbing without the rung that broke
        results.append(result)
        if on_result:
            on_result(result)
        if result.status == "stopped":
            break  # Stop, or Ctrl-C: the rungs above are not climbed
    return results


# The ladders `scalekit ladder KIND` climbs: KIND -> a function (base RunConfig, on_status, on_result, stop)
# -> list of results.  "train" is the training ladder above; the data, inference and fine-tuning ladders
# add themselves here.
LADDERS = {"train": ladder, "finetune": finetune_ladder}
