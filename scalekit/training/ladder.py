"""The speed-up ladders: a baseline, then optimizations switched on one by one, cumulatively.

The training ladder's order is the one practitioners apply them in (build-nanogpt's): TF32 → bf16 autocast
→ torch.compile → SDPA attention → nice numbers → fused AdamW.  The data ladder (`scalekit ladder data`)
starts from a data-bound pipeline and climbs chapter 05's toggles.  A rung this machine cannot run is kept
in the table as skipped, with the reason, and left out of the rungs above it.
"""

from __future__ import annotations

import dataclasses

from ..comparison.repeats import check_repeats, repeat_rows, timing_only
from ..hf.family_of import toggle_family
from ..inference.ladder import inference_ladder
from ..machine.hardware import detect
from ..toggles import TOGGLES
from .config import RunConfig
from .engine import run
from .finetune import finetune_ladder
from .results import RunResult

LADDER = ("tf32", "bf16", "compile", "sdpa", "nice_numbers", "fused_adamw")


def ladder(base: RunConfig | None = None, rungs=LADDER, on_status=None, on_result=None, stop=None,
           repeats: int = 1) -> list[RunResult]:
    """The baseline, then each rung switched on cumulatively; with `repeats`, every row that measured is
    measured that many times in all, the order alternating (scalekit.comparison.repeats), for intervals that cover the
    machine changing between runs."""
    check_repeats("ladder(repeats=)", repeats)
    base = base or RunConfig()
    hw = detect(base.device)
    results: list[RunResult] = []
    configs: list[RunConfig | None] = []  # what each row ran, for its repeats
    on: dict = dict(base.toggles)

    def keep(result: RunResult, cfg: RunConfig | None) -> None:
        results.append(result)
        configs.append(cfg)
        if on_result:
            on_result(result)

    # a rung is a toggle's name (switched on with True) or a (name, value) pair
    pairs = [rung if isinstance(rung, tuple) else (rung, True) for rung in rungs]
    rows = [("baseline", None, None)] + [(f"+ {n}" if v is True else f"+ {n}={v}", n, v) for n, v in pairs]
    for label, name, value in rows:
        if stop is not None and stop.is_set():
            break
        why = _unavailable(name, base, hw) if name is not None else ""
        if why:
            keep(RunResult(label=label, config={}, status="skipped", error=why, device=hw.device_name), None)
            continue
        if name is not None:
            on[name] = value
        cfg = dataclasses.replace(base, toggles=dict(on), label=label)
        result = run(cfg, on_status=on_status, stop=stop, hw=hw, catch_errors=True)
        if result.status in ("failed", "diverged") and name is not None:
            del on[name]  # keep climbing without the rung that broke
        keep(result, cfg)
        if result.status == "stopped":
            break  # Stop, or Ctrl-C: the rungs above are not climbed
    repeat_rows(results, lambda i: run(timing_only(configs[i]), on_status=on_status, stop=stop, hw=hw,
                                           catch_errors=True),
                repeats, stop=stop, on_status=on_status)
    return results


def _unavailable(name: str, base: RunConfig, hw) -> str:
    """Why this machine (or your own model) cannot take the rung `name`, or ''."""
    ok, why = TOGGLES[name].available(hw)
    if ok and base.custom_model:  # your own model: a rung that changes the GPT needs the model's adapter
        ok, why = TOGGLES[name].applies_to(toggle_family(base.model))
    return "" if ok else why


def data_rungs(hw) -> tuple:
    """The data ladder's rungs, in the order chapter 05 takes them: workers (about half the cores, at most 4),
    pinned memory and asynchronous copies (GPU only), the training format, vectorized transforms, echo."""
    workers = max(1, min(4, hw.cpu_count // 2))
    return (("dataloader_num_workers", workers), "dataloader_pin_memory", "non_blocking", "training_format",
            "vectorized_transforms", ("data_echo", 2))


MODEL_ON_GPU = ("tf32", "bf16", "sdpa")  # on a GPU the data ladder's model runs as chapter 07's does


def data_ladder(base: RunConfig | None = None, rungs=None, on_status=None, on_result=None, stop=None,
                repeats: int = 1):
    """The data-bound baseline, then each data toggle cumulatively.

    The baseline reads raw text, tokenized and transformed per sample, with no workers (data='auto'
    becomes 'shakespeare-raw').  On a GPU, a base with no toggles gets MODEL_ON_GPU, so that the model's
    step is fast enough for the data to matter; on a CPU the model runs as given."""
    base = base or RunConfig()
    hw = detect(base.device)
    if base.data == "auto":
        base = dataclasses.replace(base, data="shakespeare-raw")
    if hw.device_type == "cuda" and not base.toggles:
        base = dataclasses.replace(base, toggles=[n for n in MODEL_ON_GPU if TOGGLES[n].available(hw)[0]])
    return ladder(base, data_rungs(hw) if rungs is None else rungs, on_status=on_status, on_result=on_result,
                  stop=stop, repeats=repeats)


# The ladders `scalekit ladder KIND` climbs: KIND -> a function (base RunConfig, on_status, on_result, stop,
# repeats) -> list of results.  "train" is the training ladder above, "data" chapter 05's, "finetune" chapter 09's,
# "inference" the generation ladder (scalekit/inference/ladder.py).
LADDERS = {"train": ladder, "data": data_ladder, "finetune": finetune_ladder, "inference": inference_ladder}
# How a ladder's table quotes throughput when not per median step: "wall" is the measured tokens over the
# measured loop's wall time, for ladders whose steps differ by design (with data_echo, one step in k waits).
TABLE_THROUGHPUT = {"data": "wall"}
